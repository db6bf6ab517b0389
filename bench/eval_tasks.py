"""Labelled index tasks where a compact token codec can fail: appearance, direction of motion, change over time.

    python bench/eval_tasks.py --out DIR [--seed 53] [--sizes 300,100,200] [--tasks appearance,direction,...]

writes, per task, ``DIR/TASK/{train,val,test}/NNNNN.mp4`` (lossless x264, 4:4:4, 15 fps) and the index files
``DIR/TASK/{train,val,test}.txt`` (``path label``) that ``levjepa probe --task index:TRAIN,VAL,TEST`` and
``bench/eval_compact.py tasks`` read, plus ``DIR/tasks.json`` (what each label means, the seed, the sizes).
Every clip is 16 frames of 32 × 32 px, the demo encoder's clips (``levjepa pretrain --preset demo-cpu``), and a
function of ``(seed, task, split, index)`` only (numpy ``default_rng``): the same command writes the same pixels.
Few training clips (300 by default), so that what the tokens keep of the detail decides the accuracy.

A clip is drawn like the clips the demo encoder was pretrained on (``data.synthetic`` of the demo-cpu preset):
a light handwritten digit (the scikit-learn digits shipped with levjepa, split by source image 70/15/15 so no
image is in two splits; HSV saturation ≤ 0.25, value 0.85–1) on a dark plain background (value 0.1–0.2) — an
encoder that never saw texture or colour reads nothing else well, and a task it cannot read says nothing about
a codec:

* ``appearance`` — the digit's class (10); 17 px, drifting at 0.3–0.7 px/frame in a random direction.
* ``direction`` — the compass direction of its motion, 8 classes (0 E, 1 NE, 2 N, ... counter-clockwise),
  0.5–0.8 px/frame, a random 17-px digit.
* ``size`` — change of size: 0 the digit grows, 1 it shrinks, linearly between 10–12 px and 1.4–1.6× that (the
  same sizes in both classes, in the other order; no single frame tells), its centre drifting ≤ 0.2 px/frame.
* ``speed`` — change of speed: 0 it speeds up, 1 it slows down (``d(t) = L (t/15)²`` or ``L (1 − (1 − t/15)²)``,
  the same 9–13 px path in a random direction: start, end and every frame's set of positions agree).
* ``order`` — order of two events: the 17-px digit makes two moves of 3–5 px each, one horizontal and one
  vertical (each its own random sign, one after the other at constant speed); 0 the horizontal move first, 1
  the vertical one. Start and end agree; only the corner between them tells. (Two squares lighting up left
  then right, or right then left, were tried first: the demo encoder reads their order at chance, whatever
  the codec.)

Never commit the data: it is written where ``--out`` says.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SIZE, FRAMES = 32, 16
TASKS = {
    "appearance": (10, "the digit's class, 0-9"),
    "direction": (8, "direction of motion, 45°·k counter-clockwise from east"),
    "size": (2, "0 the digit grows, 1 it shrinks"),
    "speed": (2, "0 it speeds up, 1 it slows down"),
    "order": (2, "0 the horizontal move comes first, 1 the vertical one"),
}
SPLITS = ("train", "val", "test")


def _digits(seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The digit images (float [M, 8, 8] in 0..1), their classes and the split of image indices (70/15/15)."""
    from levjepa.data.digits import load_digits

    d = load_digits()
    images, labels = np.asarray(d.images, np.float32) / 16.0, np.asarray(d.target, np.int64)
    perm = np.random.default_rng([seed, 0]).permutation(len(images))
    a, b = int(0.70 * len(images)), int(0.85 * len(images))
    return {"train": perm[:a], "val": perm[a:b], "test": perm[b:]}, images, labels


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    import colorsys

    return np.array(colorsys.hsv_to_rgb(h, s, v), np.float32)


def _glyph(image: np.ndarray, side: int) -> np.ndarray:
    """An 8 × 8 digit resized to ``side`` px (antialiased bilinear), float [side, side] in 0..1."""
    x = torch.from_numpy(image)[None, None]
    return F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False, antialias=True)[0, 0].numpy()


def _paste(frame: np.ndarray, alpha: np.ndarray, y: float, x: float, colour: np.ndarray) -> None:
    """Blend ``colour`` into ``frame`` [S, S, 3] with ``alpha`` [h, w] at top-left (y, x) rounded, clipped."""
    h, w = alpha.shape
    y0, x0 = round(y), round(x)
    ys, xs = slice(max(0, y0), min(SIZE, y0 + h)), slice(max(0, x0), min(SIZE, x0 + w))
    a = alpha[ys.start - y0 : ys.stop - y0, xs.start - x0 : xs.stop - x0, None]
    frame[ys, xs] = frame[ys, xs] * (1 - a) + colour * a


