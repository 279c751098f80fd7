"""Streaming statistics: exact moments, deterministic quantiles with a bounded rank error."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_trainpipe.runtime.data.sketch import Moments, QuantileSketch

QS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]


def _fed(values: np.ndarray, batch: int, size: int) -> QuantileSketch:
    sketch = QuantileSketch(size)
    for start in range(0, len(values), batch):
        sketch.update(values[start : start + batch])
    return sketch


def test_exact_while_the_stream_fits_one_buffer() -> None:
    values = np.random.default_rng(1).lognormal(0, 2, 5000)
    assert _fed(values, 333, 8192).quantiles(QS) == [
        float(np.quantile(values, q, method="inverted_cdf")) for q in QS
    ]


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_rank_error_stays_within_the_bound_beyond_the_buffer(n: int) -> None:
    size = 256
    values = np.random.default_rng(2).lognormal(0, 2, n)
    got = _fed(values, 9_999, size).quantiles(QS[1:-1])
    ordered = np.sort(values)
    ranks = np.searchsorted(ordered, got, side="right") / n
    assert np.max(np.abs(ranks - np.array(QS[1:-1]))) <= np.log2(n / size) / size


def test_the_same_stream_gives_the_same_quantiles_whatever_the_batches() -> None:
    values = np.random.default_rng(3).normal(size=200_000)
    reference = _fed(values, 200_000, 1024).quantiles(QS)
    assert _fed(values, 7, 1024).quantiles(QS[:1]) == reference[:1]  # tiny batches: slow, so one query
    assert _fed(values, 4_099, 1024).quantiles(QS) == reference
    assert _fed(values[::-1], 4_099, 1024).quantiles(QS) != reference  # order matters: the test can fail


def test_moments_merge_per_batch_like_numpy() -> None:
    values = np.random.default_rng(4).normal(50, 3, 100_000)
    moments = Moments()
    for start in range(0, len(values), 3_001):
        moments.update(values[start : start + 3_001])
    assert moments.count == len(values)
    assert moments.mean == pytest.approx(values.mean(), rel=1e-12)
    assert moments.std == pytest.approx(values.std(), rel=1e-10)
    assert (moments.min, moments.max) == (values.min(), values.max())


def test_an_empty_stream_has_no_quantiles() -> None:
    assert QuantileSketch().quantiles([0.5]) == [None]
