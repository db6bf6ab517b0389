"""What a feature set's checks cost (``levjepa.features.check``): the non-finite check and the CRC-32 when a
unit is written, the verification on the first read in a process, beside the work they guard, in one run.

A store of ``--units`` units of ``--rows`` rows is written with ``Unit.write`` (``cls``, ``mean`` float32 [n, D];
``tokens`` float16 [n, 1+L, D], the attentive probe's), then every row of every array is read twice with
``FeatureSet.read``: the first read verifies each file, the second (the same process) does not. Files are in
the page cache (just written), so the read times are the CPU's, the worst case for the check's share; a disk
adds its time to both. Also times SHA-256 on the same bytes (why the checksum is CRC-32).

    python bench/store_check.py --units 8 --rows 256 --dim 192 --tokens 196
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

import levjepa.features.check as feature_check
from levjepa.features.feature_set import FeatureSet, Unit, finish
from levjepa.infer.cpu import cpu_info


def _unit(k: int, rows: int, dim: int, tokens: int) -> Unit:
    g = torch.Generator().manual_seed(k)
    unit = Unit(f"{k:05d}")
    meta = [{"file": f"v{k}-{i}.mp4", "label": i % 10, "item": k * rows + i} for i in range(rows)]
    unit.add(
        meta,
        {
            "cls": torch.randn(rows, dim, generator=g),
            "mean": torch.randn(rows, dim, generator=g),
            "tokens": torch.randn(rows, 1 + tokens, dim, generator=g).half(),
        },
    )
    return unit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--units", type=int, default=8)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--tokens", type=int, default=196)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as root:
        out = Path(root)
        manifest = {"version": 2, "cutter": "store", "layout": "npy", "config": {}, "encoder": "bench"}
        units = [_unit(k, args.rows, args.dim, args.tokens) for k in range(args.units)]
        check_s = 0.0
        for u in units:  # the non-finite check alone, on the tensors a write gets
            tensors = {n: torch.cat(parts) for n, parts in u.arrays.items()}
            t = time.perf_counter()
            feature_check.refuse_nonfinite(out, u.name, u.rows, tensors)
            check_s += time.perf_counter() - t
        t = time.perf_counter()
        for u in units:
            u.write(out, "npy")
        write_s = time.perf_counter() - t
        finish(out, manifest, "npy", [u.name for u in units])
        total = sum(f.stat().st_size for f in out.glob("*.npy"))
        blob = b"".join(f.read_bytes() for f in sorted(out.glob("tokens-*.npy")))
        t = time.perf_counter()
        zlib.crc32(blob)
        crc_s = (time.perf_counter() - t) * total / len(blob)
        t = time.perf_counter()
        hashlib.sha256(blob).digest()
        sha_s = (time.perf_counter() - t) * total / len(blob)
        reads = []
        fs = FeatureSet(out)
        rows = np.arange(len(fs))
        for _ in range(2):
            fs.close()  # a reader opened again: the files' check is remembered for the process
            t = time.perf_counter()
            for name in ("cls", "mean", "tokens"):
                for chunk in np.array_split(rows, max(1, len(rows) // 64)):  # a probe's batches of 64
                    fs.read(name, chunk)
            reads.append(time.perf_counter() - t)
        fs.close()
    mb = total / 1e6
    print(f"store: {args.units} units x {args.rows} rows, D={args.dim}, 1+{args.tokens} tokens: {mb:.0f} MB\n")
    print("| what | seconds | MB/s | share |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| write every unit (the checks included) | {write_s:.2f} | {mb / write_s:.0f} | 100 % |")
    print(f"| of which the non-finite check | {check_s:.2f} | {mb / check_s:.0f} | {check_s / write_s:.0%} |")
    print(f"| of which CRC-32 of the bytes written | {crc_s:.2f} | {mb / crc_s:.0f} | {crc_s / write_s:.0%} |")
    print(f"| first read of every row (files verified) | {reads[0]:.2f} | {mb / reads[0]:.0f} | 100 % |")
    print(
        f"| second read, same process (no check) | {reads[1]:.2f} | {mb / reads[1]:.0f} | {reads[1] / reads[0]:.0%} |"
    )
    print(f"| SHA-256 of the same bytes (not used) | {sha_s:.2f} | {mb / sha_s:.0f} | |")


if __name__ == "__main__":
    main()
