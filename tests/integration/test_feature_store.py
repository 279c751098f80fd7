"""dags/configs/fraud_detector_features.yaml through the factory's five tasks in Airflow's own
dag.test(): the week's transactions (entity rows) are joined with the Feast repo's card and
merchant features as of each transaction (a real Feast 0.67 repo, DuckDB offline store, in the
Feast interpreter), frozen, validated, trained on and registered; promotion loaded the views into
the SQLite online store first. The registered model then scores transactions from the online
store (served as of an instant, the views' TTLs applied) and from the frozen training set: the
same features, the same predictions; and `trainpipe reproduce` trains the identical model from the
frozen rows without Feast."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.feature_store import client
from airflow_trainpipe.examples.feast_repo import CARD_FEATURES, FEATURE_SERVICE, MERCHANT_FEATURES
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import FACTORY_TASKS, run_factory_pipeline
from tests.helpers.feast_repo import START, feast_repo
from tests.helpers.source_configs import assert_reproduces

LAST = START + timedelta(days=6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_features_from_feast_train_register_and_serve_online_what_training_read(
    airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow import MlflowClient

    home = Path(airflow_env["TRAINPIPE_HOME"])
    example = feast_repo(home / "feast", days=7, rows=1000)  # where the example config looks
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_features.yaml").read_text())
    run, output = run_factory_pipeline(airflow_env, config, LAST.isoformat())
    assert run["tasks"] == dict.fromkeys(FACTORY_TASKS, "success"), output[-8000:]
    assert "joined 7 feature(s) of Feast project trainpipe_fraud (card_activity, merchant_risk;" in output
    assert (
        "materialised feature view card_activity into the online store: 2025-12-30T00:00:00+00:00 .. "
        in output
    )

    tracking = f"sqlite:///{home / 'mlflow.db'}"
    version = MlflowClient(tracking).get_model_version_by_alias("fraud_detector_features", "champion")
    tags = version.tags
    assert tags["trainpipe.feast_project"] == "trainpipe_fraud"
    assert tags["trainpipe.feast_feature_views"] == "card_activity,merchant_risk"
    assert tags["trainpipe.feast_features"].split(",") == [
        *(f"card_activity:{name}" for name in CARD_FEATURES),
        *(f"merchant_risk:{name}" for name in MERCHANT_FEATURES),
    ]
    assert tags["trainpipe.feast_materialized_views"] == "card_activity,merchant_risk"
    manifest = json.loads(
        (
            home
            / "feast"
            / "transactions"
            / "_trainpipe"
            / "snapshots"
            / f"{tags['trainpipe.data_digest'][7:]}.json"
        ).read_text()
    )
    features = manifest["features"]
    assert features["definitions_sha256"] == tags["trainpipe.feast_definitions_sha256"]
    assert features["entity_start"] == "2026-01-01T00:00:00+00:00" and manifest["rows"] == 7000
    assert manifest["window"][0] == "ds=2026-01-01" and manifest["window"][-1] == "ds=2026-01-07"

    # The last day's transactions as trained on (joined as of each one's time), and the same
    # entities served from the online store as of noon that day: what serving reads is what
    # training read, feature for feature, prediction for prediction.
    (frozen,) = manifest["files"]
    training = pq.read_table(local_path(frozen["uri"]))
    midnight = datetime.combine(LAST, datetime.min.time(), UTC)
    last_day = training.filter(
        pc.greater(training["event_time"], pa.scalar(midnight, training.schema.field("event_time").type))
    )
    assert 900 < last_day.num_rows < 1000
    entities = home / "serving.parquet"
    pq.write_table(
        last_day.select(["transaction_id", "card_id", "merchant_id", "amount", "channel"]), entities
    )
    served = pq.read_table(
        client.online_features(
            python=None,
            repo=example.repo,
            entity_file=entities,
            output=home / "served.parquet",
            feature_service=FEATURE_SERVICE,
            as_of=midnight + timedelta(hours=12),
        )
    )
    names = [*CARD_FEATURES, *MERCHANT_FEATURES]
    assert served.select(names).equals(last_day.select(names))
    assert last_day["txn_count_7d"].null_count > 0  # cards without a value inside the TTL: null in both

    # set_tracking_uri exports MLFLOW_TRACKING_URI: set through monkeypatch, the teardown removes
    # it, or every later test's subprocesses would track into this test's store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    mlflow.set_tracking_uri(tracking)
    try:
        model = mlflow.pyfunc.load_model("models:/fraud_detector_features@champion")
    finally:
        mlflow.set_tracking_uri(None)  # later tests in this process get the default store again
    offline = model.predict(last_day.to_pandas())["probability"]
    online = model.predict(served.to_pandas())["probability"]
    assert np.array_equal(np.asarray(offline), np.asarray(online))
    assert len(set(np.round(np.asarray(offline), 6))) > 100  # real scores, not a constant

    # The model is reproduced from the frozen joined rows alone: no Feast interpreter, no offline
    # tables (moved away), and the same weights.
    shutil.move(home / "feast" / "features", home / "features.moved")
    env = {**airflow_env, "TRAINPIPE_FEAST_PYTHON": str(home / "no-feast-here")}
    assert_reproduces("fraud_detector_features@champion", env)
