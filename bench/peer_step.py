"""levjepa's training step against the reference LeVJEPA step, same settings, interleaved; and a profile of ours.

    python bench/peer_step.py                                   # levjepa only
    python bench/peer_step.py --reference PATH/TO/module.py     # beside the reference (MLO-lab/LeVJEPA)
    python bench/peer_step.py --baseline /tmp/old               # beside an earlier levjepa (its src/ and bench/)
    python bench/peer_step.py --profile                         # torch.profiler: step ÷ (matmul + attention)

The reference code is CC BY-NC 4.0: it is never shipped with levjepa. ``--reference`` names the user's copy
of its ``module.py`` (it needs ``vit_tiny``, ``Projector`` and ``SIGReg`` with training-time token dropping),
loaded at run time; its step is assembled as the official ``main.py`` ``multiview_forward`` does (the global
view, then the ``(b v)`` local views, through the encoder in train mode with ``token_drop_rate = ρ``,
``token_drop_mode="random"``; one projector call on the ``[B, 1 + V, D]`` CLS; ``pred_loss + 0.02 · sigreg``),
then backward and ``torch.optim.AdamW`` (lr 4e-4, betas (0.9, 0.95), weight decay 0.04 off biases, norms and
1-D parameters, as ``main.py``). levjepa's step is ``levjepa.train.step.train_step`` on the
``vit-tiny-consumer`` preset (its gradient clipping and fused AdamW included).

Both: ViT-Tiny, per-frame 16×16 patches, 16 frames, 1 global view at 224 and 4 local at 96, block-causal
attention, 3D RoPE, projector 2048 → 256, λ = 0.02, fp32, ``--threads`` intra-op threads. The inputs are the
normalised float views each implementation's loader hands its step (levjepa ``[V, B, C, T, H, W]`` groups,
the reference ``[B, T, C, H, W]`` and ``[B, V, T, C, H, W]``).

Each (setting, implementation) runs in a fresh process (``--worker``), so that its peak RSS
(``ru_maxrss``: imports, model, optimiser state, activations) is its own; the processes are interleaved —
every round runs every setting with both implementations, their order alternating — so load from other
processes on a shared machine hits both alike. A process runs one warm-up step and ``--steps`` timed steps;
``--baseline DIR`` adds an earlier levjepa checkout (e.g. ``git archive <commit> src bench | tar -x -C DIR``)
to the same rounds (with ``--compiled``, its compiled step too), run by its own copy of this script: before
and after measured side by side. A setting's
ms/step is the minimum over rounds of each process's fastest step (the least disturbed by other
load: on a shared machine a median still moves with what else runs), its peak RSS the largest of its runs.
With ``--threads 1`` the process's CPU time per step is printed too (``cpu ms``): the compute of the step,
which other processes on the machine disturb far less than its wall time.

``--paired N`` times every implementation in this one process instead, alternating their steps (round ``r``
runs each once, the order reversed every other round) for ``N`` rounds after two warm-up steps each: on a
machine whose speed drifts by 10–20 % between processes and minutes, the ratio of two steps run back to back
moves far less than the ratio of two processes' times. It prints each side's median and fastest step and the
per-round ratio reference / levjepa (median and range); peak RSS is not measured (one process holds all).

``--profile`` runs levjepa's step (ρ = 0.95, batch 8) under ``torch.profiler`` and prints the step's time
over the self CPU time of its matrix products (``mm``, ``addmm``, ``bmm``, convolutions) and attention kernels
(``scaled_dot_product_*`` forward and backward; on the CPU short-sequence path, whose products are ``bmm``, the
softmax forward and backward), with the largest other ops: what is left to remove. ``--kernels`` adds where
the step's time goes: the floating-point work of its products (from their shapes) and the rate they ran at,
beside this machine's rate on a square 1024² product timed in the same process; and the rest of the step by
kind of work (GELU, softmax, LayerNorm, RoPE, layout copies, optimiser, gradient norms, compiled-call
wrappers, Python between ops). With ``--compiled`` it turns on TorchInductor's kernel profiling, so each
generated kernel is an event of its own, named after the operations fused into it.

Results and the commands that made them: ``bench/train.md`` (A training step near its limit).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levjepa.config import apply_overrides
from levjepa.infer.cpu import cpu_info
from levjepa.objective import build_objective
from levjepa.presets import preset
from levjepa.rng import sample_keys
from levjepa.train.loop import build_models
from levjepa.train.optim import build_optimizer
from levjepa.train.step import Pretrainer, train_step

# name -> (drop ratio, batch)
SETTINGS = {"rho0.95_b8": (0.95, 8), "rho0.75_b8": (0.75, 8), "nodrop_b2": (0.0, 2)}
LABELS = {"rho0.95_b8": "ρ = 0.95, batch 8", "rho0.75_b8": "ρ = 0.75, batch 8", "nodrop_b2": "no dropping, batch 2"}
FRAMES, GLOBAL, LOCAL, NUM_LOCAL, LAMBDA = 16, 224, 96, 4, 0.02
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution")
ATTENTION_PREFIX = "aten::_scaled_dot_product"
# the CPU short-sequence path (levjepa.model.attention.attend) computes attention as two products (counted as
# matmul) and a softmax: its softmax, forward and backward, is attention's, as inside SDPA's fused kernel
ATTENTION_OPS = ("aten::_softmax", "aten::_softmax_backward_data")


def is_attention(op: str) -> bool:
    return op.startswith(ATTENTION_PREFIX) or op in ATTENTION_OPS


def _views(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float views: global ``[1, B, C, T, 224, 224]``, local ``[4, B, C, T, 96, 96]``."""
    g = torch.Generator().manual_seed(seed)
    glob = torch.randn(1, batch, 3, FRAMES, GLOBAL, GLOBAL, generator=g)
    local = torch.randn(NUM_LOCAL, batch, 3, FRAMES, LOCAL, LOCAL, generator=g)
    return glob, local


