"""Label-free model selection from the training loss (``levjepa select RUN_DIR [RUN_DIR ...]``).

The LeJEPA paper finds that its training loss tracks frozen-probe accuracy: over its runs the Spearman
rank correlation ``ρ_s(train_loss, accuracy)`` is ≈ 0.85 in magnitude, and ≈ 0.99 with the loss rescaled
by the regulariser weight, ``C(α) = ρ_s(train_loss / λ^α, accuracy)`` at ``α ≈ 0.4`` (its Figure 10).

**Ranking (no labels, no probe).** For every complete checkpoint of every run given:

* the **training loss near that step**: the mean of ``loss`` over the ``metrics.jsonl`` rows with
  ``step - window < s ≤ step`` (default ``window``: half the median spacing between checkpoints, at least
  one step);
* ``loss / λ^α`` with the run's λ (its ``config.json`` parsed into a ``PretrainConfig``:
  ``objective.lam_value``, the objective's default when ``lam`` is null: 0.02 levjepa, 0.05 lejepa, 0.1
  localejepa).

Checkpoints are ranked by ``loss / λ^α`` (lowest first; the paper's selection rule) with their rank by the
raw loss beside. This reads only ``metrics.jsonl``, ``config.json`` and the checkpoint list: seconds for
any number of runs.

**Validation (optional, ``task``).** With a task, each checkpoint's frozen encoder (EMA weights by default)
is probed — a built-in benchmark task (``appearance``, ``motion``, ``arrow``) or the user's own labelled
split files (``index:TRAIN,VAL[,TEST]``, through the dataset-scale path ``levjepa.eval.dataset_task``) —
and the Spearman correlations of ``−loss`` and ``−loss/λ^α`` with accuracy are reported (the sign is
flipped so that +1 means "lower loss ranks higher accuracy", the direction that makes the loss usable for
selection), with two-sided p-values from the t approximation (``t = ρ √((n−2)/(1−ρ²))``, n − 2 degrees of
freedom; equal to ``scipy.stats.spearmanr``'s, checked in ``tests/test_select.py``).

Honest caveat printed with every validation: within one run λ is constant, so dividing by ``λ^α`` cannot
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

import numpy as np

from levjepa import distributed
from levjepa.config import ConfigError
from levjepa.eval.clips_task import LabelledSplits
from levjepa.eval.config import EvalConfig
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.harness import evaluate
from levjepa.eval.synthetic_task import TASKS, synthetic_config_for, synthetic_splits
from levjepa.formats.reading.load import WEIGHTS_MEANING, load_encoder, read_run_config
from levjepa.formats.reading.views import model_views
from levjepa.train.config import PretrainConfig
from levjepa.train.run_dir import RunDirError
from levjepa.weights import CONFIG, checkpoint_step, list_checkpoints, read_metrics

__all__ = [
    "SelectionResult",
    "loss_near",
    "rank_checkpoints",
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


def _ranks(x: list[float]) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of their ranks."""
    a = np.asarray(x, np.float64)
    ranks = np.asarray(_rank(x), np.float64)
    for v in np.unique(a):
        tie = a == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(1000):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    return front * (f - 1.0) / a


