"""CPU benchmark of the encoder: training cost vs drop ratio, and streaming latency vs full-clip forward.

    PYTHONPATH=src python bench/encoder.py [--preset vit-tiny] [--threads 2] [--out bench/encoder.json]

1. ``fwd+bwd`` of one training step (``forward_views(global 1x16x224², local 4x16x96²)`` + backward) per
   clip at ρ ∈ {0, 0.5, 0.9, 0.95}, printed as speed-ups over ρ = 0 beside the FLOPs function's prediction.
2. Streaming a 16-frame 224² clip one frame at a time through the KV-cache encoder (patch features of the
   new frame + a CLS readout) vs recomputing the full-clip forward on every prefix; then 32 frames with a
   4-frame sliding window (per-frame cost stays flat).

Ratios are what this bench is for: absolute CPU times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.infer import StreamingEncoder
from levjepa.infer.cpu import cpu_info
from levjepa.model import VideoEncoder, encoder_config
from levjepa.tools.flops import training_flops_per_clip


def timed(fn, reps: int) -> float:
    """Minimum wall time of ``reps`` calls after a warm-up (the minimum is the least disturbed by other load)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def train_step(enc: VideoEncoder, views: tuple[torch.Tensor, ...], g: torch.Generator) -> None:
    enc.zero_grad(set_to_none=True)
    enc.forward_views(*views, generator=g).square().mean().backward()


def bench_drop(preset: str, reps: int) -> list[dict]:
    """Per-clip fwd+bwd time at each ρ; the ρ values are interleaved in every round so that load from other
    processes hits them alike, and each keeps its minimum over ``reps`` rounds (after one warm-up round)."""
    batches = {0.0: 1, 0.5: 1, 0.9: 4, 0.95: 8}
    setups = []
    for rho, batch in batches.items():
        cfg = encoder_config(preset, drop_ratio=rho)
        torch.manual_seed(0)
        enc = VideoEncoder(cfg).train()
        views = (torch.randn(1, batch, 3, 16, 224, 224), torch.randn(4, batch, 3, 16, 96, 96))

        setups.append((rho, batch, cfg, functools.partial(train_step, enc, views, torch.Generator().manual_seed(0))))
    best = {rho: float("inf") for rho in batches}
    for round_ in range(reps + 1):
        for rho, batch, _, step in setups:
            t0 = time.perf_counter()
            step()
            if round_:
                best[rho] = min(best[rho], (time.perf_counter() - t0) / batch)
    rows = []
    for rho, batch, cfg, _ in setups:
        fl = training_flops_per_clip(cfg).training
        enc_flops = sum(v for k, v in fl.items() if k not in ("projector", "objective"))
        rows.append({"rho": rho, "batch": batch, "s_per_clip": best[rho], "encoder_train_flops": enc_flops})
        print(f"  rho={rho:<5} batch={batch}: {best[rho]:7.3f} s/clip  ({enc_flops / best[rho] / 1e9:6.1f} GFLOP/s)")
    for r in rows:
        r["measured_speedup"] = rows[0]["s_per_clip"] / r["s_per_clip"]
        r["flops_speedup"] = rows[0]["encoder_train_flops"] / r["encoder_train_flops"]
    return rows


def bench_embed(preset: str, reps: int, batch: int = 8) -> dict:
    """fwd+bwd of the patch embedding per clip: kept patches only (ours) vs all patches then drop (paper)."""
    from levjepa.model.tokens import gather_tokens, sample_keep_idx

    cfg = encoder_config(preset)
    enc = VideoEncoder(cfg)
    pe = enc.patch_embed
    views = [torch.randn(batch, 3, 16, 224, 224), *(torch.randn(batch, 3, 16, 96, 96) for _ in range(4))]
    g = torch.Generator().manual_seed(0)
    keep = [sample_keep_idx(batch, pe.grid(v), cfg.drop_ratio, "uniform", g) for v in views]

    def kept_first() -> None:
        pe.zero_grad(set_to_none=True)
        sum(pe(v, k)[0].sum() for v, k in zip(views, keep, strict=True)).backward()

    def all_first() -> None:
        pe.zero_grad(set_to_none=True)
        sum(gather_tokens(pe(v)[0], k).sum() for v, k in zip(views, keep, strict=True)).backward()

    return {
        "kept_first_s_per_clip": timed(kept_first, reps) / batch,
        "all_first_s_per_clip": timed(all_first, reps) / batch,
    }


