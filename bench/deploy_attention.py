"""Block-causal attention of whole frames in onnxruntime: one dense masked ``Attention`` op against the loop over
temporal slots that ``levjepa.formats.deployment.frame_attention`` writes, per tokens a slot (bench/deploy.md,
"Attention in the graphs"). It sets ``frame_attention.MIN_TOKENS_PER_SLOT``.

    python bench/deploy_attention.py [--threads 1] [--reps 20]

Each row: one attention layer's queries, keys and values ``[B, h, 1 + S·P, hd]`` (CLS first, ``S`` slots of ``P``
tokens), the dense graph (the ``[L, L]`` block-causal mask of ``levjepa.model.attention``) and the same graph
rewritten by :func:`frame_attention`; median ms of ``--reps`` calls each, interleaved, and the largest difference
of their outputs. Shapes: the demo encoder's (B = 8 clips, 4 heads of 32, 8 slots) at 4 to 64 tokens a slot and
ViT-Tiny's (one clip, 3 heads of 64, 16 slots) at 49 to 196 (224²).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto
from onnx import helper as h

from levjepa.formats.deployment.frame_attention import frame_attention
from levjepa.infer.cpu import cpu_info
from levjepa.model.attention import TokenMeta, build_attn_mask

SHAPES = [(8, 4, 32, 8, p) for p in (4, 8, 16, 64)] + [(1, 3, 64, 16, p) for p in (49, 100, 196)]


def dense_graph(b: int, heads: int, hd: int, slots: int, per_slot: int) -> onnx.ModelProto:
    """One Attention node under the block-causal mask; a ``grid`` input ``[1, 1, S, P, 1]`` whose shape gives the
    rewrite its slots and tokens (tubelet 1, patch 1)."""
    frames = torch.arange(slots).repeat_interleave(per_slot)
    meta = TokenMeta(torch.full((1, 1), slots - 1), torch.ones(1, 1, dtype=torch.bool)).cat(
        TokenMeta.patches(frames[None])
    )  # CLS at the newest slot, then the patches, time-major: the encoder's order
    mask = build_attn_mask("block_causal", meta, meta)
    assert mask is not None
    length = mask.shape[-1]
    inputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, [b, heads, length, hd]) for n in "qkv"]
    inputs.append(h.make_tensor_value_info("grid", TensorProto.FLOAT, [1, 1, slots, per_slot, 1]))
    node = h.make_node("Attention", ["q", "k", "v", "mask"], ["y"], name="attn")
    node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'encoder.blocks.0.attn']")
    graph = h.make_graph(
        [node], "dense", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(mask.numpy(), "mask")],
    )  # fmt: skip
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 23)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    print(f"CPU: {cpu_info().describe()}; onnxruntime {ort.__version__}; {args.threads} thread(s)")
    print("| clips × heads × head dim | slots × tokens | dense (ms) | loop over slots (ms) | dense / loop | max diff |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for b, heads, hd, slots, per_slot in SHAPES:
        model = dense_graph(b, heads, hd, slots, per_slot)
        dense = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        assert frame_attention(model, input_name="grid", tubelet=1, patch=1) == 1
        loop = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        shape = (b, heads, 1 + slots * per_slot, hd)
        feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
        feeds["grid"] = np.zeros((1, 1, slots, per_slot, 1), np.float32)
        diff = float(np.abs(dense.run(None, feeds)[0] - loop.run(None, feeds)[0]).max())
        times: dict[str, list[float]] = {"dense": [], "loop": []}
        for _ in range(args.reps):
            for name, sess in (("dense", dense), ("loop", loop)):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                times[name].append(1e3 * (time.perf_counter() - t0))
        d, lp = statistics.median(times["dense"]), statistics.median(times["loop"])
        print(f"| {b} × {heads} × {hd} | {slots} × {per_slot} | {d:.3f} | {lp:.3f} | {d / lp:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
