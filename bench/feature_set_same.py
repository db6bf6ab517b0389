"""The one feature-set format (issue 52) changed no feature: the same store and extractions written by two
levjepa checkouts hold the same arrays, bit for bit, and the same index rows (modulo the renamed fields).

Write with each checkout, then compare (bench/eval.md, "One feature-set format (issue 52)")::

    git worktree add /tmp/before 9055897
    PYTHONPATH=src python bench/feature_set_same.py write /tmp/fs/after /tmp/fs/media
    PYTHONPATH=/tmp/before/src python bench/feature_set_same.py write /tmp/fs/before /tmp/fs/media
    PYTHONPATH=src python bench/feature_set_same.py compare /tmp/fs/before /tmp/fs/after
    python bench/feature_set_same.py digest /tmp/fs/after  # one sha256 per folder (arrays and index rows)

``write`` makes a few small videos and an image in MEDIA (once: both checkouts read the same files), a
feature store of them (2 segments × 3
crops, tokens, shards of 2 files) and four extractions (safetensors with patches, npy, npy streaming,
per_video); the checkout's own API is used for each (``ExtractConfig(window=...)`` before,
``ExtractConfig(ViewSpec(...))`` after). ``compare`` loads every array file with numpy / safetensors and
every ``index.jsonl`` row, renames the old extraction fields (``path`` -> ``file``; a per-video row's
``file: a.npy`` -> ``shard: a``), drops the field the new format adds to extraction's rows (``item``), and
prints one line per folder: every row's values of every array, matched by what the row is (file and window
or view), its index fields, and whether whole array files and the row order are the same too; the exit
status is the number of folders whose rows differ.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch


def _media(root: Path) -> None:
    from PIL import Image

    from levjepa.data import write_video

    root.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate((40, 9, 23)):
        y, x = np.mgrid[0:24, 0:40]
        frames = np.stack(
            [np.stack([(x * 6 + 9 * t + i) % 256, (y * 9 + 5 * t) % 256, (x + y + 13 * t) % 256], -1) for t in range(n)]
        ).astype(np.uint8)
        write_video(root / f"v{i}.mp4", frames, fps=10)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(root / "im.png")
    (root / "broken.mp4").write_text("not a video")
    (root / "index.txt").write_text(
        "".join(
            f"{root / n} {k % 2}\n" for k, n in enumerate(sorted(p.name for p in root.iterdir() if p.suffix != ".txt"))
        )
    )


def write(out: Path, media: Path) -> None:
    import inspect

    from levjepa.data.eval_clip import ViewSpec
    from levjepa.data.sources import parse_index

    try:
        from levjepa.features.extract import ExtractConfig, extract
        from levjepa.features.store import StoreConfig, build_store
    except ImportError:  # a checkout before levjepa.features (issue 67): the same code in eval/
        from levjepa.features.extract import ExtractConfig, extract  # type: ignore[no-redef]
        from levjepa.features.store import StoreConfig, build_store  # type: ignore[no-redef]
    from levjepa.formats.reading.load import random_encoder
    from levjepa.model import encoder_config

    torch.set_num_threads(1)
    if not (media / "index.txt").is_file():
        _media(media)
    enc = random_encoder(encoder_config("vit-test"), seed=3).encoder
    items = parse_index(media / "index.txt")
    views = ViewSpec(16, 4, 2, segments=2, crops=3)
    build_store(enc, items, out / "store", StoreConfig(views, batch_size=5, workers=0, shard_items=2))
    new = "views" in inspect.signature(ExtractConfig).parameters
    for name, kw in (
        ("safetensors", dict(patches=True, shard_rows=3)),
        ("npy", dict(format="npy", shard_rows=4)),
        ("stream", dict(format="npy", stream=True, patches=True)),
        ("per_video", dict(format="per_video", patches=True)),
    ):
        frames = dict(views=ViewSpec(16, 8, 2)) if new else dict(window=8, frame_stride=2, size=16)
        cfg = ExtractConfig(**frames, stride=4, batch_size=3, workers=0, **kw)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extract(enc, str(media / "index.txt"), out / name, cfg, progress=False)


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for p in sorted(folder.iterdir()):
        if p.suffix == ".npy":
            out[p.name] = np.load(p)
        elif p.suffix == ".safetensors":
            out.update({f"{p.name}:{k}": v for k, v in load_file(p).items()})
    return out


def _rows(folder: Path, store: bool) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "index.jsonl").read_text().splitlines()]
    for r in rows:
        if "path" in r and "file" in r:  # an old per-video row: file named the array file, path the source
            r["shard"] = r.pop("file")[: -len(".npy")]
        if "path" in r:  # an extraction before the one format
            r["file"] = r.pop("path")
        if not store:
            r.pop("item", None)  # a field the new format adds to extraction's rows
    return rows


def _by_row(folder: Path, rows: list[dict], arrays: dict[str, np.ndarray]) -> dict[tuple, dict[str, np.ndarray]]:
    """Every row's values of every array, keyed by what the row is (its file and its window or view)."""
    out: dict[tuple, dict[str, np.ndarray]] = {}
    for r in rows:
        key = (r["file"], r.get("window"), r.get("segment"), r.get("crop"))
        shard = r["shard"]
        if isinstance(shard, str):  # per_video: <name>.npy and <name>.patches.npy
            files = {"feature": f"{shard}.npy", "patches": f"{shard}.patches.npy"}
        else:
            files = {k.split("-")[0]: k for k in arrays if k.endswith(f"-{shard:05d}.npy")}
            files |= {k.split(":")[1]: k for k in arrays if k.startswith(f"features-{shard:05d}.safetensors:")}
        out[key] = {name: arrays[f][r["offset"]] for name, f in files.items() if f in arrays}
    return out


