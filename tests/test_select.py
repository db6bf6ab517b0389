"""Label-free model selection: the loss window, λ defaults, the Spearman report (the λ^α scaling recovers a
law that the raw loss ranks imperfectly), and the `levjepa select` command end to end on a tiny run."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from levjepa.commands import select as select_mod
from levjepa.eval.load import read_run_config
from levjepa.eval.select import loss_near, spearman_report
from levjepa.weights import WeightsError
from test_export import make_run_dir

TINY = ["size=16", "num_frames=4", "num_train=48", "num_val=24", "num_test=24"]


def test_loss_near_averages_the_window_before_the_step():
    rows = [{"step": s, "loss": float(s)} for s in range(1, 11)] + [{"step": 11, "loss": float("nan")}]
    assert loss_near(rows, 10, 3) == statistics.fmean([8.0, 9.0, 10.0])
    assert loss_near(rows, 10, 1) == 10.0
    assert loss_near(rows, 11, 1) is None  # non-finite losses are ignored
    assert loss_near(rows, 0, 5) is None


def test_the_run_config_is_read_back_typed_with_the_objectives_default_lambda(tmp_path):
    # select reads λ through the run's PretrainConfig (objective.lam_value), never through a table of its own
    run = make_run_dir(tmp_path)
    cases = [({"name": "levjepa", "lam": None}, 0.02), ({"name": "lejepa"}, 0.05), ({"name": "localejepa"}, 0.1)]
    cases += [({"name": "lejepa", "lam": 0.3}, 0.3), ({}, 0.02)]
    for objective, lam in cases:
        config = json.loads((run / "config.json").read_text())
        config["objective"] = objective
        (run / "config.json").write_text(json.dumps(config))
        assert read_run_config(run).objective.lam_value == lam, objective
    config["objective"] = {"name": "byol"}
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"config.json.*valid choices are levjepa, lejepa, localejepa"):
        read_run_config(run)
    config["objective"] = {"name": "levjepa", "lamda": 0.1}  # a typo is an error, not a silent default
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="unknown config key"):
        read_run_config(run)


def test_spearman_scaling_recovers_a_loss_over_lambda_power_law():
    # accuracy is a decreasing function of loss / λ^0.4 across runs with different λ: the raw loss ranks it
    # imperfectly (runs with a large λ have larger losses at equal quality), the scaled loss perfectly
    lams = [0.01, 0.02, 0.05, 0.1] * 3
    quality = [0.5, 0.9, 1.3, 0.7, 1.1, 0.6, 1.0, 1.5, 0.8, 1.2, 0.55, 0.95]
    losses = [q * lam**0.4 for q, lam in zip(quality, lams, strict=True)]
    accs = [100 - 30 * q for q in quality]
    rep = spearman_report(losses, lams, accs, alpha=0.4)
    assert rep["rho_scaled"] == pytest.approx(1.0)
    assert rep["rho_raw"] < 0.9
    assert spearman_report(losses, lams, accs, alpha=0.0)["rho_scaled"] == pytest.approx(rep["rho_raw"])
    # one λ: the scaling cannot change ranks; too few points or a constant column: undefined, not NaN
    same = spearman_report([3.0, 2.0, 1.0], [0.02] * 3, [10.0, 30.0, 20.0])
    assert same["rho_raw"] == same["rho_scaled"] == pytest.approx(0.5)
    assert spearman_report([1.0, 2.0], [0.02] * 2, [1.0, 2.0])["rho_raw"] is None
    assert spearman_report([1.0, 2.0, 3.0], [0.02] * 3, [5.0, 5.0, 5.0])["rho_raw"] is None


def test_select_command_end_to_end(tmp_path, capsys):
    run = make_run_dir(tmp_path, steps=(4, 8, 12), losses=lambda s: 2.0 / s)
    out = tmp_path / "select.json"
    parser = argparse.ArgumentParser()
    select_mod.add_arguments(parser)
    args = parser.parse_args(
        [str(run), "--probe", "knn", "--out", str(out), *[a for kv in TINY for a in ("--synthetic", kv)]]
    )
    assert select_mod.main(args) == 0
    text = capsys.readouterr().out
    assert "Spearman ρ(−loss, accuracy)" in text and "one λ" in text
    assert "ema weights (the EMA copy, a weighted average of the online weights" in text  # which copy
    result = json.loads(out.read_text())
    assert [r["step"] for r in result["rows"]] == [4, 8, 12]
    assert all(r["weights"].startswith(f"ema weights step {r['step']}") for r in result["rows"])
    # default window: half the checkpoint spacing (2 steps) -> the loss is the mean of steps s-1, s
    for r in result["rows"]:
        assert r["loss"] == pytest.approx(statistics.fmean([2.0 / (r["step"] - 1), 2.0 / r["step"]]))
        assert r["scaled_loss"] == pytest.approx(r["loss"] / 0.02**0.4)
        assert 0.0 <= r["acc"] <= 100.0
    assert result["spearman"]["n"] == 3 and result["image_source"] in ("digits", "fashion-mnist")
