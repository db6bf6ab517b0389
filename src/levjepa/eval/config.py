"""What a frozen evaluation runs: the probes by name, what each reads, and :class:`EvalConfig`.

A probe name is what a user asks for (``--probe attentive,linear,linear_cls,knn``); each reads one input of
a feature source (``levjepa.eval.source``) and, except kNN, trains one kind of stacked probe grid
(``levjepa.eval.probes``). The encoder has no absolute position embedding (3D RoPE), so mean-pooled patches
cannot say *where* or *in which frame* something is; the CLS, which the pretraining objective trains
directly and which attends every patch with relative positions, can. Reporting both linear readouts shows
which one carries a task.

What is evaluated and how — tasks, probes, budget, probe config, seed, device, batch size, feature cache, what
the attentive probe reads of the tokens (``tokens``: every token, or a compact store, ``levjepa.eval.compact``) —
is one frozen :class:`EvalConfig`, passed unchanged from ``levjepa.eval.harness.evaluate`` down to the probes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from levjepa.config import check
from levjepa.eval.compact import TokenCodec
from levjepa.eval.probes import ProbeConfig, ProbeKind, probe_config

__all__ = ["BUDGETS", "PROBES", "PROBE_INPUTS", "PROBE_KINDS", "PROBE_LABELS", "EvalConfig"]

PROBES = ("attentive", "linear", "linear_cls", "knn")
# what each probe reads and which probe model it trains (kNN trains none)
PROBE_INPUTS = {"attentive": "tokens", "linear": "mean", "linear_cls": "cls", "knn": "cls"}
PROBE_KINDS: dict[str, ProbeKind] = {"attentive": "attentive", "linear": "linear", "linear_cls": "linear"}
PROBE_LABELS = {"attentive": "attentive", "linear": "linear (mean)", "linear_cls": "linear (CLS)", "knn": "kNN (CLS)"}
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
    tokens: str = "full"  # what the attentive probe reads of the tokens: full or a compact codec (eval/compact.py)
    online: bool = False  # labelled files: tokens encoded on the fly every epoch, no token store (eval/online.py)

    def __post_init__(self) -> None:
        check(self.budget in BUDGETS, f"budget={self.budget!r}: valid choices are {', '.join(BUDGETS)}")
        check(len(self.probes) > 0, "eval: at least one probe")
        for p in self.probes:
            check(p in PROBES, f"probe {p!r}: valid choices are {', '.join(PROBES)}")
        check(self.keep_heads in ("none", "best", "all"), f"eval.keep_heads={self.keep_heads!r}: none, best, all")
        check(self.batch_size >= 1, f"eval.batch_size={self.batch_size}: must be >= 1")
        TokenCodec.parse(self.tokens)  # a bad codec name is refused here, in one line
        check(not (self.online and self.tokens != "full"), "eval: online tokens are never stored: drop --tokens")

    @property
    def codec(self) -> TokenCodec:
        return TokenCodec.parse(self.tokens)

    @property
    def probe_cfg(self) -> ProbeConfig:
        return self.probe if self.probe is not None else probe_config(self.budget)
