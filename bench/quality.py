"""Does pretraining learn? Diagnostics of the built-in benchmark's three tasks (results: ``bench/quality.md``).

    python bench/quality.py supervised --preset demo-cpu [--steps N] [--budget-s S] --out DIR [k=v ...]
    python bench/quality.py ssl --preset demo-cpu --out DIR [--eval-at 200,400,...] [--final online,random]
                                [--resume] [k=v ...]
    python bench/quality.py table [--per-probe] DIR [DIR ...]
    python bench/quality.py spread DIR|RUN_DIR|PROBE.json [...]
    python bench/quality.py factors CHECKPOINT [CHECKPOINT ...] [--weights ema] [--random] [--out DIR]

``supervised`` — the **supervised ceiling**: the preset's encoder, trained on the same clips (the
benchmark's train split, or its images rendered anew for every batch when the preset pretrains on fresh
clips; the whole clip as one view, tokens dropped at the preset's ρ as in pretraining)
with the labels: one linear head per task on the CLS, the summed cross-entropies, the preset's AdamW and
learning-rate schedule. It answers whether this architecture at these sizes can carry appearance, motion
and the arrow of time at all within the budget. The trained encoder is then frozen and read by the same
probes as a pretrained one, beside the same encoder at random initialisation.

``ssl`` — the real ``levjepa.train.pretrain`` with the preset and overrides; checkpoints at ``--eval-at``
steps are each frozen and probed (a learning curve); the random-init column is computed once. ``--resume``
continues an interrupted ``DIR/run`` from its latest checkpoint (the same trajectory: ``levjepa pretrain
--resume``), and each probed checkpoint is written to ``DIR/quality.json`` as it ends.

``spread`` — the demo's targets run by run (one ``ssl`` directory per seed and thread count, or the run directory
of a ``levjepa pretrain`` that ended with probes): pretrained vs random init and the margin per task, what each
run misses, how many points it has to spare (the least over tasks, above a target and above the margin), and
the learning curve where ``--eval-at`` made one; exits 1 when a run misses a target or margin.

``factors`` — *what the frozen CLS encodes*: ridge regressions from a checkpoint's CLS (train split) to every
factor that decides a clip — the labels and the nuisances (object and background colour, start and end
position, speed) — scored by R² on the val split. A factor the objective does not need but that every view
shares (the background's brightness, say) shows up here before any label does.

Every run writes ``DIR/quality.json``: the config overrides, train seconds, losses, and the accuracy table
(test split, probe chosen on val). ``table`` prints the markdown rows of ``bench/quality.md`` from them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.data.synthetic import load_split
from levjepa.data.views import normalize, rgb_to_hsv
from levjepa.eval import EvalConfig, evaluate_benchmark
from levjepa.eval.config import PROBE_LABELS, PROBES
from levjepa.eval.synthetic_task import TASKS
from levjepa.formats.reading.load import load_encoder
from levjepa.infer.cpu import cpu_info
from levjepa.presets import DEMO_MARGIN, DEMO_TARGETS, demo_misses, preset
from levjepa.rng import make_generator
from levjepa.train.loop import build_models, pretrain
from levjepa.train.optim import build_optimizer, lr_at
from levjepa.weights import PROBE_RESULTS, checkpoint_name


def _config(name: str, overrides: list[str], threads: int | None):
    extra = [f"train.threads={threads}"] if threads else []
    return apply_overrides(preset(name), [*overrides, *extra])


def _evaluate(cfg, encoders: dict[str, nn.Module], probes: list[str]) -> dict:
    evaluation = EvalConfig(budget=cfg.train.eval_budget, seed=cfg.train.seed, probes=tuple(probes))
    res = evaluate_benchmark(encoders, cfg.data.synthetic, evaluation)
    print(res.table(), flush=True)
    data = res.to_json()
    return {"accuracy": data["accuracy"], "chance": data["chance"], "info": data["info"]}


def _batch_reader(cfg, data):
    """``read(idx, gen) -> (clips, labels)`` of a training batch: the train split's clips ``idx``, or — when
    pretraining reads fresh clips (``synthetic.pretrain_clips=fresh``) — the same train images rendered anew,
    as SSL sees them."""
    syn = cfg.data.synthetic
    if syn.pretrain_clips != "fresh":
        return lambda idx, gen: (data.clips[idx], {t: data.labels[t][idx] for t in TASKS})
    from levjepa.data import synthetic

    pool = synthetic.load_image_pool(syn)
    images = synthetic.split_images(syn, "train", pool)  # once, not every step

    def read(idx: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
        params = synthetic.draw_params(syn, images[idx], gen)
        labels = {"appearance": pool.labels[params.image], "motion": params.motion, "arrow": params.arrow}
        return synthetic.render(syn, params, pool), labels

    return read


def supervised(args: argparse.Namespace) -> dict:
    """Train the preset's encoder with the labels (a linear head per task on CLS); then probe it frozen."""
    cfg = _config(args.preset, args.overrides, args.threads)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    data = load_split(cfg.data.synthetic, "train")
    encoder, _ = build_models(cfg, seed=cfg.train.seed)
    heads = nn.ModuleDict({t: nn.Linear(cfg.model.dim, data.num_classes[t]) for t in TASKS})
    model = nn.ModuleDict({"encoder": encoder, "heads": heads})
    optimizer = build_optimizer(model, cfg.optim)
    steps = args.steps or cfg.train.steps
    batch = cfg.data.batch_size
    gen = make_generator("quality-supervised", cfg.train.seed)
    read_batch = _batch_reader(cfg, data)
    start, log = time.perf_counter(), []
    step = 0
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.optim, steps)
        idx = torch.randint(0, len(data), (batch,), generator=gen)
        clips, labels = read_batch(idx, gen)
        cls = encoder.forward_features(normalize(clips), drop=cfg.model.drop_ratio > 0, generator=gen).cls
        losses = {t: F.cross_entropy(heads[t](cls), labels[t]) for t in TASKS}
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            values = {t: round(v.item(), 4) for t, v in losses.items()}
            log.append({"step": step, **values})
            print(f"step {step}  " + "  ".join(f"{t} {v:.3f}" for t, v in values.items()), flush=True)
        if time.perf_counter() - start > args.budget_s:
            break
    train_s = time.perf_counter() - start
    encoder.eval()
    random_init, _ = build_models(cfg, seed=cfg.train.seed)
    out = {
        "kind": "supervised",
        "preset": args.preset,
        "overrides": args.overrides,
        "steps": step + 1,
        "train_s": train_s,
        "log": log,
    }
    t0 = time.perf_counter()
    out.update(_evaluate(cfg, {"supervised": encoder, "random init": random_init}, args.probes))
    out["eval_s"] = time.perf_counter() - t0
    return out


