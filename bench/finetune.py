"""Fine-tuning vs the frozen probe vs fine-tuning from random init, on the built-in benchmark through the CLI.

``python bench/finetune.py index --run RUN --out DIR [--task appearance]`` writes the demo budget's splits of
the benchmark the run trained on as small video files (lossless x264, 4:4:4) and ``DIR/{train,val,test}.txt``
index files, so that ``levjepa probe`` and ``levjepa finetune`` read them through ``--task index:``, the path
users take. ``python bench/finetune.py table DIR`` collects ``DIR/probe.json`` and every ``DIR/ft-*/results.json``
into the table of ``bench/finetune.md`` (the commands are there).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from levjepa.data import write_video
from levjepa.eval.synthetic_task import synthetic_config_for, synthetic_splits
from levjepa.formats.load import read_run_config


def write_index(run: str, out: Path, task: str) -> None:
    splits = synthetic_splits(synthetic_config_for(read_run_config(run)), "demo")
    out.mkdir(parents=True, exist_ok=True)
    for split, clips in splits.clips.items():
        labels = splits.labels[split][task]
        rows = []
        for i, clip in enumerate(clips):  # uint8 [C, T, H, W]
            path = out / split / f"{i:05d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            frames = clip.permute(1, 2, 3, 0).contiguous().numpy()
            write_video(path, frames, fps=15, options={"crf": "0"}, pix_fmt="yuv444p")
            rows.append(f"{path.resolve()} {int(labels[i])}")
        (out / f"{split}.txt").write_text("\n".join(rows) + "\n")
        print(f"{split}: {len(rows)} clips -> {out / f'{split}.txt'}")


def table(out: Path) -> None:
    rows: list[tuple[str, str]] = []
    probe = out / "probe.json"
    if probe.is_file():
        acc = json.loads(probe.read_text())["accuracy"]["pretrained-ema"]["labels"]
        for name, value in acc.items():
            rows.append((f"frozen probe, {name}", f"{value:.1f}"))
    groups: dict[str, list[float]] = {}
    for res in sorted(out.glob("ft-*/results.json")):
        name = res.parent.name.rsplit("-seed", 1)[0]
        groups.setdefault(name, []).append(float(json.loads(res.read_text())["test_acc"]))
    for name, accs in groups.items():
        spread = f" ± {statistics.stdev(accs):.1f}" if len(accs) > 1 else ""
        each = ", ".join(f"{a:.1f}" for a in accs)
        rows.append((f"{name} ({len(accs)} seeds: {each})", f"{statistics.mean(accs):.1f}{spread}"))
    print("| readout | test accuracy (%) |\n| --- | ---: |")
    for name, value in rows:
        print(f"| {name} | {value} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("index")
    p.add_argument("--run", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--task", default="appearance", choices=("appearance", "motion", "arrow"))
    t = sub.add_parser("table")
    t.add_argument("out")
    args = parser.parse_args()
    if args.cmd == "index":
        write_index(args.run, Path(args.out), args.task)
    else:
        table(Path(args.out))


if __name__ == "__main__":
    main()
