"""The sorted export the table sources share: the external sort orders as one Arrow sort does,
whatever runs it spills, and a key Arrow cannot sort is named."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_trainpipe.config.sources import DeltaSource, IcebergSource
from airflow_trainpipe.data.sources.errors import SourceError
from airflow_trainpipe.data.sources.sorted_export import export_sorted, sorted_batches


def _source(**fields: object) -> DeltaSource:
    return DeltaSource.model_validate(
        {"kind": "delta", "uri": "x", "time_column": "t", "order_by": ["id"], **fields}
    )


def test_the_external_sort_orders_like_one_arrow_sort_nulls_last(tmp_path: Path) -> None:
    """Three key columns with nulls and non-ASCII text, in runs that interleave (shuffled rows) and
    in runs that do not overlap at all (rows already in order): the merge's order is Arrow's."""
    rng = random.Random(3)
    rows = 3_000
    table = pa.table(
        {
            "a": pa.array([rng.choice([None, *range(12)]) for _ in range(rows)], pa.int32()),
            "b": [rng.choice([None, "x", "é", "zz", "ab", ""]) for _ in range(rows)],
            "c": list(range(rows)),
            "v": [rng.random() for _ in range(rows)],
        }
    )
    keys = ["a", "b", "c"]
    expected = table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
    rng.shuffle(shuffled := list(range(rows)))
    for name, given in (("interleaved", table.take(pa.array(shuffled))), ("disjoint", expected)):
        for file_rows in (250, 1_024, 5_000):
            source = _source(order_by=keys, file_rows=file_rows)
            spill = tmp_path / f"{name}-{file_rows}"
            spill.mkdir()
            batches = sorted_batches(given.to_batches(max_chunksize=97), table.schema, source, spill)
            assert pa.Table.from_batches(list(batches), table.schema).equals(expected), (name, file_rows)


def test_both_table_sources_cut_the_same_rows_into_the_same_files(tmp_path: Path) -> None:
    """A delta and an iceberg source with the same key and sizes export the same bytes; no rows
    give no files, for the caller to name its window."""
    table = pa.table({"id": list(range(999, -1, -1)), "v": [float(i) for i in range(1_000)]})
    sizes = {"order_by": ["id"], "batch_rows": 100, "file_rows": 300}
    iceberg = IcebergSource.model_validate(
        {"kind": "iceberg", "conn_id": "c", "table": "n.t", "time_column": "t", **sizes}
    )
    outputs = []
    for name, source in (("delta", _source(**sizes)), ("iceberg", iceberg)):
        (tmp_path / name).mkdir()
        files, schema = export_sorted(
            source, table.to_batches(max_chunksize=64), table.schema, tmp_path / name, "t"
        )
        assert schema == table.schema and [f.rows for f in files] == [300, 300, 300, 100]
        outputs.append([f.path.read_bytes() for f in files])
    assert outputs[0] == outputs[1]
    (tmp_path / "empty").mkdir()
    assert export_sorted(_source(), [], table.schema, tmp_path / "empty", "t") == ([], None)


def test_a_key_arrow_cannot_sort_is_named(tmp_path: Path) -> None:
    table = pa.table({"id": [[2], [1]], "v": [1, 2]})
    with pytest.raises(
        SourceError, match=r"sorting the window of lake\.t by data.source.order_by: "
    ) as caught:
        export_sorted(_source(), table.to_batches(), table.schema, tmp_path, "lake.t")
    assert caught.value.retryable is False
