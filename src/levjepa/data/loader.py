"""The pretraining loader: deterministic, resumable, rank-sharded batches of multi-view clips.

**Positions.** An epoch has ``L`` positions (``samples_per_epoch``, default: the number of items over all
sources). Epoch ``e``'s *plan* maps each position to ``(source, item)``: each source gets a fixed quota of
positions proportional to its weight (largest remainder), the quotas are shuffled together, and the
k-th position of source ``s`` takes item ``perm_{s,e,⌊k/N_s⌋}[k mod N_s]`` — so with one source an epoch is
a permutation of its items, and a source smaller than its quota is cycled through fresh permutations.
Every permutation is a function of ``(seed, e)``.

**Batches.** With ``G = batch_size · world_size`` clips per global micro-batch and ``A = micro_batches`` of
them per optimizer step (``E = A·G``, the trainer's effective batch), an epoch holds ``S = L // E`` optimizer
steps (drop_last on the *effective* batch) and ``A·S`` micro-batches: global micro-batch ``k`` is epoch
``e = k // (A·S)``, positions ``[b·G, (b+1)·G)`` with ``b = k mod (A·S)``; rank ``r`` takes the r-th
contiguous chunk of ``batch_size``. Optimizer step ``s`` of an epoch therefore covers positions
``[s·E, (s+1)·E)`` however ``E`` is split into ranks × micro-batches (2 ranks with batch B, 1 rank with
batch 2B, or 1 rank accumulating 2 micro-batches of B see the same clips per step, and the same epoch
boundaries), and ``start_step = k`` resumes at global micro-batch ``k``.

**Randomness.** Everything random about position ``i`` of epoch ``e`` — the time window, every crop, flip
and photometric parameter — comes from generators seeded by ``(seed, e, i, purpose)``. A batch therefore
depends on neither the number of workers, nor the rank layout, nor which worker built it.

**Bad files.** A file that fails (``DataError``, see ``badfiles.py``) is replaced by the next item of the
same source (``j+1, j+2, ...``, skipping files this worker already knows to be bad), with the same
generators, so the replacement is deterministic too. Each failure travels with the batch as
``(path, reason)`` in ``ViewBatch.bad_files`` (and into ``bad_files``, the run's :class:`BadFileReport`,
when given). If every item of a source fails, a ``DataError`` names the source and stops the run.

**Workers** start from a forkserver by default (``data.worker_start``): never forked from a trainer whose
other threads may hold locks. The dataset is pickled to them once; tensors in it (the built-in benchmark's
clips, ~300 MB at the defaults) go through shared memory, like every batch, so ``/dev/shm`` must be large
(containers: ``--shm-size``), as for any PyTorch DataLoader.

**Transfer.** Workers ship uint8 views and float32 photometric parameters; ``ViewBatch.to_device`` moves
them (pinned when CUDA is available), applies the photometric change to the local views in batch on the
device, and normalises every view.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from levjepa.data.badfiles import BadFileReport, DataError
from levjepa.data.config import DataConfig
from levjepa.data.sources import SYNTHETIC, MediaItem, list_media
from levjepa.data.video import decode_clip_with_info, load_image
from levjepa.data.views import apply_photometric, make_views, normalize
from levjepa.rng import derive_seed

__all__ = [
    "PretrainDataset",
    "PretrainLoader",
    "StepBatchSampler",
    "ViewBatch",
    "build_pretrain_loader",
    "collate_views",
    "sample_generator",
]


def sample_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from ``(seed, *parts)`` (stable across processes and Python versions)."""
    return derive_seed(seed, *parts)


def sample_generator(seed: int, epoch: int, position: int, purpose: str) -> torch.Generator:
    """The generator of one random purpose (``"time"``, ``"views"``) of position ``position`` of ``epoch``."""
    return torch.Generator().manual_seed(sample_seed(seed, "sample", epoch, position, purpose))


# ---------------------------------------------------------------------------------------------- batches


@dataclass
class ViewBatch:
    """One per-rank batch: uint8 view groups, the local views' photometric parameters, and provenance."""

    views: list[torch.Tensor]  # [global uint8 [G, B, C, T, Hg, Wg], local uint8 [V, B, C, T, Hl, Wl]]
    photometric: torch.Tensor  # float32 [V, B, 6] (PHOTOMETRIC_FIELDS of views.py)
    index: torch.Tensor  # int64 [B] positions in the epoch
    epoch: int
    step: int  # the global batch number
    bad_files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.index.numel())

    def pin_memory(self) -> ViewBatch:
        return ViewBatch(
            [v.pin_memory() for v in self.views],
            self.photometric.pin_memory(),
            self.index,
            self.epoch,
            self.step,
            self.bad_files,
        )

    def to_device(
        self, device: torch.device | str, *, non_blocking: bool = True, dtype: torch.dtype = torch.float32
    ) -> list[torch.Tensor]:
        """``[global float [G, B, C, T, H, W], local float [V, B, C, T, h, w]]`` on ``device``: the local group
        photometrically changed (in batch, by ``photometric``), then every view ImageNet-normalised."""
        glob, local = (v.to(device, non_blocking=non_blocking) for v in self.views)
        out_global = normalize(glob, dtype=dtype)
        if local.shape[0] == 0:
            return [out_global, normalize(local, dtype=dtype)]
        v, b = local.shape[:2]
        params = self.photometric.to(device, non_blocking=non_blocking).reshape(v * b, -1)
        x = local.reshape(v * b, *local.shape[2:]).to(dtype) / 255.0
        x = apply_photometric(x, params).reshape(local.shape)
        return [out_global, normalize(x, dtype=dtype)]


