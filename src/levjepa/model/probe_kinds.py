"""The kinds of probe head, one registry: a new kind is one class here (or anywhere, registered with
:func:`register`) and its test.

A **kind** (:class:`HeadKind`) says everything the rest of levjepa asks of a head:

* ``probes`` — the probe names it answers to (what ``--probe`` takes and ``levjepa.eval.config`` lists), each
  with the input it reads of a feature source (``tokens`` [S·(1+L), D]: CLS then every patch token; ``mean``:
  the patch tokens averaged; ``cls``) and its label in the results table. The linear kind answers to two,
  ``linear`` (mean) and ``linear_cls``;
* :meth:`HeadKind.build` — the stacked grid of ``G`` heads (``levjepa.model.probe_heads``) that the frozen
  probes train (``levjepa.eval.trainer``), and with ``G = 1`` the single head that a kept probe, ``finetune``
  and ``classify`` run (``levjepa.model.classifier.build_head``);
* its training defaults — which (lr, weight decay) grid and epoch count of ``levjepa.eval.probes.ProbeConfig``
  it trains with (:attr:`HeadKind.settings`: the fields ``{settings}lrs``, ``{settings}weight_decays``,
  ``{settings}epochs``), whether its inputs are standardised with the training split's mean and std first
  (:attr:`HeadKind.standardize`), and the ``HeadConfig`` fields that rebuild one row of its grid
  (:meth:`HeadKind.head_fields`).

kNN is a probe without a head (``levjepa.eval.knn``), so it is no kind; ``levjepa.eval.config`` lists it after
the kinds' probes. Registration order is the order of ``--probe all`` and of the results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch
from torch import nn

from levjepa.model.probe_heads import AttentiveProbeGrid, LinearProbeGrid

__all__ = ["KINDS", "HeadKind", "ProbeSpec", "head_kind", "kind_names", "probe_specs", "register"]

# name -> the kind; read through the functions below (a test may register a kind into a copy of it)
KINDS: dict[str, HeadKind] = {}


class ProbeSpec(NamedTuple):
    """What a probe name means: the kind it trains, the input it reads, its label in the results table."""

    kind: str
    input: str
    label: str


class HeadKind:
    """One kind of probe head (module doc). Subclass it, set the class attributes, write :meth:`build`, and
    decorate the class with :func:`register`."""

    name: ClassVar[str]  # what HeadConfig.kind and classifier.json say
    probes: ClassVar[Mapping[str, tuple[str, str]]]  # probe name -> (input: tokens, mean or cls; table label)
    settings: ClassVar[str] = "linear_"  # ProbeConfig's fields it trains with: "" (lrs, ...) or "linear_" (...)
    standardize: ClassVar[bool] = False  # its grid has set_standardizer(mean, std) of the training inputs

    @property
    def inputs(self) -> tuple[str, ...]:
        """What a head of this kind may read (the inputs of its probes, without repeats)."""
        return tuple(dict.fromkeys(inp for inp, _ in self.probes.values()))

    def build(
        self,
        num_probes: int,
        dim: int,
        num_classes: int,
        *,
        depth: int = 1,
        num_heads: int = 0,
        mlp_ratio: float = 4.0,
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> nn.Module:
        """``num_probes`` stacked heads reading ``dim``-wide inputs: ``[B, ...] -> logits [G, B, num_classes]``.
        A kind takes the sizes it has and ignores the others (a linear head has no depth)."""
        raise NotImplementedError(f"probe kind {self.name!r}: build() is not written")

    def head_fields(self, grid: nn.Module) -> dict[str, Any]:
        """``HeadConfig`` fields, besides kind, input, dim, classes, mlp_ratio and init_std, that rebuild one
        row of ``grid``."""
        return {}

    def result_kind(self, depth: int) -> str:
        """What a result of this kind is called (``GridResult.kind``) with ``ProbeConfig.depth``."""
        return self.name

    def grid(self, cfg: Any) -> list[tuple[float, float]]:
        """(lr, weight decay) of each probe of the grid of ``cfg`` (a ``ProbeConfig``), weight decay major
        (V-JEPA's order)."""
        lrs, wds = getattr(cfg, f"{self.settings}lrs"), getattr(cfg, f"{self.settings}weight_decays")
        return [(lr, wd) for wd in wds for lr in lrs]

    def epochs(self, cfg: Any) -> int:
        """The epochs the grid of ``cfg`` (a ``ProbeConfig``) trains."""
        return int(getattr(cfg, f"{self.settings}epochs"))


K = TypeVar("K", bound=type[HeadKind])


def register(cls: K) -> K:
    """Class decorator: ``cls`` becomes the kind ``cls.name`` (its probe names must be new)."""
    kind = cls()
    taken = {p for k in KINDS.values() if k.name != cls.name for p in k.probes}
    clash = sorted(taken & set(cls.probes)) + (["knn"] if "knn" in cls.probes else [])
    if clash:
        raise ValueError(f"probe kind {cls.name!r}: probe name(s) {', '.join(clash)} are taken")
    KINDS[cls.name] = kind
    return cls


def head_kind(name: str) -> HeadKind:
    """The kind ``name``; a ``ValueError`` listing the valid ones otherwise."""
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"probe kind {name!r}: valid choices are {', '.join(kind_names())}")
    return kind


def kind_names() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(KINDS)


def probe_specs() -> dict[str, ProbeSpec]:
    """Every probe name of every kind -> its ``(kind, input, label)``, in registration order."""
    return {p: ProbeSpec(k.name, inp, label) for k in KINDS.values() for p, (inp, label) in k.probes.items()}


@register
class Attentive(HeadKind):
    """The attentive probe: one learnable query cross-attending every token (V-JEPA's protocol; ``depth = 4``:
    V-JEPA 2's variant). ``levjepa.eval.probes``' module doc has the architecture."""

    name = "attentive"
    probes: ClassVar[Mapping[str, tuple[str, str]]] = {"attentive": ("tokens", "attentive")}
    settings = ""  # lrs, weight_decays, epochs: V-JEPA 2's attentive grid

    def build(
        self,
        num_probes: int,
        dim: int,
        num_classes: int,
        *,
        depth: int = 1,
        num_heads: int = 0,
        mlp_ratio: float = 4.0,
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> nn.Module:
        return AttentiveProbeGrid(
            num_probes,
            dim,
            num_classes,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            init_std=init_std,
            generator=generator,
        )

    def head_fields(self, grid: nn.Module) -> dict[str, Any]:
        return {"depth": int(getattr(grid, "depth")), "num_heads": int(getattr(grid, "num_heads"))}  # noqa: B009

    def result_kind(self, depth: int) -> str:
        return self.name if depth == 1 else f"{self.name}{depth}"


@register
class Linear(HeadKind):
    """The linear probe on standardised pooled features: the patch tokens averaged, or CLS."""

    name = "linear"
    probes: ClassVar[Mapping[str, tuple[str, str]]] = {
        "linear": ("mean", "linear (mean)"),
        "linear_cls": ("cls", "linear (CLS)"),
    }
    settings = "linear_"  # linear_lrs, linear_weight_decays, linear_epochs
    standardize = True

    def build(
        self,
        num_probes: int,
        dim: int,
        num_classes: int,
        *,
        depth: int = 1,
        num_heads: int = 0,
        mlp_ratio: float = 4.0,
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> nn.Module:
        return LinearProbeGrid(num_probes, dim, num_classes, generator=generator)