def _spearman(x: list[float], y: list[float]) -> tuple[float | None, float | None]:
    """Spearman's ρ (Pearson correlation of the ranks) and its two-sided p-value (t approximation)."""
    n = len(x)
    if n < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None, None
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    rho = float(np.clip((rx * ry).sum() / math.sqrt((rx * rx).sum() * (ry * ry).sum()), -1.0, 1.0))
    if abs(rho) == 1.0:
        return rho, 0.0
    df = n - 2
    t2 = rho * rho * df / (1.0 - rho * rho)
    return rho, _betainc(df / 2.0, 0.5, df / (df + t2))


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
    """Every checkpoint ranked by ``loss / λ^α``; with a task, its accuracy and the Spearman report."""

    rows: list[dict[str, Any]]  # run, step, lam, loss, scaled_loss, rank, rank_by_loss (, acc)
    report: dict[str, Any] | None  # None: label-free ranking only
    info: dict[str, Any]

    def table(self) -> str:
        a = self.info["alpha"]
        validated = self.report is not None
        head = (
            f"Label-free checkpoint ranking by training loss / λ^{a} (lowest first); loss = mean training loss "
            f"over the {self.info['window']} steps up to each checkpoint"
        )
        if validated:
            i = self.info
            head += (
                f". Validation: {i['task']} task, {i['probe']} probe on {i['weights']} weights "
                f"({WEIGHTS_MEANING.get(i['weights'], '')}); accuracy % on {i['split_text']}"
            )
        lines = [
            head,
            "",
            f"| rank | run | step | λ | loss | loss / λ^{a} | rank by loss |"
            + (" accuracy (%) |" if validated else ""),
        ]
        lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if validated else ""))
        for r in sorted(self.rows, key=lambda r: r["rank"]):
            cells = [str(r["rank"]), r["run"], str(r["step"]), f"{r['lam']:g}", f"{r['loss']:.4f}"]
            cells += [f"{r['scaled_loss']:.4f}", str(r["rank_by_loss"])]
            if validated:
                cells.append(f"{r['acc']:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
        if not validated:
            lines += [
                "",
                "(No labels used. Pass --task index:TRAIN,VAL[,TEST] to check this ranking on your own data.)",
            ]
            return "\n".join(lines)

        def fmt(rho: float | None, p: float | None) -> str:
            return "undefined (fewer than 3 points or a constant column)" if rho is None else f"{rho:+.3f} (p={p:.2g})"

        rep = self.report
        assert rep is not None
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
        out: dict[str, Any] = {"rows": self.rows, **self.info}
        if self.report is not None:
            out["spearman"] = {k: v for k, v in self.report.items() if k != "scaled_loss"}
        return out


def _default_window(steps: list[int]) -> int:
    if len(steps) < 2:
        return max(1, steps[0] // 10) if steps else 1
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    return max(1, int(statistics.median(gaps) // 2))


def _rank(values: list[float]) -> list[int]:
    """Ranks 1..n, lowest first, ties in list order."""
    return [int(r) + 1 for r in np.argsort(np.argsort(np.asarray(values, np.float64), kind="stable"))]


def rank_checkpoints(
    run_dirs: list[str | Path], *, alpha: float = 0.4, window: int | None = None
) -> tuple[list[dict[str, Any]], int | None]:
    """Every checkpoint with a logged loss near its step, ranked by ``loss / λ^α`` (no labels; module doc).
    Returns the rows (with ``checkpoint``, the path to load) and the loss window of the first run."""
    rows: list[dict[str, Any]] = []
    windows = []
    for run in map(Path, run_dirs):
        if not run.is_dir():
            raise RunDirError(f"{run}: no such run directory")
        run_cfg = read_run_config(run) if (run / CONFIG).is_file() else PretrainConfig()
        lam = run_cfg.objective.lam_value
        metrics = read_metrics(run)
        if not metrics:
            raise RunDirError(f"{run}: no training losses (metrics.jsonl is missing or has no rows with 'step')")
        ckpts = list_checkpoints(run)
        if not ckpts:
            raise RunDirError(f"{run}: no complete checkpoint (checkpoints/step_*/meta.json)")
        steps = [checkpoint_step(c) for c in ckpts]
        win = window or _default_window(steps)
        windows.append(win)
        for ckpt, step in zip(ckpts, steps, strict=True):
            loss = loss_near(metrics, step, win)
            if loss is None:
                print(f"warning: {ckpt}: no logged loss in steps ({step - win}, {step}]; checkpoint skipped")
                continue
            rows.append(
                {
                    "run": str(run),
                    "step": step,
                    "lam": lam,
                    "loss": loss,
                    "scaled_loss": loss / lam**alpha,
                    "checkpoint": str(ckpt),
                }
            )
    if not rows:
        raise RunDirError("select: no checkpoint had a logged training loss near its step")
    for key, rank_key in (("scaled_loss", "rank"), ("loss", "rank_by_loss")):
        for r, k in zip(rows, _rank([r[key] for r in rows]), strict=True):
            r[rank_key] = k
    return rows, windows[0] if windows else None


def select(
    run_dirs: list[str | Path],
    *,
    task: str | None = None,
    probe: str = "linear",  # a name of levjepa.eval.config.probe_names()
    alpha: float = 0.4,
    window: int | None = None,
    weights: Literal["ema", "online"] = "ema",
    budget: Literal["demo", "full"] = "demo",
    synthetic_overrides: list[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    index_options: dict[str, Any] | None = None,
) -> SelectionResult:
    """Rank every checkpoint by its loss (and loss / λ^α); with ``task`` (a built-in task or
    ``index:TRAIN,VAL[,TEST]``) also probe each and report the Spearman correlations (see the module doc).
    ``cache_dir``: the feature cache (built-in) or the feature-store folder (index task);
    ``index_options``: keyword arguments of ``levjepa.eval.dataset_task.dataset_task`` (protocol, ...) and the
    clip's ``size``, ``frames``, ``frame_stride``, ``fps`` (default: the model's, ``levjepa.formats.reading.views``)."""
    if task is None or not task.startswith("index:"):
        given = {k: v for k, v in (index_options or {}).items() if k in ("protocol", "video_root", "labels_file") and v}
        if given:
            raise ConfigError(f"{', '.join(sorted(given))} apply to --task index:TRAIN,VAL[,TEST] only")
    rows, win = rank_checkpoints(run_dirs, alpha=alpha, window=window)
    info: dict[str, Any] = {"alpha": alpha, "window": win, "task": task, "weights": weights}
    if task is None:
        return SelectionResult(rows, None, info)
    is_index = task.startswith("index:")
    name = task
    if is_index:
        options = dict(index_options or {})
        first = load_encoder(rows[0]["checkpoint"], weights=weights, device=device)
        views, said = model_views(
            first, **{k: options.pop(k, None) for k in ("size", "frames", "frame_stride", "fps")}
        )  # the clips the run's model was trained on, unless given
        if progress:
            print(said)
        dtask = dataset_task(
            task[len("index:") :].split(","),
            tokens=EvalConfig(probes=(probe,)).reads_tokens,
            features_dir=cache_dir or "features",
            views=views,
            tubelet=first.config.tubelet,
            **options,
        )
        name = dtask.name
        split_text = f"{'test' if 'test' in dtask.splits else 'val'} of {task[len('index:') :]} ({dtask.clip_text})"
    evaluation = EvalConfig(
        tasks=(name,),
        probes=(probe,),
        budget=budget,
        seed=seed,
        device=device,
        cache_dir=None if cache_dir is None or is_index else str(cache_dir),
        progress=progress,
    )
    if not is_index:
        if task not in TASKS:
            raise ConfigError(f"--task {task!r}: valid choices are {', '.join(TASKS)} or index:TRAIN,VAL[,TEST]")
        split_cache: dict[str, LabelledSplits] = {}
    for r in rows:
        enc = load_encoder(r["checkpoint"], weights=weights, device=device)
        if is_index:
            res = evaluate({"ckpt": enc.encoder}, dtask, evaluation)
            if res is None:  # not rank 0
                continue
            result = res.results["ckpt"][name][probe]
        else:
            if r["run"] not in split_cache:
                run_cfg = read_run_config(r["run"]) if (Path(r["run"]) / CONFIG).is_file() else PretrainConfig()
                split_cache[r["run"]] = synthetic_splits(
                    synthetic_config_for(run_cfg, synthetic_overrides or []), budget
                )
            splits = split_cache[r["run"]]
            done = evaluate({"ckpt": enc.encoder}, splits, evaluation)
            assert done is not None  # clips in memory: every process probes
            result = done.results["ckpt"][task][probe]
            split_text = (
                f"the built-in benchmark's test split (image source {splits.image_source}, clips {splits.clip_text})"
            )
            info.update(image_source=splits.image_source, clip=splits.clip_text, split_sizes=splits.sizes)
        r.update(acc=result.reported, weights=enc.describe(), probe_result=result.to_json())
    if not distributed.is_main():  # the probes ran on rank 0
        return SelectionResult(rows, None, info)
    report = spearman_report([r["loss"] for r in rows], [r["lam"] for r in rows], [r["acc"] for r in rows], alpha)
    info.update(probe=probe, budget=budget, split_text=split_text)
    return SelectionResult(rows, report, info)
