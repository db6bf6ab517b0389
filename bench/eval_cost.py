"""What frozen evaluation costs at benchmark scale, from per-view measurements (bench/eval.md, "Cost table").

    python bench/eval_cost.py [--models vit-tiny,vit-base,vit-large]
        [--codecs full,int8,pool2-int8,last-int8,tpool3-int4] [--threads 2] [--epochs 20]
        [--accuracy "int8=-0.5/-1.2,pool2-int8=..."]

Measures on this machine, per model: one encoder forward of one 8-frame 224² view (the paper's matched
evaluation, 8 temporal slots at tubelet 1; a 256² view is scaled by its token count) and one training step of
the attentive probe grid (V-JEPA 2's 20 probes, 1000 classes) per view for every token count a codec keeps.
Then it multiplies out, for IN-1K, SSv2 and K400 at their public sizes and protocol views, with the formulas
(``last`` codecs, every slot but the last dropped, only for IN-1K, whose views repeat one image):

* bytes per view: the codec's tokens (``TokenCodec.bytes_per_view``: ``(1 + L') · b`` with ``b = 2D`` in
  float16, ``D + 2`` in int8, ``D/2 + 2`` in int4; ``L = 8 · (S/16)²`` patches before pooling) plus CLS and
  mean in float32 (``2 · D · 4``); bytes per clip: that times the protocol's views per clip;
* encoder forwards per training clip: a store, the train views once; online, ``epochs × train views``;
* time: ``forwards × t_enc + epochs × train views × t_probe(L')`` (a store's probes read its kept tokens; the
  online probes read every token).

The times are this CPU's (a GPU runs both far faster; the ratios between the rows are what carries over).
``--accuracy`` adds a row: the attentive probe's measured difference from the full store per codec (bench/eval.md,
"Compact stores", measured at demo scale). The time table compares the full store, the last codec given and
online.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# public split sizes and the protocols' views per file (levjepa.eval.protocols): train rows, eval rows
DATASETS = {
    "IN-1K": {"train": 1_281_167, "eval": 50_000, "size": 224, "train_views": 1, "eval_views": 1},
    "SSv2": {"train": 168_913, "eval": 24_777, "size": 256, "train_views": 2, "eval_views": 6},
    "K400": {"train": 240_436, "eval": 19_877, "size": 256, "train_views": 8, "eval_views": 24},
}
SLOTS = 8


def _time(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    fn()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(model: str, threads: int, kept: list[int]) -> dict[str, float]:
    import torch

    from levjepa.eval.probes import build_probe_grid, probe_config
    from levjepa.formats.reading.load import random_encoder
    from levjepa.infer.encode import encode
    from levjepa.model import encoder_config

    torch.set_num_threads(threads)
    enc = random_encoder(encoder_config(model, tubelet=1), seed=0).encoder
    d = enc.cfg.dim
    clip = torch.randint(0, 256, (1, 3, SLOTS, 224, 224), dtype=torch.uint8)
    t_enc = _time(lambda: encode(enc, clip, "cpu"), repeat=1 if model == "vit-large" else 2)
    grid = build_probe_grid("attentive", probe_config("full"), d, 1000)
    out = {"dim": d, "t_enc_224": t_enc}
    for tokens in sorted(set(kept)):
        x = torch.randn(16, tokens, d)

        def step(x: torch.Tensor = x) -> None:
            grid(x).sum().backward()

        out[f"t_probe_{tokens}"] = _time(step, repeat=6) / len(x)
    return out


def _grid(size: int) -> tuple[int, int, int]:
    return SLOTS, size // 16, size // 16


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} EB"


def _hours(s: float) -> str:
    return f"{s / 3600:,.0f} h" if s >= 36_000 else f"{s / 3600:.1f} h"


def table(measured: dict[str, dict[str, float]], codecs: list[str], epochs: int, accuracy: dict[str, str]) -> None:
    """Two tables: disk per clip and in all for every codec (and the measured accuracy row), then encoder
    passes and time for a store against online."""
    from levjepa.features.compact import FULL, TokenCodec

    small = codecs[-1] if len(codecs) > 1 else codecs[0]
    print("Disk: bytes per clip (train and eval views, every array) and the whole benchmark, per store\n")
    print("| benchmark | model | " + " | ".join(codecs) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in codecs) + " |")
    rows = []
    for bench, ds in DATASETS.items():
        grid = _grid(ds["size"])
        scale = grid[0] * grid[1] * grid[2] / (SLOTS * 196)  # a 256² view: more tokens than the measured 224²
        views = ds["train"] * ds["train_views"] + ds["eval"] * ds["eval_views"]
        clips, train_views = ds["train"] + ds["eval"], ds["train"] * ds["train_views"]
        for model, m in measured.items():
            d, t_enc = int(m["dim"]), m["t_enc_224"] * scale
            cells = []
            for name in codecs:
                if "last" in name and bench != "IN-1K":  # ``last``: for image protocols only
                    cells.append("—")
                    continue
                per_view = TokenCodec.parse(name).bytes_per_view(grid, d) + 2 * d * 4  # + CLS and mean, float32
                cells.append(f"{_bytes(per_view * views / clips)} ({_bytes(per_view * views)})")
            print(f"| {bench} | {model} | " + " | ".join(cells) + " |")
            online_forwards = epochs * train_views + ds["eval"] * ds["eval_views"]
            probe = [epochs * train_views * m[f"t_probe_{c.kept(grid)}"] for c in (FULL, TokenCodec.parse(small))]
            rows.append((bench, model, ds["train_views"], online_forwards / ds["train"], views * t_enc,
                         online_forwards * t_enc, probe))  # fmt: skip
    if accuracy:
        print(
            "| attentive probe against full, demo scale | | " + " | ".join(accuracy.get(c, "") for c in codecs) + " |"
        )
    print(
        f"\nTime on this CPU: encoder forwards per training clip and hours, a store against online ({epochs} epochs)\n"
    )
    print(f"| benchmark | model | forwards per train clip: store / online | encoding: store / online | "
          f"probes: full store / {small} | in all: full store / online |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for bench, model, fwd_store, fwd_online, enc_store, enc_online, probe in rows:
        full_p, small_p = probe
        print(
            f"| {bench} | {model} | {fwd_store} / {fwd_online:.0f} | {_hours(enc_store)} / {_hours(enc_online)} | "
            f"{_hours(full_p)} / {_hours(small_p)} | {_hours(enc_store + full_p)} / {_hours(enc_online + full_p)} |"
        )


def main() -> None:
    sys.path.insert(0, str(SRC))
    from levjepa.features.compact import TokenCodec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vit-tiny,vit-base,vit-large")
    ap.add_argument(
        "--codecs", default="full,int8,pool2-int8,last-int8,tpool3-int4", help="the last one: the time table's"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--accuracy", default="", help="codec=text,... : a column of measured accuracy differences")
    args = ap.parse_args()
    from levjepa.infer.cpu import cpu_info

    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    codecs = args.codecs.split(",")
    accuracy = dict(item.split("=", 1) for item in args.accuracy.split(",") if item)
    kept = [TokenCodec.parse(c).kept(_grid(ds["size"])) for c in [*codecs, "full"] for ds in DATASETS.values()]
    measured = {}
    for model in args.models.split(","):
        measured[model] = m = measure(model, args.threads, kept)
        probe = ", ".join(f"{k[8:]} tokens {1000 * v:.0f} ms" for k, v in m.items() if k.startswith("t_probe_"))
        print(f"{model}: D {int(m['dim'])}, encoder {m['t_enc_224']:.2f} s a 8×224² view; attentive grid step a view: "
              f"{probe}", file=sys.stderr, flush=True)  # fmt: skip
    table(measured, codecs, args.epochs, accuracy)


if __name__ == "__main__":
    main()
