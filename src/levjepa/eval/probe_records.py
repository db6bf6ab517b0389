"""Finished probes kept beside the feature stores, so that a stopped evaluation continues from them.

A probe of one encoder on a labelled task (``levjepa.eval.dataset_task``) trains from that encoder's feature
stores. Once a probe is trained on every label set, its results — the grid's accuracies, and the weights of
the heads kept (``keep_heads``) — are written under ``FEATURES/probe-results/<key>.json`` (the heads beside it
in ``<key>.safetensors``), each file atomically and the JSON last, so a record either is whole or is not
there. ``key`` hashes everything the results depend on: the stores read (their names hold the encoder's
function fingerprint, the split file and every view setting), the probe's name and config, the probe seeds,
the label sets and their class counts, the token codec, online tokens or not, which heads are kept, the
device and levjepa's version (a probe fixed in a later release is trained again). ``levjepa probe`` stopped
by a signal (exit 75) and run again reads the finished probes back instead of training them again, and ends
with the table of an uninterrupted run; any other setting has another key and trains afresh. A record that
cannot be read is trained again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from torch import Tensor

from levjepa.config import to_dict
from levjepa.eval.config import EvalConfig
from levjepa.eval.knn import KnnResult
from levjepa.eval.result import Result
from levjepa.eval.trainer import GridResult
from levjepa.version import __version__
from levjepa.weights import WeightsError, load_tensors, read_json, save_tensors, write_json

__all__ = ["RECORDS", "ProbeRecords"]

RECORDS = "probe-results"  # the folder under the feature stores' folder


def _grid(r: GridResult, tensors: dict[str, Tensor], prefix: str) -> dict[str, Any]:
    """``r``'s fields as JSON, its kept heads' tensors added to ``tensors`` under ``prefix``."""
    for i, state in r.heads.items():
        tensors.update({f"{prefix}{i}.{k}": v for k, v in state.items()})
    out = {f.name: getattr(r, f.name) for f in fields(GridResult)}
    out.update(heads=sorted(r.heads), seeds=[_grid(s, tensors, f"{prefix}seed{j}.") for j, s in enumerate(r.seeds)])
    return out


def _knn(r: KnnResult) -> dict[str, Any]:
    return {"kind": "knn", **{f.name: getattr(r, f.name) for f in fields(KnnResult)}}


def _grid_back(d: dict[str, Any], tensors: Mapping[str, Tensor], prefix: str) -> GridResult:
    heads = {}
    for i in d["heads"]:
        head = f"{prefix}{i}."
        heads[int(i)] = {k[len(head) :]: v for k, v in tensors.items() if k.startswith(head)}
    seeds = [_grid_back(s, tensors, f"{prefix}seed{j}.") for j, s in enumerate(d["seeds"])]
    return GridResult(**{**d, "heads": heads, "seeds": seeds})


class ProbeRecords:
    """The finished probes of one encoder's stores (module doc): :meth:`load` / :meth:`save` by :meth:`key`."""

    def __init__(self, folder: str | Path, stores: Mapping[str, str | Path]) -> None:
        self.folder = Path(folder)
        self.stores = {split: Path(p).name for split, p in stores.items()}  # what the features are

    def key(self, probe: str, cfg: EvalConfig, classes: Mapping[str, int]) -> str:
        """A name for the results of ``probe`` under ``cfg`` on these stores' label sets ``classes``."""
        basis = {
            "stores": self.stores,
            "probe": probe,
            "probe_config": to_dict(cfg.probe_cfg),
            "seed": cfg.seed,
            "seeds": cfg.seeds,
            "classes": dict(classes),
            "tokens": cfg.tokens,
            "online": cfg.online,
            "keep_heads": cfg.keep_heads,
            "device": str(cfg.device),
            "levjepa": __version__,
        }
        text = json.dumps(basis, sort_keys=True, default=str)
        return f"{probe}-{hashlib.sha1(text.encode()).hexdigest()[:16]}"

    def load(self, key: str) -> dict[str, Result] | None:
        """label set -> result, as :meth:`save` wrote them; None when there is no whole, readable record."""
        path = self.folder / f"{key}.json"
        if not path.is_file():
            return None
        try:
            record = read_json(path)
            heads = self.folder / f"{key}.safetensors"
            tensors = load_tensors(heads)[0] if heads.is_file() else {}
            out: dict[str, Result] = {}
            for task, d in record["results"].items():
                if d["kind"] == "knn":
                    out[task] = KnnResult(**{k: v for k, v in d.items() if k != "kind"})
                else:
                    out[task] = _grid_back(d, tensors, f"{task}/")
            return out
        except (WeightsError, KeyError, TypeError, ValueError):
            return None  # unreadable: trained again

    def save(self, key: str, results: Mapping[str, Result]) -> None:
        """Write ``results`` (label set -> result): the heads first, the JSON that marks the record whole last."""
        tensors: dict[str, Tensor] = {}
        record = {
            task: _knn(r) if isinstance(r, KnnResult) else _grid(r, tensors, f"{task}/") for task, r in results.items()
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        if tensors:
            save_tensors(self.folder / f"{key}.safetensors", tensors)
        write_json(self.folder / f"{key}.json", {"results": record}, indent=None)