def levjepa_step(rho: float, batch: int, compile_blocks: bool = False) -> Callable[[int], None]:
    """``step(i)``: one ``train_step`` of the ``vit-tiny-consumer`` preset at drop ratio ``rho``."""
    overrides = ["data.sources=/unused", f"model.drop_ratio={rho}", f"data.batch_size={batch}"]
    cfg = apply_overrides(preset("vit-tiny-consumer"), [*overrides, f"train.batch_size={batch}"])
    model = Pretrainer(*build_models(cfg, seed=0))
    if compile_blocks:
        model.encoder.compile_blocks()
    objective = build_objective(cfg.objective, check_finite=False)
    opt = build_optimizer(model, cfg.optim)
    views = list(_views(batch))
    keys = sample_keys(0, "drop", 0, positions=range(batch))

    def step(i: int) -> None:
        out = train_step(model, objective, opt, [views], [keys], step=i, lr=4e-4, grad_clip=cfg.optim.grad_clip)
        float(out.loss)

    return step


def reference_step(
    path: str,
    rho: float,
    batch: int,
    *,
    factory: str = "vit_tiny",
    views: tuple[torch.Tensor, torch.Tensor] | None = None,
    autocast: torch.dtype | None = None,
) -> Callable[[int], None]:
    """``step(i)``: the reference step (module docstring) from the user's ``module.py`` at ``path``: the encoder
    its ``factory`` builds, on the device of ``views`` (levjepa's layout, global ``[1, B, C, T, H, W]`` and local
    ``[V, B, C, T, h, w]``; default: this script's CPU views), under ``autocast`` (``main.py``'s bf16-mixed)."""
    spec = importlib.util.spec_from_file_location("levjepa_reference_module", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--reference {path}: not a Python module")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    glob, local = views if views is not None else _views(batch)
    device = glob.device
    torch.manual_seed(0)
    encoder = getattr(ref, factory)(
        img_size=glob.shape[-1],
        patch_size=16,
        num_frames=glob.shape[3],
        tubelet_size=1,
        use_rope=True,
        token_drop_rate=rho,
        token_drop_mode="random",
        attn_mode="block_causal",
    ).train()
    projector = ref.Projector(input_dim=encoder.embed_dim, hidden_dim=2048, output_dim=256).train()
    encoder, projector, sigreg = encoder.to(device), projector.to(device), ref.SIGReg().to(device)
    params = [(n, p) for m in (encoder, projector) for n, p in m.named_parameters()]
    no_decay = [p for n, p in params if "bias" in n.lower() or "norm" in n.lower() or p.ndim == 1]
    decay = [p for n, p in params if not ("bias" in n.lower() or "norm" in n.lower() or p.ndim == 1)]
    groups = [{"params": decay, "weight_decay": 0.04}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=4e-4, betas=(0.9, 0.95))
    global_frame = glob[0].transpose(1, 2).contiguous()  # [B, T, C, H, W]: the official loader's layout
    local_frames = local.permute(1, 0, 3, 2, 4, 5).contiguous()  # [B, V, T, C, H, W]
    num_local = local.shape[0]

    def step(i: int) -> None:
        b = global_frame.shape[0]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            global_cls = encoder(global_frame.permute(0, 2, 1, 3, 4))[:, 0].unsqueeze(1)  # "b t c h w -> b c t h w"
            local_tokens = encoder(local_frames.flatten(0, 1).permute(0, 2, 1, 3, 4))  # "b v t c h w -> (b v) ..."
            local_cls = local_tokens[:, 0].reshape(b, num_local, -1)  # "(b v) d -> b v d"
            embeddings = projector(torch.cat([global_cls, local_cls], dim=1))
            pred_loss = (embeddings[:, :1] - embeddings).pow(2).mean()
            loss = pred_loss + LAMBDA * sigreg(embeddings.transpose(0, 1))  # "b v d -> v b d"
        loss.backward()
        opt.step()
        float(loss)

    return step


def worker(impl: str, setting: str, steps: int, reference: str | None) -> dict:
    """One process's run: a warm-up step, then ``steps`` timed steps; its fastest step (ms) and peak RSS."""
    rho, batch = SETTINGS[setting]
    if impl == "reference":
        assert reference is not None
        step = reference_step(reference, rho, batch)
    else:
        step = levjepa_step(rho, batch, compile_blocks=impl == "levjepa_compiled")
    step(0)
    times, cpu = [], []
    for i in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        step(i)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"impl": impl, "setting": setting, "ms": min(times), "cpu_ms": min(cpu), "rss_mib": rss_mib}


