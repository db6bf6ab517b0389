"""What reproducing the released ViT-L's paper table costs: disk per codec, encoder forwards and estimated GPU
hours, a store against V-JEPA 2's online protocol (docs/evaluation.md, "What the paper's table costs"; issue 54).

    python bench/paper_cost.py [--tflops 231] [--epochs 20] [--codecs full,int8,tpool3-int4g32,pool2-int8]

The released ViT-L (``galilai-group/LeVJEPA-VideoMix-Large``: D = 1024, 24 blocks, 16 px patches, tubelet 1)
read as the paper's table reads it, 8 temporal slots (``levjepa.eval.protocols``, ``--slots 8``):

* **IN-1K** — images repeated 8 times, 224², one view, attentive probe (also the ``last`` codecs: only the last
  slot's tokens, for images);
* **SSv2** — 8 frames at 256², 2 segments (training) / 2 × 3 views (test), attentive probe;
* **K400 linear** — the paper's K400 readout: a linear probe on mean-pooled tokens (``--probe linear``), 8
  segments / 8 × 3 views at 256²; a store of it keeps only CLS and mean (float32);
* **K400 attentive** — the readout the paper skipped, from a compact store.

Public split sizes (train / eval): IN-1K 1,281,167 / 50,000; SSv2 168,913 / 24,777; K400 240,436 / 19,877.

**Counted, not timed** (no GPU in this script): encoder FLOPs per view from ``levjepa.tools.flops.encoder_flops``
(every token, ``1 + 8·(S/16)²``); the attentive probe grid's (V-JEPA 2's 20 probes; levjepa's one-block probe, the
paper's) FLOPs per view and training step counted by ``torch.utils.flop_counter`` on this CPU (forward + backward;
an evaluation pass is the forward alone) for the tokens each codec keeps; the linear probe's are negligible.
Hours are **estimates**: FLOPs ÷ ``--tflops``, by default 231 TFLOP/s, the rate levjepa's ViT-B/16 training step
reached on one H200 (bf16, eager; ``bench/gpu.md``). Decoding and disk reads are not in the hours: the last
column gives the bytes a store's probes read over their epochs instead (the attentive probe's FLOPs are tiny —
levjepa folds its key projection into the query — so reading the tokens, not computing on them, is what a
full store's probes wait for).

Forwards: a store encodes every train and eval view once; V-JEPA 2's online protocol encodes each epoch's train
views (new augmentations) and, since its loop validates every epoch, the eval views every epoch too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

DATASETS = {  # name: train, eval, size, train views, eval views, probe
    "IN-1K": (1_281_167, 50_000, 224, 1, 1, "attentive"),
    "SSv2": (168_913, 24_777, 256, 2, 6, "attentive"),
    "K400 linear": (240_436, 19_877, 256, 8, 24, "linear"),
    "K400 attentive": (240_436, 19_877, 256, 8, 24, "attentive"),
}
CLASSES = {"IN-1K": 1000, "SSv2": 174, "K400 linear": 400, "K400 attentive": 400}
SLOTS = 8


def probe_flops(dim: int, tokens: int, classes: int) -> tuple[float, float]:
    """(training step, forward) FLOPs per view of the full attentive grid reading ``tokens`` tokens."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from levjepa.eval.probes import build_probe_grid, probe_config

    grid = build_probe_grid("attentive", probe_config("full"), dim, classes)
    x = torch.randn(2, tokens, dim)
    with FlopCounterMode(display=False) as count:
        grid(x).sum().backward()
    step = count.get_total_flops() / 2
    with FlopCounterMode(display=False) as count:  # the forward alone (its graph unused)
        grid(x)
    return step, count.get_total_flops() / 2


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} EB"


