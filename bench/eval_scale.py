"""Dataset-scale evaluation on the CPU: features per second per core, and peak memory against dataset size.

    PYTHONPATH=src python bench/eval_scale.py speed  [--clips 256] [--preset vit-demo] [--size 64] [--frames 16]
    PYTHONPATH=src python bench/eval_scale.py memory [--clips 1000,5000,20000] [--out bench/eval_scale.json]

``speed``: generated videos (``--frames`` × 2 source frames, 80×``--size`` px, so each gives one centre
clip of ``--frames`` at stride 2) through ``build_store`` with one intra-op thread and decoding in the same
process (``workers=0``): everything on one core, so clips/s is the per-core rate of the whole path (decode
+ resize + frozen forward + write). The same with 1 decoding worker beside the encoder thread is printed too.

``memory``: ``N`` generated 16×16 images (clips of 4 repeated frames at 16 px, ``vit-test``), for each N in
a fresh process: the training split's store (2 decoding workers) and a 200-clip validation store, then the
attentive and linear probes from disk (1 epoch each, the demo grid). Prints the process's peak RSS
(``VmHWM``: the main process; each decoding worker holds at most two decoded files) and the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MEMORY_SCRIPT = """
import json, sys, time, torch
torch.set_num_threads(1)
from levjepa.eval.config import EvalConfig
from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.harness import evaluate
from levjepa.formats.reading.load import random_encoder
from levjepa.eval.probes import probe_config
from levjepa.model import encoder_config
t0 = time.perf_counter()
task = dataset_task(
    [sys.argv[1], sys.argv[2]], views=ViewSpec(16, 4, 1), workers=2, batch_size=64, features_dir=sys.argv[3]
)
enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
grid = probe_config("demo", epochs=1, linear_epochs=1)
cfg = EvalConfig(tasks=("labels",), probes=("attentive", "linear"), probe=grid)
res = evaluate({"random": enc}, task, cfg)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"peak_rss_mb": int(hwm) / 1024, "seconds": time.perf_counter() - t0,
                  "acc": res.accuracy("random", "labels", "linear")}))
"""


def _images(root: Path, n: int, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    rng = np.random.default_rng(n)
    lines = []
    for i in range(n):
        label = i % 2
        colour = np.array([200, 40, 40] if label == 0 else [40, 40, 200])
        img = np.clip(colour + rng.integers(-40, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
        path = root / f"{i}.png"
        if not path.exists():
            Image.fromarray(img).save(path)
        lines.append(f"{path} {label}")
    index = root.parent / f"{name}.txt"
    index.write_text("\n".join(lines) + "\n")
    return index


def memory(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.clips.split(",")]
    work = Path(tempfile.mkdtemp(prefix="eval_scale_"))
    val = _images(work / "val", 200, "val")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results = {}
    for n in sizes:
        train = _images(work / "train", n, f"train{n}")  # the first n images of one growing folder
        out = subprocess.run(
            [sys.executable, "-c", MEMORY_SCRIPT, str(train), str(val), str(work / f"features{n}")],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[n] = json.loads(out.strip().splitlines()[-1])
        print(f"{n} clips: peak RSS {results[n]['peak_rss_mb']:.0f} MB, {results[n]['seconds']:.0f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"memory": results}, indent=2) + "\n")


def speed(args: argparse.Namespace) -> None:
    import torch

    from levjepa.data import MediaItem, write_video
    from levjepa.data.eval_clip import ViewSpec
    from levjepa.features.store import StoreConfig, build_store
    from levjepa.formats.reading.load import random_encoder
    from levjepa.model import encoder_config

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="eval_speed_"))
    rng = np.random.default_rng(0)
    items = []
    for i in range(args.clips):
        path = work / f"{i}.mp4"
        frames = rng.integers(0, 256, (2 * args.frames, args.size, args.size * 5 // 4, 3), dtype=np.uint8)
        write_video(path, frames, fps=30)
        items.append(MediaItem(str(path), i % 2, "video"))
    enc = random_encoder(encoder_config(args.preset), seed=0).encoder
    for workers in (0, 1):
        cfg = StoreConfig(ViewSpec(args.size, args.frames, 2), workers=workers, batch_size=8)
        build_store(enc, items[:8], work / f"warm{workers}", cfg)
        wall, cpu = time.perf_counter(), time.process_time()
        build_store(enc, items, work / f"store{workers}", cfg)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"{args.preset}, {args.frames}x{args.size}x{args.size} clips, 1 thread, workers={workers}: "
            f"{args.clips / wall:.1f} clips/s wall, main-process CPU {1000 * cpu / args.clips:.0f} ms/clip",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("speed", "memory"))
    ap.add_argument("--clips", default=None)
    ap.add_argument("--preset", default="vit-demo")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    if args.mode == "memory":
        args.clips = args.clips or "1000,5000,20000"
        memory(args)
    else:
        args.clips = int(args.clips or 256)
        speed(args)


if __name__ == "__main__":
    main()
