"""feature_store.join through `freeze_run` (as the validate task calls it) on a real Feast repo:
entity rows from a non-file source (a Delta table) are joined and frozen with the source's
lineage kept beside the features'; joining the same rows again gives the same bytes (the same
digest: a run is reproducible from its manifest alone)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.examples.feast_repo import CARD_FEATURES, FEATURE_SERVICE, MERCHANT_FEATURES
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.feast_repo import START, feast_repo

pytestmark = pytest.mark.slow


def test_entity_rows_from_a_delta_table_are_joined_frozen_and_reproducible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import write_deltalake

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    example = feast_repo(tmp_path / "feast", days=1, rows=1000)
    rows = pq.read_table(example.transaction_files[0])
    write_deltalake(str(tmp_path / "entities"), rows)
    source = {
        "kind": "delta",
        "uri": (tmp_path / "entities").as_uri(),
        "time_column": "event_time",
        "order_by": ["transaction_id"],
    }
    config_text = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_features.yaml").read_text())
    data = config_text["data"]
    data.pop("window")
    data.update(
        uri=(tmp_path / "records").as_uri(),
        source=source,
        wait={"min_rows": 100},
        feature_store={**data["feature_store"], "repo": str(example.repo)},
    )
    config_text["snapshots"] = {"uri": (tmp_path / "snapshots").as_uri()}
    path = tmp_path / "entities_from_delta.yaml"
    path.write_text(yaml.safe_dump(config_text, sort_keys=False))
    config = load_config(path)

    manifest = snapshot_for_date(config, START.isoformat())
    assert manifest.source is not None and manifest.source.kind == "delta" and manifest.source.version == 0
    assert manifest.features is not None and manifest.features.feature_service == FEATURE_SERVICE
    assert manifest.rows == 1000 and list(manifest.columns)[-7:] == [*CARD_FEATURES, *MERCHANT_FEATURES]
    (frozen,) = manifest.files
    joined = pq.read_table(local_path(frozen.uri))
    assert local_path(frozen.uri).is_relative_to(tmp_path / "snapshots")
    # The export sorted the entity rows by order_by; the join kept that order and every row.
    ids = joined["transaction_id"].to_pylist()
    assert ids == sorted(rows["transaction_id"].to_pylist())
    assert joined.select(rows.column_names).equals(
        rows.take(pa.array(sorted(range(rows.num_rows), key=lambda i: rows["transaction_id"][i].as_py())))
    )
    # The entity export and the joined rows are both in the store; the manifest names the export's digest.
    assert manifest.features.entity_digest != manifest.digest

    again = snapshot_for_date(config, START.isoformat())
    assert again.digest == manifest.digest and again.files == manifest.files
