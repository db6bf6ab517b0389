"""Augmented training views from a store against fixed centre crops and online augmentation (bench/eval.md,
"The reference training transform (issue 65)"; before it, "Augmented views from a store (issue 53)").

    python bench/eval_views.py --run RUN --index DIR [--tasks appearance,...] [--ks 1,2,4] [--codec tpool3-int4g32]
        [--seeds 0-9] [--json OUT.json] [--only fixed,K=4] [--crop-scale 0.3,1]
    python bench/eval_views.py --table A.json[,B.json]

The augmented views are V-JEPA's frozen-evaluation training transform (``levjepa.data.clip_augment``: RandAugment,
random resized crop 8–100 %, random erasing, V-JEPA 2's temporal starts, no flip). ``--json`` is also where a
stopped run resumes: every (task, setting, seed) already there is skipped, and the file is rewritten after each
one, so ``nohup python bench/eval_views.py ... --json OUT.json &`` can be killed and started again at any time.

Every index task under ``DIR`` (``DIR/TASK/{train,val,test}.txt``, ``python bench/eval_tasks.py --out DIR``) is
probed with the attentive probe (the demo grid, chosen on val, read on test) from the training views of:

* ``fixed`` — the store of one centre crop per segment (``--train-views fixed``);
* ``K=k`` — a store of ``k`` augmented views per video (``levjepa probe --train-views k``; the probes read view
  ``epoch mod k``), with every token and with the compact codec ``--codec``;
* ``online`` — ``levjepa probe --train-views online`` (the reference protocol): the frozen encoder re-run on a new
  augmented view every epoch.

Each setting runs exactly as ``levjepa probe --task index:...`` does (``dataset_task`` + ``evaluate``) into a
fresh features folder, so its encoder forwards (counted at ``levjepa.infer.encode.encode`` as the store and the
online source call it: training, validation and test views together) and its wall-clock (stores + probes, one
CPU thread) are the whole cost. The probe seed is also the views' seed. The seed loop is outermost, so a run
stopped early leaves every setting with the same seeds; ``--json`` keeps each seed as it finishes and
``--table`` merges files (runs of other seeds or tasks in other processes). The table: per task and setting, the
mean test accuracy, the mean paired difference from ``online`` ± its standard error (the seeds' standard deviation
of the difference / √seeds), the forwards and the seconds (means over seeds). A JSON of another encoder or
transform is refused, never resumed into. ``--only`` runs some of the settings; ``--crop-scale LO,HI`` is an
ablation, the same transform with another random-resized-crop scale (the JSON's ``transform`` says which).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def settings(ks: list[int], codec: str) -> list[tuple[str, int, str, bool]]:
    """(name, K, tokens, online) of every setting, in table order."""
    out = [("fixed", 0, "full", False)]
    out += [(f"K={k}", k, "full", False) for k in ks]
    out += [(f"K={k} {codec}", k, codec, False) for k in ks]
    return [*out, ("online", 0, "full", True)]


def run_one(loaded: Any, folder: Path, k: int, tokens: str, online: bool, seed: int) -> dict[str, float]:
    """One setting of one task and seed: test accuracy (%), encoder forwards and seconds."""
    import levjepa.eval.online as online_mod
    import levjepa.features.store as feature_store
    from levjepa.eval.config import EvalConfig
    from levjepa.eval.dataset_task import dataset_task
    from levjepa.eval.harness import evaluate
    from levjepa.formats.reading.views import model_views

    views, _ = model_views(loaded)
    count = [0]
    real = feature_store.encode

    def counted(encoder, clips, *args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += len(clips)
        return real(encoder, clips, *args, **kwargs)

    feature_store.encode, online_mod.encode = counted, counted  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as work:
            t0 = time.perf_counter()
            paths = [str(folder / f"{s}.txt") for s in ("train", "val", "test")]
            task = dataset_task(
                paths, views=views, tubelet=loaded.config.tubelet, workers=0, features_dir=work, train_views=k
            )
            cfg = EvalConfig(
                tasks=(task.name,), probes=("attentive",), budget="demo", seed=seed, tokens=tokens, online=online
            )
            res = evaluate({"ema": loaded.encoder}, task, cfg)
            seconds = time.perf_counter() - t0
    finally:
        feature_store.encode, online_mod.encode = real, real  # type: ignore[assignment]
    assert res is not None
    return {"acc": float(res.results["ema"][task.name]["attentive"].reported), "forwards": count[0], "s": seconds}


def measure(
    run: str,
    index: str,
    tasks: list[str],
    ks: list[int],
    codec: str,
    seeds: list[int],
    out: str | None,
    only: list[str] | None = None,
    crop_scale: tuple[float, float] | None = None,
) -> dict[str, Any]:
    sys.path.insert(0, str(SRC))
    import torch

    from levjepa.data import clip_augment
    from levjepa.formats.reading.load import load_encoder

    torch.set_num_threads(1)
    loaded = load_encoder(run)
    record: dict[str, Any] = {"run": run, "index": index, "codec": codec, "ks": ks, "results": {}}
    transform = clip_augment.NAME
    if crop_scale is not None and crop_scale != clip_augment.CROP_SCALE:  # an ablation: another crop scale
        clip_augment.CROP_SCALE = crop_scale  # read at each draw, in this process (workers=0)
        transform += f" with crop scale {crop_scale[0]:g}-{crop_scale[1]:g}"
    record.update(transform=transform, encoder=loaded.describe())
    if out and Path(out).is_file():  # resume: keep what a stopped run measured, with this encoder only
        before = json.loads(Path(out).read_text())
        if before.get("encoder") != record["encoder"] or before.get("transform") != record["transform"]:
            sys.exit(
                f"eval_views: {out} holds measurements of {before.get('encoder', 'another encoder')} "
                f"({before.get('transform')}), not of {record['encoder']}: give another --json"
            )
        record["results"] = before["results"]
    for seed in seeds:
        for task in tasks:
            for name, k, tokens, online in settings(ks, codec):
                if only and name not in only:
                    continue
                done = record["results"].get(task, {}).get(name, {})
                if str(seed) in done:
                    continue
                r = run_one(loaded, Path(index) / task, k, tokens, online, seed)
                record["results"].setdefault(task, {}).setdefault(name, {})[str(seed)] = r
                print(
                    f"seed {seed} {task} {name}: {r['acc']:.1f} % {r['forwards']} forwards {r['s']:.1f} s", flush=True
                )
                if out:
                    Path(out).write_text(json.dumps(record, indent=1))
    return record


def merge(paths: list[str]) -> dict[str, Any]:
    """The records of ``paths`` as one: every (task, setting, seed) any of them measured."""
    merged: dict[str, Any] = {}
    for p in paths:
        rec = json.loads(Path(p).read_text())
        if not merged:
            merged = {**rec, "results": {}}
        for task, by_setting in rec["results"].items():
            for name, by_seed in by_setting.items():
                merged["results"].setdefault(task, {}).setdefault(name, {}).update(by_seed)
    return merged


def _paired(acc: list[float], ref: list[float]) -> tuple[float, float]:
    d = [a - b for a, b in zip(acc, ref, strict=True)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else float("nan")
    return mean, sd / math.sqrt(len(d))


def table(record: dict[str, Any]) -> None:
    """The markdown table of a record (module doc), then per setting the mean over tasks of its paired difference
    from online and from fixed, ± the standard error over the seeds of that per-seed mean."""
    print(
        "| task | training views | seeds | test acc % | − online (± SE) | − fixed (± SE) | encoder forwards | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    names = settings(record["ks"], record["codec"])
    over: dict[str, dict[str, dict[str, list[float]]]] = {}  # setting -> ref -> seed -> the tasks' differences
    for task, by_setting in record["results"].items():
        ref, fixed = by_setting.get("online", {}), by_setting.get("fixed", {})
        for name, *_ in names:
            runs = by_setting.get(name, {})
            seeds = sorted((s for s in runs if s in fixed and (s in ref or not ref)), key=int)
            if not seeds:
                continue
            acc = [runs[s]["acc"] for s in seeds]
            diff, se = _paired(acc, [ref[s]["acc"] for s in seeds]) if ref else (math.nan, math.nan)
            dfix, sefix = _paired(acc, [fixed[s]["acc"] for s in seeds])
            for what, base in (("online", ref), ("fixed", fixed)):
                for s in seeds if base else []:
                    over.setdefault(name, {}).setdefault(what, {}).setdefault(s, []).append(
                        runs[s]["acc"] - base[s]["acc"]
                    )
            fw = sum(runs[s]["forwards"] for s in seeds) / len(seeds)
            sec = sum(runs[s]["s"] for s in seeds) / len(seeds)
            mean = sum(acc) / len(acc)
            print(
                f"| {task} | {name} | {len(seeds)} | {mean:.1f} | {diff:+.1f} ± {se:.1f} | {dfix:+.1f} ± {sefix:.1f} | "
                f"{fw:.0f} | {sec:.0f} |"
            )
    print("\nmean over tasks of the paired difference (points; ± SE over seeds of each seed's mean over the tasks):")
    print("\n| training views | − online | − fixed | tasks | seeds |\n|---|---|---|---|---|")
    for name, by_ref in over.items():
        cells = []
        for what in ("online", "fixed"):
            per_seed = [sum(d) / len(d) for d in by_ref.get(what, {}).values()]
            m, se = _paired(per_seed, [0.0] * len(per_seed)) if per_seed else (math.nan, math.nan)
            cells.append(f"{m:+.2f} ± {se:.2f}")
        tasks = max(len(d) for d in by_ref["fixed"].values())
        print(f"| {name} | {cells[0]} | {cells[1]} | {tasks} | {len(by_ref['fixed'])} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="/work/runs/demo")
    ap.add_argument("--index", default="/work/runs/eval_tasks")
    ap.add_argument("--tasks", default="appearance,direction,speed,order")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--codec", default="tpool3-int4g32")
    ap.add_argument("--seeds", default="0-9", help="a list (0,1,2) or a range (0-9)")
    ap.add_argument("--json", default=None, help="keep the measurements here, seed by seed")
    ap.add_argument("--only", default=None, help="these settings only (comma-separated names: fixed,K=4,online)")
    ap.add_argument(
        "--crop-scale",
        default=None,
        help="an ablation: the transform with this crop scale (LO,HI; the reference's is 0.08,1)",
    )
    ap.add_argument("--table", default=None, help="print the table of these JSON files (comma-separated)")
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    if args.table:
        table(merge(args.table.split(",")))
        return
    ks = [int(k) for k in args.ks.split(",")]
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(s) for s in args.seeds.split(",")]
    only = args.only.split(",") if args.only else None
    crop = None
    if args.crop_scale:
        lo, hi = (float(x) for x in args.crop_scale.split(","))
        crop = (lo, hi)
    table(measure(args.run, args.index, args.tasks.split(","), ks, args.codec, seeds, args.json, only, crop))


if __name__ == "__main__":
    main()
