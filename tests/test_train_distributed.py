"""Two gloo ranks train exactly like one rank on the same global batch: every weight to 1e-5, token dropping on;
and a run started on two ranks resumes on one (accumulating two micro-batches) along the same trajectory.

No parameter is exempt (the final LayerNorm has no bias whose gradient is structurally zero, so AdamW has no
rounding noise to amplify) and AdamW keeps its default eps.
"""

from __future__ import annotations

import json

import pytest
import torch

from dist_utils import run_gloo
from levjepa.train.loop import pretrain
from levjepa.weights import load_tensors
from train_utils import tiny_config

OVERRIDES = (
    "train.steps=3",
    "train.checkpoint_every=3",
    "train.batch_size=16",
)


def _rank_run(rank: int, world: int, run_dir: str):
    cfg = tiny_config(*OVERRIDES, f"data.batch_size={16 // world}")
    pretrain(cfg, run_dir, progress=False)
    return None


@pytest.mark.distributed
def test_two_ranks_equal_one_rank_with_the_same_global_batch(tmp_path):
    # token dropping on (rho = 0.75): each clip's kept tokens are keyed by the clip, not the rank
    pretrain(tiny_config(*OVERRIDES, "data.batch_size=16"), tmp_path / "one", progress=False)
    run_gloo(_rank_run, 2, str(tmp_path / "two"))
    a, _ = load_tensors(tmp_path / "one" / "checkpoints" / "step_000003" / "model.safetensors")
    b, _ = load_tensors(tmp_path / "two" / "checkpoints" / "step_000003" / "model.safetensors")
    assert a.keys() == b.keys()
    moved = 0.0
    init = tiny_config(*OVERRIDES)
    from levjepa.train.loop import build_models

    enc, proj = build_models(init, seed=0)
    start = {
        **{f"encoder.{k}": v for k, v in enc.state_dict().items()},
        **{f"projector.{k}": v for k, v in proj.state_dict().items()},
    }
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5, msg=key)
        if a[key].is_floating_point():
            moved = max(moved, float((a[key] - start[key]).abs().max()))
    assert moved > 1e-3  # the parameters did change: the comparison is not vacuous


RESUME = (
    "train.batch_size=16",
    "data.batch_size=8",  # 2 ranks x 8 (one pass each, DDP), or 1 rank accumulating 2 x 8 (GradCache)
    "train.checkpoint_every=3",
    "train.log_every=1",
    "optim.schedule=flat",  # the learning rate of a step does not depend on train.steps
)


def _rank_run_steps(rank: int, world: int, run_dir: str, steps: int):
    pretrain(tiny_config(*RESUME, f"train.steps={steps}"), run_dir, progress=False)


@pytest.mark.distributed
def test_a_run_started_on_two_ranks_resumes_on_one_along_the_same_trajectory(tmp_path):
    # 64 clips, 16 per step: 6 steps cross an epoch boundary; token dropping on (rho = 0.75)
    ref = tmp_path / "one"
    pretrain(tiny_config(*RESUME, "data.batch_size=16", "train.steps=6"), ref, progress=False)
    run = tmp_path / "moved"
    run_gloo(_rank_run_steps, 2, str(run), 3)
    pretrain(tiny_config(*RESUME, "train.steps=6"), run, resume=True, progress=False)  # 1 rank, 2 micro-batches

    def metrics(path):
        return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]

    got, want = metrics(run), metrics(ref)
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, 7))
    for g, w in zip(got, want, strict=True):
        for key in ("loss", "invariance", "sigreg", "grad_norm"):  # the embedding monitors are per rank
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-5), (g["step"], key)
    for name in ("model.safetensors", "ema.safetensors"):
        a, _ = load_tensors(ref / "checkpoints" / "step_000006" / name)
        b, _ = load_tensors(run / "checkpoints" / "step_000006" / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-5, msg=f"{name}: {key}")