# ``--kernels``: the step's non-product time by kind of work, from op and TorchInductor kernel names (a
# generated kernel is named after the operations fused into it); the first group whose word a name contains
KERNEL_GROUPS = (
    ("GELU", ("gelu",)),
    ("softmax", ("softmax",)),
    ("LayerNorm", ("layer_norm",)),
    ("RoPE", ("addcmul",)),
    ("layout copies", ("clone", "transpose", "copy", "cat", "index")),
    ("optimiser", ("adamw", "optimizer")),
    ("vector norms (gradient clipping, SIGReg)", ("norm",)),
    ("compiled-call wrappers", ("compiledfxgraph", "compiledfunction", "dynamo", "aotdispatcher", "pregraph")),
    ("Python between ops", ("train_step",)),
)


def kernel_group(name: str) -> str:
    low = name.lower()
    return next((label for label, words in KERNEL_GROUPS if any(w in low for w in words)), "other")


def product_flops(op: str, shapes: list) -> int:
    """Floating-point operations of one matrix-product op from its recorded input shapes (0 if unknown)."""
    if op == "aten::mm" and len(shapes) >= 2 and len(shapes[0]) == len(shapes[1]) == 2:
        return 2 * shapes[0][0] * shapes[0][1] * shapes[1][1]
    if op == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == len(shapes[2]) == 2:
        return 2 * shapes[1][0] * shapes[1][1] * shapes[2][1]
    if op in ("aten::bmm", "aten::baddbmm"):
        a, b = (shapes[0], shapes[1]) if op == "aten::bmm" else (shapes[1], shapes[2])
        if len(a) == len(b) == 3:
            return 2 * a[0] * a[1] * a[2] * b[2]
    return 0


