"""``levjepa flops [--model vit-base] [--set key=value ...]``: forward and training FLOPs per clip and per run.

The accounting and its conventions live in :mod:`levjepa.tools.flops`; this prints its tables (or one JSON
object with ``--json``), with a sweep over drop ratios.
"""

from __future__ import annotations

import argparse
import json

from levjepa.commands._numbers import whole
from levjepa.config import ConfigError, apply_overrides
from levjepa.model import EncoderConfig
from levjepa.model.config import ENCODER_PRESETS, encoder_config
from levjepa.tools.flops import K710_20PCT_CLIPS, rho_sweep, training_flops_per_clip

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="vit-base", choices=list(ENCODER_PRESETS), help="encoder preset")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override an EncoderConfig field, e.g. --set tubelet=2 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--frames", type=int, default=16, help="frames per clip (16)")
    parser.add_argument("--global-size", type=int, default=224, help="global view side in pixels (224)")
    parser.add_argument("--local-size", type=int, default=96, help="local view side in pixels (96)")
    parser.add_argument("--num-global", type=whole(1, 64), default=1, help="global views per clip (1)")
    parser.add_argument("--num-local", type=whole(0, 256), default=4, help="local views per clip V (4)")
    parser.add_argument("--drop-ratio", type=float, default=None, help="token drop ratio (default: the config's)")
    parser.add_argument("--embed-all", action="store_true", help="embed every patch before dropping (paper order)")
    parser.add_argument(
        "--clips", type=whole(1, 10**12), default=K710_20PCT_CLIPS, help="clips per epoch (K710 20%%: 131600)"
    )
    parser.add_argument("--epochs", type=whole(1, 10**6), default=240, help="epochs (240)")
    parser.add_argument("--sigreg-directions", type=whole(1, 10**6), default=1024, help="SIGReg directions M (1024)")
    parser.add_argument("--sweep", default="0,0.3,0.6,0.9,0.95", help="comma-separated drop ratios to compare")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _fmt(x: float) -> str:
    return f"{x:10.3e}"


def _check(args: argparse.Namespace, cfg: EncoderConfig) -> tuple[float, ...]:
    """The options in the encoder's terms (``ConfigError`` naming the option); returns the sweep's drop ratios."""
    if args.frames < 1 or args.frames % cfg.tubelet:
        raise ConfigError(f"--frames {args.frames}: expected a positive multiple of the tubelet ({cfg.tubelet} frames)")
    for option, side in (("--global-size", args.global_size), ("--local-size", args.local_size)):
        if side < 1 or side % cfg.patch_size:
            raise ConfigError(f"{option} {side}: expected a positive multiple of the patch size ({cfg.patch_size} px)")
    try:
        rhos = tuple(float(r) for r in args.sweep.split(",") if r.strip())
    except ValueError:
        raise ConfigError(f"--sweep {args.sweep}: expected comma-separated drop ratios, e.g. 0,0.5,0.9") from None
    for option, rho in [("--drop-ratio", args.drop_ratio)] * (args.drop_ratio is not None) + [
        ("--sweep", r) for r in rhos
    ]:
        if not 0.0 <= rho < 1.0:
            raise ConfigError(f"{option} {rho:g}: a drop ratio lies in [0, 1)")
    return rhos


def main(args: argparse.Namespace) -> int:
    cfg = apply_overrides(encoder_config(args.model), args.overrides)
    rhos = _check(args, cfg)
    views = {
        "frames": args.frames,
        "global_size": args.global_size,
        "local_size": args.local_size,
        "num_global": args.num_global,
        "num_local": args.num_local,
        "embed_all": args.embed_all,
        "sigreg_directions": args.sigreg_directions,
    }
    clip = training_flops_per_clip(cfg, drop_ratio=args.drop_ratio, **views)
    run = args.clips * args.epochs * clip.training_total
    sweep = rho_sweep(cfg, rhos, **views) if rhos else []
    rho = cfg.drop_ratio if args.drop_ratio is None else args.drop_ratio
    if args.json:
        out = {
            "model": args.model,
            "overrides": args.overrides,
            "drop_ratio": rho,
            "views": views,
            "tokens_per_view": clip.tokens,
            "forward_per_clip": clip.forward,
            "training_per_clip": clip.training,
            "forward_total": clip.forward_total,
            "training_total": clip.training_total,
            "clips": args.clips,
            "epochs": args.epochs,
            "run_total": run,
            "sweep": sweep,
        }
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{args.model} (dim {cfg.dim}, depth {cfg.depth}, patch {cfg.patch_size}, tubelet {cfg.tubelet}), "
        f"{args.num_global} x {args.global_size}px + {args.num_local} x {args.local_size}px views of "
        f"{args.frames} frames, drop ratio {rho} ({cfg.drop_mode}); sequence length per view incl. CLS: "
        + ", ".join(f"{k}: {v}" for k, v in clip.tokens.items())
    )
    print(f"\n{'term':<12} {'forward':>10} {'training':>10}   FLOPs per clip")
    for term in clip.forward:
        print(f"{term:<12} {_fmt(clip.forward[term])} {_fmt(clip.training[term])}")
    print(f"{'total':<12} {_fmt(clip.forward_total)} {_fmt(clip.training_total)}")
    print(
        f"\nrun: {args.clips:,} clips x {args.epochs} epochs x {clip.training_total:.3e} = {run:.3e} FLOPs "
        f"= {run / 1e18:.2f} EFLOPs"
    )
    if sweep:
        print(
            f"\n{'rho':>5} {'patch_emb':>10} {'per_token':>10} {'attention':>10} {'head+loss':>10} {'total':>10}  ratio"
        )
        for r in sweep:
            print(
                f"{r['rho']:>5g} {_fmt(r['patch_embed'])} {_fmt(r['per_token'])} {_fmt(r['attention'])} "
                f"{_fmt(r['head_objective'])} {_fmt(r['total'])}  {r['speedup']:6.1f}x"
            )
        print(
            "ratio = training FLOPs at the first rho / at this rho. Per-token terms fall with the token count "
            "(CLS always kept, rounding up), attention with its square, the patch embedding not at all with "
            "--embed-all; measured time follows neither exactly (bench/encoder.md)."
        )
    print(
        "\nassumptions: 1 multiply-add = 2 FLOPs, matmuls only (norms, softmax, GELU, RoPE, biases left out); "
        "attention scores dense (the mask saves nothing); backward = 2 x forward except the patch embedding "
        "(1 x: pixels need no gradient); K710 = 658k clips, its 20 % subset = 131,600 clips; optimizer step "
        "and data loading not counted."
    )
    return 0
