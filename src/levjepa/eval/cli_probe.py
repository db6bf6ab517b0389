"""``levjepa probe RUN_OR_CHECKPOINT``: frozen-probe accuracy, with the random-initialisation baseline beside.

Tasks (``--task``):

* ``appearance,motion,arrow`` (any subset): the built-in benchmark, with the benchmark config the run
  trained with (``config.json`` → ``data.synthetic``) unless overridden with ``--synthetic key=value``;
* ``index:TRAIN,VAL[,TEST]``: a user's labelled V-JEPA index files (``path label`` rows; images allowed).
  Each clip is the centre window of ``--frames`` frames at ``--frame-stride``, resized to a short side of
  ``--size`` and centre-cropped (images: the frame repeated). Without TEST the numbers are validation
  accuracies of the probe chosen on that same validation split (optimistic; the caption says so).
  Unreadable files are skipped and listed in ``bad_files.json`` beside ``--out``.

``--weights ema|online|both`` picks the checkpoint's weights (an export holds one set); the table adds
``random-init``: the same architecture at random initialisation (``--baseline-seed``), unless
``--no-baseline``. ``--probe attentive,linear,knn`` or ``all``; ``--probe-depth 4`` switches the attentive
probe to V-JEPA 2's 4-block variant. ``--budget demo|full`` sets the grid and (built-in benchmark) the
split sizes; ``--set epochs=5`` etc. overrides the probe config. Prints the table; ``--out`` writes JSON
with every probe of every grid.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from levjepa.config import apply_overrides
from levjepa.eval.benchmark import (
    PROBES,
    TASKS,
    LabelledSplits,
    benchmark_splits,
    evaluate_splits,
    synthetic_config_for,
)
from levjepa.eval.features import center_square
from levjepa.eval.load import LoadedEncoder, load_encoder, random_encoder
from levjepa.eval.probes import probe_config

__all__ = ["add_arguments", "load_index_splits", "main"]


def _decode_item(item: Any, *, frames: int, frame_stride: int, size: int, patch: int) -> torch.Tensor:
    """uint8 [C, T, S, S]: the centre window of a video, or an image repeated along time."""
    from levjepa.data.video import decode_clip, load_image, probe_video

    if item.kind == "image":
        img = center_square(load_image(item.path, short_side=size)[None], size, patch)
        return img.expand(frames, -1, -1, -1).permute(3, 0, 1, 2).contiguous()
    n = probe_video(item.path).num_frames
    span = (frames - 1) * frame_stride + 1
    start = max(0, (n - span) // 2) if n > 0 else 0
    clip = decode_clip(item.path, num_frames=frames, frame_stride=frame_stride, start_frame=start, short_side=size)
    return center_square(clip, size, patch).permute(3, 0, 1, 2).contiguous()


def load_index_splits(
    paths: list[str], *, frames: int = 16, frame_stride: int = 2, size: int = 224, patch: int = 16, bad_files=None
) -> LabelledSplits:
    """Clips and labels of V-JEPA index files ``[train, val(, test)]`` as one task named ``labels``."""
    import hashlib

    from levjepa.data import BadFileReport, DataError
    from levjepa.data.sources import parse_index

    if len(paths) not in (2, 3):
        raise ValueError(f"index task: expected TRAIN,VAL[,TEST] index files, got {len(paths)}: {paths}")
    report = bad_files if bad_files is not None else BadFileReport()
    clips, labels = {}, {}
    for split, path in zip(("train", "val", "test"), paths, strict=False):
        items = parse_index(path)
        unlabeled = [it.path for it in items if it.label is None]
        if unlabeled:
            raise ValueError(f"{path}: {len(unlabeled)} row(s) have no integer label, e.g. {unlabeled[0]!r}")
        xs, ys = [], []
        for it in items:
            try:
                xs.append(_decode_item(it, frames=frames, frame_stride=frame_stride, size=size, patch=patch))
                ys.append(it.label)
            except (DataError, OSError, RuntimeError) as err:
                report.add(it.path, str(err))
        if not xs:
            raise ValueError(f"{path}: no readable clip ({report.total} bad file(s) so far)")
        clips[split] = torch.stack(xs)
        labels[split] = {"labels": torch.tensor(ys, dtype=torch.long)}
    num_classes = int(max(int(v["labels"].max()) for v in labels.values())) + 1
    key = hashlib.sha1(json.dumps([paths, frames, frame_stride, size, patch]).encode()).hexdigest()[:12]
    return LabelledSplits(clips, labels, {"labels": max(2, num_classes)}, f"index {paths[0]}", key=f"index-{key}")


def _split_list(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    items = list(valid) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise ValueError(f"--{what} {text!r}: valid choices are {', '.join(valid)} or all")
    return items


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="run directory, checkpoint or export")
    parser.add_argument(
        "--task", default="appearance,motion,arrow", help="appearance,motion,arrow (any) or index:TRAIN,VAL[,TEST]"
    )
    parser.add_argument("--weights", choices=("ema", "online", "both"), default="ema")
    parser.add_argument("--probe", default="all", help="attentive,linear,knn (any) or all")
    parser.add_argument(
        "--probe-depth", type=int, choices=(1, 4), default=1, help="attentive blocks: 1 paper, 4 V-JEPA 2"
    )
    parser.add_argument("--budget", choices=("demo", "full"), default="demo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="probe config override")
    parser.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE", help="benchmark override")
    parser.add_argument("--baseline-seed", type=int, default=0, help="seed of the random-init baseline")
    parser.add_argument("--no-baseline", action="store_true", help="skip the random-init column")
    parser.add_argument("--frames", type=int, default=16, help="index task: frames per clip")
    parser.add_argument("--frame-stride", type=int, default=2, help="index task: keep every n-th frame")
    parser.add_argument("--size", type=int, default=224, help="index task: short side + centre crop")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per encoder forward")
    parser.add_argument("--cache", default=None, help="feature cache folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0, help="probe seed")
    parser.add_argument("--out", default=None, help="write the JSON result here")


def main(args: argparse.Namespace) -> int:
    probes = _split_list(args.probe, PROBES, "probe")
    weights = ["ema", "online"] if args.weights == "both" else [args.weights]
    loaded: dict[str, LoadedEncoder] = {}
    for w in weights:
        enc = load_encoder(args.checkpoint, weights=w, device=args.device)  # type: ignore[arg-type]
        loaded.setdefault(f"pretrained-{enc.weights}", enc)
    first = next(iter(loaded.values()))
    if not args.no_baseline:
        loaded["random-init"] = random_encoder(first.config, seed=args.baseline_seed, device=args.device)
    cfg = apply_overrides(probe_config(args.budget, depth=args.probe_depth), args.set)
    bad = None
    if args.task.startswith("index:"):
        from levjepa.data import BadFileReport

        bad = BadFileReport()
        splits = load_index_splits(
            args.task[len("index:") :].split(","),
            frames=args.frames,
            frame_stride=args.frame_stride,
            size=args.size,
            patch=first.config.patch_size,
            bad_files=bad,
        )
        tasks, title = ["labels"], f"labelled index {args.task[len('index:') :]}"
    else:
        tasks = _split_list(args.task, TASKS, "task")
        syn = synthetic_config_for(first.run_config, args.synthetic)
        splits = benchmark_splits(syn, args.budget)
        title = "built-in benchmark (moving image over texture: appearance, motion direction, arrow of time)"
    result = evaluate_splits(
        {name: le.encoder for name, le in loaded.items()},
        splits,
        tasks=tasks,
        probes=probes,
        budget=args.budget,
        probe_cfg=cfg,
        device=args.device,
        seed=args.seed,
        cache_dir=args.cache,
        progress=True,
        title=title,
        batch_size=args.batch_size,
    )
    result.info["encoders"] = {name: le.describe() for name, le in loaded.items()}
    for name, le in loaded.items():  # which copy each column is (the EMA copy by default)
        print(f"{name}: {le.describe()}")
    print(result.table())
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {out}")
        if bad is not None:
            bad.write(out.parent / "bad_files.json")
    if bad is not None and bad.total:
        print(f"{bad.total} unreadable file(s) skipped: {bad.counts}")
    return 0
