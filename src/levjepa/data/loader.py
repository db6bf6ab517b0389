"""The pretraining loader: deterministic, resumable, rank-sharded batches of multi-view clips.

**Positions.** An epoch has ``L`` positions (``samples_per_epoch``, default: the number of items over all
sources, times ``repeats``). Epoch ``e``'s *plan* maps each position to ``(source, item)``: each source gets
a fixed quota of positions proportional to its weight (largest remainder), the quotas are shuffled together, and the
k-th position of source ``s`` takes item ``perm_{s,e,⌊k/N_s⌋}[k mod N_s]`` — so with one source an epoch is
a permutation of its items, and a source smaller than its quota is cycled through fresh permutations.
Every permutation is a function of ``(seed, e)``. With ``repeats = k`` the plan is drawn over groups of k
consecutive positions (``⌈L / k⌉`` groups): the k positions of a group read the same item from one decode
(``__getitems__``), each with its own views. A shard source maps the groups that rank ``r`` reads to rank
``r``'s own shards, in stored order (``shards.py``): ranks read disjoint shards, each batch a contiguous
run of members.

**Batches.** With ``G = batch_size · world_size`` clips per global micro-batch and ``A = micro_batches`` of
them per optimizer step (``E = A·G``, the trainer's effective batch), an epoch holds ``S = L // E`` optimizer
steps (drop_last on the *effective* batch) and ``A·S`` micro-batches: global micro-batch ``k`` is epoch
``e = k // (A·S)``, positions ``[b·G, (b+1)·G)`` with ``b = k mod (A·S)``; rank ``r`` takes the r-th
contiguous chunk of ``batch_size``. Optimizer step ``s`` of an epoch therefore covers positions
``[s·E, (s+1)·E)`` however ``E`` is split into ranks × micro-batches (2 ranks with batch B, 1 rank with
batch 2B, or 1 rank accumulating 2 micro-batches of B see the same clips per step, and the same epoch
boundaries), and ``start_step = k`` resumes at global micro-batch ``k``.

**Randomness.** Everything random about position ``i`` of epoch ``e`` — the time window, its direction
(``reverse_p``), every crop, flip and photometric parameter — comes from generators seeded by
``(seed, e, i, purpose)`` (the time window by ``(seed, e, ⌊i / k⌋, "time")``, shared by a group). A batch
therefore depends on neither the number of workers, nor the rank layout, nor which worker built it.

**Bad files.** A file that fails (``DataError``, or any error of a decoder: the one bad-file rule of
``badfiles.py``, :func:`~levjepa.data.badfiles.is_bad_file`) is replaced by the next item of the
same source (``j+1, j+2, ...``, skipping files this worker already knows to be bad), with the same
generators, so the replacement is deterministic too. Each failure travels with the batch as
``(path, reason)`` in ``ViewBatch.bad_files`` (and into ``bad_files``, the run's :class:`BadFileReport`,
when given). If every item of a source fails, a ``DataError`` names the source and stops the run.

**Workers** start from a forkserver by default (``data.worker_start``): never forked from a trainer whose
other threads may hold locks. The dataset is pickled to them once; tensors in it (the built-in benchmark's
clips, ~300 MB at the defaults) go through shared memory, like every batch, so ``/dev/shm`` must be large
(containers: ``--shm-size``), as for any PyTorch DataLoader.

**Transfer** (``batch.py``). Workers ship uint8 views (``ViewBatch``, ``data.resize_on="worker"``) or the
decoded frames with each view's crop box (``FrameBatch``, ``"device"``, the default on CUDA) and float32
photometric parameters; ``augment_to_device`` moves them (pinned when CUDA is available), cuts the views if
the worker did not, applies the photometric change to the local views in batch on the device, and
normalises every view.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from levjepa.data.badfiles import BadFileReport, DataError, bad_file_reason, is_bad_file, plain
from levjepa.data.batch import FrameBatch, ViewBatch, collate_views
from levjepa.data.config import DataConfig
from levjepa.data.shards import ShardSource, is_shard_store
from levjepa.data.sources import SYNTHETIC, Decoded, FileSource, SyntheticSource, list_media
from levjepa.data.video import hwaccel_status
from levjepa.data.views import make_views, sample_view_params
from levjepa.data.workers import initializer, start_context
from levjepa.rng import make_generator

__all__ = [
    "FrameBatch",
    "PretrainDataset",
    "PretrainLoader",
    "StepBatchSampler",
    "ViewBatch",
    "collate_views",
    "sample_generator",
]


def sample_generator(seed: int, epoch: int, position: int, purpose: str) -> torch.Generator:
    """The generator of one random purpose (``"time"``, ``"views"``) of position ``position`` of ``epoch``."""
    return make_generator(seed, "sample", epoch, position, purpose)


# ---------------------------------------------------------------------------------------------- batches


class StepBatchSampler(Sampler[list[tuple[int, int, int]]]):
    """Infinite per-rank batches of ``(step, epoch, position)`` keys from ``start_step`` on (see module doc)."""

    def __init__(
        self,
        samples_per_epoch: int,
        batch_size: int,
        rank: int,
        world_size: int,
        start_step: int,
        micro_batches: int = 1,
        repeats: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}: expected 0 <= rank < world_size={world_size}")
        if start_step < 0:
            raise ValueError(f"start_step={start_step}: expected >= 0")
        if micro_batches < 1:
            raise ValueError(f"micro_batches={micro_batches}: expected >= 1 micro-batches per optimizer step")
        self.global_batch = batch_size * world_size
        step_batch = self.global_batch * micro_batches
        if samples_per_epoch // step_batch < 1:
            raise DataError(_smaller_than_a_batch(samples_per_epoch, batch_size, world_size, micro_batches, repeats))
        self.batches_per_epoch = (samples_per_epoch // step_batch) * micro_batches  # global micro-batches
        self.micro_batches = micro_batches
        self.batch_size, self.rank, self.start_step = batch_size, rank, start_step

    def keys(self, step: int) -> list[tuple[int, int, int]]:
        epoch, b = divmod(step, self.batches_per_epoch)
        base = b * self.global_batch + self.rank * self.batch_size
        return [(step, epoch, base + j) for j in range(self.batch_size)]

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        step = self.start_step
        while True:
            yield self.keys(step)
            step += 1


def _smaller_than_a_batch(samples: int, batch_size: int, world_size: int, micro_batches: int, repeats: int) -> str:
    """What to set when an epoch holds fewer clips than one optimizer step: the largest ``train.batch_size``
    that fits (whole micro-batches if one fits, else one micro-batch that ``data.batch_size`` follows)."""
    micro, step = batch_size * world_size, batch_size * world_size * micro_batches
    head = (
        f"an epoch of {samples} clips is smaller than one optimizer step's batch of {step} (train.batch_size = "
        f"data.batch_size {batch_size} x {world_size} process(es) x {micro_batches} micro-batch(es))"
    )
    unit = world_size * repeats  # a train.batch_size that splits into whole per-rank batches of repeat groups
    if samples >= micro:
        fit = f"set train.batch_size={samples // micro * micro} (data.batch_size stays {batch_size})"
    elif samples >= unit:
        fit = f"set train.batch_size={samples // unit * unit} (data.batch_size then follows it)"
    else:
        return f"{head}: add data, or repeat it with data.samples_per_epoch={step}"
    return f"{head}: {fit}, or repeat the data with data.samples_per_epoch={step}"


# ---------------------------------------------------------------------------------------------- sources


def _largest_remainder(total: int, weights: list[float]) -> list[int]:
    raw = [total * w / sum(weights) for w in weights]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


class PretrainDataset(Dataset):
    """Map-style dataset keyed by ``(step, epoch, position)``; returns one clip's views (see module doc).

    ``rank`` / ``world_size`` matter only for shard sources, whose items are rank-sharded (``shards.py``).
    """

    def __init__(
        self, cfg: DataConfig, seed: int, sources: list[Any] | None = None, *, rank: int = 0, world_size: int = 1
    ) -> None:
        self.cfg, self.seed = cfg, seed
        self.rank, self.world_size = rank, world_size
        self.sources = sources if sources is not None else [_build_source(s, cfg) for s in cfg.sources]
        for src in self.sources:
            if len(src) == 0:
                raise DataError(f"missing: source {src.name!r} holds no video or image files")
        self.weights = list(cfg.weights) if cfg.weights else [1.0] * len(self.sources)
        self.repeats = cfg.repeats
        self.samples_per_epoch = cfg.samples_per_epoch or cfg.repeats * sum(len(s) for s in self.sources)
        self._plans: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._known_bad: list[set[int]] = [set() for _ in self.sources]
        self._reported: set[str] = set()

    def plan(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source [N], item [N])`` of every group of ``repeats`` positions of ``epoch`` (cached: the last
        two epochs); with ``repeats = 1`` a group is a position."""
        if epoch not in self._plans:
            n_pos = -(-self.samples_per_epoch // self.repeats)
            g = make_generator(self.seed, "plan", epoch)
            quotas = _largest_remainder(n_pos, self.weights)
            source = torch.repeat_interleave(torch.arange(len(self.sources)), torch.tensor(quotas))
            if len(self.sources) > 1:
                source = source[torch.randperm(n_pos, generator=g)]
            item = torch.empty(n_pos, dtype=torch.int64)
            for s, (src, quota) in enumerate(zip(self.sources, quotas, strict=True)):
                if quota == 0:
                    continue
                n = len(src)
                perms = [
                    torch.randperm(n, generator=make_generator(self.seed, "perm", epoch, s, c))
                    for c in range(-(-quota // n))
                ]
                item[source == s] = torch.cat(perms)[:quota]
                if hasattr(src, "rank_stream"):  # shards: this rank's groups read this rank's shards, in order
                    mine = (source == s) & (self._group_rank(n_pos) == self.rank)
                    stream = src.rank_stream(self.seed, epoch, self.rank, self.world_size)
                    item[mine] = stream[torch.arange(int(mine.sum())) % len(stream)]
            if len(self._plans) >= 2:
                self._plans.pop(min(self._plans))
            self._plans[epoch] = (source, item)
        return self._plans[epoch]

    def _group_rank(self, n_groups: int) -> torch.Tensor:
        """The rank that reads each group (StepBatchSampler: rank r takes the r-th batch_size chunk)."""
        batch = self.cfg.batch_size
        return (torch.arange(n_groups) * self.repeats) % (batch * self.world_size) // batch

    def _load(self, s: int, j: int, epoch: int, group: int) -> tuple[Decoded, list[tuple[str, str]]]:
        src, bad = self.sources[s], []
        known = self._known_bad[s]
        n = len(src)
        for k in range(n):
            jj = (j + k) % n
            if jj in known:
                continue
            try:
                decoded = src.load(jj, sample_generator(self.seed, epoch, group, "time"), self.repeats)
            except Exception as exc:  # the one bad-file rule (badfiles.is_bad_file): a bug still ends the run
                if not is_bad_file(exc):
                    raise
                known.add(jj)
                bad.append((src.path(jj), bad_file_reason(exc)))
                continue
            if decoded.note is not None and src.path(jj) not in self._reported:
                self._reported.add(src.path(jj))
                bad.append((src.path(jj), decoded.note))
            return decoded, bad
        example = "; ".join(plain(reason) for _, reason in bad[:3])
        raise DataError(
            f"source {src.name!r}: every one of its {n} file(s) failed to load, so training "
            f"cannot draw a clip from it (first reasons: {example or 'see the bad-file report'}); "
            "run `levjepa data check` on it"
        )

    def __len__(self) -> int:
        return self.samples_per_epoch

    def _sample(self, decoded: Decoded, member: int, step: int, epoch: int, position: int) -> dict[str, Any]:
        cfg, frames, index = self.cfg, decoded.frames, decoded.index[member]
        if cfg.reverse_p > 0:  # the clip played backwards: every view of it, same crops and colours
            r = sample_generator(self.seed, epoch, position, "reverse")
            if torch.rand(1, generator=r, dtype=torch.float64).item() < cfg.reverse_p:
                index = index.flip(0)
        g = sample_generator(self.seed, epoch, position, "views")
        common = {"position": position, "epoch": epoch, "step": step, "bad_files": []}
        if cfg.resize_on == "device":
            boxes, flips, photo = sample_view_params(frames.shape[1], frames.shape[2], cfg, g)
            sizes = (cfg.num_global, cfg.global_size, cfg.local_size)
            return {"frames": frames, "frame_index": index, "boxes": boxes, "flips": flips, "photometric": photo,
                    "sizes": sizes, **common}  # fmt: skip
        if frames.shape[0] == 1:
            clip = frames.expand(index.numel(), -1, -1, -1)
        elif frames.shape[0] == index.numel() and torch.equal(index, torch.arange(index.numel())):
            clip = frames
        else:
            clip = frames[index]
        glob, local, photo = make_views(clip.permute(0, 3, 1, 2), cfg, g)
        return {"global": glob, "local": local, "photometric": photo, **common}

    def __getitems__(self, keys: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
        """The samples of a batch; the ``repeats`` positions of a group share one decode."""
        groups: dict[tuple[int, int], tuple[int, int]] = {}
        for _, epoch, position in keys:
            source, item = self.plan(epoch)
            group = position // self.repeats
            groups.setdefault((epoch, group), (int(source[group]), int(item[group])))
        decoded: dict[tuple[int, int], Decoded] = {}
        for s, src in enumerate(self.sources):
            if hasattr(src, "prefetch"):  # shards: read this batch's members in a few large reads
                src.prefetch([j for ss, j in groups.values() if ss == s])
            if hasattr(src, "load_many"):  # the synthetic benchmark: every clip of the batch in one call
                mine = [(key, j) for key, (ss, j) in groups.items() if ss == s]
                gens = [sample_generator(self.seed, epoch, group, "time") for (epoch, group), _ in mine]
                for (key, _), d in zip(mine, src.load_many([j for _, j in mine], gens, self.repeats), strict=True):
                    decoded[key] = d
        out = []
        for step, epoch, position in keys:
            group = position // self.repeats
            bad: list[tuple[str, str]] = []
            if (epoch, group) not in decoded:
                s, j = groups[(epoch, group)]
                decoded[(epoch, group)], bad = self._load(s, j, epoch, group)
            sample = self._sample(decoded[(epoch, group)], position % self.repeats, step, epoch, position)
            sample["bad_files"] = bad
            out.append(sample)
        return out

    def __getitem__(self, key: tuple[int, int, int]) -> dict[str, Any]:
        return self.__getitems__([key])[0]


def _build_source(spec: str, cfg: DataConfig) -> Any:
    if spec == SYNTHETIC:
        return SyntheticSource(cfg)
    if is_shard_store(spec):
        return ShardSource(spec, cfg)
    return FileSource(spec, list_media(spec), cfg)


def resolve_devices(cfg: DataConfig) -> DataConfig:
    """``resize_on="auto"`` → "device" when CUDA is available, else "worker"; ``decode_device="cuda"`` →
    "cpu", with a warning that says why, when FFmpeg cannot decode on NVDEC here."""
    resize_on = cfg.resize_on
    if resize_on == "auto":
        resize_on = "device" if torch.cuda.is_available() else "worker"
    decode_device = cfg.decode_device
    if decode_device == "cuda":
        reason = hwaccel_status("cuda")
        if reason is not None:
            warnings.warn(
                f"data.decode_device='cuda': FFmpeg cannot decode on NVDEC here ({reason}); decoding on the CPU",
                stacklevel=2,
            )
            decode_device = "cpu"
    return replace(cfg, resize_on=resize_on, decode_device=decode_device)


class PretrainLoader:
    """Iterator over per-rank :class:`ViewBatch` es, forever (epoch after epoch)."""

    def __init__(
        self,
        cfg: DataConfig,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        bad_files: BadFileReport | None = None,
        micro_batches: int = 1,
    ) -> None:
        self.cfg = cfg = resolve_devices(cfg)
        self.dataset = PretrainDataset(cfg, seed, rank=rank, world_size=world_size)
        self.sampler = StepBatchSampler(
            self.dataset.samples_per_epoch, cfg.batch_size, rank, world_size, start_step, micro_batches, cfg.repeats
        )
        self.bad_files = bad_files
        self.next_step = start_step
        workers = cfg.num_workers
        self.loader = DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            num_workers=workers,
            collate_fn=collate_views,
            pin_memory=cfg.pin_memory and torch.cuda.is_available(),
            persistent_workers=cfg.persistent_workers and workers > 0,
            prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
            worker_init_fn=initializer() if workers > 0 else None,
            multiprocessing_context=start_context(cfg.worker_start) if workers > 0 else None,
            # the base seed of the workers' torch RNG (unused: every draw has its own generator) comes from here,
            # not from the global RNG, which the loader would otherwise advance at each start by a random amount
            generator=make_generator(seed, "loader", rank),
        )
        self._it: Iterator[ViewBatch] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.sampler.batches_per_epoch

    @property
    def samples_per_epoch(self) -> int:
        return self.dataset.samples_per_epoch

    def state_dict(self) -> dict[str, int]:
        """Where the data stream stands; resuming needs only ``next_step`` (as ``start_step``), the rest lets a
        resumed run check that the epoch layout is unchanged (same data, batch size and world size)."""
        return {
            "next_step": self.next_step,
            "samples_per_epoch": self.samples_per_epoch,
            "global_batch": self.sampler.global_batch,
            "micro_batches": self.sampler.micro_batches,
            "batches_per_epoch": self.batches_per_epoch,
        }

    def __iter__(self) -> PretrainLoader:
        return self

    def __next__(self) -> ViewBatch | FrameBatch:
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        self.next_step = batch.step + 1
        if self.bad_files is not None and batch.bad_files:
            self.bad_files.extend(batch.bad_files)
        return batch

    def close(self) -> None:
        """Stop the worker processes now. Persistent workers otherwise live as long as the ``DataLoader``,
        which a traceback or a reference cycle can keep until the interpreter exits (and they ignore the
        SIGTERM with which multiprocessing ends a leftover worker at exit: ``levjepa.data.workers``)."""
        self._it = None
        it, self.loader._iterator = self.loader._iterator, None  # the iterator a persistent loader keeps
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()  # what the iterator's __del__ does: a None to each worker, then join
