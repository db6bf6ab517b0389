"""Label-free model selection from the training loss (``levjepa select RUN_DIR [RUN_DIR ...]``).

The LeJEPA paper finds that its training loss tracks frozen-probe accuracy: over its runs the Spearman
rank correlation ``ρ_s(train_loss, accuracy)`` is ≈ 0.85 in magnitude, and ≈ 0.99 with the loss rescaled
by the regulariser weight, ``C(α) = ρ_s(train_loss / λ^α, accuracy)`` at ``α ≈ 0.4`` (its Figure 10).
This command measures that signal on *our* runs:

* for every complete checkpoint of every run given, the **training loss near that step**: the mean of
  ``loss`` over the ``metrics.jsonl`` rows with ``step - window < s ≤ step`` (default ``window``: half the
  median spacing between checkpoints, at least one step);
* ``loss / λ^α`` with the run's λ (its ``config.json`` parsed into a ``PretrainConfig``:
  ``objective.lam_value``, the objective's default when ``lam`` is null: 0.02 levjepa, 0.05 lejepa, 0.1
  localejepa);
* a **cheap probe accuracy** of that checkpoint's frozen encoder (EMA weights by default) on a built-in
  benchmark task (default: appearance, linear probe on mean-pooled tokens, the ``demo`` budget);
* the Spearman correlations of ``−loss`` and ``−loss/λ^α`` with accuracy (the sign is flipped so that
  +1 means "lower loss ranks higher accuracy", the direction that makes the loss usable for selection).

Honest caveat printed with every result: within one run λ is constant, so dividing by ``λ^α`` cannot
change any rank and both correlations are equal; the α-scaling only matters across runs with different
λ (give several run directories). Across the steps of one run the loss also falls as training proceeds,
so a high ρ within a run partly says "later checkpoints are better" rather than ranking unrelated
models. With fewer than 3 checkpoints, or a constant loss or accuracy, ρ is undefined (reported as null).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from levjepa.eval.benchmark import EvalConfig, benchmark_splits, evaluate_encoder_on_splits, synthetic_config_for
from levjepa.eval.load import WEIGHTS_MEANING, load_encoder, read_run_config
from levjepa.train.config import PretrainConfig
from levjepa.weights import CONFIG, checkpoint_step, list_checkpoints, read_metrics

__all__ = [
    "SelectionResult",
    "loss_near",
    "select",
    "spearman_report",
]


def loss_near(rows: list[dict[str, Any]], step: int, window: int, key: str = "loss") -> float | None:
    """Mean of ``key`` over rows with ``step - window < row.step <= step`` (None if there is none)."""
    vals = [
        float(r[key])
        for r in rows
        if step - window < r["step"] <= step and isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]
    return statistics.fmean(vals) if vals else None


def _spearman(x: list[float], y: list[float]) -> tuple[float | None, float | None]:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, None
    from scipy.stats import spearmanr

    res = spearmanr(x, y)
    rho, p = float(res.statistic), float(res.pvalue)
    return (None, None) if math.isnan(rho) else (rho, p)


def spearman_report(
    losses: list[float], lambdas: list[float], accuracies: list[float], alpha: float = 0.4
) -> dict[str, Any]:
    """ρ_s(−loss, acc) and ρ_s(−loss/λ^α, acc) with p-values; +1 = lower loss ranks higher accuracy."""
    if not len(losses) == len(lambdas) == len(accuracies):
        raise ValueError(f"spearman_report: {len(losses)} losses, {len(lambdas)} λ, {len(accuracies)} accuracies")
    scaled = [loss / lam**alpha for loss, lam in zip(losses, lambdas, strict=True)]
    rho_raw, p_raw = _spearman([-v for v in losses], accuracies)
    rho_scaled, p_scaled = _spearman([-v for v in scaled], accuracies)
    return {
        "n": len(losses),
        "alpha": alpha,
        "rho_raw": rho_raw,
        "p_raw": p_raw,
        "rho_scaled": rho_scaled,
        "p_scaled": p_scaled,
        "distinct_lambdas": sorted(set(lambdas)),
        "scaled_loss": scaled,
    }


@dataclass
class SelectionResult:
    rows: list[dict[str, Any]]  # run, step, lam, loss, scaled_loss, acc
    report: dict[str, Any]
    info: dict[str, Any]

    def table(self) -> str:
        a = self.report["alpha"]
        lines = [
            f"Label-free model selection — {self.info['task']} task, {self.info['probe']} probe on "
            f"{self.info['weights']} weights ({WEIGHTS_MEANING.get(self.info['weights'], '')}; accuracy % on the "
            "built-in benchmark's test split; image source "
            f"{self.info['image_source']}, clips {self.info['clip']}); loss = mean training loss over the "
            f"{self.info['window']} steps up to each checkpoint",
            "",
            f"| run | step | λ | loss | loss / λ^{a} | accuracy (%) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in self.rows:
            cells = [r["run"], str(r["step"]), f"{r['lam']:g}", f"{r['loss']:.4f}", f"{r['scaled_loss']:.4f}"]
            lines.append("| " + " | ".join(cells) + f" | {r['acc']:.1f} |")

        def fmt(rho: float | None, p: float | None) -> str:
            return "undefined (fewer than 3 points or a constant column)" if rho is None else f"{rho:+.3f} (p={p:.2g})"

        rep = self.report
        lines += [
            "",
            f"Spearman ρ(−loss, accuracy)       = {fmt(rep['rho_raw'], rep['p_raw'])}",
            f"Spearman ρ(−loss/λ^{a}, accuracy) = {fmt(rep['rho_scaled'], rep['p_scaled'])}",
            "(LeJEPA paper, across its runs: ≈ 0.85 raw, ≈ 0.99 with α ≈ 0.4.)",
        ]
        if len(rep["distinct_lambdas"]) == 1:
            lines.append(
                "Note: every checkpoint shares one λ, so λ^α rescales all losses alike and cannot change the "
                "ranks; pass runs with different λ to measure the α-scaling. Within one run the loss also "
                "falls with training time, so ρ partly measures 'later is better'."
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "spearman": {k: v for k, v in self.report.items() if k != "scaled_loss"},
            **self.info,
        }


def _default_window(steps: list[int]) -> int:
    if len(steps) < 2:
        return max(1, steps[0] // 10) if steps else 1
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    return max(1, int(statistics.median(gaps) // 2))


def select(
    run_dirs: list[str | Path],
    *,
    task: str = "appearance",
    probe: Literal["linear", "knn", "attentive"] = "linear",
    alpha: float = 0.4,
    window: int | None = None,
    weights: Literal["ema", "online"] = "ema",
    budget: Literal["demo", "full"] = "demo",
    synthetic_overrides: list[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> SelectionResult:
    """Loss near each checkpoint, its probe accuracy, and their Spearman correlations (see the module doc)."""
    evaluation = EvalConfig(
        tasks=(task,),
        probes=(probe,),
        budget=budget,
        seed=seed,
        device=device,
        cache_dir=None if cache_dir is None else str(cache_dir),
        progress=progress,
    )
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    windows = []
    for run in map(Path, run_dirs):
        run_cfg = read_run_config(run) if (run / CONFIG).is_file() else PretrainConfig()
        lam = run_cfg.objective.lam_value
        metrics = read_metrics(run)
        if not metrics:
            raise ValueError(f"{run}: no training losses (metrics.jsonl is missing or has no rows with 'step')")
        ckpts = list_checkpoints(run)
        if not ckpts:
            raise ValueError(f"{run}: no complete checkpoint (checkpoints/step_*/meta.json)")
        steps = [checkpoint_step(c) for c in ckpts]
        win = window or _default_window(steps)
        windows.append(win)
        syn_cfg = synthetic_config_for(run_cfg, synthetic_overrides or [])
        splits = benchmark_splits(syn_cfg, budget)
        info = {
            "image_source": splits.image_source,
            "clip": splits.clip_text,
            "split_sizes": splits.sizes,
        }
        for ckpt, step in zip(ckpts, steps, strict=True):
            loss = loss_near(metrics, step, win)
            if loss is None:
                print(f"warning: {ckpt}: no logged loss in steps ({step - win}, {step}]; checkpoint skipped")
                continue
            enc = load_encoder(ckpt, weights=weights, device=device)
            res = evaluate_encoder_on_splits(enc.encoder, splits, evaluation)[0][task][probe]
            rows.append(
                {
                    "run": str(run),
                    "step": step,
                    "lam": lam,
                    "loss": loss,
                    "scaled_loss": loss / lam**alpha,
                    "acc": res.reported,
                    "weights": enc.describe(),
                    "probe_result": res.to_json(),
                }
            )
    if not rows:
        raise ValueError("select: no checkpoint had a logged training loss near its step")
    report = spearman_report([r["loss"] for r in rows], [r["lam"] for r in rows], [r["acc"] for r in rows], alpha)
    info.update(
        task=task, probe=probe, weights=weights, budget=budget, alpha=alpha, window=windows[0] if windows else None
    )
    return SelectionResult(rows, report, info)
