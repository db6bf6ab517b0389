"""Explicit randomness: every stochastic choice draws from a generator derived from named integers.

``derive_seed(seed, step, rank, purpose)`` mixes its parts with SplitMix64 into a 63-bit seed, so
generators for different purposes, steps and ranks are independent and reproducible, and no library code
touches the global RNG (STYLE 10).
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["derive_seed", "make_generator"]

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive_seed(*parts: int | str) -> int:
    """A deterministic 63-bit seed from integers and purpose strings (order matters)."""
    h = 0
    for part in parts:
        value = zlib.crc32(part.encode()) if isinstance(part, str) else int(part)
        h = _splitmix64(h ^ (value & _MASK))
    return h & ((1 << 63) - 1)


def make_generator(*parts: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*parts))
    return gen
