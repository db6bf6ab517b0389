"""A task of labelled clips held in memory: the built-in benchmark's splits, or any clips a script cut.

For each encoder the features of the train / val (/ test) clips are computed **once** (``levjepa.features.cache``:
frozen, ``eval()``, no dropping; cached on disk under ``EvalConfig.cache_dir``, keyed by the weights and
:attr:`LabelledSplits.key`) and every probe of every label set reads them (``levjepa.eval.harness``); with a
compact ``EvalConfig.tokens`` codec the attentive probe reads the tokens as a compact store keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from levjepa.eval.config import EvalConfig
from levjepa.eval.source import FeatureSource, MemorySource
from levjepa.features.cache import cached_features
from levjepa.model.vit import VideoEncoder

__all__ = ["LabelledSplits"]


@dataclass
class LabelledSplits:
    """Clips and labels of train / val (/ test) splits, for one or several label sets (tasks)."""

    clips: dict[str, Tensor]  # split -> uint8 [N, C, T, H, W]
    labels: dict[str, dict[str, Tensor]]  # split -> task -> int64 [N]
    num_classes: dict[str, int]  # task -> classes
    image_source: str  # what the clips show ("fashion-mnist", "digits", an index file, ...)
    key: str  # names the data for the feature cache
    report_seconds: bool = True

    @property
    def tasks(self) -> list[str]:
        return list(self.num_classes)

    @property
    def sizes(self) -> dict[str, int]:
        return {s: len(c) for s, c in self.clips.items()}

    @property
    def clip_text(self) -> str:
        c = next(iter(self.clips.values()))
        return f"{c.shape[2]}×{c.shape[3]}×{c.shape[4]} (T×H×W)"

    def prepare(self, encoders: Mapping[str, VideoEncoder], cfg: EvalConfig) -> bool:
        return True  # every process evaluates on its own: nothing to share

    def sources(self, name: str, encoder: VideoEncoder, cfg: EvalConfig) -> dict[str, FeatureSource]:
        out: dict[str, FeatureSource] = {}
        for split, clips in self.clips.items():
            f = cached_features(
                encoder,
                clips,
                key=f"{self.key}-{split}",
                cache_dir=cfg.cache_dir,
                keep_tokens=cfg.reads_tokens,
                batch_size=cfg.batch_size,
                device=cfg.device,
                progress=cfg.progress,
                desc=f"features {split}",
            )
            labels = {t: self.labels[split][t] for t in cfg.tasks}
            tokens = f.tokens
            if tokens is not None and not cfg.codec.lossless:  # what a compact store would have kept
                t, h, w = clips.shape[2:]
                grid = (t // encoder.cfg.tubelet, h // encoder.cfg.patch_size, w // encoder.cfg.patch_size)
                tokens = cfg.codec.roundtrip(tokens, grid)
            out[split] = MemorySource({"tokens": tokens, "mean": f.mean, "cls": f.cls}, labels, name=split)
        return out

    def info(self) -> dict[str, Any]:
        return {}
