"""Two gloo ranks train exactly like one rank on the same global batch: every weight to 1e-5, token dropping on.

No parameter is exempt (the final LayerNorm has no bias whose gradient is structurally zero, so AdamW has no
rounding noise to amplify) and AdamW keeps its default eps.
"""

from __future__ import annotations

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