def collate_views(samples: list[dict[str, Any]]) -> ViewBatch:
    """Stack per-sample views along a new batch dim 1: ``[G, C, T, H, W]`` × B → ``[G, B, C, T, H, W]``."""
    return ViewBatch(
        views=[torch.stack([s["global"] for s in samples], 1), torch.stack([s["local"] for s in samples], 1)],
        photometric=torch.stack([s["photometric"] for s in samples], 1),
        index=torch.tensor([s["position"] for s in samples], dtype=torch.int64),
        epoch=samples[0]["epoch"],
        step=samples[0]["step"],
        bad_files=[pair for s in samples for pair in s["bad_files"]],
    )


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
            raise DataError(
                f"an epoch of {samples_per_epoch} samples is smaller than one global batch of {step_batch} "
                f"(batch_size {batch_size} x world_size {world_size} x {micro_batches} micro-batch(es) per "
                "optimizer step); drop_last would yield nothing: add data, lower train.batch_size, or raise "
                "data.samples_per_epoch"
            )
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


# ---------------------------------------------------------------------------------------------- sources


class _FileSource:
    def __init__(self, name: str, items: list[MediaItem], cfg: DataConfig) -> None:
        self.name, self.items, self.cfg = name, items, cfg

    def __len__(self) -> int:
        return len(self.items)

    def path(self, j: int) -> str:
        return self.items[j].path

    def load(self, j: int, generator: torch.Generator) -> tuple[torch.Tensor, str | None]:
        """uint8 [T, C, H, W] frames of item ``j`` and a note when padded; raises DataError."""
        cfg, item = self.cfg, self.items[j]
        if item.kind == "image":
            img = load_image(item.path, short_side=cfg.short_side, min_side=cfg.min_side, max_side=cfg.max_side)
            return img.permute(2, 0, 1).unsqueeze(0).expand(cfg.num_frames, -1, -1, -1), None
        frames, note = decode_clip_with_info(
            item.path,
            num_frames=cfg.num_frames,
            frame_stride=cfg.frame_stride,
            target_fps=cfg.target_fps,
            short_side=cfg.short_side,
            short_videos=cfg.short_videos,
            generator=generator,
            min_side=cfg.min_side,
            max_side=cfg.max_side,
            threads=cfg.decode_threads,
        )
        return frames.permute(0, 3, 1, 2), note


class _SyntheticSource:
    """The benchmark's train clips (labels unused). Its clips are already at the benchmark's frame rate, so
    ``frame_stride`` / ``target_fps`` do not apply: a clip longer than ``num_frames`` gives a random window of
    consecutive frames, a shorter one is padded with its last frame."""

    def __init__(self, cfg: DataConfig) -> None:
        from levjepa.data.synthetic import load_split

        self.name, self.cfg = SYNTHETIC, cfg
        self.clips = load_split(cfg.synthetic, "train").clips

    def __len__(self) -> int:
        return self.clips.shape[0]

    def path(self, j: int) -> str:
        return f"synthetic:train/{j}"

    def load(self, j: int, generator: torch.Generator) -> tuple[torch.Tensor, str | None]:
        clip = self.clips[j]  # [C, T, H, W]
        t_src, t = clip.shape[1], self.cfg.num_frames
        start = int(torch.randint(0, t_src - t + 1, (1,), generator=generator).item()) if t_src > t else 0
        idx = torch.clamp(torch.arange(start, start + t), max=t_src - 1)
        return clip[:, idx].permute(1, 0, 2, 3), None


def _largest_remainder(total: int, weights: list[float]) -> list[int]:
    raw = [total * w / sum(weights) for w in weights]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


