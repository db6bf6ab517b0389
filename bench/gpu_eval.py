"""Dataset-scale evaluation on one GPU: feature-store throughput (worker decoding + bf16 encoder) and the
attentive probe trained from disk, at ViT-B and 16×224² clips. Part of ``bench/gpu_all.sh``.

    python3 bench/gpu_eval.py --out OUT [--budget-s 45] [--clips 128] [--workers 12]
    PYTHONPATH=src python bench/gpu_eval.py --out /tmp/e --device cpu --preset vit-test --size 32 --clips 8 --workers 1
                                                           # the same code on the CPU, tiny: a smoke test

Generates ``--clips`` videos (32 frames of 256×320 noise, so each gives one 16-frame centre clip at
stride 2) with a process pool, then ``build_store`` on ``cuda`` (``--workers`` decoding processes, batches
of 16, bf16 autocast) for a random-init ``vit-base``, then one epoch of the demo attentive grid from the
store on the GPU. Writes ``OUT/gpu_eval.json`` after each part (clips/s, GPU memory peak, probe seconds);
stops generating more data when half the budget is spent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np


def _write(args: tuple[str, int, int]) -> str:
    from levjepa.data import write_video

    path, seed, size = args
    rng = np.random.default_rng(seed)
    write_video(path, rng.integers(0, 256, (32, size * 8 // 14 * 2, size * 10 // 14 * 2, 3), dtype=np.uint8), fps=30)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=45.0)
    ap.add_argument("--clips", type=int, default=128)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="vit-base")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"device": args.device, "preset": args.preset, "size": args.size}

    def save() -> None:
        (out / "gpu_eval.json").write_text(json.dumps(result, indent=2) + "\n")

    import torch

    from levjepa.data import MediaItem
    from levjepa.data.eval_clip import ViewSpec
    from levjepa.eval.probes import probe_config
    from levjepa.eval.source import StoreSource
    from levjepa.eval.trainer import train_probes
    from levjepa.features.feature_set import FeatureSet
    from levjepa.features.store import StoreConfig, build_store
    from levjepa.formats.reading.load import random_encoder
    from levjepa.model import encoder_config
    from levjepa.rng import make_generator

    work = Path(tempfile.mkdtemp(prefix="gpu_eval_"))
    with Pool(min(14, args.clips)) as pool:
        paths = []
        for p in pool.imap(_write, [(str(work / f"{i}.mp4"), i, args.size) for i in range(args.clips)]):
            paths.append(p)
            if time.perf_counter() - start > args.budget_s / 2:
                break
    items = [MediaItem(p, i % 2, "video") for i, p in enumerate(paths)]
    result["clips"] = len(items)
    result["generate_s"] = time.perf_counter() - start
    save()
    cuda = args.device.startswith("cuda")
    enc = random_encoder(encoder_config(args.preset), seed=0, device=args.device).encoder
    cfg = StoreConfig(ViewSpec(args.size, 16, 2), workers=args.workers, batch_size=16, shard_items=64)
    build_store(enc, items[:16], work / "warm", cfg, device=args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    res = build_store(enc, items, work / "store", cfg, device=args.device)
    wall = time.perf_counter() - t0
    result.update(
        store_clips_per_s=len(items) / wall,
        store_s=wall,
        store_rows=res.rows,
        store_gpu_peak_gb=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        disk_mb_per_clip=sum(f.stat().st_size for f in (work / "store").iterdir()) / 2**20 / max(1, res.rows),
    )
    save()
    store = StoreSource(FeatureSet(work / "store"))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    pr = train_probes(
        "attentive",
        probe_config("demo", epochs=1, batch_size=32),
        "tokens",
        store,
        store,
        classes={"labels": 2},
        generator=make_generator("gpu-eval", 0),
        device=args.device,
    )["labels"]
    result.update(
        probe_epoch_s=time.perf_counter() - t0,
        probe_gpu_peak_gb=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        probe_val_acc=pr.best_val,
        total_s=time.perf_counter() - start,
    )
    save()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
