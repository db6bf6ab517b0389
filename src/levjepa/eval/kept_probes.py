"""Keep the probes an evaluation trained: each one a classifier directory that ``levjepa classify`` runs.

``levjepa probe`` trains grids of attentive and linear probes and reports the one validation chose; with
the weights kept (``EvalConfig.keep_heads``) :func:`save_probes` writes, for each task and probe name::

    OUT/<task>/<probe>/                     the chosen probe (levjepa.formats.classifier's layout)
    OUT/<task>/<probe>-grid/<i>-lr<lr>-wd<wd>/  every probe of the grid (``keep_heads="all"``)

Each records the head (kind, sizes, what it reads), the label names, the protocol its scores were measured
with (size, frames, stride, segments × crops of the val/test views), how it was trained and scored (lr,
weight decay, val and test accuracy) and the encoder it reads (source, weights copy, fingerprint). kNN keeps
no weights of its own and is not saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.result import EvalResult
from levjepa.eval.trainer import GridResult
from levjepa.formats.classifier import ClassifierRecord, write_classifier
from levjepa.formats.load import LoadedEncoder
from levjepa.model.classifier import HeadConfig
from levjepa.weights import weights_fingerprint

__all__ = ["save_probes"]


def save_probes(
    result: EvalResult,
    encoder_name: str,
    loaded: LoadedEncoder,
    out: str | Path,
    *,
    protocol: ViewSpec,
    labels: Mapping[str, Sequence[str]],
    encoder_source: str,
) -> list[Path]:
    """Write every kept probe of ``encoder_name``'s column (see the module doc); returns the chosen probes'
    directories. ``labels``: task -> class names; ``encoder_source``: where ``classify`` reads the encoder."""
    fingerprint = weights_fingerprint(loaded.encoder)
    written = []
    for task, probes in result.results[encoder_name].items():
        for probe, res in probes.items():
            if not isinstance(res, GridResult) or not res.heads:
                continue
            head = HeadConfig(**res.head_fields, token_dtype="float16")  # the stores keep tokens in float16
            names = tuple(labels[task])[: head.num_classes]
            for i, state in res.heads.items():
                trained = {
                    "probe": probe,
                    "task": task,
                    "lr": res.lrs[i],
                    "weight_decay": res.weight_decays[i],
                    "epochs": res.epochs,
                    "val_acc": res.val_acc[i],
                    "test_acc": None if res.test_acc is None else res.test_acc[i],
                    "chosen": i == res.best,
                    "grid_index": i,
                }
                record = ClassifierRecord(
                    head, names, protocol, encoder_source, loaded.weights, fingerprint, trained=trained
                )
                if i == res.best:
                    written.append(write_classifier(Path(out) / task / probe, record, state))
                if len(res.heads) > 1:
                    name = f"{i}-lr{res.lrs[i]:g}-wd{res.weight_decays[i]:g}"
                    write_classifier(Path(out) / task / f"{probe}-grid" / name, record, state)
    return written
