"""What an evaluation will cost, said before it runs: ``levjepa probe ... --plan``.

For a labelled task (``levjepa.eval.dataset_task``) and an encoder, :func:`plan` counts, per split, the files,
the views per file and the store's rows, the disk they take — ``cls`` and ``mean`` (float32, ``2 · D · 4`` bytes
a row, ``D`` the encoder's readout width: ``len(layers) · dim`` with ``--layers``) and, for the attentive
probe, the tokens as the store keeps them (``levjepa.features.compact``: ``1 + L``
tokens of ``2 · D`` bytes in float16, fewer and smaller in a compact store; none online) — and the encoder's
forwards: one per view for a store (``K`` per training segment with ``--train-views K``, each file decoded
``K`` times, and with ``--seeds N`` a K-view store per seed: ``N · K``); online, every epoch of the attentive probe
for a training view (times ``--seeds``: each seed block encodes its own views once), one per validation and test
view. (A training split's "files" count every seed's store.)
It then measures a short sample on this machine — decoding a few files, one encoder batch of their views, one
step of the attentive grid (times ``--seeds``: each seed trains its own) — and multiplies out an estimated time.
The estimate is what the sample says: decoding that hits a slower disk, or a GPU that is shared, will differ.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from levjepa.data import MediaItem
from levjepa.data.badfiles import is_bad_file
from levjepa.data.eval_clip import ViewSpec
from levjepa.eval.config import EvalConfig
from levjepa.eval.dataset_task import DatasetTask
from levjepa.eval.probes import build_probe_grid
from levjepa.features.compact import FULL, TokenCodec
from levjepa.formats.reading.load import LoadedEncoder
from levjepa.infer.encode import encode
from levjepa.model import EncoderConfig

__all__ = ["Plan", "SplitPlan", "plan"]


@dataclass
class SplitPlan:
    split: str
    files: int
    views: int  # per file
    token_bytes: int  # per view (0: no token stored)
    small_bytes: int  # per view: cls + mean
    forwards: int  # encoder forwards of the whole split

    @property
    def rows(self) -> int:
        return self.files * self.views

    @property
    def disk(self) -> int:
        return self.rows * (self.token_bytes + self.small_bytes)


@dataclass
class Plan:
    task: str
    encoder: str
    tokens: str  # how the attentive probe's tokens are kept
    splits: list[SplitPlan]
    measured: dict[str, float] = field(default_factory=dict)  # decode_s (per file), encode_s (per view), step_s
    estimate_s: dict[str, float] = field(default_factory=dict)  # decode, encode, probes

    def text(self) -> str:
        lines = [
            f"plan: task {self.task}; encoder {self.encoder}; attentive probe's tokens: {self.tokens}",
            "| split | files | views per file | rows | disk | encoder forwards |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in self.splits:
            lines.append(f"| {s.split} | {s.files:,} | {s.views} | {s.rows:,} | {_bytes(s.disk)} | {s.forwards:,} |")
        total = sum(s.disk for s in self.splits)
        lines.append(f"disk in all: {_bytes(total)}; encoder forwards in all: {sum(s.forwards for s in self.splits):,}")
        m = self.measured
        if m:
            lines.append(
                f"measured here on {int(m['files'])} file(s): decoding {m['decode_s']:.2f} s a file, the encoder "
                f"{1000 * m['encode_s']:.1f} ms a view, a step of the attentive grid {1000 * m['step_s']:.1f} ms"
            )
            e = self.estimate_s
            lines.append(
                f"estimated time: decoding {_duration(e['decode'])} ({int(m['workers'])} worker(s)), encoding "
                f"{_duration(e['encode'])}, probes {_duration(e['probes'])}; in all {_duration(sum(e.values()))}"
            )
        return "\n".join(lines)


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def plan(task: DatasetTask, loaded: LoadedEncoder, cfg: EvalConfig, *, sample: int = 4) -> Plan:
    """The costs of evaluating ``loaded`` on ``task`` as ``cfg`` says (module doc); ``sample`` files measured."""
    enc = loaded.encoder
    c = enc.cfg
    attentive = "attentive" in cfg.probes
    codec = cfg.codec if attentive and not cfg.online else FULL
    epochs = cfg.probe_cfg.epochs
    splits = []
    for split, items in task.splits.items():
        views = (task.train_views if split == "train" else task.test_views).views
        grid = _token_grid(views, c, images=all(it.kind == "image" for it in items))
        stored = attentive and not cfg.online
        per_file = views.views * max(1, _augmented(task, split))  # K augmented views: K rows per segment
        stores = cfg.seeds if _augmented(task, split) and not cfg.online else 1  # a K-view store per seed
        forwards = len(items) * per_file * stores  # the store(s): one forward per view
        if cfg.online and attentive:  # and the tokens online: every epoch (and seed) for training, once for val / test
            forwards += len(items) * per_file * (epochs * cfg.seeds if split == "train" else 1)
        splits.append(
            SplitPlan(
                split,
                len(items) * stores,  # the files of every seed's store
                per_file,
                codec.bytes_per_view(grid, enc.num_features) if stored else 0,
                2 * enc.num_features * 4,
                forwards,
            )
        )
    tokens = "encoded every epoch, not stored" if cfg.online and attentive else _codec_text(codec, attentive)
    out = Plan(task.name, loaded.describe(), tokens, splits)
    _measure(out, task, loaded, cfg, sample)
    return out


def _augmented(task: DatasetTask, split: str) -> int:
    """``K``, the augmented views per file of ``split``'s store (0: its fixed views; only training has them)."""
    return task.train_views.train_views if split == "train" else 0


