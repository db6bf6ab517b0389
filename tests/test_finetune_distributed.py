"""Fine-tuning on 2 gloo ranks computes the weights of 1 rank accumulating 2 micro-batches of the same size,
with every source of randomness on (mixup, drop-path, half the tokens dropped, the clips' augmentation); and a
refused start ends both ranks.

The reference accumulates 2 micro-batches, not one micro-batch of the whole batch: mixup mixes a micro-batch
with its own reverse, and token dropping draws a micro-batch's clips from one generator (the classifier's
forward takes no per-clip keys), so what stays the same on any number of ranks is a step's global
micro-batches: micro-batch ``g`` holds the same clips and draws from ``(seed, purpose, step, g)`` whichever
rank computes it (``levjepa.data.labelled_stream.rank_positions``, ``loop.train_step``).
"""

from __future__ import annotations

import faulthandler
import json
from pathlib import Path

import pytest
import torch

import levjepa.finetune.loop as ft_loop
from dist_utils import run_gloo
from levjepa import distributed
from levjepa.config import apply_overrides
from levjepa.data.labelled_stream import rank_positions
from levjepa.finetune import FinetuneConfig, finetune
from levjepa.threads import torch_threads
from levjepa.train.run_dir import RunDirError
from levjepa.weights import load_tensors
from test_classify import write_index
from test_export import make_run_dir
from test_finetune import RECIPE as FINETUNE_RECIPE

# test_finetune's tiny recipe (every augmentation and source of randomness on; micro_batch=2 there: 1 rank
# runs 2 micro-batches of 2, 2 ranks 1 each), one step shorter, evaluated and checkpointed at its end
RECIPE = [*FINETUNE_RECIPE, "steps=3", "eval_every=3", "checkpoint_every=3", "device=cpu"]
WATCHDOG_S = 120  # a refused start takes seconds; a rank left waiting in DDP's first collective waits forever


def _config(tmp_path: Path) -> FinetuneConfig:
    source = make_run_dir(tmp_path, steps=(5,))
    media = tmp_path / "media"
    task = tuple(str(write_index(media, s, n, seed)) for s, n, seed in (("train", 6, 0), ("val", 3, 1)))
    return apply_overrides(FinetuneConfig(source=str(source), task=task), RECIPE)


def _rank_finetune(rank: int, world: int, cfg: FinetuneConfig, out: str, busy: str) -> tuple[str, str]:
    info = distributed.setup(device="cpu")  # run_gloo's group, torn down by run_gloo
    ft_loop._finetune(cfg, Path(out), info, resume=False, progress=False)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:  # BUSY exists and is not empty: the main rank refuses it, and every rank must raise
        ft_loop._finetune(cfg, Path(busy), info, resume=False, progress=False)
        refused = ("started", "")
    except RunDirError as err:
        refused = (type(err).__name__, str(err))
    faulthandler.cancel_dump_traceback_later()
    return refused


def test_rank_positions_split_each_step_into_the_same_global_micro_batches():
    one = rank_positions(range(2), 8, 2, 4, 0, 1)  # 1 rank: 4 micro-batches of 2 per step
    assert sorted(one) == list(range(16))
    micro = [one[i : i + 2] for i in range(0, 16, 2)]
    for world in (2, 4):
        for rank in range(world):
            got = rank_positions(range(2), 8, 2, 4 // world, rank, world)
            assert all(p % world == rank for p in got)
            for step in range(2):
                for m in range(4 // world):  # rank's m-th micro-batch is global micro-batch m * world + rank
                    start = (step * (4 // world) + m) * 2
                    assert got[start : start + 2] == micro[step * 4 + m * world + rank]


@pytest.mark.distributed
def test_two_ranks_fine_tune_like_one_rank_accumulating_two_micro_batches(tmp_path):
    cfg = _config(tmp_path)
    with torch_threads(1):
        finetune(cfg, tmp_path / "one")  # 1 rank, 2 micro-batches of 2
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "kept.txt").write_text("another run's\n")
    ranks = run_gloo(_rank_finetune, 2, cfg, str(tmp_path / "two"), str(busy))

    assert ranks[0] == ranks[1] and ranks[0][0] == "RunDirError" and "already exists" in ranks[0][1]
    assert sorted(p.name for p in busy.iterdir()) == ["kept.txt"]
    a, _ = load_tensors(tmp_path / "one/checkpoints/step_000003/model.safetensors")
    b, _ = load_tensors(tmp_path / "two/checkpoints/step_000003/model.safetensors")
    start, _ = load_tensors(Path(cfg.source) / "checkpoints/step_000005/ema.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=key)
    moved = max(float((a[k] - start[k]).abs().max()) for k in a if k in start)
    assert moved > 1e-3  # the encoder itself trained: the comparison is not vacuous

    def losses(out):
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"]) for r in lines if "loss" in r]

    got, want = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert [s for s, _ in got] == [s for s, _ in want] == [1, 2, 3]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5)  # the mean over both ranks
