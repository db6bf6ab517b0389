"""What the patch features of one clip look like (``levjepa visualize CKPT VIDEO|IMAGE|synthetic[:i] --out DIR``).

Two qualitative readouts (SPEC §5; LeJEPA / LeVJEPA figures):

* **PCA → RGB.** All patch tokens of the clip (every frame, nothing dropped) are centred and projected on
  their first three principal components (SVD of the ``[N_tokens, D]`` matrix); each component is mapped
  to a colour channel after clipping to its 1st–99th percentile over the clip (robust min–max), so that
  the same colour means the same feature direction in every frame. Parts of the scene the encoder groups
  together share a colour; a video encoder's maps should also stay stable along time.
* **Cosine similarity from a query patch** ``(t, y, x)`` (patch-grid coordinates, default: the centre
  patch of the middle frame): ``cos(f_query, f_i)`` for every token, shown with a dark-to-bright colour
  ramp stretched from the clip's 1st percentile of similarity (dark) to 1 (bright, the query itself) —
  features of a trained encoder are rarely anti-correlated, so a fixed [−1, 1] scale would wash every
  map out; the raw range is in the JSON. The query cell is outlined in the input frame.

Outputs: ``DIR/visualize.png`` — input frames (top row, query outlined), PCA maps (middle), similarity
maps (bottom), each map upsampled (nearest) to the frame size; ``DIR/visualize.gif`` — the three panels
side by side, one GIF frame per video frame (Pillow, cheap); ``DIR/visualize.json`` — the explained
variance of the three components, the query, the token grid, the source. Pillow only: no matplotlib.

The clip (``levjepa.data.eval_clip.load_eval_clip``, the evaluation transform): ``--frames`` frames of a
video at ``--frame-stride`` from ``--start``, or an image repeated along time, resized to a short side of
``--size`` and centre-cropped to a square multiple of the patch size; ``synthetic:i`` is clip ``i`` of the
built-in benchmark's test split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor

from levjepa.config import ConfigError
from levjepa.data.config import SyntheticConfig
from levjepa.data.eval_clip import center_square, load_eval_clip
from levjepa.data.synthetic import load_split
from levjepa.infer.encode import encode
from levjepa.model.vit import VideoEncoder
from levjepa.weights import write_json

__all__ = [
    "GIF",
    "MAPS",
    "PNG",
    "SUMMARY",
    "cosine_map",
    "load_clip",
    "pca_rgb",
    "render_panels",
    "visualize",
]

PNG, GIF, SUMMARY = "visualize.png", "visualize.gif", "visualize.json"  # what visualize writes
MAPS = (PNG, GIF, SUMMARY)

# a perceptually increasing ramp (dark blue -> teal -> yellow), for the similarity maps
_RAMP = torch.tensor(
    [[0.05, 0.03, 0.25], [0.15, 0.25, 0.55], [0.10, 0.55, 0.55], [0.45, 0.80, 0.30], [0.99, 0.91, 0.15]]
)


def pca_rgb(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """``tokens`` [N, D] -> (colours [N, 3] in [0, 1], explained-variance ratios [3]) via the top-3 PCA."""
    x = tokens.double()
    x = x - x.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    k = min(3, vh.shape[0])
    proj = x @ vh[:k].T  # [N, k]
    if k < 3:
        proj = torch.cat([proj, proj.new_zeros(len(proj), 3 - k)], 1)
    lo = torch.quantile(proj, 0.01, dim=0)
    hi = torch.quantile(proj, 0.99, dim=0)
    rgb = ((proj - lo) / (hi - lo).clamp_min(1e-8)).clamp(0, 1)
    var = s**2
    ratio = var[:3] / var.sum().clamp_min(1e-12)
    return rgb.float(), torch.cat([ratio, ratio.new_zeros(3 - len(ratio))]).float()


def cosine_map(tokens: Tensor, query: int) -> Tensor:
    """Cosine similarity of every token [N, D] with token ``query``: [N] in [−1, 1]."""
    t = F.normalize(tokens.double(), dim=-1)
    return (t @ t[query]).float()


def _ramp(values: Tensor) -> Tensor:
    """Values in [0, 1] -> RGB [.., 3] in [0, 1] along :data:`_RAMP`."""
    pos = values.clamp(0, 1) * (len(_RAMP) - 1)
    i = pos.floor().long().clamp(max=len(_RAMP) - 2)
    w = (pos - i)[..., None]
    return _RAMP[i] * (1 - w) + _RAMP[i + 1] * w


def _to_frames(maps: Tensor, tubelet: int, size: tuple[int, int]) -> Tensor:
    """Token maps [T', h, w, 3] -> per-frame images uint8 [T'·τ, H, W, 3] (nearest upsampling)."""
    up = F.interpolate(maps.permute(0, 3, 1, 2), size=size, mode="nearest")  # [T', 3, H, W]
    up = up.repeat_interleave(tubelet, dim=0)
    return (up.permute(0, 2, 3, 1) * 255).round().clamp(0, 255).to(torch.uint8)


def render_panels(
    frames: Tensor, pca: Tensor, sim: Tensor, query: tuple[int, int, int], patch: int, tubelet: int
) -> tuple[Image.Image, list[Image.Image]]:
    """PIL images: the grid (frames / PCA / similarity rows) and the GIF frames (one per video frame).

    ``frames`` uint8 [T, H, W, 3]; ``pca`` [T', h, w, 3] in [0, 1]; ``sim`` [T', h, w] in [−1, 1].
    """
    t_len, h, w, _ = frames.shape
    pca_f = _to_frames(pca, tubelet, (h, w))
    sim_f = _to_frames(_ramp(sim), tubelet, (h, w))
    shown = frames.clone()
    qt, qy, qx = query
    gap = 2
    grid = Image.new("RGB", (t_len * (w + gap) - gap, 3 * (h + gap) - gap), (255, 255, 255))
    gif = []
    for t in range(t_len):
        tiles = [
            Image.fromarray(shown[t].numpy()),
            Image.fromarray(pca_f[t].numpy()),
            Image.fromarray(sim_f[t].numpy()),
        ]
        if t // tubelet == qt:
            ImageDraw.Draw(tiles[0]).rectangle(
                [qx * patch, qy * patch, (qx + 1) * patch - 1, (qy + 1) * patch - 1], outline=(255, 0, 0)
            )
        for row, tile in enumerate(tiles):
            grid.paste(tile, (t * (w + gap), row * (h + gap)))
        strip = Image.new("RGB", (3 * (w + gap) - gap, h), (255, 255, 255))
        for col, tile in enumerate(tiles):
            strip.paste(tile, (col * (w + gap), 0))
        gif.append(strip)
    return grid, gif


@torch.no_grad()
def visualize(
    encoder: VideoEncoder,
    clip: Tensor,
    out_dir: str | Path,
    *,
    query: tuple[int, int, int] | None = None,
    scale: int = 1,
    device: str = "cpu",
    gif: bool = True,
    source: str = "",
) -> dict[str, Any]:
    """Write the PCA / similarity visualisation of ``clip`` (uint8 [C, T, H, W] or [T, H, W, 3]).

    ``scale`` enlarges every tile (nearest) for small clips. Returns the summary written to JSON.
    """
    if clip.dim() != 4 or clip.dtype != torch.uint8:
        raise ValueError(
            f"visualize: clip must be uint8 [C, T, H, W] or [T, H, W, 3], got {clip.dtype} {list(clip.shape)}"
        )
    if clip.shape[0] != 3 and clip.shape[-1] == 3:
        clip = clip.permute(3, 0, 1, 2)
    c, t_len, h, w = clip.shape
    cfg = encoder.cfg
    p, tau = cfg.patch_size, cfg.tubelet
    if c != 3 or h % p or w % p or t_len % tau:
        raise ValueError(
            f"visualize: clip [C, T, H, W] = {list(clip.shape)} needs C=3, H, W multiples of {p}, T of {tau}"
        )
    out = encode(encoder, clip[None], device, token_dtype=torch.float32)
    grid = (t_len // tau, h // p, w // p)
    tokens = out.patches[0]  # [N, D]; positions give each token's (t, y, x)
    pos = out.positions[0]
    flat = (pos[:, 0] * grid[1] + pos[:, 1]) * grid[2] + pos[:, 2]
    order = torch.argsort(flat)
    tokens = tokens[order]
    if query is None:
        query = (grid[0] // 2, grid[1] // 2, grid[2] // 2)
    if not all(0 <= q < g for q, g in zip(query, grid, strict=True)):
        top = tuple(g - 1 for g in grid)
        raise ConfigError(
            f"--query {','.join(map(str, query))}: outside the token grid {grid} (t, y, x): each coordinate from 0 "
            f"to {','.join(map(str, top))}; omit --query for the centre patch"
        )
    q_index = (query[0] * grid[1] + query[1]) * grid[2] + query[2]
    rgb, ratio = pca_rgb(tokens)
    sim = cosine_map(tokens, q_index)
    lo = float(torch.quantile(sim, 0.01))
    shown = ((sim - lo) / max(1.0 - lo, 1e-6)).clamp(0, 1)
    frames = clip.permute(1, 2, 3, 0).contiguous()  # [T, H, W, 3]
    if scale > 1:
        frames = frames.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    image, strips = render_panels(frames, rgb.view(*grid, 3), shown.view(*grid), query, p * scale, tau)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    image.save(out_dir / PNG)
    files = {"png": str(out_dir / PNG)}
    if gif:
        strips[0].save(out_dir / GIF, save_all=True, append_images=strips[1:], duration=150, loop=0)
        files["gif"] = str(out_dir / GIF)
    summary = {
        "source": source,
        "clip": [t_len, h, w],
        "token_grid": list(grid),
        "query": list(query),
        "pca_explained_variance_ratio": [round(float(r), 4) for r in ratio],
        "similarity_range": [float(sim.min()), float(sim.max())],
        "similarity_shown_from": lo,
        "files": files,
    }
    write_json(out_dir / SUMMARY, summary)
    return summary


def _synthetic_index(source: str) -> int:
    """``i`` of ``synthetic[:i]``, bounded by the benchmark's test split (each clip below it is generated)."""
    text = source.split(":", 1)[1] if ":" in source else "0"
    limit = SyntheticConfig().num_test
    if not text.strip().isdigit() or int(text) >= limit:
        raise ConfigError(f"{source!r}: expected synthetic:i with i an integer in 0..{limit - 1} (the test split)")
    return int(text)


def load_clip(
    source: str,
    *,
    num_frames: int,
    frame_stride: int,
    start: int,
    size: int,
    patch: int,
    target_fps: float | None = None,
) -> Tensor:
    """uint8 [T, H, W, 3] from a video (every ``frame_stride``-th frame, or at ``target_fps``), an image or
    ``synthetic[:i]`` (see the module doc)."""
    if source == "synthetic" or source.startswith("synthetic:"):
        i = _synthetic_index(source)
        cfg = SyntheticConfig(num_train=1, num_val=1, num_test=max(1, i + 1))
        clip = load_split(cfg, "test").clips[i].permute(1, 2, 3, 0)
        return center_square(clip, min(clip.shape[1], clip.shape[2]), patch)
    return load_eval_clip(
        source,
        num_frames=num_frames,
        frame_stride=frame_stride,
        start=start,
        size=size,
        patch=patch,
        target_fps=target_fps,
    )
