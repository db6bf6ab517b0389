"""Compact token stores against the full store: bytes per clip and the attentive probe's accuracy (bench/eval.md).

    python bench/eval_compact.py benchmark --run RUN [--codecs full,int8,pool2,pool2-int8,pool4] [--seeds 0,1,2,3,4]
    python bench/eval_compact.py index --run RUN --index DIR [--codecs ...] [--seeds 0,1,2,3,4]
    python bench/eval_compact.py tasks --run RUN --index DIR [--codecs ...] [--seeds 0-19] [--json OUT.json]

``benchmark``: the built-in benchmark's three tasks (the demo budget, the run's own clips), the attentive probe
only, once per codec (``levjepa.features.compact``) with the same probe seed, in memory — where the tokens are
what a store of that codec would keep. ``index``: an index task of small video files (``DIR/train.txt``,
``DIR/val.txt``, ``DIR/test.txt``, e.g. ``python bench/finetune.py index --run RUN --out DIR``), through feature
stores on disk, as ``levjepa probe --task index: --tokens CODEC`` reads it; the bytes are the stores' own.
Prints one markdown table: codec, bytes per view of the tokens, the ratio to the full store, the test accuracy
of each task (the mean over the probe seeds ``--seeds``: one attentive probe reads 400 test clips, so a single
seed moves by a point or two), its difference from the full store's and the seeds' standard deviation.

``tasks``: every index task under ``DIR`` (``DIR/TASK/{train,val,test}.txt``, e.g. ``python bench/eval_tasks.py
--out DIR``: appearance, direction of motion, change over time), where a codec can fail. The views are cut as a
store cuts them (the model's preprocessing) and the full float16 tokens computed once per task; every codec's
tokens are ``TokenCodec.roundtrip`` of them, which is exactly what a store of that codec returns
(``tests/test_compact.py``: "a compact store holds what the codec keeps of the in-memory tokens", "a rotated
store on disk is read back by restore"). Each probe seed trains the demo's attentive grid (chosen on val, read on
test) once per codec with the same seed, so codecs are **paired**: the table gives, per task and codec, the token
bytes per view, the ratio to full, the token error (what the bits lose: the relative L2 error of the test tokens
against the same slots and pooling unrounded), the mean test accuracy, the mean paired difference from full ± its
standard error (the seeds' standard deviation of the difference / √seeds) and how many seeds fell below full. The seed
loop is outermost: a run stopped early leaves every codec with the same seeds (``--json`` keeps each one as it
finishes; ``--table A.json[,B.json]`` prints the table of kept files, runs of other seeds merged on the codecs they
share: two processes on two cores, or more seeds for some codecs). ``asym4`` codecs (``tpool3-asym4``) are a
bench prototype, not a store codec: asymmetric 4-bit, ``round(15 (x − min) / (max − min))`` with a float16 min
and scale per token.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from levjepa.features.compact import TokenCodec

SRC = Path(__file__).resolve().parents[1] / "src"
DEFAULT_CODECS = "full,int8,pool2,pool2-int8,pool4,pool4-int8,tpool2-pool2-int8"
TASK_CODECS = (
    "full,int8,int4,tpool2,tpool3,tpool3-int4,pool2-int8,"  # the codecs the docs recommended or measured
    "int4g32,int4g16,rot-int4,rot-int4g32,asym4,"  # finer 4-bit: groups of channels, rotation, min/max
    "tpool3-int4g32,tpool3-int4g16,tpool3-rot-int4,tpool3-rot-int4g32,tpool3-asym4,tpool2-rot-int4"
)


def _grid(loaded, size: int, frames: int) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    c = loaded.config
    return frames // c.tubelet, size // c.patch_size, size // c.patch_size


def benchmark(run: str, codecs: list[str], seeds: list[int]) -> None:
    from levjepa.eval.config import EvalConfig
    from levjepa.eval.synthetic_task import evaluate_benchmark, synthetic_config_for
    from levjepa.features.compact import TokenCodec
    from levjepa.formats.reading.load import load_encoder

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
    from levjepa.formats.reading.load import load_encoder
    from levjepa.formats.reading.views import model_views

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


def _asym4(reduce: TokenCodec, tokens: Tensor, grid: tuple[int, int, int]) -> Tensor:
    """The bench prototype ``asym4``: min/max 4-bit per token (16 levels), float16 min and scale (module doc)."""
    import torch

    x = reduce.reduce(tokens, grid).float()
    lo = x.amin(-1, keepdim=True).to(torch.float16).float()
    scale = ((x.amax(-1, keepdim=True) - lo).clamp_min(1e-8) / 15).to(torch.float16).float()
    return (((x - lo) / scale).round().clamp(0, 15) * scale + lo).to(torch.float16)


def _codec(name: str):  # type: ignore[no-untyped-def]
    """(roundtrip(tokens, grid), bytes_per_view(grid, dim)) of a codec name, the ``asym4`` prototype included."""
    from levjepa.features.compact import TokenCodec

    if name.split("-")[-1] == "asym4":
        reduce = TokenCodec.parse("-".join(name.split("-")[:-1]) or "full")
        return (lambda t, g: _asym4(reduce, t, g)), (lambda g, d: reduce.kept(g) * (-(-d // 2) + 4))
    codec = TokenCodec.parse(name)
    return codec.roundtrip, codec.bytes_per_view


def _quantisation_error(name: str, tokens: Tensor, grid: tuple[int, int, int]) -> float:
    """What the bits lose: ‖codec(x) − pooled(x)‖ / ‖pooled(x)‖ over the tokens (pooled: the codec's slots and
    pooling in float, no rounding), so pooling itself does not count."""
    from levjepa.features.compact import TokenCodec

    pooled = "-".join(p for p in name.split("-") if p.startswith(("pool", "tpool")) or p == "last") or "full"
    ref = TokenCodec.parse(pooled).reduce(tokens, grid).float()
    return float((_codec(name)[0](tokens, grid).float() - ref).norm() / ref.norm())


def _task_tokens(loaded, views, folder: Path, batch: int = 50):  # type: ignore[no-untyped-def]
    """split -> (tokens float16 [N, 1 + L, D], mean, cls, labels) of the index task in ``folder``, and the grid."""
    import torch

    from levjepa.eval.labelled import read_task
    from levjepa.features.compact import grid_of
    from levjepa.infer.encode import encode

    task = read_task([folder / f"{s}.txt" for s in ("train", "val", "test")])
    out, grid = {}, (0, 0, 0)
    for split, items in task.splits.items():
        parts = []
        for lo in range(0, len(items), batch):
            clips = torch.cat([views.load(it.path, loaded.config.patch_size) for it in items[lo : lo + batch]])
            parts.append(encode(loaded.encoder, clips, "cpu"))
        grid = grid_of(parts[0].positions)
        labels = torch.tensor([int(it.label or 0) for it in items])
        tokens, mean, cls = (torch.cat([getattr(p, a) for p in parts]) for a in ("tokens", "mean", "cls"))
        out[split] = (tokens, mean, cls, labels)
    return out, grid, task.num_classes


def tasks(run: str, folder: str, codecs: list[str], seeds: list[int], keep: str | None) -> None:
    import json
    import time

    from levjepa.eval.config import EvalConfig
    from levjepa.eval.harness import probe_sources
    from levjepa.eval.source import MemorySource
    from levjepa.formats.reading.load import load_encoder
    from levjepa.formats.reading.views import model_views

    loaded = load_encoder(run)
    views, _ = model_views(loaded)
    names = sorted(p.parent.name for p in Path(folder).glob("*/train.txt"))
    data = {t: _task_tokens(loaded, views, Path(folder) / t) for t in names}
    dim = loaded.config.dim
    record = {
        "run": str(run), "encoder": loaded.describe(), "views": views.describe(), "index": str(folder),
        "codecs": codecs, "tasks": names, "seeds": [],
        "bytes": {t: {c: _codec(c)[1](data[t][1], dim) for c in codecs} for t in names},
        "qerr": {t: {c: _quantisation_error(c, data[t][0]["test"][0], data[t][1]) for c in codecs} for t in names},
        "acc": {t: {c: [] for c in codecs} for t in names},
    }  # fmt: skip
    for seed in seeds:  # outermost: every codec has the same seeds whenever the run stops
        t0 = time.perf_counter()
        for t in names:
            splits, grid, classes = data[t]
            for c in codecs:
                roundtrip = _codec(c)[0]
                sources = {
                    s: MemorySource({"tokens": roundtrip(tok, grid), "mean": mean, "cls": cls}, {t: y}, name=s)
                    for s, (tok, mean, cls, y) in splits.items()
                }
                cfg = EvalConfig(tasks=(t,), probes=("attentive",), budget="demo", seed=seed)
                record["acc"][t][c].append(probe_sources(sources, cfg, {t: classes})[t]["attentive"].reported)
        record["seeds"].append(seed)
        print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True, file=sys.stderr)
        if keep:
            Path(keep).write_text(json.dumps(record, indent=1) + "\n")
    paired_table(record)


def merge_records(paths: list[str]) -> dict:  # type: ignore[type-arg]
    """One record of several ``--json`` files of the same tasks and encoder run on other seeds (e.g. two
    processes, ``--seeds 0-9`` and ``--seeds 10-19``), the seeds in order; the codecs that every file has."""
    import json

    records = [json.loads(Path(p).read_text()) for p in paths]
    out = records[0]
    for r in records[1:]:
        if (r["tasks"], r["encoder"]) != (out["tasks"], out["encoder"]) or set(r["seeds"]) & set(out["seeds"]):
            raise SystemExit(f"--table: {paths}: not the same tasks and encoder, or a seed twice")
        out["codecs"] = [c for c in out["codecs"] if c in r["codecs"]]
        out["seeds"] += r["seeds"]
        for t in out["tasks"]:
            for c in out["codecs"]:
                out["acc"][t][c] += r["acc"][t][c]
    out["qerr"] = next((r["qerr"] for r in records if "qerr" in r), None)  # a function of the tokens alone
    order = sorted(range(len(out["seeds"])), key=out["seeds"].__getitem__)
    out["seeds"] = [out["seeds"][i] for i in order]
    out["acc"] = {t: {c: [accs[c][i] for i in order] for c in out["codecs"]} for t, accs in out["acc"].items()}
    return out


def _paired(acc: list[float], ref: list[float]) -> tuple[float, float, int]:
    """Mean of the paired differences ``acc − ref``, its standard error, and how many are below 0."""
    import statistics

    diff = [a - r for a, r in zip(acc, ref, strict=True)]
    se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
    return statistics.fmean(diff), se, sum(d < 0 for d in diff)


def _pooled(name: str) -> str:
    """The codec's slots and pooling without its bits: ``tpool3-rot-int4g32`` -> ``tpool3``, ``int4`` -> ``full``."""
    return "-".join(p for p in name.split("-") if p.startswith(("pool", "tpool")) or p == "last") or "full"