def _unit(angle: float) -> np.ndarray:
    """(dy, dx) of a screen direction ``angle`` radians counter-clockwise from east (y points down)."""
    return np.array([-math.sin(angle), math.cos(angle)])


def _inside(rng: np.random.Generator, path: np.ndarray, side: np.ndarray) -> np.ndarray:
    """A start (y, x) drawn uniformly among those keeping the object (top-left ``start + path[t]`` [T, 2], side
    ``side[t]`` px) on screen in every frame."""
    lo, hi = -path.min(0), SIZE - (path + side[:, None]).max(0)
    return lo + rng.random(2) * np.maximum(hi - lo, 0.0)


def render(task: str, rng: np.random.Generator, image: np.ndarray) -> tuple[np.ndarray, int]:
    """One clip of ``task``, uint8 [T, S, S, 3], and its label (the module doc says what each task draws)."""
    t = np.arange(FRAMES, dtype=np.float64)
    bg_colour = _hsv(rng.random(), 0.25 * rng.random(), 0.1 + 0.1 * rng.random())
    obj_colour = _hsv(rng.random(), 0.25 * rng.random(), 0.85 + 0.15 * rng.random())
    side = np.full(FRAMES, 17.0)
    path = np.zeros((FRAMES, 2))
    label = 0
    if task == "appearance":
        path = t[:, None] * _unit(2 * math.pi * rng.random()) * (0.3 + 0.4 * rng.random())
    elif task == "direction":
        label = int(rng.integers(8))
        path = t[:, None] * _unit(label * math.pi / 4) * (0.5 + 0.3 * rng.random())
    elif task == "size":
        label = int(rng.integers(2))
        small = 10 + 2 * rng.random()
        ends = (small, small * (1.4 + 0.2 * rng.random()))
        side = np.linspace(*(ends if label == 0 else ends[::-1]), FRAMES)
        path = -side[:, None] / 2  # grows and shrinks about its centre
        path = path + t[:, None] * _unit(2 * math.pi * rng.random()) * 0.2 * rng.random()
    elif task == "speed":
        label = int(rng.integers(2))
        u = t / (FRAMES - 1)
        frac = u**2 if label == 0 else 1 - (1 - u) ** 2
        path = (9 + 4 * rng.random()) * frac[:, None] * _unit(2 * math.pi * rng.random())
    elif task == "order":
        label = int(rng.integers(2))
        legs = [np.array([0.0, rng.choice([-1, 1]) * (3 + 2 * rng.random())]),
                np.array([rng.choice([-1, 1]) * (3 + 2 * rng.random()), 0.0])]  # fmt: skip
        first, second = legs if label == 0 else legs[::-1]
        u = t / (FRAMES - 1)
        path = np.minimum(2 * u, 1)[:, None] * first + np.clip(2 * u - 1, 0, 1)[:, None] * second
    else:
        raise ValueError(f"task {task!r}: one of {', '.join(TASKS)}")
    frames = np.empty((FRAMES, SIZE, SIZE, 3), np.float32)
    start = _inside(rng, path, side)
    for i in range(FRAMES):
        frames[i] = bg_colour
        _paste(frames[i], _glyph(image, int(np.rint(side[i]))), *(start + path[i]), obj_colour)
    return (np.clip(frames, 0, 1) * 255 + 0.5).astype(np.uint8), label


def write_task(out: Path, task: str, seed: int, sizes: dict[str, int]) -> None:
    from levjepa.data import write_video

    split_images, images, classes = _digits(seed)
    for k, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, list(TASKS).index(task) + 1, k])
        rows = []
        for i in range(sizes[split]):
            idx = int(rng.choice(split_images[split]))
            clip, label = render(task, np.random.default_rng([seed, list(TASKS).index(task) + 1, k, i]), images[idx])
            label = int(classes[idx]) if task == "appearance" else label
            path = out / task / split / f"{i:05d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_video(path, clip, fps=15, options={"crf": "0"}, pix_fmt="yuv444p")
            rows.append(f"{path.resolve()} {label}")
        (out / task / f"{split}.txt").write_text("\n".join(rows) + "\n")
    print(f"{task}: {', '.join(f'{s} {n}' for s, n in sizes.items())} clips -> {out / task}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the videos and index files (never committed)")
    ap.add_argument("--seed", type=int, default=53)
    ap.add_argument("--sizes", default="300,100,200", help="train,val,test clips per task")
    ap.add_argument("--tasks", default=",".join(TASKS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    out, tasks = Path(args.out), args.tasks.split(",")
    sizes = dict(zip(SPLITS, (int(n) for n in args.sizes.split(",")), strict=True))
    for task in tasks:
        write_task(out, task, args.seed, sizes)
    meta = {"seed": args.seed, "sizes": sizes, "clip": f"{FRAMES}×{SIZE}×{SIZE}", "tasks": {t: TASKS[t] for t in tasks}}
    (out / "tasks.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
