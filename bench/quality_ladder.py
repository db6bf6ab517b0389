"""Why the old demo benchmark could not be learned even with labels: a ladder of still-image tasks.

    python bench/quality_ladder.py [--steps 600] [--rungs centred,position,grey,dark]

The demo's encoder (``vit-demo``, patch 8) and a linear head on CLS, trained with the appearance labels
(AdamW lr 1e-3, batches of 64, 1 thread) on 2-frame still clips of 32×32 px of scikit-learn's digits
(an 18-px glyph, the demo's object size), normalised as in training (ImageNet statistics). Each rung adds
one property of the old benchmark; accuracy is on the held-out 22 % of the digits:

* ``centred`` — a white glyph centred on black;
* ``position`` — the glyph at a random position;
* ``grey`` — plus random colours: an HSV object (value 0.75–1) on an HSV background of value 0.25–0.6
  (the old benchmark's range, ``SyntheticConfig.background_value``);
* ``dark`` — the same with a dark background (value 0.05–0.3, the demos' benchmark now).

Results in ``bench/quality.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.data import SyntheticConfig
from levjepa.data.synthetic import _hsv, load_image_pool
from levjepa.data.views import normalize
from levjepa.infer.cpu import cpu_info
from levjepa.model import VideoEncoder, encoder_config
from levjepa.rng import make_generator

SIZE, SIDE, FRAMES = 32, 18, 2
BACKGROUND = {"grey": (0.25, 0.6), "dark": (0.05, 0.3)}


def make_clips(glyphs: torch.Tensor, rung: str, g: torch.Generator) -> torch.Tensor:
    """Glyphs [n, 1, SIDE, SIDE] in [0, 1] -> normalised clips [n, 3, FRAMES, SIZE, SIZE]."""
    n = len(glyphs)
    canvas = torch.zeros(n, 1, SIZE, SIZE)
    if rung == "centred":
        off = torch.full((n, 2), (SIZE - SIDE) // 2)
    else:
        off = torch.randint(0, SIZE - SIDE + 1, (n, 2), generator=g)
    for i in range(n):
        canvas[i, :, off[i, 0] : off[i, 0] + SIDE, off[i, 1] : off[i, 1] + SIDE] = glyphs[i]
    if rung in BACKGROUND:
        lo, hi = BACKGROUND[rung]
        u = torch.rand(n, 6, generator=g)
        fg = _hsv(u[:, 0], 0.6 + 0.4 * u[:, 1], 0.75 + 0.25 * u[:, 2])[:, :, None, None]
        bg = _hsv(u[:, 3], 0.15 + 0.35 * u[:, 4], lo + (hi - lo) * u[:, 5])[:, :, None, None]
    else:
        fg, bg = torch.ones(n, 3, 1, 1), torch.zeros(n, 3, 1, 1)
    img = bg + (fg - bg) * canvas  # [n, 3, S, S] in [0, 1]
    return normalize(img[:, :, None].expand(-1, -1, FRAMES, -1, -1).contiguous())


def run(rung: str, steps: int) -> dict[str, float]:
    pool = load_image_pool(SyntheticConfig(image_source="digits"))
    glyphs = F.interpolate(pool.images[:, None].float() / 255, size=(SIDE, SIDE), mode="bilinear", antialias=True)
    labels, n_train = pool.labels, 1400
    g = make_generator("quality-ladder", rung)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        encoder = VideoEncoder(encoder_config("vit-demo"))
        head = nn.Linear(encoder.cfg.dim, 10)
    opt = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=1e-3)
    start = time.process_time()
    loss = torch.zeros(())
    for _ in range(steps):
        idx = torch.randint(0, n_train, (64,), generator=g)
        loss = F.cross_entropy(head(encoder(make_clips(glyphs[idx], rung, g))), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        test = torch.arange(n_train, len(labels))
        acc = (head(encoder(make_clips(glyphs[test], rung, g))).argmax(1) == labels[test]).float().mean()
    return {"loss": loss.item(), "test_acc": 100 * acc.item(), "cpu_s": time.process_time() - start}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--rungs", default="centred,position,grey,dark")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(1)
    print("| rung | steps | final loss | test accuracy % | CPU s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for rung in args.rungs.split(","):
        r = run(rung, args.steps)
        print(f"| {rung} | {args.steps} | {r['loss']:.3f} | {r['test_acc']:.1f} | {r['cpu_s']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
