"""Explicit randomness: every stochastic choice draws from a generator derived from named parts.

``derive_seed(seed, "drop", step, rank)`` hashes its parts (BLAKE2b) into a 63-bit seed, so generators
for different purposes, steps, ranks and samples are independent and reproducible, nearby tuples give
unrelated streams, and no library code touches the global RNG (STYLE 10). Token dropping, SIGReg's
directions, k-means, the data order and every augmentation draw from such generators.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["derive_seed", "make_generator"]


def derive_seed(*parts: object) -> int:
    """A deterministic 63-bit seed from integers and purpose strings (order matters)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def make_generator(*parts: object, device: str | torch.device = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*parts))
    return gen
