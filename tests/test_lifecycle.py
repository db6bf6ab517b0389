"""The run's life between its first and last step (``levjepa.train.lifecycle``), driven directly: the stop
after ``max_consecutive_skips`` non-finite steps in a row wherever the run falls between two checks, and what a
pre-emption says when its checkpoint could not be written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from levjepa.distributed import DistInfo
from levjepa.train.lifecycle import Lifecycle, TrainingStopped

ALONE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _life(path: Path, **kwargs) -> Lifecycle:
    settings = {"command": "levjepa pretrain", "steps": 20, "checkpoint_every": 100, "keep_last": 1}
    return Lifecycle(path, ALONE, **{**settings, "max_consecutive_skips": 5, **kwargs})


def _run(life: Lifecycle, bad: set[int], steps: int, check_every: int) -> None:
    for step in range(steps):
        life.record(step, torch.tensor(step in bad))
        if (step + 1) % check_every == 0:
            life.check()


def test_a_run_of_bad_steps_across_a_check_stops_the_run(tmp_path):
    # steps 3-7 non-finite: 3 before the check after step 4, 2 after it, and step 8 good before the next check
    with pytest.raises(TrainingStopped, match="5 consecutive optimizer steps") as stopped:
        _run(_life(tmp_path), bad={3, 4, 5, 6, 7}, steps=10, check_every=5)
    assert "bad_files.json" in str(stopped.value)  # pretraining's hint, the default


def test_runs_shorter_than_the_limit_do_not_stop_the_run(tmp_path):
    life = _life(tmp_path)
    _run(life, bad={0, 1, 2, 3, 5, 6, 7, 8, 11, 12}, steps=15, check_every=5)  # runs of 4 (one across a check), 4 and 2
    assert life.skipped == [0, 1, 2, 3, 5, 6, 7, 8, 11, 12]