def compare(before: Path, after: Path) -> int:
    failed = 0
    for name in ("store", "safetensors", "npy", "stream", "per_video"):
        a, b = _arrays(before / name), _arrays(after / name)
        files_same = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
        ra, rb = _rows(before / name, name == "store"), _rows(after / name, name == "store")
        va, vb = _by_row(before / name, ra, a), _by_row(after / name, rb, b)
        rows_same = va.keys() == vb.keys() and all(
            va[k].keys() == vb[k].keys() and all(np.array_equal(va[k][n], vb[k][n]) for n in va[k]) for k in va
        )
        content = sorted(
            json.dumps({k: v for k, v in r.items() if k not in ("row", "shard", "offset")}, sort_keys=True) for r in ra
        )
        content_same = content == sorted(
            json.dumps({k: v for k, v in r.items() if k not in ("row", "shard", "offset")}, sort_keys=True) for r in rb
        )
        failed += not (rows_same and content_same)
        print(
            f"{name:11s} {len(ra)} rows × {len(va[next(iter(va))])} arrays: every row's values "
            f"{'identical' if rows_same else 'DIFFER'}, index fields {'identical' if content_same else 'DIFFER'}; "
            f"array files {'identical' if files_same else 'differ'}, row order "
            f"{'identical' if ra == rb else 'differs'} ({sum(v.size for v in a.values())} values)"
        )
    return failed


def digest(root: Path) -> str:
    """One sha256 per folder and over all of them: every array (name, dtype, shape, bytes) and every index row
    (``store.json`` left out: it holds no feature, and its key order is free)."""
    import hashlib

    total = hashlib.sha256()
    for name in ("store", "safetensors", "npy", "stream", "per_video"):
        h = hashlib.sha256()
        for key, a in sorted(_arrays(root / name).items()):
            h.update(f"{key}:{a.dtype}:{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update((root / name / "index.jsonl").read_bytes())
        print(f"{name:11s} {h.hexdigest()}")
        total.update(h.digest())
    return total.hexdigest()


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "digest":
        print(f"all         {digest(Path(sys.argv[2]))}")
    else:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
