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
from levjepa.formats.reading.load import read_run_config


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
    """Markdown rows: each frozen probe of ``DIR/probe.json`` and each fine-tuning recipe of ``DIR/ft-NAME-seedS``
    (mean over its seeds), test accuracy and the validation accuracy the readout was chosen on."""
    rows: list[tuple[str, str, str]] = []
    probe = out / "probe.json"
    if probe.is_file():
        for task, results in json.loads(probe.read_text())["results"]["pretrained-ema"].items():  # task: its name
            for name, res in results.items():
                rows.append(
                    (f"frozen probe, {task}, {name}", f"{res['reported_acc']:.1f}", f"{res['best']['val_acc']:.1f}")
                )
    groups: dict[str, list[tuple[float, float]]] = {}
    for path in sorted(out.glob("ft-*/results.json")):
        name = path.parent.name.removeprefix("ft-").rsplit("-seed", 1)[0]
        res = json.loads(path.read_text())
        groups.setdefault(name, []).append((float(res["test_acc"]), float(res["best_val_acc"])))
    for name, accs in groups.items():
        tests, vals = [a for a, _ in accs], [v for _, v in accs]
        spread = f" ± {statistics.stdev(tests):.1f}" if len(tests) > 1 else ""
        each = ", ".join(f"{a:.1f}" for a in tests)
        rows.append((f"{name} ({len(tests)} seed(s): {each})", f"{statistics.mean(tests):.1f}{spread}",
                     f"{statistics.mean(vals):.1f}"))  # fmt: skip
    print("| readout | test accuracy (%) | val (chosen on) |\n| --- | ---: | ---: |")
    for name, test, val in rows:
        print(f"| {name} | {test} | {val} |")


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
