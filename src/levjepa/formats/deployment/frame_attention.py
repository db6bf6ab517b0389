"""Block-causal attention of whole frames in an exported ONNX graph: a loop over temporal slots, each an unmasked
fused ``Attention`` over the keys it may read — the form PyTorch computes it in, written for a graph.

Why. A clip graph (``clip_encoder.onnx``, ``classifier.onnx``) takes whole frames in time-major order, CLS
first: the tokens are ``[CLS, slot 0's P patches, slot 1's, …, slot S−1's]``. Under block-causal attention
(``levjepa.model.attention``) CLS reads every token and a patch of slot ``t`` reads the patches of slots ``≤ t``:
a *prefix* of the keys. PyTorch computes each slot's queries as one unmasked attention over its prefix
(``KeySpans``): about half the score FLOPs of the full ``L × L`` and no mask. Traced code cannot read token
metadata, so ``torch.export`` writes the dense form instead — one ``Attention`` node with an ``[L, L]``
mask per layer — which computes every score, the future's included, and at 16 × 224² made the ONNX clip
encoder ~2× slower than PyTorch eager (``bench/deploy.md``). :func:`frame_attention` rewrites each encoder
``Attention`` node of such a graph into::

    y_cls   = Attention(q[:, :, :1], k, v)                          CLS: every key
    y_slots = Loop t in 0..S−1:                                      S and P read from the input's shape
                Attention(q[:, :, 1+tP : 1+(t+1)P], k[:, :, 1 : 1+(t+1)P], v[:, :, 1 : 1+(t+1)P])
    y       = Concat(y_cls, y_slots as [B, h, S·P, hd])

the same function (``tests/test_deploy.py``: ONNX = PyTorch within 1e-4 at several batch sizes, clip lengths
and frame sizes), still dynamic in batch, frames and size, with the score FLOPs and the speed of PyTorch's
spans. It applies to graphs of the encoder's full forward only (no sliding window, nothing dropped): what the
clip graphs are. The streaming step needs no rewrite: its queries are one slot, its mask one row of validity.
Needs opset 23 (the ONNX ``Attention`` op; with older opsets the exporter writes MatMul/Softmax, left as is).

**When it pays** (:func:`frame_loop_pays`): the loop costs a few kernel calls per slot and layer, the dense form
computes the future's scores. Frames of at least :data:`MIN_TOKENS_PER_SLOT` tokens (16 patches: 64-px frames of
16-px patches, 32-px frames of 8-px ones) get the loop; smaller frames (the demo encoder's 4 tokens a slot) keep
the dense masked op, which is faster there (``bench/deploy_attention.py`` measures both, ``bench/deploy.md``). The
writer decides at the export's frame size (``deploy.frame_loop``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIN_TOKENS_PER_SLOT", "frame_attention", "frame_loop_pays"]

MIN_TOKENS_PER_SLOT = 16  # measured: bench/deploy_attention.py, bench/deploy.md


def frame_loop_pays(height: int, width: int, patch: int) -> bool:
    """Whether frames of ``height × width`` pixels (``patch``-px patches) have enough tokens a slot for the loop
    over slots to beat the dense masked attention (module doc)."""
    return (height // patch) * (width // patch) >= MIN_TOKENS_PER_SLOT


def frame_attention(model: Any, *, input_name: str, tubelet: int, patch: int) -> int:
    """Rewrite, in place, every encoder ``Attention`` node of the ONNX ``model`` (a clip graph whose input
    ``input_name`` ends in ``[…, C, T, H, W]``: ``S = T/tubelet`` slots of ``P = (H/patch)·(W/patch)`` tokens)
    into a loop over slots (module doc), drop what only the dense mask used, and return how many were
    rewritten. Encoder nodes are those whose recorded module path is a block's (``blocks.N.attn``): a
    classifier head's attention stays as it is."""
    from onnx import TensorProto
    from onnx import helper as h

    graph = model.graph
    targets = {
        i for i, n in enumerate(graph.node)
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx") and _encoder(n) and len(n.input) == 4
        and not any(a.name == "q_num_heads" for a in n.attribute)  # 4-D q, k, v: [B, h, L, hd]
    }  # fmt: skip
    if not targets:
        return 0
    c = "frame_attn"  # a prefix no exporter name has

    def const(name: str, values: list[int], dims: list[int] | None = None) -> Any:
        return h.make_tensor(f"{c}_{name}", TensorProto.INT64, [len(values)] if dims is None else dims, values)

    graph.initializer.extend([const("zero", [0]), const("one", [1]), const("three", [3]), const("axis", [2]),
                              const("zero_scalar", [0], []), const("minus_one", [-1]),
                              const("grid_div", [tubelet, patch, patch])])  # fmt: skip
    nodes = [  # S (a scalar) and P ([1]) from the input's last three dimensions, first: they read only the input
        h.make_node("Shape", [input_name], [f"{c}_thw"], start=-3),
        h.make_node("Div", [f"{c}_thw", f"{c}_grid_div"], [f"{c}_grid"]),
        h.make_node("Gather", [f"{c}_grid", f"{c}_zero_scalar"], [f"{c}_slots"], axis=0),
        h.make_node("Slice", [f"{c}_grid", f"{c}_one", f"{c}_three"], [f"{c}_hw"]),
        h.make_node("ReduceProd", [f"{c}_hw"], [f"{c}_per_slot"], keepdims=1),
    ]
    dtypes = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    for i, node in enumerate(graph.node):  # each replacement where its node was: after q, k and v are made
        nodes += (
            _loop_nodes(node, f"{c}{i}", c, dtypes.get(node.output[0], TensorProto.FLOAT))
            if i in targets
            else [_copy(node)]
        )
    _replace(graph.node, nodes)
    _prune(graph)
    return len(targets)