def _checkpoint_encoder(ckpt: Path, which: str) -> nn.Module:
    return load_encoder(ckpt, weights=which).encoder  # type: ignore[arg-type]


def ssl(args: argparse.Namespace) -> dict:
    """The real pretraining loop; each checkpoint in ``--eval-at`` frozen and probed (EMA weights)."""
    eval_at = sorted(int(s) for s in args.eval_at.split(",")) if args.eval_at else []
    cfg = _config(args.preset, args.overrides, args.threads)
    steps = cfg.train.steps
    keep = [*eval_at, steps]
    every = math.gcd(*keep)
    cfg = apply_overrides(
        cfg, ["train.eval_at_end=false", f"train.checkpoint_every={every}", f"train.keep_every={every}"]
    )
    run = args.out / "run"
    resumed = args.resume and (run / "checkpoints" / "latest").exists()
    start = time.perf_counter()
    summary = pretrain(cfg, run, resume=resumed, overwrite=not resumed, progress=False)
    train_s = time.perf_counter() - start
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("loss", "invariance", "sigreg", "effective_rank")
    out = {
        "kind": "ssl",
        "preset": args.preset,
        "overrides": args.overrides,
        "steps": steps,
        "train_s": train_s,  # of this invocation: a resumed run's time before the interruption is not in it
        "resumed": resumed,
        "clips_per_s": summary.clips_per_s,
        "first": {k: metrics[0].get(k) for k in keys},
        "last": {k: metrics[-1].get(k) for k in keys},
        "curve": {},
    }
    random_init, _ = build_models(cfg, seed=cfg.train.seed)
    for s in keep:
        ckpt = run / "checkpoints" / checkpoint_name(s)
        encoders = {f"EMA @ {s}": _checkpoint_encoder(ckpt, "ema")}
        if s == steps and "online" in args.final:
            encoders["online"] = _checkpoint_encoder(ckpt, "online")
        if s == steps and "random" in args.final:
            encoders["random init"] = random_init
        t0 = time.perf_counter()
        out["curve"][s] = _evaluate(cfg, encoders, args.probes)
        out["curve"][s]["eval_s"] = time.perf_counter() - t0
        (args.out / "quality.json").write_text(json.dumps(out, indent=1, default=str))  # a crash keeps each point
    return out