@torch.no_grad()
def bench_stream(preset: str, passes: int, frames: int = 16, window_frames: int = 32, window: int = 4) -> dict:
    """Per-frame latencies (minimum over ``passes`` runs of the whole stream)."""
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config(preset)).eval()
    video = torch.randn(1, 3, max(frames, window_frames), 224, 224)
    enc.forward_features(video[:, :, :2])  # warm-up

    def per_frame(step, n: int) -> list[float]:
        best = [float("inf")] * n
        for _ in range(passes):
            state = {}
            for t in range(n):
                t0 = time.perf_counter()
                step(t, state)
                best[t] = min(best[t], time.perf_counter() - t0)
        return best

    def stream_step(t: int, state: dict, window: int | None = None) -> None:
        if t == 0:
            state["s"] = StreamingEncoder(enc, window=window)
        state["s"].push(video[:, :, t : t + 1])
        state["s"].cls()

    return {
        "frames": frames,
        "stream_per_frame_s": per_frame(stream_step, frames),
        "recompute_prefix_s": per_frame(lambda t, _: enc.forward_features(video[:, :, : t + 1]), frames),
        "window": window,
        "window_per_frame_s": per_frame(lambda t, st: stream_step(t, st, window), window_frames),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="vit-tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5, help="timed rounds; each number is the minimum")
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, preset {args.preset}")
    print("1. training step (1 x 16x224² + 4 x 16x96² views), fwd+bwd per clip vs drop ratio")
    drop = bench_drop(args.preset, args.reps)
    print(f"  {'rho':>5} {'tokens/clip':>11} {'measured':>9} {'FLOPs':>7}   (speed-up over rho = 0)")
    for r in drop:
        cfg = encoder_config(args.preset, drop_ratio=r["rho"])
        per_view = training_flops_per_clip(cfg).tokens  # sequence length incl. CLS of each view size
        tokens = per_view["global"] + 4 * per_view["local"]
        print(f"  {r['rho']:>5} {tokens:>11} {r['measured_speedup']:>8.1f}x {r['flops_speedup']:>6.1f}x")
    emb = bench_embed(args.preset, args.reps)
    print(
        f"  patch embedding fwd+bwd per clip: kept patches only {emb['kept_first_s_per_clip'] * 1e3:.1f} ms, "
        f"all patches then drop (paper order) {emb['all_first_s_per_clip'] * 1e3:.1f} ms"
    )
    print("2. streaming 224² frames (push + CLS readout) vs recomputing the full forward on each prefix")
    st = bench_stream(args.preset, args.reps)
    for t in (0, 3, 7, 15):
        print(
            f"  frame {t + 1:>2}: stream {st['stream_per_frame_s'][t] * 1e3:7.1f} ms   "
            f"full prefix forward {st['recompute_prefix_s'][t] * 1e3:7.1f} ms"
        )
    total_stream, total_full = sum(st["stream_per_frame_s"]), sum(st["recompute_prefix_s"])
    print(
        f"  16 frames one by one: stream {total_stream:.2f} s, recompute every prefix {total_full:.2f} s, "
        f"one 16-frame forward {st['recompute_prefix_s'][-1]:.2f} s"
    )
    w = st["window_per_frame_s"]
    print(
        f"  window {st['window']} frames: frame 4 {w[3] * 1e3:.1f} ms, frame 16 {w[15] * 1e3:.1f} ms, "
        f"frame 32 {w[31] * 1e3:.1f} ms (flat)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"drop": drop, "embed": emb, "stream": st}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
