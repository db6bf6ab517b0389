"""Same numbers before and after a change to the evaluation (bench/eval.md, "One pipeline: the same numbers").

    PYTHONPATH=src python bench/eval_same.py media DIR          # 18 + 9 tiny labelled videos, train/val.txt
    PYTHONPATH=src python bench/eval_same.py compare A.json B.json

``media``: 3 classes of 20-frame 48×40 videos, each a random base colour with its class's channel raised by
25 and per-pixel noise (seeded: the same files every time), so the probes land between chance and 100 %.
``compare``: every value of two ``levjepa probe --out`` JSON files, the wall-clock fields (``seconds``,
``timings_s``) and the feature-store folder names ignored; prints the differing values and, for
``val_loss``, the largest relative difference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

IGNORED = {"seconds", "timings_s", "feature_stores"}


def media(root: Path) -> None:
    from levjepa.data import write_video

    root.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    for split, n in (("train", 18), ("val", 9)):
        lines = []
        for i in range(n):
            label = i % 3
            base = gen.integers(60, 200, 3)
            base[label] += 25
            frames = np.clip(base + gen.integers(-40, 40, (20, 40, 48, 3)), 0, 255).astype(np.uint8)
            write_video(root / f"{split}{i}.mp4", frames, fps=10)
            lines.append(f"{split}{i}.mp4 {label}")
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {root}/train.txt (18 videos) and {root}/val.txt (9)")


def _diffs(a: Any, b: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in IGNORED:
                continue
            if k not in a or k not in b:
                out.append((f"{path}/{k}", a.get(k), b.get(k)))
            else:
                _diffs(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _diffs(u, v, f"{path}[{i}]", out)
    elif a != b:
        out.append((path, a, b))


def compare(a: Path, b: Path) -> None:
    out: list[tuple[str, Any, Any]] = []
    _diffs(json.loads(a.read_text()), json.loads(b.read_text()), "", out)
    losses = [abs(x - y) / abs(x) for p, x, y in out if p.endswith("/val_loss") and x]
    others = [(p, x, y) for p, x, y in out if not p.endswith("/val_loss")]
    print(f"{len(out)} differing value(s); {len(losses)} of them val_loss (largest relative difference "
          f"{max(losses, default=0.0):.2g}); {len(others)} other(s)")  # fmt: skip
    for p, x, y in others[:40]:
        print(f"  {p}: {x!r} -> {y!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("media").add_argument("dir", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.mode == "media":
        media(args.dir)
    else:
        compare(args.a, args.b)


if __name__ == "__main__":
    main()
