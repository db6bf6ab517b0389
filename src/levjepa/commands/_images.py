"""``--image-frames one|repeat`` for the commands that read images (``extract``, ``probe``, ``classify``): one
option, one spelling, one way to turn it into ``ViewSpec.image_frames``.

``repeat`` (what ``extract`` and ``probe`` do unless told; the paper's protocol): an image is its frame repeated to
the clip's frames (the model's slots). ``one``: an image is one temporal slot — one frame for a tubelet-1
model, the frame repeated τ times for a tubelet-τ one (its patch embedding reads τ frames a token).
``classify`` defaults to what the probe was scored with (its record).
"""

from __future__ import annotations

import argparse
import dataclasses

from levjepa.data.eval_clip import ViewSpec

__all__ = ["IMAGE_FRAMES", "add_image_frames_argument", "image_frames"]

IMAGE_FRAMES = ("one", "repeat")


def add_image_frames_argument(parser: argparse.ArgumentParser, default_text: str = "repeat") -> None:
    """The option; its value is None unless given (``default_text`` says what that means)."""
    parser.add_argument(
        "--image-frames",
        choices=IMAGE_FRAMES,
        default=None,
        help="an image as one temporal slot (one frame at tubelet 1), or repeated to the clip's frames (the "
        f"paper's protocol); default: {default_text}",
    )


def image_frames(views: ViewSpec, mode: str | None, tubelet: int) -> ViewSpec:
    """``views`` with images read as ``mode`` says (None: as they are)."""
    if mode is None:
        return views
    return dataclasses.replace(views, image_frames=tubelet if mode == "one" else None)
