"""The CPU inference runs on: its model name and the instruction sets that decide which kernels run.

Two facts decide CPU inference speed and int8 correctness, and both are read here, in one place:

* **the float kernels' level**, ``torch.backends.cpu.get_cpu_capability()`` (``AVX2``, ``AVX512``,
  ``DEFAULT``): what PyTorch dispatches to, and what decides the last bits of every float result;
* **int8 dot products**: an instruction that multiplies int8 by uint8 and sums into int32 exactly — x86
  ``avx512_vnni`` / ``avx_vnni`` (VNNI, Intel Cascade Lake and later, AMD Zen 4 and later), ``amx_int8``
  (AMX tiles, Intel Sapphire Rapids and later), Arm ``asimddp`` (``sdot`` / ``udot``). Without one, x86 int8
  kernels (onnxruntime's and oneDNN's) multiply with ``vpmaddubsw``, which adds pairs of uint8 × int8 products
  into int16 and saturates when the pair exceeds 32767: weights of full 8-bit range can overflow it, 7-bit
  weights cannot (255 · 64 · 2 < 2¹⁵). ``levjepa.formats.deployment.quantize`` chooses its int8 scheme from this.

Read from ``/proc/cpuinfo`` (Linux; elsewhere the flags are unknown and ``int8_dot`` is False, the safe
answer: a portable int8 scheme is chosen).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from levjepa.threads import allowed_cpus

__all__ = ["CpuInfo", "INT8_DOT_FLAGS", "cpu_info", "parse_cpuinfo"]

# the /proc/cpuinfo flags of an int8 dot product instruction (module doc)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp")


@dataclass(frozen=True)
class CpuInfo:
    """What :func:`cpu_info` read: ``model`` ("AMD EPYC"), ``capability`` (PyTorch's float kernel level),
    ``flags`` (``/proc/cpuinfo``'s, empty where unknown), ``cores`` (logical CPUs this process may use)."""

    model: str
    capability: str
    flags: frozenset[str]
    cores: int

    @property
    def int8_dot(self) -> bool:
        """True when the CPU has an int8 dot product instruction (module doc): int8 kernels sum exactly."""
        return any(f in self.flags for f in INT8_DOT_FLAGS)

    @property
    def vector(self) -> str:
        """The widest vector ISA: ``AVX-512``, ``AVX2``, ``NEON``, or PyTorch's capability where the flags are
        unknown."""
        f = self.flags
        for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON")):
            if flag in f:
                return name
        return self.capability

    @property
    def int8(self) -> str:
        """The int8 dot products in words: ``VNNI``, ``VNNI, AMX``, ``dot`` (Arm), or ``no VNNI``."""
        f = self.flags
        names = [n for n, flags in (("VNNI", ("avx512_vnni", "avx_vnni")), ("AMX", ("amx_int8",)),
                                    ("dot", ("asimddp",))) if any(x in f for x in flags)]  # fmt: skip
        return ", ".join(names) or "no VNNI"

    def describe(self) -> str:
        """One line for a benchmark table: ``AMD EPYC, AVX2, no VNNI, 2 cores``."""
        return f"{self.model}, {self.vector}, {self.int8}, {self.cores} cores"


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The model name and the flags of the first processor in ``/proc/cpuinfo``'s ``text`` (x86: ``model
    name`` and ``flags``; Arm: ``Features``, and no model name)."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """The CPU this process runs on (read once)."""
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        model, flags = "", frozenset()
    cores = len(allowed_cpus())
    return CpuInfo(model or platform.processor() or platform.machine(), torch.backends.cpu.get_cpu_capability(),
                   flags, cores)  # fmt: skip
