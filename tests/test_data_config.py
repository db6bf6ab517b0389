"""Data configs round-trip through JSON and command-line overrides, and bad values fail where they are set,
naming the field, the value and what would be valid."""

from __future__ import annotations

import json

import pytest

from levjepa.config import ConfigError, apply_overrides, from_dict, to_dict
from levjepa.data import DataConfig, SyntheticConfig


def test_round_trip_through_json_and_overrides():
    cfg = DataConfig(sources=("synthetic", "/data/k400.csv"), weights=(1.0, 2.0), target_fps=7.5)
    assert from_dict(DataConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg
    new = apply_overrides(
        cfg,
        [
            "num_local=10",
            "global_scale=0.5,1.0",
            "target_fps=none",
            "short_videos=skip",
            "synthetic.size=96",
            "synthetic.image_source=digits",
            "synthetic.fashion_mnist_dir=/tmp/fm",
        ],
    )
    assert new.num_local == 10 and new.global_scale == (0.5, 1.0) and new.target_fps is None
    assert new.short_videos == "skip" and new.synthetic == SyntheticConfig(
        size=96, image_source="digits", fashion_mnist_dir="/tmp/fm"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["sources=a,b", "weights=1.0"], "expected none or one per source"),
        (["sources=a,b", "weights=1,-1"], "every weight must be > 0"),
        (["local_scale=0.5,0.2"], "data.local_scale=(0.5, 0.2)"),
        (["jitter_p=1.5"], "data.jitter_p=1.5: expected a probability"),
        (["hue=0.7"], "data.hue=0.7"),
        (["short_videos=drop"], "valid choices are pad, skip"),
        (["num_global=0"], "data.num_global=0: expected >= 1"),
        (["synthetic.friction=1.5"], "synthetic.friction=1.5"),
        (["synthetic.image_source=mnist"], "valid choices are auto, fashion-mnist, digits"),
    ],
)
def test_bad_values_name_the_field_and_the_valid_range(overrides, message):
    with pytest.raises(ConfigError) as err:
        apply_overrides(DataConfig(), overrides)
    assert message in str(err.value)
