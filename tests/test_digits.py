"""The bundled 8×8 digits (levjepa.data.digits) give the benchmark exactly the images scikit-learn gave it."""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from levjepa.data import synthetic
from levjepa.data.digits import load_digits

# sha256 of the benchmark's digit pool (uint8 images, int64 labels) as synthetic.py built it from
# sklearn.datasets.load_digits() before the copy was bundled (scikit-learn 1.9.1)
POOL_IMAGES_SHA256 = "b41ca9fd335466eee997366c2e6f6bbe0a1b4582afe091fc4eba35f4a254182f"
POOL_LABELS_SHA256 = "a3c91c262eddcf7ba8f0e37507c30284493c9b20412ffe4af30d536401f7ba21"


def test_the_bundled_digits_are_scikit_learns():
    digits = load_digits()
    assert digits.images.shape == (1797, 8, 8) and digits.images.dtype == np.float64
    assert digits.images.min() == 0 and digits.images.max() == 16
    assert np.array_equal(digits.images, np.round(digits.images))  # pixel counts 0..16
    assert np.bincount(digits.target).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert digits.target[:10].tolist() == list(range(10))


def test_the_benchmark_pool_is_unchanged_and_needs_no_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # importing scikit-learn now fails
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    pool = synthetic._load_digits()
    assert pool.name == "digits" and pool.images.shape == (1797, 8, 8)
    assert hashlib.sha256(pool.images.numpy().tobytes()).hexdigest() == POOL_IMAGES_SHA256
    assert hashlib.sha256(pool.labels.numpy().tobytes()).hexdigest() == POOL_LABELS_SHA256