def _encoder(node: Any) -> bool:
    from levjepa.formats.deployment.quantize import node_scope

    scope = node_scope(node)
    return "blocks." in scope and scope.endswith(".attn")


def _loop_nodes(node: Any, p: str, c: str, dtype: int) -> list[Any]:
    """The nodes that replace the ``Attention`` ``node`` (module doc) of output element type ``dtype``; ``p``
    prefixes their names."""
    from onnx import TensorProto
    from onnx import helper as h

    q, k, v, _ = node.input
    attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
    body = h.make_graph(
        [
            h.make_node("Mul", [f"{p}_t", f"{c}_per_slot"], [f"{p}_tp"]),
            h.make_node("Add", [f"{p}_tp", f"{c}_one"], [f"{p}_start"]),
            h.make_node("Add", [f"{p}_start", f"{c}_per_slot"], [f"{p}_end"]),
            h.make_node("Slice", [q, f"{p}_start", f"{p}_end", f"{c}_axis"], [f"{p}_qt"]),
            h.make_node("Slice", [k, f"{c}_one", f"{p}_end", f"{c}_axis"], [f"{p}_kt"]),
            h.make_node("Slice", [v, f"{c}_one", f"{p}_end", f"{c}_axis"], [f"{p}_vt"]),
            h.make_node("Attention", [f"{p}_qt", f"{p}_kt", f"{p}_vt"], [f"{p}_yt"], name=f"{p}_slot", **attrs),
            h.make_node("Identity", [f"{p}_cond_in"], [f"{p}_cond_out"]),
        ],
        f"{p}_body",
        [h.make_tensor_value_info(f"{p}_t", TensorProto.INT64, []),
         h.make_tensor_value_info(f"{p}_cond_in", TensorProto.BOOL, [])],
        [h.make_tensor_value_info(f"{p}_cond_out", TensorProto.BOOL, []),
         h.make_tensor_value_info(f"{p}_yt", dtype, None)],
    )  # fmt: skip
    return [
        h.make_node("Slice", [q, f"{c}_zero", f"{c}_one", f"{c}_axis"], [f"{p}_qc"]),
        h.make_node("Attention", [f"{p}_qc", k, v], [f"{p}_ycls"], name=f"{p}_cls", **attrs),
        h.make_node("Loop", [f"{c}_slots", ""], [f"{p}_ys"], name=f"{p}_loop", body=body),  # [S, B, h, P, hd]
        h.make_node("Transpose", [f"{p}_ys"], [f"{p}_yt5"], perm=[1, 2, 0, 3, 4]),  # [B, h, S, P, hd]
        h.make_node("Shape", [q], [f"{p}_bh"], end=2),
        h.make_node("Shape", [q], [f"{p}_hd"], start=3),
        h.make_node("Concat", [f"{p}_bh", f"{c}_minus_one", f"{p}_hd"], [f"{p}_shape"], axis=0),
        h.make_node("Reshape", [f"{p}_yt5", f"{p}_shape"], [f"{p}_yslots"]),
        h.make_node("Concat", [f"{p}_ycls", f"{p}_yslots"], [node.output[0]], axis=2, name=node.name),
    ]


def _used(node: Any) -> set[str]:
    """The names ``node`` reads, those its subgraphs (a Loop's body) read from the outer scope included."""
    out = {i for i in node.input if i}
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in g.node:
                out |= _used(inner)
    return out


def _prune(graph: Any) -> None:
    """Drop the nodes and initializers no graph output depends on (the dense mask's, after the rewrite)."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed |= _used(node)
    _replace(graph.node, [_copy(n) for n in reversed(keep)])
    _replace(graph.initializer, [_copy(t) for t in graph.initializer if t.name in needed])


def _copy(message: Any) -> Any:
    """A copy of a protobuf message that outlives its repeated field's clearing."""
    out = type(message)()
    out.CopyFrom(message)
    return out


def _replace(field: Any, items: list[Any]) -> None:
    del field[:]
    field.extend(items)