def _factor_targets(cfg, split: str, n: int) -> dict[str, torch.Tensor]:
    """Every factor of the first ``n`` clips of ``split``, float [n] each (the labels as indicators/unit vectors)."""
    from levjepa.data import synthetic

    pool = synthetic.load_image_pool(cfg)
    params = synthetic.sample_params(cfg, split, pool).select(slice(0, n))
    obj_hsv = rgb_to_hsv(params.obj_colour[:, :, None])[:, :, 0]  # [n, 3]
    bg_hsv = rgb_to_hsv(params.bg_colour[:, :, None])[:, :, 0]
    pos, _ = synthetic._trajectory(cfg, params)  # forward time [n, T, 2]
    shown = torch.where(params.arrow.bool()[:, None, None], pos.flip(1), pos)  # as the frames show it
    unit = synthetic._unit(params.motion).float()  # visible direction (dy, dx)
    labels = pool.labels[params.image]
    out = {
        "appearance (digit = 0)": (labels == 0).float(),
        "appearance (digit = 1)": (labels == 1).float(),
        "motion dx": unit[:, 1],
        "motion dy": unit[:, 0],
        "arrow": params.arrow.float(),
        "speed": params.speed.float(),
        "object hue (cos)": torch.cos(2 * math.pi * obj_hsv[:, 0]),
        "object saturation": obj_hsv[:, 1],
        "object value": obj_hsv[:, 2],
        "background hue (cos)": torch.cos(2 * math.pi * bg_hsv[:, 0]),
        "background saturation": bg_hsv[:, 1],
        "background value": bg_hsv[:, 2],
        "first-frame x": shown[:, 0, 1].float(),
        "first-frame y": shown[:, 0, 0].float(),
        "last-frame x": shown[:, -1, 1].float(),
        "last-frame y": shown[:, -1, 0].float(),
        "mean x over the clip": pos[:, :, 1].mean(1).float(),
        "mean y over the clip": pos[:, :, 0].mean(1).float(),
    }
    return out


def _cls(encoder: nn.Module, clips: torch.Tensor) -> torch.Tensor:
    from levjepa.features.cache import compute_features

    return compute_features(encoder, clips, batch_size=50, keep_tokens=False).cls


