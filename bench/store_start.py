"""What a feature store pays before its first row: the decoding workers' start (bench/eval.md, issue 47 § 4).

    python bench/store_start.py [--clips 32] [--workers 2] [--rounds 3]

Builds the same small store (``--clips`` tiny videos, 4×32×32 views, the ``vit-test`` encoder, so that the
forward costs little) ``--rounds`` times in each of two child processes, run one after the other per round:
one whose forkserver preloads torch, PyAV and ``levjepa.data`` (``levjepa.data.workers.PRELOAD``, what
levjepa does) and one with multiprocessing's default preload (the main script only), where every worker
imports torch itself. A process's first store also starts the forkserver; the later ones show what each new
pool of workers costs (a probe builds one store per split and encoder). Prints the wall time of each store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

CHILD = """
import json, sys, time
sys.path.insert(0, {src!r})
import torch
torch.set_num_threads(1)
from levjepa.data import MediaItem
from levjepa.data import workers
from levjepa.data.eval_clip import ViewSpec
from levjepa.features.store import StoreConfig, build_store
from levjepa.formats.reading.load import random_encoder
from levjepa.model import encoder_config

if __name__ == "__main__":
    if {default!r}:
        workers.PRELOAD[:] = ["__main__"]  # multiprocessing's own default
    items = [MediaItem(p, i % 2, "video") for i, p in enumerate({paths!r})]
    enc = random_encoder(encoder_config("vit-test"), seed=0).encoder
    cfg = StoreConfig(ViewSpec(32, 4, 1), workers={workers}, batch_size=8, shard_items=64)
    walls = []
    for r in range({stores}):
        t0 = time.perf_counter()
        build_store(enc, items, {out!r} + f"/s{{r}}", cfg)
        walls.append(time.perf_counter() - t0)
    print(json.dumps(walls))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stores", type=int, default=3, help="stores built one after another in each process")
    args = ap.parse_args()
    sys.path.insert(0, SRC)
    import numpy as np

    from levjepa.data import write_video
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="store_start_"))
    rng = np.random.default_rng(0)
    paths = []
    for i in range(args.clips):
        path = work / f"{i}.mp4"
        write_video(path, rng.integers(0, 256, (12, 36, 44, 3), dtype=np.uint8), fps=10)
        paths.append(str(path))
    results: dict[str, list[list[float]]] = {"preloaded": [], "default": []}
    for r in range(args.rounds):
        for name in results:
            code = CHILD.format(src=SRC, default=name == "default", paths=paths, workers=args.workers,
                                stores=args.stores, out=str(work / f"{name}{r}"))  # fmt: skip
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.clips} clips, {args.workers} workers, {args.stores} stores per process, {args.rounds} rounds")
    print("| forkserver preload | first store (s) | each later store (s) | later stores, clips/s |")
    print("| --- | ---: | ---: | ---: |")
    for name, runs in results.items():
        first = statistics.median(w[0] for w in runs)
        later = statistics.median(x for w in runs for x in w[1:])
        print(f"| {name} | {first:.2f} | {later:.2f} | {args.clips / later:.1f} |")


if __name__ == "__main__":
    main()
