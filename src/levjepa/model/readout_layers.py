"""Which blocks a frozen reader reads: the encoder's *readout layers* (``EncoderConfig.readout_layers``,
``--layers`` on ``probe``, ``extract``, ``classify`` and ``export``).

By default a frozen reader reads the last block, through the final LayerNorm. A readout of other blocks takes
the output of each block named (``0`` is the first, ``-1`` the last, as Python indexes), gives each one the
encoder's **final norm**, and **concatenates them on channels in the order given**: CLS and every patch token
get ``len(layers) · D`` channels, block ``layers[0]``'s first. Why so:

* V-JEPA 2's encoder (``vjepa2`` ``src/models/vision_transformer.py``, ``out_layers``) returns ``self.norm(x)`` at
  each layer it is asked for: the one final norm on every layer. LeVJEPA weights carry one norm, the final one,
  so that is the norm a levjepa readout applies.
* V-JEPA 2.1 (``app/vjepa_2_1/models/vision_transformer.py``) reads its *hierarchical layers* — ViT-L blocks 5,
  11, 17 and 23 — each through its own LayerNorm (``norms_block``, trained with those layers as targets) and
  concatenates them on channels (``torch.cat(hier, dim=2)``). LeVJEPA was not trained with per-layer norms; the
  channel concatenation is V-JEPA 2.1's, each part's norm V-JEPA 2's. ``hierarchical`` names V-JEPA 2.1's four
  blocks for its depths (12: 2, 5, 8, 11; 24: 5, 11, 17, 23; 40: 9, 19, 29, 39; 48: 11, 23, 37, 47), and
  the ends of the four quarters of the depth, ``⌈depth·k/4⌉ − 1``, for any other depth.

A readout is stored *normalised*: non-negative block indices in the order given, and ``None`` for the last
block alone, whatever way it was written (``-1``, ``depth − 1``, ``last``), so that the default readout is the
encoder as it always was — the same features, the same function fingerprint (``levjepa.model.fingerprint``),
the same feature stores and kept probes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from levjepa.config import ConfigError

__all__ = ["HIERARCHICAL", "hierarchical_layers", "layers_text", "normalize_layers", "parse_layers"]

# V-JEPA 2.1's hierarchical layers by encoder depth (app/vjepa_2_1/models/vision_transformer.py)
HIERARCHICAL: dict[int, tuple[int, ...]] = {
    12: (2, 5, 8, 11),
    24: (5, 11, 17, 23),
    40: (9, 19, 29, 39),
    48: (11, 23, 37, 47),
}


def hierarchical_layers(depth: int) -> tuple[int, ...]:
    """V-JEPA 2.1's four hierarchical blocks of an encoder of ``depth`` blocks (module doc), in depth order."""
    if depth in HIERARCHICAL:
        return HIERARCHICAL[depth]
    return tuple(sorted({math.ceil(depth * k / 4) - 1 for k in range(1, 5)}))


def normalize_layers(layers: Sequence[int] | None, depth: int, name: str) -> tuple[int, ...] | None:
    """``layers`` as stored (module doc): each index in ``-depth .. depth − 1`` made non-negative, in the order
    given; ``None`` for the last block alone. A ``ConfigError`` in one line names ``name`` and the depth for an
    index out of range, a repeated block or an empty list."""
    if layers is None:
        return None
    given = tuple(layers)
    if not given:
        raise ConfigError(f"{name}: no block given; name one or more (e.g. -1, or 5,11,17,23)")
    for i in given:
        if not isinstance(i, int) or isinstance(i, bool):
            raise ConfigError(f"{name}: {i!r} is not a block index (an integer, negative from the end)")
        if not -depth <= i < depth:
            raise ConfigError(
                f"{name}: block {i} is out of range for this model of depth {depth} (blocks 0..{depth - 1}, or "
                f"-{depth}..-1 from the end)"
            )
    out = tuple(i % depth for i in given)
    repeated = sorted({i for i in out if out.count(i) > 1})
    if repeated:
        raise ConfigError(f"{name}: block {repeated[0]} is given twice; name each block once")
    return None if out == (depth - 1,) else out


def parse_layers(text: str, depth: int, name: str = "--layers") -> tuple[int, ...] | None:
    """The readout a command line names for an encoder of ``depth`` blocks: comma-separated block indices
    (``-1`` the last), ``hierarchical`` (V-JEPA 2.1's four) or ``last``; normalised (:func:`normalize_layers`)."""
    word = text.strip().lower()
    if word == "last":
        return None
    if word == "hierarchical":
        return normalize_layers(hierarchical_layers(depth), depth, f"{name} hierarchical")
    parts = [p.strip() for p in text.split(",")]
    try:
        layers = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(
            f"{name} {text!r}: expected block indices, comma-separated (-1 the last, e.g. 5,11,17,23), "
            "hierarchical or last"
        ) from None
    return normalize_layers(layers, depth, f"{name} {text}")


def layers_text(layers: tuple[int, ...] | None, depth: int) -> str:
    """How a readout is said: ``"the last block (11)"``, ``"block 5 of 12"``, ``"blocks 5, 11 of 12, concatenated
    on channels"``."""
    if layers is None:
        return f"the last block ({depth - 1})"
    if len(layers) == 1:
        return f"block {layers[0]} of {depth}"
    return f"blocks {', '.join(map(str, layers))} of {depth}, concatenated on channels"
