"""levjepa.data: from video files, shard stores (or the built-in benchmark) to multi-view clip batches.

Read in this order: ``config.py`` (what can be set), ``video.py`` (PyAV decoding of clip windows, the
fixed-GOP fast path), ``sources.py`` (folders, V-JEPA index files, images), ``views.py`` (crop boxes and
photometric parameters in the worker, photometric change and normalisation on device), ``resize.py`` (views
cut on the device), ``batch.py`` (what a worker ships: views or frames + boxes), ``loader.py``
(deterministic, resumable, rank-sharded batches, repeated sampling), ``shards.py`` (tar shard stores),
``badfiles.py`` (how broken files are skipped and reported), ``synthetic.py`` (the appearance/motion
benchmark), ``encode.py`` (writing videos), ``prepare.py`` / ``check.py`` (what the ``levjepa data``
command runs).
"""

from __future__ import annotations

from levjepa.data.badfiles import BadFileReport, DataError
from levjepa.data.config import DataConfig, SyntheticConfig
from levjepa.data.encode import VideoWriter, write_video
from levjepa.data.loader import FrameBatch, PretrainLoader, ViewBatch
from levjepa.data.sources import MediaItem, list_media, parse_index
from levjepa.data.video import VideoFrames, decode_all, decode_clip, load_image, probe_video
from levjepa.data.views import apply_photometric, normalize

__all__ = [
    "BadFileReport",
    "DataConfig",
    "DataError",
    "FrameBatch",
    "MediaItem",
    "PretrainLoader",
    "SyntheticConfig",
    "VideoFrames",
    "VideoWriter",
    "ViewBatch",
    "apply_photometric",
    "decode_all",
    "decode_clip",
    "list_media",
    "load_image",
    "normalize",
    "parse_index",
    "probe_video",
    "write_video",
]
