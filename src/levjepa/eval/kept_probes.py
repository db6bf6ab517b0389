"""Keep the probes an evaluation trained: each one a classifier directory that ``levjepa classify`` runs.

``levjepa probe`` trains grids of attentive and linear probes and reports the one validation chose; with
the weights kept (``EvalConfig.keep_heads``) :func:`save_probes` writes, for each task and probe name::

    OUT/<task>/<probe>/                     the chosen probe (levjepa.formats.reading.classifier's layout)
    OUT/<task>/<probe>-grid/<i>-lr<lr>-wd<wd>/  every probe of the grid (``keep_heads="all"``)

Each records the head (kind, sizes, what it reads), the label names, the protocol its scores were measured
with (size, frames, stride or rate, segments × crops of the val/test views), how it was trained and scored
(lr, weight decay, val and test accuracy, the task's split files) and the encoder it reads (source, weights
copy, fingerprint, and the blocks it reads when they are not the last alone: ``probe --layers``). kNN keeps
no weights of its own and is not saved.

A task is named by its files (``levjepa.eval.dataset_task.task_name``, or ``probe --name``), so two tasks keep
two folders; a folder that holds the probes of another task — other split files — is never overwritten:
:func:`check_probe_dir` refuses it in one line before anything is computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from levjepa.config import ConfigError
from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.result import EvalResult
from levjepa.eval.trainer import GridResult
from levjepa.formats.reading.classifier import CLASSIFIER, ClassifierRecord, read_classifier, write_classifier
from levjepa.formats.reading.load import LoadedEncoder
from levjepa.model.classifier import HeadConfig
from levjepa.model.fingerprint import function_fingerprint

__all__ = ["check_probe_dir", "save_probes"]


def save_probes(
    result: EvalResult,
    encoder_name: str,
    loaded: LoadedEncoder,
    out: str | Path,
    *,
    protocol: ViewSpec,
    labels: Mapping[str, Sequence[str]],
    encoder_source: str,
    files: Mapping[str, str] | None = None,
    tokens: str = "full",
) -> list[Path]:
    """Write every kept probe of ``encoder_name``'s column (see the module doc); returns the chosen probes'
    directories. ``labels``: task -> class names; ``encoder_source``: where ``classify`` reads the encoder;
    ``files``: split -> file of a labelled task (recorded, :func:`check_probe_dir` compares them); ``tokens``:
    the token codec the attentive probe was trained on (``levjepa.features.compact``), which ``classify`` applies."""
    fingerprint = function_fingerprint(loaded.encoder)
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
                    **({"task_files": dict(files)} if files else {}),
                }
                record = ClassifierRecord(
                    head,
                    names,
                    protocol,
                    encoder_source,
                    loaded.weights,
                    fingerprint,
                    trained=trained,
                    tokens=tokens if head.input == "tokens" else "full",
                    readout_layers=loaded.encoder.cfg.readout_layers,
                )
                if i == res.best:
                    written.append(write_classifier(Path(out) / task / probe, record, state))
                if len(res.heads) > 1:
                    name = f"{i}-lr{res.lrs[i]:g}-wd{res.weight_decays[i]:g}"
                    write_classifier(Path(out) / task / f"{probe}-grid" / name, record, state)
    return written


def check_probe_dir(root: str | Path, task: str, files: Mapping[str, str], *, columns: Sequence[str] = ()) -> None:
    """Refuse (``ConfigError``, one line) to keep the probes of the labelled task ``task`` (split -> file) where
    ``root`` already holds the probes of another task under that name: different files, or none recorded."""
    weights = [c.removeprefix("pretrained-") for c in columns]
    roots = [Path(root)] if len(columns) <= 1 else [Path(root) / w for w in weights]
    want = {s: str(Path(p).expanduser().resolve()) for s, p in files.items()}
    for base in roots:
        folder = base / task
        for record in sorted(folder.glob(f"*/{CLASSIFIER}")) if folder.is_dir() else []:
            held = read_classifier(record.parent).trained.get("task_files")
            got = {s: str(Path(p).expanduser().resolve()) for s, p in (held or {}).items()}
            if got != want:
                split = next(s for s in ("train", "val", "test", *want, *got) if got.get(s) != want.get(s))
                what = f"probes whose {split} file is {got.get(split)}" if got else "probes of another task"
                raise ConfigError(
                    f"{folder} holds {what}, not {want.get(split, 'none')}: pass --name NAME to keep these probes "
                    "beside them, --probes-dir DIR to keep them elsewhere, or --no-save"
                )