def factors(args: argparse.Namespace) -> dict:
    """Ridge regression CLS -> each factor, fitted on train, R² on val (features standardised on train)."""
    from levjepa.formats.reading.load import random_encoder

    out: dict = {"kind": "factors", "encoders": {}}
    if args.threads:
        torch.set_num_threads(args.threads)
    encoders = {}
    for ckpt in args.checkpoints:
        loaded = load_encoder(ckpt, weights=args.weights)
        encoders[str(ckpt)] = loaded
    if args.random:
        first = next(iter(encoders.values()))
        encoders["random init"] = random_encoder(first.config, seed=first.run_config.train.seed)
    for name, loaded in encoders.items():
        cfg = (loaded.run_config or next(iter(encoders.values())).run_config).data.synthetic
        n = {"train": min(args.n_train, cfg.num_train), "val": cfg.num_val}
        feats = {s: _cls(loaded.encoder, load_split(cfg, s).clips[: n[s]]) for s in n}
        mu, sd = feats["train"].mean(0), feats["train"].std(0) + 1e-6
        design = {s: torch.cat([(f - mu) / sd, torch.ones(len(f), 1)], 1).double() for s, f in feats.items()}
        targets = {s: _factor_targets(cfg, s, n[s]) for s in n}
        a = design["train"]
        ridge = a.T @ a + args.ridge * torch.eye(a.shape[1], dtype=a.dtype)
        r2 = {}
        for key, y in targets["train"].items():
            w = torch.linalg.solve(ridge, a.T @ y.double())
            yv = targets["val"][key].double()
            r2[key] = float(1 - ((design["val"] @ w - yv) ** 2).mean() / yv.var().clamp_min(1e-12))
        out["encoders"][name] = r2
    names = list(out["encoders"])
    print("| factor | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for key in next(iter(out["encoders"].values())):
        print(f"| {key} | " + " | ".join(f"{out['encoders'][e][key]:.2f}" for e in names) + " |")
    return out


def _best(acc: dict[str, float]) -> tuple[str, float]:
    probe = max(acc, key=acc.get)
    return probe, acc[probe]


def per_probe_table(d: Path) -> None:
    """Markdown: one row per task and probe, one column per evaluated encoder (every checkpoint of a curve)."""
    res = json.loads((d / "quality.json").read_text())
    evals = list(res["curve"].values()) if res["kind"] == "ssl" else [res]
    columns = [(enc, per_task) for ev in evals for enc, per_task in ev["accuracy"].items()]
    chance = evals[-1]["chance"]
    print("| task | probe | " + " | ".join(enc for enc, _ in columns) + " | chance |")
    print("| --- | --- |" + " ---: |" * (len(columns) + 1))
    for t in TASKS:
        for probe in columns[0][1][t]:
            cells = " | ".join(f"{per_task[t][probe]:.1f}" for _, per_task in columns)
            print(f"| {t} | {PROBE_LABELS.get(probe, probe)} | {cells} | {chance[t]:.1f} |")


def table(dirs: list[Path], per_probe: bool = False) -> None:
    """Markdown rows: one per evaluated encoder, best probe per task (and which probe it was)."""
    if per_probe:
        for d in dirs:
            per_probe_table(d)
        return
    print("| run | encoder | steps | train s | " + " | ".join(f"{t} (best probe)" for t in TASKS) + " |")
    print("| --- | --- | ---: | ---: |" + " --- |" * len(TASKS))
    for d in dirs:
        res = json.loads((d / "quality.json").read_text())
        evals = res["curve"].values() if res["kind"] == "ssl" else [res]
        for ev in evals:
            for enc, per_task in ev["accuracy"].items():
                cells = []
                for t in TASKS:
                    probe, value = _best(per_task[t])
                    cells.append(f"{value:.1f} ({probe})")
                print(f"| {d.name} | {enc} | {res['steps']} | {res['train_s']:.0f} | " + " | ".join(cells) + " |")


def spread(dirs: list[Path]) -> int:
    """Markdown: one row per ``ssl`` run (seed, threads: the directory's name), per ``levjepa probe --out``
    JSON file or per ``levjepa pretrain`` run directory (its end-of-run ``probe_results.json``), best probe
    per task, pretrained vs random init with the margin, a ✗ on each target or margin missed; then the curve
    of each run that has one. Returns how many runs miss something."""
    head = " | all met | least room: target, margin | train s | clips/s |"
    print("| run | " + " | ".join(f"{t}: EMA vs random (margin)" for t in TASKS) + head)
    print("| --- |" + " --- |" * len(TASKS) + " --- | --- | ---: | ---: |")
    missed, curves = 0, []
    untimed = {"steps": 0, "curve": {}, "train_s": math.nan, "clips_per_s": math.nan}  # probes only, no curve
    for d in dirs:
        if d.suffix == ".json":  # the --out of `levjepa probe RUN` (its EMA encoder and its random-init column)
            acc, res = json.loads(d.read_text())["accuracy"], untimed
            pre, rnd = acc["pretrained-ema"], acc["random-init"]
        elif (d / PROBE_RESULTS).exists() and not (d / "quality.json").exists():  # `levjepa pretrain`'s run dir
            acc, res = json.loads((d / PROBE_RESULTS).read_text())["accuracy"], untimed
            pre, rnd = acc["pretrained (EMA)"], acc["random init"]
        else:
            res = json.loads((d / "quality.json").read_text())
            final = res["curve"][str(res["steps"])]["accuracy"]
            pre, rnd = final[f"EMA @ {res['steps']}"], final["random init"]
        steps = res["steps"]
        cells, missing = [], demo_misses(pre, rnd)
        ok = not missing
        room: list[tuple[float, str]] = []  # (points above a target, task); then above the margin
        margin_room: list[tuple[float, str]] = []
        for t in TASKS:
            p, r = _best(pre[t])[1], _best(rnd[t])[1]
            met = not any(m.startswith(f"{t}: ") for m in missing)
            cells.append(f"{p:.1f} vs {r:.1f} ({p - r:+.1f}){'' if met else ' ✗'}")
            room.append((p - DEMO_TARGETS[t], t))
            margin_room.append((p - r - DEMO_MARGIN, t))
        missed += not ok
        (tr, tt), (mr, mt) = min(room), min(margin_room)
        least = f"{tr:+.1f} ({tt}), {mr:+.1f} ({mt})"
        row = f"| {d.name} | " + " | ".join(cells) + f" | {'yes' if ok else '**no**'} | {least} |"
        timing = "— | — |" if math.isnan(res["train_s"]) else f"{res['train_s']:.0f} | {res['clips_per_s']:.1f} |"
        print(row + " " + timing)
        points = [k for k in res["curve"] if k != str(steps)]
        if points:
            curves.append((d.name, [(k, res["curve"][k]["accuracy"][f"EMA @ {k}"]) for k in [*points, str(steps)]]))
    if curves:
        print("\n| run | step | " + " | ".join(f"{t} (best probe)" for t in TASKS) + " |")
        print("| --- | ---: |" + " --- |" * len(TASKS))
        for name, points in curves:
            for k, acc in points:
                cells = [f"{_best(acc[t])[1]:.1f} ({_best(acc[t])[0]})" for t in TASKS]
                print(f"| {name} | {k} | " + " | ".join(cells) + " |")
    return missed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("supervised", "ssl"):
        s = sub.add_parser(name)
        s.add_argument("--preset", default="demo-cpu")
        s.add_argument("--out", type=Path, required=True)
        s.add_argument("--threads", type=int, default=None)
        s.add_argument("--probes", default=",".join(PROBES))
        s.add_argument("overrides", nargs="*")
        if name == "supervised":
            s.add_argument("--steps", type=int, default=None, help="schedule length (default: the preset's)")
            s.add_argument("--budget-s", type=float, default=math.inf, help="stop training after this wall time")
        else:
            s.add_argument("--eval-at", default="", help="also probe the checkpoints of these steps")
            s.add_argument("--final", default="online,random", help="probed beside EMA at the end: online, random")
            s.add_argument("--resume", action="store_true", help="continue OUT/run from its latest checkpoint")
    sp = sub.add_parser("spread")
    sp.add_argument("dirs", type=Path, nargs="+")
    t = sub.add_parser("table")
    t.add_argument("dirs", type=Path, nargs="+")
    t.add_argument("--per-probe", action="store_true", help="every probe of every encoder, one table per DIR")
    f = sub.add_parser("factors")
    f.add_argument("checkpoints", type=Path, nargs="+", help="checkpoint directories (or run directories)")
    f.add_argument("--weights", default="ema", choices=("ema", "online"))
    f.add_argument("--random", action="store_true", help="add the same encoder at random initialisation")
    f.add_argument("--n-train", type=int, default=1200, help="train clips the regressions fit on")
    f.add_argument("--ridge", type=float, default=1.0)
    f.add_argument("--threads", type=int, default=None)
    f.add_argument("--out", type=Path, default=None, help="also write DIR/factors.json")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    if args.cmd == "spread":
        return 1 if spread(args.dirs) else 0
    if args.cmd == "table":
        table(args.dirs, args.per_probe)
        return 0
    if args.cmd == "factors":
        result = factors(args)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "factors.json").write_text(json.dumps(result, indent=1))
        return 0
    args.probes = args.probes.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    result = supervised(args) if args.cmd == "supervised" else ssl(args)
    (args.out / "quality.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
