"""levjepa.model.linear: the compiled CPU graph gets a product and a separate bias add; eager runs the module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.backends.common import aot_autograd

from levjepa.model import linear as linear_module
from levjepa.model.config import encoder_config
from levjepa.model.linear import linear
from levjepa.model.vit import MLP, VideoEncoder


def _forward_graph_ops(fn, *args) -> list[str]:
    """The aten ops of the forward graph AOTAutograd hands the compiler for ``fn(*args)`` (run once)."""
    torch._dynamo.reset()
    ops: list[str] = []

    def record(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(fn, backend=aot_autograd(fw_compiler=record), dynamic=False)(*args)
    return ops


def test_compiled_cpu_mlp_has_no_addmm_the_bias_is_an_add():
    torch.manual_seed(0)
    mlp = MLP(16, 64)
    x = torch.randn(2, 5, 16, requires_grad=True)
    ops = _forward_graph_ops(mlp, x)
    assert not any("addmm" in op for op in ops), ops
    assert sum("aten.mm" in op for op in ops) == 2 and sum("aten.add" in op for op in ops) == 2, ops
    # what nn.Linear itself gives Inductor on the CPU: the fused addmm this module exists to avoid
    assert any("addmm" in op for op in _forward_graph_ops(nn.Sequential(nn.Linear(16, 64)), x))


@pytest.mark.parametrize("bias", [True, False])
def test_traced_form_computes_the_layer(monkeypatch, bias):
    torch.manual_seed(0)
    layer = nn.Linear(16, 24, bias=bias)
    x = torch.randn(3, 7, 16, requires_grad=True)
    want = layer(x)
    gw = torch.autograd.grad(want.square().sum(), [x, *layer.parameters()])
    monkeypatch.setattr(linear_module.torch.compiler, "is_compiling", lambda: True)
    got = linear(x, layer)
    gg = torch.autograd.grad(got.square().sum(), [x, *layer.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the bias follows the product's dtype, as in F.linear
        assert linear(x, layer).dtype == F.linear(x, layer.weight, layer.bias).dtype == torch.bfloat16


def test_eager_calls_the_module_with_its_hooks():
    layer = nn.Linear(4, 4)
    seen: list[int] = []
    layer.register_forward_hook(lambda m, i, o: seen.append(1))
    linear(torch.randn(2, 4), layer)
    assert seen == [1]


def test_compiled_encoder_graph_has_no_addmm():
    # the whole stack as Inductor would receive it: every block's qkv, proj, fc1 and fc2 products bare
    torch.manual_seed(0)
    enc = VideoEncoder(encoder_config("vit-test"))
    x = torch.randn(2, 9, enc.cfg.dim, requires_grad=True)
    cos, sin = enc.rope(torch.zeros(1, 9, 3, dtype=torch.long))
    ops = _forward_graph_ops(enc.blocks, x, (cos, sin), None)
    assert not any("addmm" in op for op in ops), ops
    assert sum("aten.mm" in op for op in ops) == 4 * enc.cfg.depth
