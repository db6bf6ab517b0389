"""A real run learns, on more than one seed: the README's main job meets every target of the demo's promise
(``levjepa.presets.DEMO_TARGETS``: appearance, motion and the arrow of time, each with its margin over the
same encoder at random initialisation), read as the command itself reads them, for seeds 0, 1, 3 and 4.

Seed 0 is the README's own run; seed 1 the one whose motion came last in ``bench/quality.md`` § 9 (the recipes
before the current one lost the arrow there first); seed 3 the one whose arrow sat on its line in every recipe
up to 128 projection dimensions (its CLS held no arrow at all; § 9, "256 projection dimensions"); seed 4 the one
whose random-init encoder reads the digit best (the digit's margin missed there at 640 steps; § 9, "800
steps") and whose CLS lost the arrow again at 256 dimensions (§ 9, "512 dimensions"). Each task must clear its
target by ``ROOM`` points (issue 56: a demo whose verdict sits on its line is one rounding away from a miss). So
a change that makes the demo fragile again fails here before it fails a user. Slow (6–8 minutes per seed on 2
cores): ``pytest -m slow tests/test_demo_learns.py``.
"""

from __future__ import annotations

import json

import pytest

from levjepa.cli import main
from levjepa.presets import DEMO_TARGETS, demo_misses
from levjepa.weights import PROBE_RESULTS

ROOM = 3.0  # points above each target that every run of bench/quality.md § 9's ten keeps


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_the_demo_meets_every_target_and_margin(tmp_path, capsys, seed):
    run = tmp_path / "run"
    assert main(["pretrain", "--preset", "demo-cpu", "--run-dir", str(run), f"train.seed={seed}"]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["loss"] < 0.8 * lines[0]["loss"]
    assert lines[-1]["effective_rank"] > 4.0  # SIGReg keeps the projections from collapsing
    accuracy = json.loads((run / PROBE_RESULTS).read_text())["accuracy"]
    misses = demo_misses(accuracy["pretrained (EMA)"], accuracy["random init"])
    assert misses == [], f"seed {seed}: {misses}\n{capsys.readouterr().err[-2500:]}"
    assert capsys.readouterr().err.rstrip().endswith("all met")  # the line the user reads says so too
    room = {t: max(accuracy["pretrained (EMA)"][t].values()) - v for t, v in DEMO_TARGETS.items()}
    assert min(room.values()) >= ROOM, f"seed {seed}: points above each target {room}"
