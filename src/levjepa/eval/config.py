"""What a frozen evaluation runs: the probes by name, what each reads, and :class:`EvalConfig`.

A probe name is what a user asks for (``--probe attentive,linear,linear_cls,knn``); each reads one input of
a feature source (``levjepa.eval.source``) and, except kNN, trains one kind of stacked probe grid
(``levjepa.eval.probes``). The names, what each reads and which kind it trains come from the one registry of
probe kinds, ``levjepa.model.probe_kinds`` (a kind registered there is a probe here); kNN, which trains no
head, comes last. ``PROBE_INPUTS``, ``PROBE_KINDS`` and ``PROBE_LABELS`` are read-only views of that registry.
The encoder has no absolute position embedding (3D RoPE), so mean-pooled patches
cannot say *where* or *in which frame* something is; the CLS, which the pretraining objective trains
directly and which attends every patch with relative positions, can. Reporting both linear readouts shows
which one carries a task.

What is evaluated and how — tasks, probes, budget, probe config, seed, device, batch size, feature cache, what
the attentive probe reads of the tokens (``tokens``: every token, or a compact store, ``levjepa.features.compact``) —
is one frozen :class:`EvalConfig`, passed unchanged from ``levjepa.eval.harness.evaluate`` down to the probes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from levjepa.config import check
from levjepa.eval.probes import ProbeConfig, probe_config
from levjepa.features.compact import TokenCodec
from levjepa.model.probe_kinds import ProbeSpec, probe_specs

__all__ = [
    "BUDGETS",
    "PROBES",
    "PROBE_INPUTS",
    "PROBE_KINDS",
    "PROBE_LABELS",
    "EvalConfig",
    "probe_names",
    "probe_spec",
]

KNN = ProbeSpec("", "cls", "kNN (CLS)")  # the probe without a head (levjepa.eval.knn): no kind


def probe_names() -> tuple[str, ...]:
    """Every probe name: the registered kinds' (``levjepa.model.probe_kinds``, in registration order), then knn."""
    return (*probe_specs(), "knn")


def probe_spec(name: str) -> ProbeSpec:
    """What probe ``name`` trains, reads and is called; a ``ConfigError`` listing the valid names otherwise."""
    specs = {**probe_specs(), "knn": KNN}
    check(name in specs, f"probe {name!r}: valid choices are {', '.join(specs)}")
    return specs[name]


class _RegistryView(Mapping[str, str]):
    """probe name -> one field of its :class:`ProbeSpec`, read from the registry at every lookup."""

    def __init__(self, field: Callable[[ProbeSpec], str], knn: bool) -> None:
        self._field, self._knn = field, knn

    def _names(self) -> tuple[str, ...]:
        return probe_names() if self._knn else tuple(probe_specs())

    def __getitem__(self, name: str) -> str:
        if name not in self._names():
            raise KeyError(name)
        return self._field(probe_spec(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


PROBES = probe_names()  # the built-in probes, the default of EvalConfig.probes
PROBE_INPUTS: Mapping[str, str] = _RegistryView(lambda s: s.input, knn=True)  # what each probe reads
PROBE_KINDS: Mapping[str, str] = _RegistryView(lambda s: s.kind, knn=False)  # the kind each trains (kNN none)
PROBE_LABELS: Mapping[str, str] = _RegistryView(lambda s: s.label, knn=True)  # its name in the results table
BUDGETS = ("demo", "full")


@dataclass(frozen=True)
class EvalConfig:
    """How frozen encoders are evaluated on a task: the one object the harness and the probes take."""

    tasks: tuple[str, ...] = ()  # which label sets of the task to probe; () = all of them
    probes: tuple[str, ...] = PROBES  # attentive (every token), linear (mean-pooled patches), linear_cls, knn (CLS)
    budget: Literal["demo", "full"] = "demo"  # the probe grid and (built-in benchmark) the split sizes
    probe: ProbeConfig | None = None  # how probes train; None: probe_config(budget)
    seed: int = 0  # probe initialisation and batch order, the same for every encoder (columns differ by it only)
    device: str = "cpu"
    batch_size: int = 8  # clips per encoder forward
    cache_dir: str | None = None  # feature cache, keyed by the weights and the data
    progress: bool = False
    title: str = ""  # what the table's caption calls the evaluation
    keep_heads: Literal["none", "best", "all"] = "none"  # results also hold the chosen (or every) probe's weights
    tokens: str = "full"  # what the attentive probe reads of the tokens: full or a compact codec (features/compact.py)
    online: bool = False  # labelled files: tokens encoded on the fly every epoch, no token store (eval/online.py)
    seeds: int = 1  # probe seeds seed..seed+seeds-1 in one pass, each its own run; mean ± sd reported

    @property
    def reads_tokens(self) -> bool:
        """Whether a probe of this evaluation reads every token (the attentive probe: a token store)."""
        return any(probe_spec(p).input == "tokens" for p in self.probes)

    def __post_init__(self) -> None:
        check(self.budget in BUDGETS, f"budget={self.budget!r}: valid choices are {', '.join(BUDGETS)}")
        check(len(self.probes) > 0, "eval: at least one probe")
        for p in self.probes:
            probe_spec(p)  # a name that no kind registered is refused, with the valid ones
        check(self.keep_heads in ("none", "best", "all"), f"eval.keep_heads={self.keep_heads!r}: none, best, all")
        check(self.batch_size >= 1, f"eval.batch_size={self.batch_size}: must be >= 1")
        check(self.seeds >= 1, f"eval.seeds={self.seeds}: must be >= 1")
        TokenCodec.parse(self.tokens)  # a bad codec name is refused here, in one line
        check(not (self.online and self.tokens != "full"), "eval: online tokens are never stored: drop --tokens")

    @property
    def codec(self) -> TokenCodec:
        return TokenCodec.parse(self.tokens)

    @property
    def probe_cfg(self) -> ProbeConfig:
        return self.probe if self.probe is not None else probe_config(self.budget)
