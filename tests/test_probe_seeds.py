"""Probe seeds trained in one pass (issue 53): one seed is today's run, each block is exactly its seed's run alone
(its initialisation and its batch order), the table says how it was made, and the weight average is the mean
of the weights."""

from __future__ import annotations

import pytest
import torch

from levjepa.eval.config import EvalConfig
from levjepa.eval.dataset_task import dataset_task
from levjepa.eval.harness import evaluate
from levjepa.eval.plan import plan
from levjepa.eval.probes import probe_config
from levjepa.eval.result import EvalResult
from levjepa.eval.source import MemorySource
from levjepa.eval.trainer import _WeightAverage, train_probes
from levjepa.rng import make_generator
from test_online_plan import setting  # noqa: F401  (a fixture)


def _sources() -> dict[str, MemorySource]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, n in (("train", 48), ("val", 16), ("test", 24)):
        y = torch.randint(0, 3, (n,), generator=g)
        tokens = torch.randn(n, 5, 16, generator=g) + y[:, None, None].float()
        out[name] = MemorySource({"tokens": tokens, "mean": tokens.mean(1)}, {"t": y}, name=name)
    return out


def _train(kind: str, what: str, extra: list[torch.Generator], seed: int = 0):  # type: ignore[no-untyped-def]
    src = _sources()
    cfg = probe_config("demo", epochs=2, linear_epochs=2, batch_size=16)
    return train_probes(
        kind, cfg, what, src["train"], src["val"], src["test"], classes={"t": 3},
        generator=make_generator("probe", seed), seed_generators=extra,
    )["t"]  # fmt: skip


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    return a.val_acc == b.val_acc and a.val_loss == b.val_loss and a.test_acc == b.test_acc and a.best == b.best


def test_one_seed_is_todays_run_and_each_block_is_its_seed_alone() -> None:
    for kind, what in (("attentive", "tokens"), ("linear", "mean")):
        alone = _train(kind, what, [])
        assert _same(alone, _train(kind, what, []))  # deterministic
        stacked = _train(kind, what, [make_generator("probe", 1), make_generator("probe", 2)])
        assert len(stacked.seeds) == 2 and len(stacked.seed_reported) == 3
        assert _same(stacked, alone)  # block 0 is the one-seed run, bit for bit
        # block s is seed s's run alone — its initialisation and its own batch order —, bit for bit
        for s, block in enumerate(stacked.seeds, start=1):
            assert _same(block, _train(kind, what, [], seed=s)), (kind, s)
        assert len({tuple(r.val_loss) for r in (stacked, *stacked.seeds)}) == 3  # three different runs


def test_weight_average_is_the_mean_of_the_averaged_steps() -> None:
    p = torch.zeros(3)
    avg = _WeightAverage([p], start=2)
    seen = []
    for step in range(5):
        p.add_(float(step + 1))
        avg.update(step)
        if step >= 2:
            seen.append(p.clone())
    avg.apply()
    assert torch.allclose(p, torch.stack(seen).mean(0))


def test_caption_states_seeds_codec_and_views() -> None:
    res = _train("linear", "mean", [make_generator("probe", 1)])
    info = {"split_sizes": {"train": 48, "val": 16, "test": 24}, "budget": "demo", "seeds": 2, "tokens": "int8"}
    table = EvalResult(["enc"], ["t"], ["linear"], {"enc": {"t": {"linear": res}}}, {"t": 33.3}, info)
    cap = table.caption()
    assert "2 probe seeds" in cap and "tokens int8" in cap and "training views: the clips as given, one fixed" in cap
    task = {**info, "train_views": "fixed centre crops"}  # a labelled index's probes: not the reference protocol
    cap = EvalResult(["enc"], ["t"], ["linear"], {"enc": {"t": {"linear": res}}}, {"t": 33.3}, task).caption()
    assert "fixed centre crops (levjepa's cheap protocol, not the reference's augmented views" in cap
    mean = sum(res.seed_reported) / 2
    assert f"{mean:.1f} ± " in table.table()
    info2 = {**info, "seeds": 1, "train_views": "4 augmented views"}
    one = EvalResult(["enc"], ["t"], ["linear"], {"enc": {"t": {"linear": res}}}, {"t": 33.3}, info2).caption()
    assert "1 probe seed" in one and "4 augmented views" in one


def test_demo_budget_chooses_by_validation_loss() -> None:
    from levjepa.eval.trainer import choose_probes

    cfg = probe_config("demo")
    assert cfg.select == "loss" and probe_config("full").select == "acc"
    val = {"t": (torch.tensor([90.0, 80.0, 85.0, 70.0]), torch.tensor([0.5, 0.2, 0.3, 0.9]))}
    test = {"t": (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.zeros(4))}
    assert choose_probes("attentive", cfg, val, test, seconds=0.0)["t"].best == 1  # lowest loss, not best acc
    acc_cfg = probe_config("demo", select="acc")
    assert choose_probes("attentive", acc_cfg, val, test, seconds=0.0)["t"].best == 0


@pytest.mark.parametrize("mode", ["k-views", "online"])
def test_with_augmented_views_a_seed_block_is_its_seed_alone(setting, tmp_path, monkeypatch, mode, one_thread):  # noqa: F811
    # issue 65: block s draws its views from seed + s (a K-view store per seed, or its own online draws), so
    # `--seed 1 --seeds 2`'s block 1 is `--seed 2` alone, bit for bit, and --plan counts the stores it builds
    import levjepa.features.store as feature_store

    files, _, loaded, views = setting
    seen: list[int] = []
    real = feature_store.encode
    monkeypatch.setattr(feature_store, "encode", lambda e, v, *a, **k: seen.append(len(v)) or real(e, v, *a, **k))

    def run(seed: int, seeds: int, folder: str):  # type: ignore[no-untyped-def]
        k = 2 if mode == "k-views" else 0
        task = dataset_task(files, views=views, workers=0, features_dir=tmp_path / folder, train_views=k)
        cfg = EvalConfig(
            tasks=(task.name,), probes=("attentive",), probe=probe_config("demo", epochs=2), seed=seed, seeds=seeds,
            online=mode == "online",
        )  # fmt: skip
        said = plan(task, loaded, cfg)
        seen.clear()
        res = evaluate({"e": loaded.encoder}, task, cfg)
        assert res is not None
        if mode == "k-views":  # the stores' forwards are what the plan said: 12 files x 2 views x `seeds` stores
            assert sum(seen) == sum(s.forwards for s in said.splits) == 12 * 2 * seeds + 6 + 9
        return res.results["e"][task.name]["attentive"]

    both = run(1, 2, "a")
    alone = run(2, 1, "b")
    assert _same(both.seeds[0], alone)  # block 1 = seed 2 alone: its init, batch order and views
    assert _same(both, run(1, 1, "c"))  # block 0 = seed 1 alone
    differ = run(1, 2, "d")
    assert _same(differ.seeds[0], both.seeds[0])  # deterministic
