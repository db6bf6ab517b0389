"""The encoder's linear layers, with the bias added apart from the product where a compiler can fuse it.

A linear layer with a bias runs as one ``addmm``. On the CPU that kernel first copies the bias into every row
of its output, then accumulates the product onto it: one extra pass over a ``[tokens, width]`` tensor per
layer. TorchInductor on the CPU calls ``addmm`` as an external kernel, so that pass stays in the compiled step
(on CUDA, Inductor itself splits off the bias when every use of the output is elementwise). While
``torch.compile`` traces a CPU model, :func:`linear` therefore writes the layer as its product followed by a
bias add, which Inductor fuses into the elementwise kernel that reads the output next: GELU after ``fc1``,
RoPE after ``qkv``, the residual add after ``attn.proj`` and ``mlp.fc2``. Eager calls, and every other
device, run the module itself: the same function, the same kernels and hooks as before
(``bench/train.md``, "The block stack compiled as one graph").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["linear"]


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """``layer(x)``; while ``torch.compile`` traces on the CPU, ``x @ weightᵀ + bias`` (module docstring), the
    bias in the product's dtype as ``F.linear`` has it under autocast."""
    if x.device.type == "cpu" and torch.compiler.is_compiling():
        y = torch.matmul(x, layer.weight.t())
        return y if layer.bias is None else y + layer.bias.to(y.dtype)
    return layer(x)
