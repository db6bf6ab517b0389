"""How much a frozen probe's reported accuracy moves with its seed, and what reporting a mean over seeds buys
(bench/eval.md, "Probe seeds").

    python bench/probe_seeds.py --run RUN --index DIR [--tasks appearance,direction,size] [--seeds 30]
        [--group 3] [--probes attentive,linear,linear_cls,knn] [--variant NAME=FIELD:VALUE+FIELD:V1/V2 ...]
        [--json OUT]

The tokens of every index task under ``DIR`` (``DIR/TASK/{train,val,test}.txt``, ``bench/eval_tasks.py``) are
computed once in memory as a store cuts them (``bench/eval_compact.py``'s ``_task_tokens``), then the probe
seeds ``0..seeds-1`` train each probe's grid of the demo budget (``probe_config("demo")``, with a variant's
overrides of ``ProbeConfig`` fields) on each task in one pass, as ``levjepa probe --seeds N`` does
(``train_probes(seed_generators=...)``): seed ``s`` draws its initialisation and its batch order from the
harness's generator ``make_generator("probe", s, TASK, PROBE)`` alone, so it is exactly the run ``levjepa probe
--seed s`` makes. Per task × probe the table gives the mean and sample sd over seeds of the reported accuracy
(test of the probe chosen on val) — what one seed may read —, the sd of the mean of ``group`` consecutive seeds
(what ``--seeds group`` reports), the sd of the best fixed grid point (the (lr, wd) with the best mean test
accuracy, no selection), and how many distinct grid points val chose and how often the choice differed from the
most common one. kNN has no seed.

(Before the trainer gave every seed block its own batch order, this script also split the spread into its
initialisation and batch-order parts, which the shared order made possible; that table is in bench/eval.md with
the commit that made it.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _variant(text: str) -> tuple[str, dict[str, object]]:
    name, _, spec = text.partition("=")
    over: dict[str, object] = {}
    for item in filter(None, spec.split("+")):
        k, _, v = item.partition(":")
        if k == "select":
            over[k] = v
        elif "/" in v:  # a tuple field: lrs:3e-3/1e-3
            over[k] = tuple(float(x) for x in v.split("/"))
        else:
            over[k] = float(v) if "." in v or "e" in v else int(v)
    return name, over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--tasks", default="appearance,direction,size")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--group", type=int, default=3, help="the sd of the mean of this many seeds (--seeds N)")
    ap.add_argument("--probes", default="attentive,linear,linear_cls,knn")
    ap.add_argument("--variant", action="append", default=[], help="NAME=FIELD:VALUE+... (ProbeConfig overrides)")
    ap.add_argument("--cache", default=None, help="folder to keep each task's tokens in (a .pt per task)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    torch.set_num_threads(args.threads)  # small probes: more threads only contend on a shared CPU
    from eval_compact import _task_tokens  # type: ignore[import-not-found]
    from levjepa.eval.config import probe_spec
    from levjepa.eval.knn import knn_from_sources
    from levjepa.eval.probes import probe_config
    from levjepa.eval.source import MemorySource
    from levjepa.eval.trainer import train_probes
    from levjepa.formats.reading.load import load_encoder
    from levjepa.formats.reading.views import model_views
    from levjepa.rng import make_generator

    variants = [_variant(v) for v in args.variant] or [("demo", {})]
    names = args.tasks.split(",")
    loaded, views = None, None
    data = {}
    for t in names:
        cached = Path(args.cache) / f"{t}.pt" if args.cache else None
        if cached is not None and cached.is_file():
            data[t] = torch.load(cached)
            continue
        if loaded is None:
            loaded = load_encoder(args.run)
            views, _ = model_views(loaded)
        splits, _, classes = _task_tokens(loaded, views, Path(args.index) / t)
        data[t] = {"splits": splits, "classes": classes}
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.save(data[t], cached)
    record: dict[str, object] = {"run": args.run, "index": args.index, "seeds": args.seeds, "rows": []}
    rows: list[dict[str, object]] = record["rows"]  # type: ignore[assignment]
    for vname, over in variants:
        cfg = probe_config("demo", **over)
        for t in names:
            splits, classes = data[t]["splits"], data[t]["classes"]
            src = {
                s: MemorySource({"tokens": tok, "mean": mean, "cls": cls}, {t: y}, name=s)
                for s, (tok, mean, cls, y) in splits.items()
            }
            for probe in args.probes.split(","):
                t0 = time.perf_counter()
                if probe == "knn":
                    acc = knn_from_sources(src["train"], src["val"], src["test"], task=t, num_classes=classes).reported
                    rows.append({"variant": vname, "task": t, "probe": probe, "both": [acc]})
                    continue
                spec = probe_spec(probe)
                res = train_probes(
                    spec.kind, cfg, spec.input, src["train"], src["val"], src["test"], classes={t: classes},
                    generator=make_generator("probe", 0, t, probe),
                    seed_generators=[make_generator("probe", s, t, probe) for s in range(1, args.seeds)],
                )[t]  # fmt: skip
                runs = [res, *res.seeds]
                both = [r.reported for r in runs]
                best = [r.best for r in runs]
                grid_test = [r.test_acc for r in runs]
                point_means = [statistics.fmean(g[i] for g in grid_test) for i in range(len(grid_test[0]))]
                top = point_means.index(max(point_means))
                common = statistics.mode(best)
                rows.append({
                    "variant": vname, "task": t, "probe": probe, "both": both, "group": args.group,
                    "best": best, "grid_test": grid_test, "top_point": top,
                    "top_point_acc": [g[top] for g in grid_test],
                    "chosen_points": len(set(best)), "choice_changed": sum(b != common for b in best),
                    "seconds_per_seed": (time.perf_counter() - t0) / args.seeds,
                })  # fmt: skip
                print(
                    f"{vname} {t} {probe}: {statistics.fmean(both):.1f} ± {_sd(both):.1f}", file=sys.stderr, flush=True
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    table(rows, args.seeds)


def _group_means(xs: list[float], k: int) -> list[float]:
    """The means of consecutive groups of ``k`` seeds (a last, shorter group left out)."""
    return [statistics.fmean(xs[i : i + k]) for i in range(0, len(xs) - k + 1, k)]


def table(rows: list[dict], seeds: int) -> None:  # type: ignore[type-arg]
    k = next((int(r["group"]) for r in rows if "group" in r), 3)
    print(
        f"Test accuracy (%) over {seeds} probe seeds (one pass, each seed its own initialisation and batch order), "
        f"mean ± sample sd; mean of {k} = the sd of the mean of {k} consecutive seeds, what `--seeds {k}` reports "
        f"({seeds // k} groups); fixed point = the grid point with the best mean test accuracy, no selection; "
        "chosen = distinct grid points val chose (times it differed from the most common)."
    )
    print()
    print(f"| variant | task | probe | one seed | mean of {k} | fixed point | chosen | s / seed |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")

    def ms(xs: list[float]) -> str:
        return f"{statistics.fmean(xs):.1f} ± {_sd(xs):.1f}" if xs else "—"

    for r in rows:
        if r["probe"] == "knn":
            print(f"| {r['variant']} | {r['task']} | knn | {r['both'][0]:.1f} (no seed) | — | — | — | — |")
            continue
        print(
            f"| {r['variant']} | {r['task']} | {r['probe']} | {ms(r['both'])} | {ms(_group_means(r['both'], k))} "
            f"| {ms(r['top_point_acc'])} | {r['chosen_points']} ({r['choice_changed']}) | {r['seconds_per_seed']:.1f} |"
        )


if __name__ == "__main__":
    main()
