"""Where weights come from: a local folder, or a hub repo id resolved through ``huggingface_hub``, with the
revision it resolved to and the SHA-256 of the weights file read.

:func:`resolve` turns ``PATH`` or ``ORG/NAME`` (+ ``revision``) into a local folder with ``snapshot_download``
(the ``hub`` extra): a download, or the hub cache as it is — ``HF_HUB_OFFLINE=1`` (or ``HF_HUB_CACHE`` /
``HF_HOME`` for another cache) are huggingface_hub's own switches and are honoured as such; levjepa reads
``HF_HUB_OFFLINE`` itself too (:func:`hub_offline`, also when it was set after huggingface_hub was imported), so
an offline reader or publisher never tries the network. A hub that cannot be reached is one line naming what
to do (:func:`hub_errors`: what huggingface_hub raises then), never a traceback. The revision recorded is the
commit the snapshot holds (its folder name in the cache), whatever branch or tag named it.

:func:`Origin.record` is what every model built from the weights carries (``LoadedEncoder.imported_from``,
an export's ``config.json``, its card): the source, the revision, the weights file and its SHA-256. Known
releases are pinned in :data:`RELEASES`: reading one of them at its pinned revision checks the file's SHA-256
and refuses a different file in one line; ``sha256=`` (``--sha256``) pins any other source the same way.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levjepa.weights import HUB_WEIGHTS, WeightsError

__all__ = ["RELEASES", "Origin", "first_line", "hub_errors", "hub_offline", "is_repo_id", "resolve", "sha256_of"]

INDEX = "model.safetensors.index.json"
# (repo id, revision) -> SHA-256 of its weights file: the official releases whose bytes are known
RELEASES = {
    ("galilai-group/LeVJEPA-VideoMix-Large", "e831a0347737fcaa660b39c57d41c109de399845"): (
        "da8bd836ce6532e1b0074ee5a6a46c65b67103f96323529ec4195be1538edc7d"
    ),
}


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' older ``TRANSFORMERS_OFFLINE``) set to a true value, as
    huggingface_hub reads it: no hub operation may try the network."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_errors() -> tuple[type[BaseException], ...]:
    """What a huggingface_hub call raises when the hub cannot be reached or refuses: ``OSError`` (offline mode,
    a refused connection under requests), its ``HfHubHTTPError`` and the base error of the HTTP library it is
    built on (whose transport errors — httpx's ``ConnectError`` — are not ``OSError``); ``ValueError`` for a
    repo id or revision it refuses. Call only where huggingface_hub is installed."""
    from huggingface_hub.errors import HfHubHTTPError

    return (OSError, ValueError, HfHubHTTPError, *HfHubHTTPError.__bases__)


def first_line(err: BaseException) -> str:
    """An error's first line (the hub's errors run to several), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def is_repo_id(text: str) -> bool:
    """``ORG/NAME``: one slash, not a relative or absolute path."""
    return text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/"))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Origin:
    """A folder of weights and where it came from."""

    path: Path  # the local folder (or file) read
    source: str  # what the caller named: a path or ORG/NAME
    repo_id: str | None = None
    revision: str | None = None  # the commit a hub snapshot holds

    def weights_file(self) -> Path | None:
        """The folder's weights file (``model.safetensors``; the shard index of a sharded one), or the file."""
        if self.path.is_file():
            return self.path
        for name in (HUB_WEIGHTS, INDEX):
            if (self.path / name).is_file():
                return self.path / name
        return None

    def record(self, sha256: str | None = None) -> dict[str, Any]:
        """``source``, ``revision``, ``file`` and ``sha256`` (checked against ``sha256`` and :data:`RELEASES`)."""
        file = self.weights_file()
        digest = sha256_of(file) if file is not None else None
        want = sha256 or (RELEASES.get((self.repo_id, self.revision or "")) if self.repo_id else None)
        if want is not None and digest != want.lower():
            named = f"{self.source}@{self.revision}" if self.revision else self.source
            raise WeightsError(
                f"{file}: SHA-256 {digest} is not the pinned {want.lower()} of {named}: the file is not the one "
                "pinned (a partial download or another file); delete it from the hub cache and download it again"
            )
        return {
            "source": self.repo_id or str(self.path.resolve()),
            "revision": self.revision,
            "file": file.name if file is not None else None,
            "sha256": digest,
        }


def _snapshot(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as err:
        raise WeightsError(
            f"{repo_id}: not a local folder; a hub repo id needs huggingface_hub (pip install 'levjepa[hub]'), or "
            "download it and pass the folder"
        ) from err
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=hub_offline()))
    except LocalEntryNotFoundError as err:
        raise WeightsError(
            f"{repo_id}{'@' + revision if revision else ''}: no such local folder, and as a hub repo id not in the "
            "hub cache while the hub cannot be reached (HF_HUB_OFFLINE, no network): check the path, or download "
            f"the repo once online (`hf download {repo_id}{' --revision ' + revision if revision else ''}`) and "
            "run this again"
        ) from err
    except hub_errors() as err:
        raise WeightsError(
            f"{repo_id}: no such local folder, and cannot be fetched from the hub ({first_line(err)})"
        ) from err


def resolve(path_or_repo_id: str | Path, revision: str | None = None) -> Origin:
    """A local path as it is (``revision`` must be ``None``), or a hub repo id through huggingface_hub."""
    path = Path(path_or_repo_id)
    if path.exists():
        if revision is not None:
            raise WeightsError(f"{path}: a local folder has no revision; revision= names a commit of a hub repo")
        return Origin(path, str(path_or_repo_id))
    text = str(path_or_repo_id)
    if not is_repo_id(text):
        raise WeightsError(f"{text}: no such file or folder, and not a hub repo id (ORG/NAME)")
    folder = _snapshot(text, revision)
    commit = folder.name if folder.parent.name == "snapshots" else revision
    return Origin(folder, text, repo_id=text, revision=commit)
