"""Label-free model selection: the loss window, λ defaults, the Spearman report (the λ^α scaling recovers a
law that the raw loss ranks imperfectly), and the `levjepa select` command end to end on a tiny run."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from levjepa.commands import select as select_mod
from levjepa.eval.select import _spearman, loss_near, spearman_report
from levjepa.formats.reading.load import read_run_config
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
        [
            str(run),
            "--task",
            "appearance",
            "--probe",
            "knn",
            "--device",
            "cpu",
            "--out",
            str(out),
            *[a for kv in TINY for a in ("--synthetic", kv)],
        ]
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


def test_spearman_equals_scipys_without_scipy():
    """Values from scipy.stats.spearmanr (scipy 1.x), which this module no longer needs."""
    cases = [
        ([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5], 0.8285714285714287, 0.04156268221574335),
        ([3.0, 2.0, 1.0], [10.0, 30.0, 20.0], -0.5, 0.6666666666666666),
        (list(range(1, 13)), [1, 3, 2, 5, 4, 6, 8, 7, 12, 9, 10, 11], 0.9370629370629372, 6.9931649532105415e-06),
        ([1, 1, 2, 3, 4], [5, 6, 7, 7, 9], 0.9473684210526317, 0.014379533619930497),  # ties
    ]
    for x, y, rho, p in cases:
        got = _spearman([float(v) for v in x], [float(v) for v in y])
        assert got[0] == pytest.approx(rho, abs=1e-12) and got[1] == pytest.approx(p, rel=1e-9)
    assert _spearman([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == (1.0, 0.0)


def test_select_ranks_checkpoints_without_labels(tmp_path, capsys):
    """No task: no probe, no encoder loaded; runs with different λ ranked by loss / λ^α."""
    a = make_run_dir(tmp_path / "a", steps=(4, 8), losses=lambda s: 2.0 / s)
    b = make_run_dir(tmp_path / "b", steps=(4, 8), losses=lambda s: 1.0 / s, lam=0.002)
    out = tmp_path / "select.json"
    parser = argparse.ArgumentParser()
    select_mod.add_arguments(parser)
    assert select_mod.main(parser.parse_args([str(a), str(b), "--out", str(out)])) == 0
    text = capsys.readouterr().out
    assert "No labels used" in text and "Spearman" not in text
    rows = json.loads(out.read_text())["rows"]
    by = {(r["run"].split("/")[-2], r["step"]): r for r in rows}
    # raw loss ranks b first (lower loss); divided by λ^0.4 b's tiny λ makes it worse than a
    assert by[("b", 8)]["rank_by_loss"] == 1 and by[("a", 8)]["rank"] == 1
    assert sorted(r["rank"] for r in rows) == [1, 2, 3, 4]
    for r in rows:
        assert r["scaled_loss"] == pytest.approx(r["loss"] / r["lam"] ** 0.4)


def test_select_validates_the_ranking_on_a_labelled_index(tmp_path, capsys, one_thread):
    import numpy as np
    from PIL import Image

    media = tmp_path / "media"
    media.mkdir()
    for split, n in (("train", 6), ("val", 4)):
        lines = []
        for i in range(n):
            colour = [220, 30, 30] if i % 2 == 0 else [30, 30, 220]
            Image.fromarray(np.full((16, 16, 3), colour, np.uint8)).save(media / f"{split}{i}.png")
            lines.append(f"{split}{i}.png {i % 2}")
        (media / f"{split}.txt").write_text("\n".join(lines) + "\n")
    run = make_run_dir(tmp_path, steps=(4, 8, 12), losses=lambda s: 2.0 / s)
    out = tmp_path / "select.json"
    parser = argparse.ArgumentParser()
    select_mod.add_arguments(parser)
    task = f"index:{media / 'train.txt'},{media / 'val.txt'}"
    args = [str(run), "--task", task, "--probe", "knn", "--frames", "4", "--size", "16", "--workers", "0"]
    args += ["--device", "cpu", "--cache", str(tmp_path / "features"), "--out", str(out)]
    assert select_mod.main(parser.parse_args(args)) == 0
    text = capsys.readouterr().out
    assert "Spearman ρ(−loss, accuracy)" in text and "val of" in text
    result = json.loads(out.read_text())
    assert [r["acc"] for r in result["rows"]] == [100.0, 100.0, 100.0]  # colour separates the classes
    assert result["spearman"]["rho_raw"] is None  # a constant accuracy: undefined, not NaN
    stores = [p for p in (tmp_path / "features").iterdir() if p.name != "probe-results"]  # and the finished probes
    assert len(stores) == 6  # 3 checkpoints × 2 splits, reused next time
