"""The thread count a command picks vs a fixed one, on a machine kept busy: the smoke run, side by side, in one run.

``levjepa pretrain`` (the README's smoke form, shortened by ``--steps`` / ``--clips``, with its end-of-run probes)
runs with ``train.threads=1``, with torch's own default (one thread per core: what every command ran with before
``levjepa.threads.choose_threads``) and with no count at all (the rule picks one and says which), each ``--rounds``
times in alternating order, while ``--load`` processes spin on the CPUs (a busy machine: another job). Prints one
markdown row per setting: wall seconds per round, their median and the ratio to one thread; and the count the rule
chose.

    python bench/threads.py --load 1 --rounds 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from levjepa.infer.cpu import cpu_info


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _run(setting: str | None, args: argparse.Namespace, root: str) -> tuple[float, str]:
    """Wall seconds of one smoke run with ``train.threads=setting`` (None: the rule), and its ``threads:`` line."""
    run = os.path.join(root, "run")
    shutil.rmtree(run, ignore_errors=True)
    n = args.clips
    cmd = [sys.executable, "-m", "levjepa", "pretrain", "--preset", "demo-cpu", f"train.steps={args.steps}"]
    cmd += [f"data.synthetic.num_train={n}", f"data.synthetic.num_val={n // 4}", f"data.synthetic.num_test={n // 4}"]
    cmd += ["--run-dir", run, "--no-progress"] + ([f"train.threads={setting}"] if setting else [])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    line = next((x for x in done.stderr.splitlines() if x.startswith("threads:")), "")
    return wall, line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", type=int, default=1, help="busy processes beside the runs")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--clips", type=int, default=160, help="train clips (val and test: a quarter each)")
    args = p.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    default = torch.get_num_threads() if "OMP_NUM_THREADS" not in os.environ else os.cpu_count()
    settings = {"train.threads=1": "1", f"torch's default ({default})": str(default), "none (the rule)": None}
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for s in spinners:
        s.start()
    times: dict[str, list[float]] = {k: [] for k in settings}
    chosen: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as root:
            for r in range(args.rounds):
                order = list(settings) if r % 2 == 0 else list(reversed(settings))
                for name in order:
                    wall, line = _run(settings[name], args, root)
                    times[name].append(wall)
                    if settings[name] is None:
                        chosen.append(re.sub(r";.*", "", line))
                    print(f"round {r + 1}: {name}: {wall:.1f} s  {line}", file=sys.stderr, flush=True)
    finally:
        stop.set()
        for s in spinners:
            s.join()
    one = statistics.median(times["train.threads=1"])
    print(f"\n{args.load} busy process(es); smoke run: {args.steps} steps, {args.clips} train clips, then its probes\n")
    print("| threads | wall per round (s) | median (s) | vs 1 thread |")
    print("| --- | --- | ---: | ---: |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {' / '.join(f'{t:.1f}' for t in ts)} | {med:.1f} | {med / one:.2f}x |")
    print(f"\nthe rule chose: {'; '.join(chosen)}")


if __name__ == "__main__":
    main()
