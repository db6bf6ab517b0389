"""A refused start or resume ends every rank, not only the main one: on 2 gloo ranks, a resume with a changed
config, one below the checkpoint's step and one of a directory another process holds locked each raise on
both ranks (the main rank decides, ``distributed.main_rank_decides``), and so does ``pretrain`` itself.

The main rank alone makes these checks; it used to raise while the other ranks waited for it at a barrier
forever. Each rank arms a watchdog (``faulthandler``): a rank still stuck after ``WATCHDOG_S`` prints where
it waits and exits, so that failure is a failed test, not a hung suite.
"""

from __future__ import annotations

import faulthandler
import functools
import re

import pytest

from dist_utils import run_gloo
from levjepa import distributed
from levjepa.config import ConfigError
from levjepa.train.loop import pretrain
from levjepa.train.run_dir import RunDirError, RunLock, check_pretrain_resume, run_directory
from train_utils import tiny_config

WATCHDOG_S = 120  # the whole rank function takes a few seconds; a rank waiting at a barrier waits forever

REFUSED = (  # (overrides of the finished 2-step run, what the refusal says)
    (("model.depth=6",), r"model\.depth \(2 -> 6\)"),  # check_resume: a changed architecture
    (("train.steps=1",), "already at step 2"),  # _check_steps: below the checkpoint
    (("train.steps=4",), "in use by another process"),  # allowed, but the test process holds the lock
)


def _refused_resumes(rank: int, world: int, run: str) -> list[tuple[str, str]]:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    info = distributed.setup(device="cpu")  # run_gloo's group
    got = []
    for overrides, _ in REFUSED:
        try:
            cfg = tiny_config("train.steps=2", *overrides)
            check = functools.partial(check_pretrain_resume, cfg=cfg, world_size=world)
            with run_directory(run, info, resume=True, overwrite=False, check=check):
                got.append(("opened", ""))
        except (ConfigError, RunDirError) as err:
            got.append((type(err).__name__, str(err)))
    try:  # and the trainer itself (which then tears the group down)
        pretrain(tiny_config("train.steps=2", "model.depth=6"), run, resume=True, progress=False)
        got.append(("trained", ""))
    except ConfigError as err:
        got.append((type(err).__name__, str(err)))
    faulthandler.cancel_dump_traceback_later()
    return got


@pytest.mark.distributed
def test_a_refused_resume_raises_on_every_rank(tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config("train.steps=2", "train.checkpoint_every=2"), run, progress=False)
    lock = RunLock(run).acquire()  # a live run's lock, held by another process than the ranks
    try:
        ranks = run_gloo(_refused_resumes, 2, str(run))
    finally:
        lock.release()
    main, other = ranks
    assert other == main  # the same exception, type and message, on both ranks
    assert len(main) == len(REFUSED) + 1
    for (kind, message), (_, want) in zip(main, [*REFUSED, REFUSED[0]], strict=True):
        assert kind in ("ConfigError", "RunDirError")
        assert re.search(want, message), (kind, message)