def main() -> None:
    sys.path.insert(0, str(SRC))
    from levjepa.features.compact import TokenCodec
    from levjepa.model import encoder_config
    from levjepa.tools.flops import encoder_flops

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tflops", type=float, default=231.0, help="assumed sustained TFLOP/s of the GPU")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--codecs", default="full,int8,tpool3-int4g32,pool2-int8")
    args = ap.parse_args()
    cfg = encoder_config("vit-large", tubelet=1)
    d, rate = cfg.dim, args.tflops * 1e12
    codecs = args.codecs.split(",")
    small = TokenCodec.parse(codecs[-2] if len(codecs) > 1 else codecs[0])  # the hours' compact store
    print(f"ViT-L (D {d}), {SLOTS} slots; hours: FLOPs / {args.tflops:g} TFLOP/s (estimates); {args.epochs} epochs\n")
    print("| benchmark | readout | " + " | ".join(codecs) + " | last-int8 | CLS + mean only |")
    print("| --- | --- | " + " | ".join("---:" for _ in codecs) + " | ---: | ---: |")
    cost_rows = []
    for name, (train, evals, size, tv, ev, probe) in DATASETS.items():
        grid = (SLOTS, size // 16, size // 16)
        views = train * tv + evals * ev
        pooled = 2 * d * 4  # CLS and mean, float32
        if probe == "linear":
            cells = ["—"] * len(codecs) + ["—", _bytes(pooled * views)]
        else:
            cells = [_bytes((TokenCodec.parse(c).bytes_per_view(grid, d) + pooled) * views) for c in codecs]
            last = _bytes((TokenCodec.parse("last-int8").bytes_per_view(grid, d) + pooled) * views)
            cells += [last if name == "IN-1K" else "—", "—"]
        print(f"| {name} | {probe} | " + " | ".join(cells) + " |")
        enc = sum(encoder_flops(cfg, SLOTS, size).values())
        store_fwd, online_fwd = views, args.epochs * views
        if probe == "linear":
            p_full = p_small = 0.0
        else:
            p = {}
            for c in (TokenCodec(), small):
                step, fwd = probe_flops(d, c.kept(grid), CLASSES[name])
                p[c] = args.epochs * (train * tv * step + evals * ev * fwd)
            p_full, p_small = p[TokenCodec()], p[small]
        per_view = pooled if probe == "linear" else small.bytes_per_view(grid, d) + pooled
        cost_rows.append(
            (name, probe, size, enc, store_fwd, online_fwd, p_full, p_small, args.epochs * views * per_view)
        )
    print(f"\nEncoder forwards and estimated GPU hours (store: {small.name} for the attentive probes)\n")
    print("| benchmark | readout | TFLOP a view | forwards: store / V-JEPA 2 online | encoder h: store / online "
          f"| probe h: {small.name} / full tokens | in all h: store / online | store read by the probes |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    total = [0.0, 0.0, 0.0, 0.0]  # hours store / online, forwards store / online
    for name, probe, _size, enc, sf, of, p_full, p_small, read in cost_rows:
        hs, ho = sf * enc / rate / 3600, of * enc / rate / 3600
        ps, pf = p_small / rate / 3600, p_full / rate / 3600
        if name != "K400 linear":  # one K400 store (a compact store keeps CLS and mean too) serves both readouts
            total[0] += hs + ps
            total[1] += ho + pf
            total[2] += sf
            total[3] += of
        print(
            f"| {name} | {probe} | {enc / 1e12:.2f} | {sf / 1e6:.2f} M / {of / 1e6:.1f} M | {hs:,.1f} / {ho:,.1f} | "
            f"{ps:,.2f} / {pf:,.2f} | {hs + ps:,.1f} / {ho + pf:,.1f} | {_bytes(read)} |"
        )
    forwards = f"{total[2] / 1e6:.2f} M / {total[3] / 1e6:.1f} M"
    print(f"| the table (K400 once) | | | {forwards} | | | {total[0]:,.1f} / {total[1]:,.1f} | |")


if __name__ == "__main__":
    main()