def paired_table(record: dict) -> None:  # type: ignore[type-arg]
    """Markdown: per task and codec, bytes, ratio, token error, mean accuracy, paired difference from full ± SE,
    seeds below full, and the paired difference from the same pooling unquantised (what the bits cost)."""
    import statistics

    n = len(record["seeds"])
    print(f"encoder {record['encoder']}; views {record['views']}; attentive probe (demo grid, chosen on val), test "
          f"accuracy %, {n} probe seeds ({', '.join(map(str, record['seeds']))}) paired on the same tokens; "
          "diff = codec − full, ± the standard error of the paired difference; below = seeds where the codec "
          "scored under full; bits = codec − the same pooling unquantised (tpool3-int4 − tpool3), ± SE")  # fmt: skip
    qerr = record.get("qerr")  # absent in records of runs before it was kept
    print("\n| task | codec | token bytes per view | fewer bytes | token error | accuracy | diff ± SE | below full "
          "| bits ± SE |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    for t in record["tasks"]:
        accs, full_bytes = record["acc"][t], record["bytes"][t]["full"]
        for c in record["codecs"]:
            acc = accs[c][:n]
            mean, se, below = _paired(acc, accs["full"][:n])
            cells = "— | —" if c == "full" else f"{mean:+.2f} ± {se:.2f} | {below}/{n}"
            ref = _pooled(c)
            bits = "—"
            if ref != c and ref in accs and not (ref == "full" and c == _pooled(c)):
                bits = "{:+.2f} ± {:.2f}".format(*_paired(acc, accs[ref][:n])[:2])
            size = record["bytes"][t][c]
            err = f"{100 * qerr[t][c]:.1f} %" if qerr and c in qerr[t] else "?"
            print(f"| {t} | {c} | {size:,} | {full_bytes / size:.1f}× | {err} | {statistics.fmean(acc):.1f} | "
                  f"{cells} | {bits} |")  # fmt: skip


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
    ap.add_argument("mode", choices=("benchmark", "index", "tasks"))
    ap.add_argument("--run", default=None)
    ap.add_argument("--index", default=None, help="index: folder of train.txt, val.txt, test.txt; tasks: of tasks")
    ap.add_argument("--codecs", default=None, help=f"default: {DEFAULT_CODECS} ({TASK_CODECS} for tasks)")
    ap.add_argument("--seeds", default=None, help="probe seeds, averaged: 0,1,2 or 0-19 (default 0-4; tasks 0-19)")
    ap.add_argument("--json", default=None, help="tasks: keep every seed's accuracies in this file as they come")
    ap.add_argument("--table", default=None, help="tasks: print the table of --json files (a,b: merged) and exit")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    import torch

    if args.table:
        paired_table(merge_records(args.table.split(",")))
        return
    if args.run is None:
        ap.error("--run is required")
    torch.set_num_threads(args.threads)
    codecs = (args.codecs or (TASK_CODECS if args.mode == "tasks" else DEFAULT_CODECS)).split(",")
    seeds = _seeds(args.seeds or ("0-19" if args.mode == "tasks" else "0-4"))
    if args.mode == "benchmark":
        benchmark(args.run, codecs, seeds)
    elif args.mode == "index":
        index(args.run, args.index, codecs, seeds)
    else:
        if "full" not in codecs:
            ap.error("tasks: --codecs must include full (the reference of the paired differences)")
        tasks(args.run, args.index, codecs, seeds, args.json)


def _seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-19`` (inclusive), or both joined by commas."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


if __name__ == "__main__":
    main()
