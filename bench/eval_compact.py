"""Compact token stores against the full store: bytes per clip and the attentive probe's accuracy (bench/eval.md).

    python bench/eval_compact.py benchmark --run RUN [--codecs full,int8,pool2,pool2-int8,pool4] [--seeds 0,1,2,3,4]
    python bench/eval_compact.py index --run RUN --index DIR [--codecs ...] [--seeds 0,1,2,3,4]

``benchmark``: the built-in benchmark's three tasks (the demo budget, the run's own clips), the attentive probe
only, once per codec (``levjepa.eval.compact``) with the same probe seed, in memory — where the tokens are
what a store of that codec would keep. ``index``: an index task of small video files (``DIR/train.txt``,
``DIR/val.txt``, ``DIR/test.txt``, e.g. ``python bench/finetune.py index --run RUN --out DIR``), through feature
stores on disk, as ``levjepa probe --task index: --tokens CODEC`` reads it; the bytes are the stores' own.
Prints one markdown table: codec, bytes per view of the tokens, the ratio to the full store, the test accuracy
of each task (the mean over the probe seeds ``--seeds``: one attentive probe reads 400 test clips, so a single
seed moves by a point or two), its difference from the full store's and the seeds' standard deviation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _grid(loaded, size: int, frames: int) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    c = loaded.config
    return frames // c.tubelet, size // c.patch_size, size // c.patch_size


def benchmark(run: str, codecs: list[str], seeds: list[int]) -> None:
    from levjepa.eval.compact import TokenCodec
    from levjepa.eval.config import EvalConfig
    from levjepa.eval.synthetic_task import evaluate_benchmark, synthetic_config_for
    from levjepa.formats.load import load_encoder

    loaded = load_encoder(run)
    syn = synthetic_config_for(loaded.run_config)
    grid = _grid(loaded, syn.size, syn.num_frames)
    rows = []
    for name in codecs:
        per_seed = []
        for seed in seeds:
            cfg = EvalConfig(probes=("attentive",), budget="demo", tokens=name, seed=seed)
            res = evaluate_benchmark({"ema": loaded.encoder}, syn, cfg)
            per_seed.append({t: res.accuracy("ema", t, "attentive") for t in res.tasks})
        accs = {t: [a[t] for a in per_seed] for t in per_seed[0]}
        rows.append((name, TokenCodec.parse(name).bytes_per_view(grid, loaded.config.dim), accs))
        print(name, accs, flush=True, file=sys.stderr)
    _table(rows, f"built-in benchmark, token grid {grid}, D = {loaded.config.dim}")


def index(run: str, folder: str, codecs: list[str], seeds: list[int]) -> None:
    import numpy as np

    from levjepa.eval.config import EvalConfig
    from levjepa.eval.dataset_task import dataset_task
    from levjepa.eval.harness import evaluate
    from levjepa.formats.load import load_encoder
    from levjepa.formats.reading import model_views

    loaded = load_encoder(run)
    views, _ = model_views(loaded)
    d = Path(folder)
    paths = [str(d / f"{s}.txt") for s in ("train", "val", "test") if (d / f"{s}.txt").is_file()]
    work = Path(tempfile.mkdtemp(prefix="eval_compact_"))
    rows = []
    for name in codecs:
        task = dataset_task(paths, views=views, tubelet=loaded.config.tubelet, workers=1, features_dir=work)
        per_seed = []
        for seed in seeds:  # the stores are built once and read by every seed's probes
            cfg = EvalConfig(tasks=(task.name,), probes=("attentive",), budget="demo", tokens=name, seed=seed)
            res = evaluate({"ema": loaded.encoder}, task, cfg)
            assert res is not None
            per_seed.append(res.accuracy("ema", task.name, "attentive"))
        store = task.stores["ema"]["test" if "test" in task.splits else "val"]
        files = sorted(store.glob("tokens-*.npy")) + sorted(store.glob("scales-*.npy"))
        rows_in = sum(np.load(f, mmap_mode="r").shape[0] for f in store.glob("tokens-*.npy"))
        per_view = sum(np.load(f, mmap_mode="r").nbytes for f in files) // max(1, rows_in)
        rows.append((name, per_view, {task.name: per_seed}))
        print(name, rows[-1], flush=True, file=sys.stderr)
    _table(rows, f"index task {folder}, views {views.describe()}, through feature stores")


def _table(rows: list[tuple[str, int, dict[str, list[float]]]], what: str) -> None:
    import statistics

    full = next((r for r in rows if r[0] == "full"), rows[0])  # the reference: full, or the first codec given
    tasks = list(full[2])
    mean = {t: statistics.fmean(full[2][t]) for t in tasks}
    seeds = len(full[2][tasks[0]])
    print(f"{what}; attentive probe, test accuracy (%: the mean over {seeds} probe seeds, its difference from the "
          f"{full[0]} store's, ± the seeds' standard deviation), demo grid")  # fmt: skip
    print("| codec | token bytes per view | fewer bytes | " + " | ".join(tasks) + " |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in tasks) + " |")
    for name, size, accs in rows:
        cells = []
        for t in tasks:
            m, sd = statistics.fmean(accs[t]), statistics.stdev(accs[t]) if len(accs[t]) > 1 else 0.0
            cells.append(f"{m:.1f}" + ("" if name == full[0] else f" ({m - mean[t]:+.1f})") + f" ±{sd:.1f}")
        print(f"| {name} | {size:,} | {full[1] / size:.1f}× | " + " | ".join(cells) + " |")


def main() -> None:
    sys.path.insert(0, str(SRC))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("benchmark", "index"))
    ap.add_argument("--run", required=True)
    ap.add_argument("--index", default=None, help="index mode: folder of train.txt, val.txt, test.txt")
    ap.add_argument("--codecs", default="full,int8,pool2,pool2-int8,pool4,pool4-int8,tpool2-pool2-int8")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="probe seeds, averaged")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    codecs, seeds = args.codecs.split(","), [int(s) for s in args.seeds.split(",")]
    if args.mode == "benchmark":
        benchmark(args.run, codecs, seeds)
    else:
        index(args.run, args.index, codecs, seeds)


if __name__ == "__main__":
    main()
