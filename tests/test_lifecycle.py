"""The run's life between its first and last step (``levjepa.train.lifecycle``), driven directly: the stop
after ``max_consecutive_skips`` non-finite steps in a row wherever the run falls between two checks, and what a
pre-emption says when its checkpoint could not be written."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from levjepa.distributed import DistInfo
from levjepa.train.lifecycle import Lifecycle, TrainingStopped
from levjepa.train.preemption import Preempted

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


def _failed_write() -> Path:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("saved", [None, 2])
def test_a_preemption_whose_checkpoint_fails_names_what_is_saved_and_claims_no_write(tmp_path, saved, capsys):
    if saved is not None:
        (tmp_path / "checkpoints" / f"step_{saved:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{saved:06d}" / "meta.json").write_text(json.dumps({"step": saved}))
    with _life(tmp_path) as life, pytest.raises(Preempted) as stopped:
        life.record(2, torch.tensor(False))
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's pre-emption, mid-step
        life.end_of_step(3, _failed_write)
    said = str(stopped.value)
    assert said.startswith("SIGTERM received: stopped after step 3")
    assert "could not be written" in said and not re.search(r"checkpoint \S+ written", said)
    assert "no space left on device" in said and "training continues" not in capsys.readouterr().err.lower()
    if saved is None:
        assert stopped.value.checkpoint is None and "none of its steps is saved" in said
    else:
        assert stopped.value.checkpoint == tmp_path / "checkpoints" / "step_000002"
        assert f"the last saved is checkpoint {stopped.value.checkpoint} (step 2)" in said
        assert f"`levjepa pretrain --resume {tmp_path}`" in said


def test_a_preemption_whose_checkpoint_is_written_names_it(tmp_path):
    def write() -> Path:
        written = tmp_path / "checkpoints" / "step_000003"
        written.mkdir(parents=True)
        (written / "meta.json").write_text(json.dumps({"step": 3}))
        return written

    with _life(tmp_path) as life, pytest.raises(Preempted) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        life.end_of_step(3, write)
    assert f"stopped after step 3, checkpoint {tmp_path / 'checkpoints' / 'step_000003'} written" in str(stopped.value)


def test_the_caller_names_its_own_remedy(tmp_path):
    life = _life(tmp_path, max_consecutive_skips=2, stop_hint="Lower lr.")
    with pytest.raises(TrainingStopped) as stopped:
        _run(life, bad={0, 1}, steps=2, check_every=2)
    assert str(stopped.value).endswith("Lower lr.") and "float32" not in str(stopped.value)
