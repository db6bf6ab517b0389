"""Images as one slot or repeated: the demo's appearance task as still images, probed both ways with paired
probe seeds (docs/evaluation.md, "Images as images"; issue 54).

    python bench/image_frames.py --run RUN --out DIR [--seeds 10] [--probes attentive,linear,linear_cls]

Writes the built-in benchmark's appearance task of the run (its ``data.synthetic`` config, the demo budget's
splits) as still images — each clip's middle frame, ``DIR/appearance/{train,val,test}/NNNNN.png``, with the
index files ``DIR/appearance/{train,val,test}.txt`` (``path label``) — then runs

    levjepa probe RUN --task index:TRAIN,VAL,TEST --image-frames one|repeat --seeds N --no-baseline ...

once per setting (every clip the same size and frames as the run's own: the model's preprocessing) and prints,
per probe, the mean ± sd over seeds of each and the paired difference ``one − repeat`` (same seed, so the same
initialisation and batch order: both read features of the same images) ± its standard error, and how many
seeds ``one`` won. ``--image-frames one`` is one temporal slot (the tubelet's frames), ``repeat`` the clip's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def write_images(run: str, out: Path) -> list[Path]:
    """The appearance task's splits as still images (module doc); returns the three index files."""
    import numpy as np
    from PIL import Image

    from levjepa.eval.synthetic_task import synthetic_config_for, synthetic_splits
    from levjepa.formats.reading.load import load_encoder

    loaded = load_encoder(run)
    splits = synthetic_splits(synthetic_config_for(loaded.run_config), "demo")
    paths = []
    for split, clips in splits.clips.items():
        folder = out / "appearance" / split
        folder.mkdir(parents=True, exist_ok=True)
        labels = splits.labels[split]["appearance"]
        lines = []
        for i in range(len(clips)):
            frame = clips[i, :, clips.shape[2] // 2].permute(1, 2, 0).numpy().astype(np.uint8)  # [H, W, 3]
            name = f"{split}/{i:05d}.png"
            if not (out / "appearance" / name).is_file():
                Image.fromarray(frame).save(out / "appearance" / name)
            lines.append(f"{name} {int(labels[i])}")
        index = out / "appearance" / f"{split}.txt"
        index.write_text("\n".join(lines) + "\n")
        paths.append(index)
    return paths


def probe(run: str, index: list[Path], mode: str, out: Path, seeds: int, probes: str) -> dict:
    result = out / f"{mode}.json"
    if not result.is_file():
        task = "index:" + ",".join(str(p) for p in index)
        cmd = [sys.executable, "-m", "levjepa", "probe", run, "--task", task, "--image-frames", mode, "--seeds",
               str(seeds), "--probe", probes, "--no-baseline", "--no-save", "--workers", "1", "--features",
               str(out / f"features-{mode}"), "--out", str(result)]  # fmt: skip
        print("$", " ".join(cmd[1:]), flush=True)
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        subprocess.run(cmd, check=True, env=env)
    data = json.loads(result.read_text())
    (encoder,) = data["results"]
    return data["results"][encoder]["appearance"]


def main() -> None:
    sys.path.insert(0, str(SRC))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True, help="folder for the images, the stores and the results (not committed)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--probes", default="attentive,linear,linear_cls")
    args = ap.parse_args()
    out = Path(args.out)
    index = write_images(args.run, out)
    res = {m: probe(args.run, index, m, out, args.seeds, args.probes) for m in ("one", "repeat")}
    print(f"\nappearance as still images, {args.seeds} paired probe seeds, test accuracy (%)\n")
    print("| probe | one slot | repeated | one − repeat (paired) | seeds one won |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for p in args.probes.split(","):
        one = res["one"][p].get("seed_reported_acc", [res["one"][p]["reported_acc"]])
        rep = res["repeat"][p].get("seed_reported_acc", [res["repeat"][p]["reported_acc"]])
        diff = [a - b for a, b in zip(one, rep, strict=True)]
        se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
        sd = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in (("one", one), ("rep", rep))}
        won = sum(d > 0 for d in diff)
        print(
            f"| {p} | {statistics.mean(one):.1f} ± {sd['one']:.1f} | {statistics.mean(rep):.1f} ± {sd['rep']:.1f} | "
            f"{statistics.mean(diff):+.2f} ± {se:.2f} | {won} / {len(diff)} |"
        )


if __name__ == "__main__":
    main()