def gemm_rate(n: int = 1024, repeats: int = 20) -> float:
    """This machine's float32 rate on a square ``n``² product, GFLOP/s (the median of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def profile(rho: float, batch: int, steps: int, compiled: bool = False, kernels: bool = False) -> dict:
    """Profiler totals of levjepa's step (``compiled``: with ``train.compile``, after its compilation): step
    time, matmul and attention self time (ms per step); ``kernels``: also the products' work and rate and the
    rest of the step by kind of work (module docstring, ``--kernels``)."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    if kernels and compiled:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # before the first call compiles
    step = levjepa_step(rho, batch, compile_blocks=compiled)
    step(0)
    step(1)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=kernels) as prof:
        for i in range(steps):
            with record_function("train_step"):
                step(2 + i)
    events = prof.key_averages()
    step_ms = sum(e.cpu_time_total for e in events if e.key == "train_step") / 1e3 / steps
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e3 / steps
    attention = sum(e.self_cpu_time_total for e in events if is_attention(e.key)) / 1e3 / steps
    others = sorted(
        (e for e in events if e.key not in MATMUL_OPS and not is_attention(e.key)),
        key=lambda e: -e.self_cpu_time_total,
    )
    top = [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in others[:20] if e.key != "train_step"]
    res = {"step_ms": step_ms, "matmul_ms": matmul, "attention_ms": attention, "top_other": top}
    if kernels:
        by_shape = prof.key_averages(group_by_input_shape=True)
        flops = sum(product_flops(e.key, e.input_shapes) * e.count for e in by_shape if e.key in MATMUL_OPS)
        groups: dict[str, float] = {}
        for e in others:
            label = kernel_group(e.key)
            groups[label] = groups.get(label, 0.0) + e.self_cpu_time_total / 1e3 / steps
        res |= {"product_gflop": flops / 1e9 / steps, "square_gemm_gflops": gemm_rate(), "groups": groups}
    return res


def paired(setting: str, rounds: int, reference: str | None, compiled: bool) -> dict:
    """Every implementation in this process, their steps alternated (module docstring, ``--paired``): per side
    the ms of every timed step, and per levjepa side the per-round ratios reference / it."""
    rho, batch = SETTINGS[setting]
    steps = {"levjepa": levjepa_step(rho, batch)}
    if compiled:
        steps["levjepa_compiled"] = levjepa_step(rho, batch, compile_blocks=True)
    if reference:
        steps["reference"] = reference_step(reference, rho, batch)
    for step in steps.values():
        step(0)
        step(1)
    names = list(steps)
    ms: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            steps[name](2 + r)
            ms[name].append((time.perf_counter() - t0) * 1e3)
    ours = [n for n in names if n != "reference"] if reference else []
    ratios = {n: [a / b for a, b in zip(ms["reference"], ms[n], strict=True)] for n in ours}
    return {"setting": setting, "ms": ms, "ratios": ratios}


def _print_paired(res: dict) -> None:
    print(f"\n{LABELS[res['setting']]}, steps alternated in one process ({len(next(iter(res['ms'].values())))} rounds)")
    print("| side | median ms/step | fastest ms/step |\n| --- | ---: | ---: |")
    for name, ms in res["ms"].items():
        print(f"| {name} | {statistics.median(ms):.0f} | {min(ms):.0f} |")
    if res["ratios"]:
        print("\n| reference / side, per round | median | range |\n| --- | ---: | --- |")
        for name, r in res["ratios"].items():
            print(f"| {name} | {statistics.median(r):.2f} | {min(r):.2f}–{max(r):.2f} |")