def _token_grid(views: ViewSpec, c: EncoderConfig, *, images: bool = False) -> tuple[int, int, int]:
    """The patch tokens of one view as (temporal slots, rows, columns); ``images``: of an image's clip (one slot
    with ``--image-frames one``)."""
    frames = views.image_length if images else views.frames
    return -(-frames // c.tubelet), views.size // c.patch_size, views.size // c.patch_size


def _codec_text(codec: TokenCodec, attentive: bool) -> str:
    if not attentive:
        return "none (no attentive probe)"
    return "every token, float16" if codec.lossless else f"{codec.name} (a compact store)"


def _measure(out: Plan, task: DatasetTask, loaded: LoadedEncoder, cfg: EvalConfig, sample: int) -> None:
    """Time ``sample`` training files' decoding, one encoder batch of their views and one attentive-grid step,
    and multiply them out (module doc)."""
    enc = loaded.encoder
    views = task.train_views.views
    items: list[MediaItem] = task.splits["train"][:sample]
    decoded, t0 = [], time.perf_counter()
    for it in items:
        try:
            decoded.append(views.load(it.path, enc.cfg.patch_size, it.kind))
        except Exception as err:  # an unreadable file costs its attempt, as in the run (the one bad-file rule)
            if not is_bad_file(err):
                raise
            continue
    if not decoded:
        return
    decode_s = (time.perf_counter() - t0) / len(items)
    batch = torch.cat(decoded)[: cfg.batch_size]
    encode(enc, batch[:1], cfg.device)  # warm-up
    t0 = time.perf_counter()
    out_tokens = encode(enc, batch, cfg.device).tokens
    encode_s = (time.perf_counter() - t0) / len(batch)
    assert out_tokens is not None
    pcfg = cfg.probe_cfg
    grid = build_probe_grid("attentive", pcfg, enc.num_features, max(2, task.classes)).to(cfg.device)
    # a training row: the tokens of its `segments` views, as the store keeps them (its codec's count)
    c = enc.cfg
    kept = (
        out_tokens.shape[1]
        if cfg.online or "attentive" not in cfg.probes
        else cfg.codec.kept(_token_grid(views, c, images=all(it.kind == "image" for it in task.splits["train"])))
    )
    x = torch.randn(min(pcfg.batch_size, 64), views.segments * kept, enc.num_features, device=cfg.device)
    grid(x).sum().backward()  # warm-up
    _sync(cfg.device)
    t0 = time.perf_counter()
    grid(x).sum().backward()
    _sync(cfg.device)
    step_s = (time.perf_counter() - t0) * pcfg.batch_size / len(x)
    workers = max(1, task.test_views.workers)
    files = sum(s.files for s in out.splits)
    forwards = sum(s.forwards for s in out.splits)
    train_files = len(task.splits["train"])
    # a probe's sample is a file's segments of one crop (of one augmented view, that epoch's)
    steps = math.ceil(train_files * views.crops / pcfg.batch_size) * pcfg.epochs
    # online: the store of CLS and mean decodes every file, then the tokens every epoch's training files and
    # the validation and test files once more; K augmented views decode a training file K times
    decodes = 2 * files + (pcfg.epochs * cfg.seeds - 1) * train_files if cfg.online else files
    k = _augmented(task, "train")  # K views of N seeds' stores: a training file decoded K·N times in all
    decodes += (k - 1) * cfg.seeds * train_files if k and not cfg.online else 0
    out.measured = {"files": len(decoded), "decode_s": decode_s, "encode_s": encode_s, "step_s": step_s,
                    "workers": workers}  # fmt: skip
    probes = steps * step_s * cfg.seeds  # --seeds N: every seed trains its own grid on its own batches
    out.estimate_s = {"decode": decodes * decode_s / workers, "encode": forwards * encode_s, "probes": probes}


def _sync(device: str | torch.device) -> None:
    """Wait for the GPU's queued work, so that a time read after it counts the work (not only its launch)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
