"""levjepa.config: overrides are typed and validated; JSON round-trips are strict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from levjepa.config import ConfigError, apply_overrides, check, from_dict, to_dict


@dataclass(frozen=True)
class Inner:
    depth: int = 2
    mode: Literal["uniform", "tube"] = "uniform"
    scale: tuple[float, float] = (0.8, 1.0)

    def __post_init__(self) -> None:
        check(self.depth > 0, f"depth must be positive, got {self.depth}")


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    lr: float = 1e-3
    flag: bool = False
    sources: tuple[str, ...] = ("synthetic",)
    window: int | None = None
    inner: Inner = field(default_factory=Inner)


def test_overrides_parse_by_type():
    cfg = apply_overrides(
        Outer(),
        ["lr=4e-4", "flag=true", "sources=a,b", "window=8", "inner.depth=6", "inner.mode=tube", "inner.scale=0.5,0.9"],
    )
    assert cfg.lr == 4e-4 and cfg.flag is True and cfg.sources == ("a", "b") and cfg.window == 8
    assert cfg.inner == Inner(depth=6, mode="tube", scale=(0.5, 0.9))
    assert apply_overrides(cfg, ["window=none"]).window is None


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("nope=1", "valid keys here are"),
        ("inner.nope=1", "depth, mode, scale"),
        ("inner.mode=cube", "valid choices are uniform, tube"),
        ("lr=fast", "expected float"),
        ("flag=maybe", "expected a boolean"),
        ("inner=3", "is a section"),
        ("inner.depth=0", "depth must be positive"),
        ("lr", "key=value"),
    ],
)
def test_bad_overrides_raise_naming_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        apply_overrides(Outer(), [override])


def test_dict_round_trip_and_strictness():
    cfg = apply_overrides(Outer(), ["inner.depth=3", "sources=a,b"])
    assert from_dict(Outer, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match=r"inner\.typo"):
        from_dict(Outer, {"inner": {"typo": 1}})
    with pytest.raises(ConfigError, match="valid choices"):
        from_dict(Outer, {"inner": {"mode": "cube"}})


@dataclass(frozen=True)
class Coupled:
    dim: int = 768
    heads: int = 12

    def __post_init__(self) -> None:
        check(self.dim % self.heads == 0, f"dim={self.dim} not divisible by heads={self.heads}")


@dataclass(frozen=True)
class HasCoupled:
    model: Coupled = field(default_factory=Coupled)


def test_coupled_fields_can_be_overridden_in_any_order():
    for order in (["model.dim=32", "model.heads=2"], ["model.heads=2", "model.dim=32"]):
        assert apply_overrides(HasCoupled(), order).model == Coupled(dim=32, heads=2)
    with pytest.raises(ConfigError, match="not divisible"):
        apply_overrides(HasCoupled(), ["model.dim=32"])
    assert apply_overrides(HasCoupled(), ["model.dim=48", "model.dim=96"]).model.dim == 96
