"""A tiny, fast pretraining config for the training tests (2-layer dim-32 encoder, 16-px synthetic clips)."""

from __future__ import annotations

from levjepa.config import apply_overrides
from levjepa.presets import preset
from levjepa.train.config import PretrainConfig

TINY = [
    "model.dim=32",
    "model.depth=2",
    "model.heads=2",
    "model.patch_size=8",
    "model.proj_hidden=64",
    "model.proj_dim=32",
    "data.synthetic.size=32",
    "data.synthetic.num_frames=4",
    "data.num_frames=4",
    "data.global_size=32",
    "data.local_size=16",
    "data.num_local=2",
    "data.synthetic.num_train=64",
    "data.synthetic.num_val=16",
    "data.synthetic.num_test=16",
    "data.batch_size=8",
    "data.num_workers=0",
    "train.batch_size=8",
    "train.log_every=2",
    "train.eval_at_end=false",
    "train.threads=1",
    "train.ema_decay=0.99",  # what the EMA tests were written at (demo-cpu itself takes 0.95)
    "objective.num_directions=64",
]


def tiny_config(*overrides: str) -> PretrainConfig:
    return apply_overrides(preset("demo-cpu"), [*TINY, *overrides])
