"""``levjepa data check|prepare|pack``: scan a source, re-encode a folder of videos for training, or pack it
into shards.

    levjepa data check SOURCE [--workers N] [--deep] [--json PATH]
    levjepa data prepare SRC DST [--short-side 256] [--keyint 16] [--workers N] [--fps F] [--crf 23]
                                 [--shards N [--keep-files]]
    levjepa data pack SOURCE DST --shards N [--seed 0] [--no-shuffle] [--workers N]

``check`` exits 1 when nothing in SOURCE is readable; ``prepare`` and ``pack`` exit 1 when any file failed
(each one is named with its reason). ``prepare --shards N`` prepares into ``DST/files`` and packs that into
``DST`` (deleting ``DST/files`` afterwards unless ``--keep-files``). What they do: :mod:`levjepa.data.check`,
:mod:`levjepa.data.prepare` and :mod:`levjepa.data.shards`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from levjepa.commands import sentence
from levjepa.commands._numbers import whole
from levjepa.commands._outputs import claim_folder, claim_optional_file, is_json_with
from levjepa.config import ConfigError
from levjepa.data.badfiles import bad_file_text
from levjepa.data.check import check_source, format_report
from levjepa.data.prepare import REPORT, PrepareOptions, prepare_folder
from levjepa.data.shards import INDEX_NAME, pack
from levjepa.data.sources import list_media
from levjepa.weights import atomic_write_text

__all__ = ["add_arguments", "main"]


def _add_workers(parser: argparse.ArgumentParser) -> None:
    default = max(1, min(8, os.cpu_count() or 1))
    parser.add_argument("--workers", type=int, default=default, help="parallel processes (default: %(default)s)")


def _sub(sub: Any, name: str, helptext: str) -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` starts with its help as a sentence."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=helptext, description=sentence(helptext))
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="{check,prepare,pack}")
    check = _sub(sub, "check", "scan a source: counts, durations, resolutions, fps, unreadable files")
    check.add_argument("source", help="a folder, a V-JEPA index file (`path label` rows), a file, or 'synthetic'")
    _add_workers(check)
    check.add_argument("--deep", action="store_true", help="decode every frame (slow; true frame counts)")
    check.add_argument("--json", type=Path, default=None, help="also write the full report (one row per file) here")
    check.add_argument("--overwrite", action="store_true", help="replace the report of an earlier check at --json")
    check.add_argument("--min-side", type=int, default=16, help="flag files whose short side is smaller (default: 16)")
    check.add_argument(
        "--max-side", type=int, default=8192, help="flag files whose long side is larger (default: 8192)"
    )

    prep = _sub(sub, "prepare", "re-encode a folder of videos: short side, frequent key frames, resumable")
    prep.add_argument("src", type=Path, help="folder of videos (searched recursively; images are rescaled and copied)")
    prep.add_argument("dst", type=Path, help="output folder (same relative paths, .mp4)")
    prep.add_argument("--short-side", type=int, default=256, help="scale down so the short side is this (default: 256)")
    prep.add_argument("--keyint", type=int, default=16, help="maximum frames between key frames (default: 16)")
    _add_workers(prep)
    prep.add_argument(
        "--fps", type=float, default=None, help="resample to this frame rate (default: keep the source's)"
    )
    prep.add_argument("--crf", type=int, default=23, help="x264 constant rate factor, lower = better (default: 23)")
    prep.add_argument("--preset", default="veryfast", help="x264 preset (default: veryfast)")
    prep.add_argument("--no-fastdecode", action="store_true", help="do not use x264's fastdecode tuning")
    prep.add_argument(
        "--shards",
        type=whole(0),
        default=0,
        help="also pack the prepared files into this many tar shards in DST (see `data pack`; default: no shards)",
    )
    prep.add_argument("--keep-files", action="store_true", help="with --shards: keep the prepared files in DST/files")
    prep.add_argument(
        "--no-fixed-gop",
        action="store_true",
        help="x264's adaptive GOP instead of the fixed one whose odd frames training can skip (see prepare.py)",
    )

    pack = _sub(sub, "pack", "pack a source's files into WebDataset-style tar shards with an index")
    pack.add_argument("source", help="a folder (searched recursively) or a V-JEPA index file; prepare it first")
    pack.add_argument("dst", type=Path, help="output folder: shard-NNNNNN.tar files and shards.json")
    pack.add_argument("--shards", type=int, required=True, help="number of shards (>= the number of training ranks)")
    pack.add_argument("--seed", type=int, default=None, help="seed of the shuffle across shards (default: 0)")
    pack.add_argument("--no-shuffle", action="store_true", help="keep the source's order instead of shuffling")
    _add_workers(pack)


def _pack(source: str, dst: Path, args: argparse.Namespace, source_root: str | None) -> int:
    items = list_media(source)
    result = pack(
        items,
        dst,
        shards=args.shards,
        seed=getattr(args, "seed", None) or 0,
        shuffle=not getattr(args, "no_shuffle", False),
        workers=args.workers,
        source_root=source_root,
    )
    print(
        f"packed {result.members} file(s) into {result.shards} shard(s) ({result.reused} kept from an earlier run), "
        f"failed {len(result.failed)}; index: {result.index}"
    )
    for path, reason in result.failed:
        print(f"  failed: {bad_file_text(path, reason)}")
    return 1 if result.failed else 0


def _pack_command(args: argparse.Namespace) -> int:
    if args.no_shuffle and args.seed is not None:
        raise ConfigError(f"--seed {args.seed} seeds the shuffle, which --no-shuffle turns off: drop one of the two")
    claim_folder(args.dst, "DST", "shards", writes=(INDEX_NAME,), resumes=True)
    root = args.source if os.path.isdir(args.source) else os.path.dirname(os.path.abspath(args.source))
    return _pack(args.source, args.dst, args, root)


def _check(args: argparse.Namespace) -> int:
    report_json = is_json_with("summary", "files")
    claim_optional_file(args.json, "--json", "a data check report (JSON)", is_own=report_json, overwrite=args.overwrite)
    report = check_source(
        args.source, workers=args.workers, deep=args.deep, min_side=args.min_side, max_side=args.max_side
    )
    print(format_report(report))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(report.to_dict(), indent=2, default=str) + "\n")
        print(f"report written to {args.json}")
    if not report.readable:
        print(f"levjepa data check: nothing readable in {args.source}", file=sys.stderr)
        return 1
    return 0


def _prepare(args: argparse.Namespace) -> int:
    opts = PrepareOptions(
        short_side=args.short_side,
        keyint=args.keyint,
        fps=args.fps,
        crf=args.crf,
        preset=args.preset,
        fastdecode=not args.no_fastdecode,
        fixed_gop=not args.no_fixed_gop,
    )
    if args.keep_files and not args.shards:
        raise ConfigError("--keep-files keeps the prepared files that --shards N packs; without --shards they are kept")
    if args.dst.resolve() == args.src.resolve():
        raise ConfigError(f"DST {args.dst}: is SRC, whose videos the prepared files would replace; choose another DST")
    kind = "shards" if args.shards else "prepared"
    claim_folder(args.dst, "DST", kind, writes=(REPORT,), resumes=True)
    files = args.dst / "files" if args.shards else args.dst
    result = prepare_folder(args.src, files, opts, workers=args.workers)
    print(
        f"prepared {len(result.done)} file(s), skipped {len(result.skipped)} already done, "
        f"failed {len(result.failed)}; report: {files / 'prepare_report.json'}"
    )
    for path, reason in result.failed:
        print(f"  failed: {bad_file_text(path, reason)}")
    if not args.shards:
        return 1 if result.failed else 0
    packed = _pack(str(files), args.dst, args, str(files))
    if packed == 0 and not args.keep_files:
        shutil.rmtree(files)
    return 1 if result.failed or packed else 0


def main(args: argparse.Namespace) -> int:
    if args.data_command == "check":
        return _check(args)
    if args.data_command == "pack":
        return _pack_command(args)
    return _prepare(args)
