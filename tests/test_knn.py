"""Cosine kNN: exact on a hand-made toy set, equal to a brute-force loop, blind to feature scale."""

from __future__ import annotations

import math

import pytest
import torch

from levjepa.eval.knn import knn_evaluate, knn_predict


def _unit(deg: float) -> list[float]:
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


def test_knn_exact_on_toy_set():
    # class 0 near 0°, class 1 near 90°, one class-1 outlier at 10°
    train = torch.tensor([_unit(0), _unit(5), _unit(-5), _unit(90), _unit(85), _unit(95), _unit(10)])
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    queries = torch.tensor([_unit(12), _unit(2), _unit(80), _unit(45.1), _unit(44.9)]) * 3.0  # scale is ignored
    # k=1: nearest by angle -> 10° (1), 0° (0), 85° (1), 85° (1) , 10° (1)
    assert knn_predict(train, labels, queries, k=1).tolist() == [1, 0, 1, 1, 1]
    # k=3 with T large (≈ plain majority): 12° -> {10°,5°,0°} = 1,0,0 -> 0
    assert knn_predict(train, labels, queries[:1], k=3, temperature=100.0).tolist() == [0]
    # with a tiny temperature the single most similar neighbour dominates the vote
    assert knn_predict(train, labels, queries[:1], k=3, temperature=1e-3).tolist() == [1]
    # k = N with equal weights: 4 votes for class 1 against 3
    assert knn_predict(train, labels, queries[1:2], k=7, temperature=1e6).tolist() == [1]


def _brute_force(train, labels, queries, k, temperature, num_classes):
    out = []
    for q in queries:
        sims = [float(q @ f / (q.norm() * f.norm())) for f in train]
        order = sorted(range(len(train)), key=lambda i: -sims[i])[:k]
        votes = [0.0] * num_classes
        for i in order:
            votes[int(labels[i])] += math.exp(sims[i] / temperature)
        out.append(max(range(num_classes), key=lambda c: (votes[c], -c)))
    return out


@pytest.mark.parametrize("k", [1, 4, 9])
def test_knn_matches_brute_force(k):
    gen = torch.Generator().manual_seed(k)
    train = torch.randn(60, 5, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (60,), generator=gen)
    queries = torch.randn(25, 5, generator=gen, dtype=torch.float64)
    got = knn_predict(train, labels, queries, k=k, temperature=0.5, num_classes=3, batch_size=7)
    assert got.tolist() == _brute_force(train, labels, queries, k, 0.5, 3)
    many = knn_predict(train, labels, queries, k=[1, k], temperature=0.5, num_classes=3)
    assert many[1].tolist() == got.tolist() and many.shape == (2, 25)


def test_knn_evaluate_chooses_k_on_val_and_reports_test():
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 8, generator=gen) * 3

    def split(n):
        y = torch.randint(0, 4, (n,), generator=gen)
        return centers[y] + torch.randn(n, 8, generator=gen), y

    train, val, test = split(200), split(80), split(80)
    res = knn_evaluate(train, val, test, ks=(1, 5, 20, 500))
    assert res.ks == [1, 5, 20, 200]  # k capped at the training-set size
    assert res.val_acc[res.best] == max(res.val_acc)
    assert res.reported == res.test_acc[res.best] > 95.0
    # every training point is its own nearest neighbour
    assert knn_evaluate(train, train, ks=(1,)).reported == 100.0
    js = res.to_json()
    assert js["best"]["k"] == res.ks[res.best] and len(js["grid"]) == 4


def test_knn_rejects_bad_input():
    with pytest.raises(ValueError, match="same D"):
        knn_predict(torch.zeros(3, 4), torch.zeros(3), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="labels"):
        knn_predict(torch.zeros(3, 4), torch.zeros(2), torch.zeros(2, 4))
