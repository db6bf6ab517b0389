"""``levjepa data check|prepare``: scan a source, or re-encode a folder of videos for training.

    levjepa data check SOURCE [--workers N] [--deep] [--json PATH]
    levjepa data prepare SRC DST [--short-side 256] [--keyint 16] [--workers N] [--fps F] [--crf 23]

``check`` exits 1 when nothing in SOURCE is readable; ``prepare`` exits 1 when any file failed (each one
is named with its reason). See ``check.py`` and ``prepare.py`` for what they do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["add_arguments", "main"]


def _default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="{check,prepare}")
    check = sub.add_parser("check", help="scan a source: counts, durations, resolutions, fps, unreadable files")
    check.add_argument("source", help="a folder, a V-JEPA index file (`path label` rows), a file, or 'synthetic'")
    check.add_argument(
        "--workers", type=int, default=_default_workers(), help="parallel processes (default: %(default)s)"
    )
    check.add_argument("--deep", action="store_true", help="decode every frame (slow; true frame counts)")
    check.add_argument("--json", type=Path, default=None, help="also write the full report (one row per file) here")
    check.add_argument("--min-side", type=int, default=16, help="flag files whose short side is smaller (default: 16)")
    check.add_argument(
        "--max-side", type=int, default=8192, help="flag files whose long side is larger (default: 8192)"
    )

    prep = sub.add_parser("prepare", help="re-encode a folder of videos: short side, frequent key frames, resumable")
    prep.add_argument("src", type=Path, help="folder of videos (searched recursively; images are rescaled and copied)")
    prep.add_argument("dst", type=Path, help="output folder (same relative paths, .mp4)")
    prep.add_argument("--short-side", type=int, default=256, help="scale down so the short side is this (default: 256)")
    prep.add_argument("--keyint", type=int, default=16, help="maximum frames between key frames (default: 16)")
    prep.add_argument(
        "--workers", type=int, default=_default_workers(), help="parallel processes (default: %(default)s)"
    )
    prep.add_argument(
        "--fps", type=float, default=None, help="resample to this frame rate (default: keep the source's)"
    )
    prep.add_argument("--crf", type=int, default=23, help="x264 constant rate factor, lower = better (default: 23)")
    prep.add_argument("--preset", default="veryfast", help="x264 preset (default: veryfast)")
    prep.add_argument("--no-fastdecode", action="store_true", help="do not use x264's fastdecode tuning")
    prep.add_argument(
        "--no-fixed-gop",
        action="store_true",
        help="x264's adaptive GOP instead of the fixed one whose odd frames training can skip (see prepare.py)",
    )


def _check(args: argparse.Namespace) -> int:
    from levjepa.data.badfiles import DataError
    from levjepa.data.check import check_source, format_report

    try:
        report = check_source(
            args.source, workers=args.workers, deep=args.deep, min_side=args.min_side, max_side=args.max_side
        )
    except DataError as exc:
        print(f"levjepa data check: {exc}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json is not None:
        from levjepa.weights import atomic_write_text

        atomic_write_text(args.json, json.dumps(report.to_dict(), indent=2, default=str) + "\n")
        print(f"report written to {args.json}")
    if not report.readable:
        print(f"levjepa data check: nothing readable in {args.source}", file=sys.stderr)
        return 1
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from levjepa.data.badfiles import DataError
    from levjepa.data.prepare import PrepareOptions, prepare_folder

    try:
        opts = PrepareOptions(
            short_side=args.short_side,
            keyint=args.keyint,
            fps=args.fps,
            crf=args.crf,
            preset=args.preset,
            fastdecode=not args.no_fastdecode,
            fixed_gop=not args.no_fixed_gop,
        )
        result = prepare_folder(args.src, args.dst, opts, workers=args.workers)
    except (DataError, ValueError) as exc:
        print(f"levjepa data prepare: {exc}", file=sys.stderr)
        return 1
    print(
        f"prepared {len(result.done)} file(s), skipped {len(result.skipped)} already done, "
        f"failed {len(result.failed)}; report: {args.dst / 'prepare_report.json'}"
    )
    for _, reason in result.failed:
        print(f"  failed: {reason}")
    return 1 if result.failed else 0


def main(args: argparse.Namespace) -> int:
    if args.data_command == "check":
        return _check(args)
    return _prepare(args)
