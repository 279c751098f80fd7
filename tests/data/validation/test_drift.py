"""Drift profiles and scores checked against values worked out by hand on tiny columns."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from airflow_trainpipe.data.validation.drift import (
    EPSILON,
    MAX_CATEGORIES,
    OTHER,
    SAMPLE_ROWS,
    CategoricalAccumulator,
    DriftScore,
    NumericAccumulator,
    _masses,
    _psi,
    categorical_score,
    numeric_score,
    reference_edges,
)

# 0.25 * ln 2 + 0.25 * ln 1.5: bins (0.5, 0.5) became (0.25, 0.75).
PSI_HALF_TO_QUARTER = 0.2746531
# (0.5 - 1) ln(0.5) + (0.5 - 1e-4) ln(0.5 / 1e-4) = 0.346574 + 4.257745: (1, 0) became (0.5, 0.5).
PSI_INTO_EMPTY_BIN = 4.604318


def _profile(values: list[float], reference_edges: np.ndarray | None = None) -> NumericAccumulator:
    accumulator = NumericAccumulator(len(values), reference_edges)
    accumulator.add(pa.array(values, pa.float64()))
    return accumulator


@pytest.fixture(scope="module")
def one_to_hundred() -> dict:
    """Profile of 1..100: the p-th percentile edge is 1 + floor(p * 99), its CDF edge / 100."""
    return _profile([float(v) for v in range(1, 101)]).profile()


def test_psi_of_two_histograms() -> None:
    assert _psi(np.array([0.5, 0.5]), np.array([0.25, 0.75])) == pytest.approx(PSI_HALF_TO_QUARTER, abs=1e-6)
    assert _psi(np.array([0.2, 0.3, 0.5]), np.array([0.2, 0.3, 0.5])) == 0.0


def test_psi_puts_epsilon_in_an_empty_bin_instead_of_dividing_by_zero() -> None:
    assert EPSILON == 1e-4
    assert _psi(np.array([1.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(PSI_INTO_EMPTY_BIN, abs=1e-6)


def test_bin_masses_include_below_the_first_and_above_the_last_edge() -> None:
    assert _masses(np.array([0.1, 0.3, 0.6])) == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_a_score_equal_to_the_threshold_is_not_drift() -> None:
    assert not DriftScore("amount", "psi", 0.2, 0.2).drifted
    assert DriftScore("amount", "psi", 0.2000001, 0.2).drifted


def test_numeric_profile_of_one_to_hundred(one_to_hundred: dict) -> None:
    assert (one_to_hundred["count"], one_to_hundred["nulls"]) == (100, 0)
    assert len(one_to_hundred["edges"]) == 99
    assert one_to_hundred["edges"][:3] == [1.0, 2.0, 3.0]  # p = 0.01, 0.02, 0.03
    assert one_to_hundred["edges"][49] == 50.0 and one_to_hundred["edges"][-1] == 99.0
    assert one_to_hundred["cdf"][49] == 0.5 and one_to_hundred["cdf"][-1] == 0.99


def test_psi_compares_at_the_deciles_and_ks_at_every_percentile(one_to_hundred: dict) -> None:
    assert reference_edges("psi", one_to_hundred).tolist() == [
        10.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        70.0,
        80.0,
        90.0,
    ]
    assert reference_edges("ks", one_to_hundred).tolist() == one_to_hundred["edges"]


def _shifted_score(method: str, reference: dict, shift: int) -> float:
    current = _profile([float(v + shift) for v in range(1, 101)], reference_edges(method, reference))
    return numeric_score(method, reference, current)


def test_the_same_column_scores_zero(one_to_hundred: dict) -> None:
    assert _shifted_score("psi", one_to_hundred, 0) == pytest.approx(0.0, abs=1e-12)
    assert _shifted_score("ks", one_to_hundred, 0) == 0.0


def test_psi_of_a_column_shifted_by_a_decile(one_to_hundred: dict) -> None:
    # 11..110 at the edges 10..90: masses (0, 0.1 x 8, 0.2) vs ten bins of 0.1;
    # (1e-4 - 0.1) ln(1e-4 / 0.1) + (0.2 - 0.1) ln 2 = 0.690085 + 0.069315.
    assert _shifted_score("psi", one_to_hundred, 10) == pytest.approx(0.759400, abs=1e-6)


def test_ks_of_a_shifted_column_is_the_share_that_moved_past_each_edge(one_to_hundred: dict) -> None:
    # At an edge e the CDFs are e/100 and max(0, e - s)/100: the gap is min(e, s)/100.
    assert _shifted_score("ks", one_to_hundred, 10) == pytest.approx(0.10)
    assert _shifted_score("ks", one_to_hundred, 200) == pytest.approx(0.99)


def test_counts_at_the_edges_include_values_equal_to_an_edge() -> None:
    current = _profile([1.0, 2.0, 3.0, 4.0], np.array([2.0, 3.5]))
    assert current.at_or_below.tolist() == [2, 3]
    assert current.cdf_at_reference().tolist() == [0.5, 0.75]


def test_nulls_are_counted_apart_and_left_out_of_the_cdf() -> None:
    accumulator = NumericAccumulator(4, np.array([2.0]))
    accumulator.add(pa.array([1, None, 3, None], pa.int64()))
    assert (accumulator.count, accumulator.nulls) == (2, 2)
    assert accumulator.cdf_at_reference().tolist() == [0.5]  # of the non-null values


def test_a_column_without_reference_edges_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="no reference edges"):
        _profile([1.0]).cdf_at_reference()


def test_an_all_null_column_has_an_empty_profile() -> None:
    accumulator = NumericAccumulator(2, None)
    accumulator.add(pa.array([None, None], pa.float64()))
    assert accumulator.profile() == {"kind": "numeric", "count": 0, "nulls": 2, "edges": [], "cdf": []}


def _sampled_profile(batch_sizes: list[int]) -> dict:
    values = np.arange(30, dtype=np.float64)
    accumulator = NumericAccumulator(3 * SAMPLE_ROWS, None)  # stride 3: every third value is kept
    start = 0
    for size in batch_sizes:
        accumulator.add(pa.array(values[start : start + size]))
        start += size
    return accumulator.profile()


@pytest.mark.parametrize("batch_sizes", [[30], [7, 23], [1] * 30, [2, 2, 26]])
def test_the_strided_sample_does_not_depend_on_the_batches(batch_sizes: list[int]) -> None:
    profile = _sampled_profile(batch_sizes)
    # The sample is 0, 3, ..., 27: the median edge is its 5th value (floor(0.5 * 9) = 4).
    assert profile["count"] == 30
    assert profile["edges"][0] == 0.0 and profile["edges"][49] == 12.0 and profile["edges"][-1] == 24.0
    assert profile["cdf"][49] == 0.5


def test_the_stride_keeps_the_sample_at_most_sample_rows() -> None:
    assert NumericAccumulator(SAMPLE_ROWS, None).stride == 1
    assert NumericAccumulator(SAMPLE_ROWS + 1, None).stride == 2
    assert NumericAccumulator(0, None).stride == 1


def test_categorical_counts_add_up_over_batches_as_strings() -> None:
    accumulator = CategoricalAccumulator()
    accumulator.add(pa.array(["pos", "atm", None, "pos"]))
    accumulator.add(pa.chunked_array([pa.array(["atm", "pos"])]))
    assert accumulator.profile() == {
        "kind": "categorical",
        "count": 5,
        "nulls": 1,
        "counts": {"pos": 3, "atm": 2},
    }
    codes = CategoricalAccumulator()
    codes.add(pa.array([7, 7, 3]))
    assert codes.profile()["counts"] == {"7": 2, "3": 1}


def test_categories_beyond_the_most_frequent_share_one_bucket() -> None:
    accumulator = CategoricalAccumulator()
    names = [f"c{i:04d}" for i in range(MAX_CATEGORIES + 2)]
    accumulator.add(pa.array([*names, "c0999", "c0999"]))
    counts = accumulator.profile()["counts"]
    # c0999 is the most frequent; ties rank by name, so c1000 and c1001 are the two left over.
    assert len(counts) == MAX_CATEGORIES + 1 and counts[OTHER] == 2
    assert counts["c0999"] == 3 and "c1000" not in counts and "c1001" not in counts


def _counts(**counts: int) -> dict:
    return {"counts": counts}


def test_categorical_psi_of_a_reweighted_mix() -> None:
    score = categorical_score("psi", _counts(a=50, b=50), _counts(a=25, b=75))
    assert score == pytest.approx(PSI_HALF_TO_QUARTER, abs=1e-6)


def test_categorical_psi_of_a_new_category_uses_epsilon() -> None:
    assert categorical_score("psi", _counts(a=10), _counts(a=5, b=5)) == pytest.approx(
        PSI_INTO_EMPTY_BIN, abs=1e-6
    )


@pytest.mark.parametrize(
    ("reference", "current", "cramers_v"),
    [
        # Expected 20 per cell: chi2 = 4 * 10^2 / 20 = 20, V = sqrt(20 / 80).
        ({"a": 30, "b": 10}, {"a": 10, "b": 30}, 0.5),
        ({"a": 10}, {"b": 10}, 1.0),  # disjoint
        ({"a": 1, "b": 3}, {"a": 2, "b": 6}, 0.0),  # the same mix at another volume
        ({"a": 4, "gone": 0}, {"a": 9}, 0.0),  # one category with rows: nothing to compare
    ],
)
def test_chi2_is_cramers_v_of_the_two_row_table(reference: dict, current: dict, cramers_v: float) -> None:
    assert categorical_score("chi2", {"counts": reference}, {"counts": current}) == pytest.approx(cramers_v)


def test_an_empty_side_scores_zero_drift() -> None:
    assert categorical_score("psi", _counts(a=3), _counts()) == 0.0
    assert categorical_score("chi2", _counts(), _counts(a=3)) == 0.0


def test_cramers_v_matches_the_textbook_formula_on_a_three_column_table() -> None:
    reference, current = {"x": 20, "y": 30, "z": 50}, {"x": 40, "y": 40, "z": 20}
    table = [[20, 30, 50], [40, 40, 20]]
    total = 200
    chi2 = sum(
        (table[r][c] - sum(table[r]) * (table[0][c] + table[1][c]) / total) ** 2
        / (sum(table[r]) * (table[0][c] + table[1][c]) / total)
        for r in range(2)
        for c in range(3)
    )
    score = categorical_score("chi2", {"counts": reference}, {"counts": current})
    assert score == pytest.approx(math.sqrt(chi2 / total))
