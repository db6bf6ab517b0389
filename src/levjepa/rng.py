"""Explicit randomness, the one source of every seed in levjepa: each stochastic choice draws from a
generator derived from named parts.

``derive_seed(seed, "drop", step, rank)`` hashes its parts (BLAKE2b) into a 63-bit seed, so generators
for different purposes, steps, ranks and samples are independent and reproducible, nearby tuples give
unrelated streams, and no library code touches the global RNG (STYLE 10). SIGReg's directions, k-means,
the data order, every augmentation, the built-in benchmark's clips and the probes' initialisations draw
from such generators (``make_generator``). Building a module is the one place torch's global RNG is used
(its initialisers draw from it): :func:`seeded_init` seeds it for the duration and restores it after.

**Per-sample keys and counter hashes** (token dropping). A sample's randomness must not depend on which rank
or micro-batch holds it, or a run could not change its GPU count. ``sample_keys(seed, purpose, epoch,
positions)`` gives every sample of a batch its own 63-bit key (BLAKE2b of ``(seed, purpose, epoch,
position)`` on the host: one hash per sample). On the device, ``counter_hash(keys, n)`` turns each key and
the counters ``0..n−1`` into ``n`` 32-bit values in one vectorised pass: two rounds of Wellons'
``lowbias32`` integer mixer (a bijection of ``[0, 2³²)`` with near-ideal avalanche), the first keyed by the
key's low half, the second by its high half (so two rows are related only if both halves are). Each round is
a bijection of the counter for a fixed key, so a row never holds two equal values (ranking them is tie-free:
the top-k of a row is a uniformly random k-subset). ``fold_keys(keys, part)`` derives independent keys for
part ``part`` (e.g. one view) of every sample. Arithmetic is int64 with every product below 2⁶³ (no
overflow), so CPU and CUDA give identical bits. Its cost against per-clip generators, with the command:
``bench/train.md`` (Keyed token dropping).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch

__all__ = ["counter_hash", "derive_seed", "fold_keys", "make_generator", "sample_keys", "seeded_init"]


def derive_seed(*parts: object) -> int:
    """A deterministic 63-bit seed from integers and purpose strings (order matters)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def make_generator(*parts: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``derive_seed(*parts)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*parts))
    return gen


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """torch's global (CPU) RNG seeded with ``seed`` for the duration, then restored: for building modules,
    whose initialisers draw from it. The seed is used as given, so a model built here equals one built after
    ``torch.manual_seed(seed)`` (every rank builds the same initial weights from ``train.seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def sample_keys(
    *parts: object, positions: torch.Tensor | list[int], device: str | torch.device = "cpu"
) -> torch.Tensor:
    """int64 ``[B]`` keys ``derive_seed(*parts, position)`` of each sample position (63-bit, non-negative)."""
    values = positions.tolist() if isinstance(positions, torch.Tensor) else list(positions)
    return torch.tensor([derive_seed(*parts, int(p)) for p in values], dtype=torch.int64, device=device)


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' ``lowbias32``: a bijection of ``[0, 2³²)`` (xor-shift, multiply, xor-shift, multiply, xor-shift).

    Both multipliers are below 2³¹ and ``x`` below 2³², so each int64 product stays below 2⁶³: exact.
    """
    x = x ^ (x >> 16)  # a new tensor: the in-place ops below never touch the caller's
    x.mul_(0x21F0AAAD).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x735A2D97).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 15)


def counter_hash(keys: torch.Tensor, n: int, start: int = 0) -> torch.Tensor:
    """int64 ``[R, n]`` hashes in ``[0, 2³²)`` of int64 keys ``[R]`` (non-negative) and counters
    ``start..start+n−1``.

    Distinct within each row (each round is a bijection of the counter); on ``keys``' device.
    """
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise ValueError(f"keys must be an int64 tensor [R], got {keys.dtype} of shape {tuple(keys.shape)}")
    if n < 1 or start < 0 or start + n > _M32:
        raise ValueError(f"counters {start}..{start + n - 1}: expected n >= 1 counters within [0, 2^32)")
    k0 = (keys & _M32)[:, None]
    k1 = ((keys >> 32) & _M32)[:, None]
    c = torch.arange(start, start + n, device=keys.device, dtype=torch.int64)[None, :]
    return _mix32(_mix32(c ^ k0).bitwise_xor_(k1))


def fold_keys(keys: torch.Tensor, part: int, count: int | None = None) -> torch.Tensor:
    """New non-negative 63-bit keys for part ``part`` (a small integer) of each sample keyed by ``keys``
    ``[B]``: ``[B]``; or, given ``count``, for parts ``part .. part+count−1`` in one pass: ``[count, B]``."""
    n = 1 if count is None else count
    h = counter_hash(keys, 2 * n, start=2 * part).view(-1, n, 2)  # [B, n, 2]
    folded = (((h[..., 0] & 0x7FFFFFFF) << 32) | h[..., 1]).T  # [n, B]
    return folded[0] if count is None else folded