def _run_worker(impl: str, setting: str, args: argparse.Namespace) -> dict:
    script, as_impl = __file__, impl
    if impl.startswith("baseline"):  # the earlier checkout's own script and src/ time its levjepa step
        script = str(Path(args.baseline) / "bench" / "peer_step.py")
        as_impl = "levjepa_compiled" if impl == "baseline_compiled" else "levjepa"
    cmd = [sys.executable, script, "--worker", as_impl, setting, "--steps", str(args.steps)]
    cmd += ["--threads", str(args.threads)] + (["--reference", args.reference] if args.reference else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker {impl} {setting} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "impl": impl}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", help="path to the reference LeVJEPA module.py (never shipped with levjepa)")
    ap.add_argument("--baseline", help="an earlier levjepa checkout (src/, bench/) to time in the same rounds")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated among {', '.join(SETTINGS)}")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (one process per setting and side)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per process, after one warm-up step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compiled", action="store_true", help="also time (or profile) levjepa with train.compile")
    ap.add_argument("--profile", action="store_true", help="profile levjepa's rho = 0.95 batch 8 step instead")
    ap.add_argument("--kernels", action="store_true", help="with --profile: the products' rate, the rest by kind")
    ap.add_argument("--paired", type=int, metavar="N", help="N rounds of alternated steps in one process instead")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--worker", nargs=2, metavar=("IMPL", "SETTING"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.steps, args.reference)))
        return
    if args.paired:
        res = paired(args.settings.split(",")[0], args.paired, args.reference, args.compiled)
        _print_paired(res)
        if args.out:
            args.out.write_text(json.dumps(res, indent=1))
        return
    if args.profile:
        res = profile(0.95, 8, args.steps, compiled=args.compiled, kernels=args.kernels)
        ratio = res["step_ms"] / (res["matmul_ms"] + res["attention_ms"])
        print(f"step {res['step_ms']:.0f} ms, matmul {res['matmul_ms']:.0f} ms, attention {res['attention_ms']:.0f} ms")
        print(f"step / (matmul + attention) = {ratio:.3f} (overhead {100 * (1 - 1 / ratio):.1f} % of the step)")
        for name, ms, count in res["top_other"]:
            print(f"  {ms:7.1f} ms  {count:5d}x  {name}")
        if args.kernels:
            gf, peak, mm = res["product_gflop"], res["square_gemm_gflops"], res["matmul_ms"]
            print(f"\nproducts: {gf:.2f} GFLOP a step in {mm:.0f} ms ({gf / mm * 1e3:.0f} GFLOP/s)")
            print(
                f"a 1024² float32 product here: {peak:.0f} GFLOP/s; the step's products at it: {gf / peak * 1e3:.0f} ms"
            )
            print("\n| the rest of the step | ms/step |\n| --- | ---: |")
            for label, ms in sorted(res["groups"].items(), key=lambda kv: -kv[1]):
                print(f"| {label} | {ms:.1f} |")
        if args.out:
            args.out.write_text(json.dumps({**res, "ratio": ratio}, indent=1))
        return
    impls = (["baseline"] if args.baseline else []) + ["levjepa"]
    impls += (["baseline_compiled"] if args.baseline else []) + ["levjepa_compiled"] if args.compiled else []
    impls += ["reference"] if args.reference else []
    settings = args.settings.split(",")
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for setting in settings:
            for impl in impls if r % 2 == 0 else impls[::-1]:
                row = _run_worker(impl, setting, args)
                results.setdefault((impl, setting), []).append(row)
                line = f"  round {r} {setting:11s} {impl:16s} {row['ms']:8.0f} ms  {row.get('cpu_ms', 0):8.0f} cpu ms"
                line += f"  {row['rss_mib']:6.0f} MiB"
                print(line, flush=True)
    ours = [i for i in impls if i != "reference"]
    table = []
    for key, unit in (("ms", "ms/step"), ("cpu_ms", "CPU ms/step"))[: 2 if args.threads == 1 else 1]:
        ratio_cols = [f"reference / {i}" for i in ours] if args.reference else []
        cols = [f"{i} {unit}" for i in impls] + ratio_cols + [f"peak RSS {' / '.join(impls)} (MiB)"]
        print("\n| setting | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 1))
        for setting in settings:
            ms = {i: min(x.get(key, x["ms"]) for x in results[(i, setting)]) for i in impls}
            rss = {i: max(x["rss_mib"] for x in results[(i, setting)]) for i in impls}
            cells = [f"{ms[i]:.0f}" for i in impls]
            cells += [f"{ms['reference'] / ms[i]:.2f}" for i in ours if args.reference]
            cells.append(" / ".join(f"{rss[i]:.0f}" for i in impls))
            print(f"| {LABELS[setting]} | " + " | ".join(cells) + " |")
            table.append({"setting": setting, "measure": key, "ms": ms, "rss_mib": rss})
    if args.out:
        args.out.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
