"""The 8×8 handwritten digits the built-in benchmark falls back on when Fashion-MNIST is not installed.

``digits.csv.gz`` beside this file is the copy scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``,
BSD-3-Clause; the data are the test set of UCI's "Optical Recognition of Handwritten Digits", E. Alpaydin and
C. Kaynak, 1998, CC BY 4.0): 1797 rows of 64 pixel counts in 0..16 (an 8×8 image, row-major) and the digit
as the 65th column. :func:`load_digits` reads it as scikit-learn's ``load_digits()`` does, so the benchmark's
images are bit-identical without depending on scikit-learn (~200 MB for this one call).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources

import numpy as np

from levjepa.data.badfiles import DataError

__all__ = ["DIGITS_FILE", "Digits", "load_digits"]

DIGITS_FILE = "digits.csv.gz"


@dataclass(frozen=True)
class Digits:
    images: np.ndarray  # float64 [1797, 8, 8], values 0..16 (as scikit-learn's ``load_digits().images``)
    target: np.ndarray  # int64 [1797], the digit 0..9


def load_digits() -> Digits:
    """The bundled digits: ``.images`` float64 [1797, 8, 8] in 0..16 and ``.target`` int64 [1797]."""
    try:
        raw = resources.files("levjepa.data").joinpath(DIGITS_FILE).read_bytes()
        data = np.loadtxt(gzip.decompress(raw).decode("ascii").splitlines(), delimiter=",")
    except (OSError, ValueError) as err:
        raise DataError(f"unreadable: levjepa's bundled {DIGITS_FILE} ({err}); reinstall levjepa") from err
    if data.shape != (1797, 65):
        raise DataError(f"unreadable: levjepa's bundled {DIGITS_FILE} has shape {data.shape}, expected (1797, 65)")
    return Digits(images=data[:, :-1].reshape(-1, 8, 8), target=data[:, -1].astype(np.int64))