class PretrainDataset(Dataset):
    """Map-style dataset keyed by ``(step, epoch, position)``; returns one clip's views (see module doc)."""

    def __init__(self, cfg: DataConfig, seed: int, sources: list[Any] | None = None) -> None:
        self.cfg, self.seed = cfg, seed
        self.sources = sources if sources is not None else [_build_source(s, cfg) for s in cfg.sources]
        for src in self.sources:
            if len(src) == 0:
                raise DataError(f"missing: source {src.name!r} holds no video or image files")
        self.weights = list(cfg.weights) if cfg.weights else [1.0] * len(self.sources)
        self.samples_per_epoch = cfg.samples_per_epoch or sum(len(s) for s in self.sources)
        self._plans: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._known_bad: list[set[int]] = [set() for _ in self.sources]
        self._reported: set[str] = set()

    def plan(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source [L], item [L])`` of every position of ``epoch`` (cached: the last two epochs)."""
        if epoch not in self._plans:
            n_pos = self.samples_per_epoch
            g = torch.Generator().manual_seed(sample_seed(self.seed, "plan", epoch))
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
                    torch.randperm(
                        n, generator=torch.Generator().manual_seed(sample_seed(self.seed, "perm", epoch, s, c))
                    )
                    for c in range(-(-quota // n))
                ]
                item[source == s] = torch.cat(perms)[:quota]
            if len(self._plans) >= 2:
                self._plans.pop(min(self._plans))
            self._plans[epoch] = (source, item)
        return self._plans[epoch]

    def _load(self, s: int, j: int, epoch: int, position: int) -> tuple[torch.Tensor, list[tuple[str, str]]]:
        src, bad = self.sources[s], []
        known = self._known_bad[s]
        n = len(src)
        for k in range(n):
            jj = (j + k) % n
            if jj in known:
                continue
            try:
                frames, note = src.load(jj, sample_generator(self.seed, epoch, position, "time"))
            except DataError as exc:
                known.add(jj)
                bad.append((src.path(jj), str(exc)))
                continue
            except Exception as exc:  # anything else a broken file can provoke must not end the run either
                known.add(jj)
                bad.append((src.path(jj), f"unreadable: {src.path(jj)}: {type(exc).__name__}: {exc}"))
                continue
            if note is not None and src.path(jj) not in self._reported:
                self._reported.add(src.path(jj))
                bad.append((src.path(jj), note))
            return frames, bad
        example = "; ".join(reason for _, reason in bad[:3])
        raise DataError(
            f"source {src.name!r}: every one of its {n} file(s) failed to load, so training "
            f"cannot draw a clip from it (first reasons: {example or 'see the bad-file report'}); "
            "run `levjepa data check` on it"
        )

    def __len__(self) -> int:
        return self.samples_per_epoch

    def __getitem__(self, key: tuple[int, int, int]) -> dict[str, Any]:
        step, epoch, position = key
        source, item = self.plan(epoch)
        s, j = int(source[position]), int(item[position])
        frames, bad = self._load(s, j, epoch, position)
        glob, local, photo = make_views(frames, self.cfg, sample_generator(self.seed, epoch, position, "views"))
        return {
            "global": glob,
            "local": local,
            "photometric": photo,
            "position": position,
            "epoch": epoch,
            "step": step,
            "bad_files": bad,
        }


def _build_source(spec: str, cfg: DataConfig) -> Any:
    if spec == SYNTHETIC:
        return _SyntheticSource(cfg)
    return _FileSource(spec, list_media(spec), cfg)


def _start_context(method: str) -> Any:
    import multiprocessing as mp

    return mp.get_context(method if method in mp.get_all_start_methods() else "spawn")


def _worker_init(_: int) -> None:
    import av

    av.logging.set_level(None)  # FFmpeg's own messages about broken files would flood the log


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
        self.cfg = cfg
        self.dataset = PretrainDataset(cfg, seed)
        self.sampler = StepBatchSampler(
            self.dataset.samples_per_epoch, cfg.batch_size, rank, world_size, start_step, micro_batches
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
            worker_init_fn=_worker_init if workers > 0 else None,
            multiprocessing_context=_start_context(cfg.worker_start) if workers > 0 else None,
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

    def __next__(self) -> ViewBatch:
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        self.next_step = batch.step + 1
        if self.bad_files is not None and batch.bad_files:
            self.bad_files.extend(batch.bad_files)
        return batch

    def close(self) -> None:
        """Stop the worker processes (they also stop when the loader is garbage-collected)."""
        self._it = None


def build_pretrain_loader(
    cfg: DataConfig,
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    start_step: int = 0,
    bad_files: BadFileReport | None = None,
    micro_batches: int = 1,
) -> PretrainLoader:
    """Infinite iterator over this rank's batches from global micro-batch ``start_step``; ``micro_batches``
    per optimizer step fix the epoch boundaries (see the module doc)."""
    return PretrainLoader(
        cfg,
        seed=seed,
        rank=rank,
        world_size=world_size,
        start_step=start_step,
        bad_files=bad_files,
        micro_batches=micro_batches,
    )
