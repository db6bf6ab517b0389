"""The fill job of a feature set, written once (``feature_set.py`` is the format it fills).

Both row cutters — the probes' stores (``store.py``: file × segment × crop, or K training views) and extraction
(``extract.py``: file × window, streaming included) — run :func:`fill`: open the folder against the manifest
(:func:`manifest`; ``feature_set.open_for_writing`` continues the same job and refuses another), take this rank's
units not done, decode the files in workers (``levjepa.data.workers.safe_map``: a bad file reported and skipped),
let the cutter say what each file's rows are (:class:`Cutter`), encode them ``batch_size`` at a time through its
forward, write the units whole (``feature_set.Unit``) and finish (``feature_set.finish``).

**Units, ranks, resume**, two rules. :class:`FileUnits`: units of consecutive files (a store's shards of
``shard_items`` files; ``per_video``: one file each); unit ``k`` on rank ``k mod world_size``, its bytes
independent of the rank count; a restart skips the done units and clears what a killed job left of the others.
:class:`RowUnits`: shards of ``shard_rows`` rows (one process); the done shards are a prefix, a restart continues
from the file of the last kept row (its kept rows computed again, not written twice) and drops later shards.

**Batches** hold rows of one clip shape, encoded when full, before a row the cutter computed itself (streaming),
before a bad file's report and when a file unit closes: rows keep the order of the files, a report lands in the
unit of the rows before it. Per-row features do not depend on the batch on the CPU.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from levjepa import distributed
from levjepa.data import MediaItem
from levjepa.data.progress import Progress
from levjepa.data.sources import items_hash
from levjepa.data.workers import safe_map
from levjepa.features.feature_set import (
    VERSION,
    Unit,
    clear_unit,
    finish,
    open_for_writing,
    outputs,
    read_manifest,
    unit_done,
    unit_index,
)
from levjepa.model.fingerprint import function_fingerprint
from levjepa.model.vit import VideoEncoder
from levjepa.train.preemption import stop_now_on_signals

__all__ = ["Cutter", "FileUnits", "RowUnits", "fill", "manifest"]

Row = tuple[dict[str, Any], Tensor | dict[str, Tensor]]  # index fields; a clip to encode, or the row's arrays


def manifest(
    cutter: str, layout: str, config: dict[str, Any], encoder: VideoEncoder, items: list[MediaItem]
) -> dict[str, Any]:
    """The manifest of a job (``feature_set``'s ``store.json``): what its features depend on."""
    out = dict(version=VERSION, cutter=cutter, layout=layout, config=config, encoder=function_fingerprint(encoder))
    out.update(patch=encoder.cfg.patch_size, items=len(items), items_sha1=items_hash(items))
    if encoder.cfg.readout_layers is not None:  # said only when not the last block: a default manifest is unchanged
        out["readout_layers"] = list(encoder.cfg.readout_layers)
    return out


class Cutter(Protocol):
    """What a row is. ``rows(i, loaded)``: each row of file ``i`` (as the job's ``load`` decoded it) — its index
    fields (the core ``file, label, item`` first) and a clip to encode, or the row's arrays ``[1, ...]`` computed
    already; ``forward(clips)``: a batch of clips stacked ``[B, ...]`` encoded into the rows' arrays."""

    def rows(self, i: int, loaded: Any) -> Iterator[Row]: ...

    def forward(self, clips: Tensor) -> Mapping[str, Tensor | None]: ...


class FileUnits:
    """Units of ``size`` consecutive files, unit ``k`` named ``names[k]`` (default ``KKKKK``), split over ranks
    (``per_video_array``: what ``<name>.npy`` holds with the ``per_video`` layout)."""

    def __init__(
        self,
        out: Path,
        layout: str,
        files: int,
        size: int,
        names: list[str] | None = None,
        per_video_array: str = "mean",
    ) -> None:
        self.out, self.layout, self.files, self.size = out, layout, files, size
        self.names = names or [f"{k:05d}" for k in range(math.ceil(files / size))]
        self.per_video_array = per_video_array
        self.mine = range(distributed.rank(), len(self.names), distributed.world_size())
        self.rows, self.computed, self.skipped = 0, 0, len(self.mine)  # a complete set: every unit skipped
        self.open: dict[int, Unit] = {}
        self.left: dict[int, int] = {}

    def todo(self) -> list[int]:
        """This rank's files of the units not done (what a killed job left of those units cleared)."""
        todo = [k for k in self.mine if not unit_done(self.out, self.layout, self.names[k])]
        for k in todo:
            clear_unit(self.out, self.layout, self.names[k])
        self.computed, self.skipped = len(todo), len(self.mine) - len(todo)
        self.open = {k: Unit(self.names[k]) for k in todo}
        self.left = {k: min(self.size, self.files - k * self.size) for k in todo}
        return [i for k in todo for i in range(k * self.size, k * self.size + self.left[k])]

    def add(self, rows: list[dict[str, Any]], arrays: Mapping[str, Tensor | None]) -> None:
        self.unit_of(rows[0]["item"]).add(rows, arrays)  # a batch never crosses a unit (module doc)

    def unit_of(self, i: int) -> Unit:
        return self.open[i // self.size]

    def file_done(self, i: int, flush: Callable[[], None]) -> None:
        """File ``i`` is whole; when it was its unit's last, the rows waiting are encoded and the unit written."""
        self.left[i // self.size] -= 1
        if self.left[i // self.size] == 0:
            flush()
            self.rows += self.open.pop(i // self.size).write(self.out, self.layout, self.per_video_array)

    def end(self) -> None:
        """Every unit closes with its last file (:meth:`file_done`)."""

    def finished(self) -> list[str]:
        return self.names


class RowUnits:
    """Shards of ``shard_rows`` rows in the order of the files (one process; the module doc)."""

    def __init__(self, out: Path, layout: str, items: list[MediaItem], shard_rows: int) -> None:
        self.out, self.layout, self.items, self.shard_rows = out, layout, items, shard_rows
        self.k = self.rows = 0
        self.skip: dict[int, int] = {}  # rows of a file an earlier job wrote: computed again, not written twice
        self.unit = Unit("00000")

    def todo(self) -> list[int]:
        """The files from the one the last kept row came from, less the files already reported."""
        last, bad = 0, set[str]()
        while unit_done(self.out, self.layout, unit := f"{self.k:05d}"):
            for line in unit_index(self.out, self.layout, unit).read_text().splitlines():
                item = int(json.loads(line)["item"])
                self.skip[item] = self.skip.get(item, 0) + 1
                self.rows, last = self.rows + 1, item
            if (report := self.out / f"bad-{unit}.json").is_file():
                bad.update(p for p, _ in json.loads(report.read_text()))
            self.k += 1
        clear_unit(self.out, self.layout, f"{self.k:05d}")  # what a stopped job left of the shard it was writing
        self.unit = Unit(f"{self.k:05d}")
        return [i for i in range(last, len(self.items)) if self.items[i].path not in bad]

    def add(self, rows: list[dict[str, Any]], arrays: Mapping[str, Tensor | None]) -> None:
        for j, row in enumerate(rows):
            if self.skip.get(row["item"], 0) > 0:
                self.skip[row["item"]] -= 1
                continue
            self.unit.add([row], {name: t[j : j + 1] for name, t in arrays.items() if t is not None})
            if len(self.unit) == self.shard_rows:
                self.end()

    def unit_of(self, i: int) -> Unit:
        return self.unit

    def file_done(self, i: int, flush: Callable[[], None]) -> None:
        """Shards close when full (:meth:`add`)."""

    def end(self) -> None:
        """Write the current shard when it has rows or reports, and start the next."""
        if len(self.unit) or self.unit.bad:
            self.rows += self.unit.write(self.out, self.layout)
            self.k += 1
        self.unit = Unit(f"{self.k:05d}")

    def finished(self) -> list[str]:
        """The shards, once every file is done; later ones a stopped job left are deleted."""
        _drop_shards_from(self.out, self.k)
        return [f"{k:05d}" for k in range(self.k)]


def _drop_shards_from(out: Path, first: int) -> None:
    """Delete the files of shards numbered ``first`` or more (none of this job's; a stopped job's unit)."""
    for path in outputs(out):
        number = path.stem.rpartition("-")[2]
        if number.isdigit() and int(number) >= first:
            path.unlink()


class _Batch:
    """Rows waiting for the encoder (module doc: when a batch is encoded)."""

    def __init__(self, cutter: Cutter, units: FileUnits | RowUnits, size: int) -> None:
        self.cutter, self.units, self.size = cutter, units, size
        self.pending: list[tuple[dict[str, Any], Tensor]] = []

    def add(self, row: dict[str, Any], x: Tensor | dict[str, Tensor]) -> None:
        if isinstance(x, dict):
            self.flush()
            self.units.add([row], x)
            return
        if self.pending and self.pending[0][1].shape != x.shape:
            self.flush()
        self.pending.append((row, x))
        if len(self.pending) == self.size:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            arrays = self.cutter.forward(torch.stack([x for _, x in self.pending]))
            self.units.add([r for r, _ in self.pending], arrays)
            self.pending.clear()


def _stopped_line(out: Path, units: FileUnits | RowUnits, signal_name: str) -> str:
    """What a stoppable job says when a signal stops it (``levjepa.train.preemption.stop_now_on_signals``)."""
    return (
        f"{signal_name} received: stopped with {units.rows} row(s) written to {out}; every file written is "
        "complete, and the same command continues where this one stopped"
    )


def fill(
    out: Path,
    meta: dict[str, Any],
    items: list[MediaItem],
    load: Callable[[int], Any],
    cutter: Cutter,
    units: FileUnits | RowUnits,
    *,
    batch_size: int,
    workers: int,
    overwrite: bool = False,
    hint: str = "delete it or choose another folder",
    progress: bool = False,
    desc: str = "features",
    stoppable: bool = False,
) -> dict[str, Any]:
    """Compute (or finish computing) the feature set ``meta`` describes in ``out`` (every rank calls it; the
    module doc). ``load(i)`` decodes file ``i`` in a worker (a module-level function or a ``functools.partial``
    of one); ``stoppable``: SIGTERM / SIGUSR1 stop the job at once with one line. Returns the complete
    manifest."""
    done = open_for_writing(out, meta, overwrite=overwrite, hint=hint)
    order = [] if done is not None else units.todo()
    batch = _Batch(cutter, units, batch_size)
    bar = Progress(len(order), desc, "file", show=progress and distributed.rank() == 0)
    stop = stop_now_on_signals(lambda name: _stopped_line(out, units, name))
    with stop if stoppable else contextlib.nullcontext():
        for i, loaded, reason in safe_map(load, order, workers):
            if loaded is None:
                batch.flush()  # rows before the report: a unit holds the reports of the files it passed
                units.unit_of(i).bad.append((items[i].path, reason))
            else:
                for row, x in cutter.rows(i, loaded):
                    batch.add(row, x)
            units.file_done(i, batch.flush)
            bar.update(1, f"{units.rows} rows")
        batch.flush()
        units.end()
    bar.close(f"{units.rows} rows")
    distributed.barrier()
    if distributed.rank() == 0 and done is None:
        done = finish(out, meta, units.layout, units.finished())
    distributed.barrier()
    record = done if done is not None else read_manifest(out)
    assert record is not None
    return record
