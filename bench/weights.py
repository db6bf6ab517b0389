"""Weights in and out, measured: how close imported official weights come to the official outputs, and what
an export round trip costs.

    python bench/weights.py            # prints the tables of bench/weights.md

Part 1 reads the fixture made by running the official LeVJEPA module.py (tests/fixtures/official) through
`levjepa import`'s reader and reports the largest absolute difference of any output token. Part 2 exports a
random ViT-Tiny in the hub layout, reads it back three ways (levjepa.load, levjepa.from_pretrained,
transformers' AutoModel) and reports the difference to the source encoder (0 = bit-exact) and the times.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import levjepa
from levjepa.formats.reading.official import Overrides, read_official
from levjepa.formats.writing.export import write_export
from levjepa.infer.cpu import cpu_info
from levjepa.model import VideoEncoder, encoder_config

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "official"


def official_rows(work: Path) -> list[str]:
    rows = ["| config | max abs difference, every token (CLS + patches) | tokens |", "| --- | ---: | ---: |"]
    for tau in (1, 2):
        t = load_file(str(FIXTURES / f"official_tau{tau}.safetensors"))
        enc = {k[len("encoder.") :]: v for k, v in t.items() if k.startswith("encoder.")}
        src = work / f"tau{tau}.safetensors"
        save_file(enc, str(src))
        for mode in ("block_causal", "full"):
            m = read_official(src, Overrides(heads=3, attention=mode))
            model = VideoEncoder(m.config).eval()
            model.load_state_dict(m.encoder)
            with torch.no_grad():
                got = model.forward_features(t["input.video"]).tokens
            diff = (got - t[f"output.{mode}"]).abs().max().item()
            rows.append(f"| dim 96, depth 2, 3 heads, τ = {tau}, {mode} | {diff:.2e} | {got.shape[1]} |")
    return rows


def roundtrip_rows(work: Path) -> list[str]:
    cfg = encoder_config("vit-tiny")
    torch.manual_seed(0)
    enc = VideoEncoder(cfg).eval()
    x = torch.randn(2, 3, 16, 224, 224)
    t0 = time.perf_counter()
    write_export(work / "export", config=cfg, encoder_state=enc.state_dict(), weights="online")
    t_write = time.perf_counter() - t0
    with torch.no_grad():
        want = enc.forward_features(x).tokens
        rows = ["| read back with | max abs difference to the source | load time (s) |", "| --- | ---: | ---: |"]
        for name, fn in (
            ("levjepa.load", lambda: levjepa.load(work / "export")),
            ("levjepa.from_pretrained", lambda: levjepa.from_pretrained(work / "export")),
            ("transformers.AutoModel", lambda: _automodel(work / "export")),
        ):
            t0 = time.perf_counter()
            model = fn()
            dt = time.perf_counter() - t0
            out = (
                model(pixel_values=x).last_hidden_state if name != "levjepa.load" else model.forward_features(x).tokens
            )
            rows.append(f"| {name} | {(out - want).abs().max().item():.1e} | {dt:.2f} |")
    size = (work / "export" / "model.safetensors").stat().st_size / 2**20
    rows.append(f"\nViT-Tiny export: write {t_write:.2f} s, model.safetensors {size:.1f} MiB")
    return rows


def _automodel(path: Path):
    import transformers

    levjepa.register_transformers()
    return transformers.AutoModel.from_pretrained(str(path))


def main() -> None:
    print(f"CPU: {cpu_info().describe()}", file=sys.stderr, flush=True)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("\n".join(official_rows(work)))
        print()
        print("\n".join(roundtrip_rows(work)))
        print(json.dumps({"torch": torch.__version__}))


if __name__ == "__main__":
    main()
