"""The Feast child through its client, against a real Feast 0.67 repo (DuckDB offline store, SQLite
online store) in the Feast interpreter: point-in-time retrieval checked against an independent
`pandas.merge_asof`, the classified failures, the definition hash, materialisation and online reads.

One repo is shared by the module: each child call costs an `import feast` (seconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.data.feature_store import client
from airflow_trainpipe.data.feature_store.client import FeatureStoreError, FeatureStoreUnavailable, Retrieval
from airflow_trainpipe.examples.feast_repo import (
    CARD_FEATURES,
    FEATURE_SERVICE,
    MERCHANT_FEATURES,
    FeastExample,
    write_repo,
)
from tests.helpers.feast_repo import START, feast_repo

pytestmark = pytest.mark.slow

TTL = {"card_activity": timedelta(days=2), "merchant_risk": timedelta(days=30)}
KEYS = {"card_activity": "card_id", "merchant_risk": "merchant_id"}
FEATURES = {"card_activity": CARD_FEATURES, "merchant_risk": MERCHANT_FEATURES}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> FeastExample:
    return feast_repo(tmp_path_factory.mktemp("feast"), days=3, rows=2000)


@pytest.fixture(scope="module")
def retrieval(example: FeastExample) -> Retrieval:
    return client.retrieve(
        python=None,
        repo=example.repo,
        entity_files=list(example.transaction_files),
        timestamp_column="event_time",
        output=example.root / "training.parquet",
        feature_service=FEATURE_SERVICE,
    )


def _entities(example: FeastExample) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in example.transaction_files)


def _as_of(entities: pd.DataFrame, features: pd.DataFrame, view: str, direction: str) -> pd.DataFrame:
    """The independent join: each entity row's latest feature row at or before its time (within
    the TTL), by the view's join key, in entity row order."""
    left = entities.assign(_row=range(len(entities))).sort_values("event_time")
    right = features.sort_values("event_timestamp")
    joined = pd.merge_asof(
        left,
        right[[KEYS[view], "event_timestamp", *FEATURES[view]]],
        left_on="event_time",
        right_on="event_timestamp",
        by=KEYS[view],
        direction=direction,  # type: ignore[arg-type]
        tolerance=pd.Timedelta(TTL[view]),
    )
    return joined.sort_values("_row").reset_index(drop=True)


def test_retrieval_keeps_every_row_in_order_and_joins_as_of_each_row(
    example: FeastExample, retrieval: Retrieval
) -> None:
    entities = _entities(example)
    out = pq.read_table(retrieval.output)
    assert retrieval.rows == out.num_rows == entities.num_rows == 6000
    # The entity table as read, unchanged: same columns, types, values and row order.
    assert out.select(entities.column_names).equals(entities)
    assert out.column_names == [*entities.column_names, *CARD_FEATURES, *MERCHANT_FEATURES]
    assert retrieval.features == tuple(
        f"{view}:{name}" for view in ("card_activity", "merchant_risk") for name in FEATURES[view]
    )
    assert str(out.schema.field("txn_count_7d").type) == "int64"
    assert str(out.schema.field("amount_mean_7d").type) == "double"
    got = out.to_pandas()
    left = entities.select(["card_id", "merchant_id", "event_time"]).to_pandas()
    for view, path in (("card_activity", example.card_activity), ("merchant_risk", example.merchant_risk)):
        expected = _as_of(left, pq.read_table(path).to_pandas(), view, "backward")
        for name in FEATURES[view]:
            pd.testing.assert_series_equal(
                got[name].astype("float64"), expected[name].astype("float64"), check_names=False
            )
    missing = got["txn_count_7d"].isna()
    assert 0 < missing.sum() < 0.05 * len(got)  # no card value inside the 2-day TTL: null, kept
    assert got["merchant_risk_score"].notna().all()
    # The check can see leakage: joining the next feature row instead gives other values.
    ahead = _as_of(left, pq.read_table(example.card_activity).to_pandas(), "card_activity", "forward")
    differ = (ahead["amount_mean_7d"] != got["amount_mean_7d"]) & ahead["amount_mean_7d"].notna()
    assert differ.sum() > 0.5 * len(got)


def test_retrieval_describes_the_views_it_used(retrieval: Retrieval) -> None:
    assert retrieval.project == "trainpipe_fraud"
    card, merchant = retrieval.views
    assert (card.name, card.join_keys, card.ttl_seconds) == ("card_activity", ("card_id",), 2 * 86400)
    assert card.schema == {
        "txn_count_7d": "Int64",
        "amount_mean_7d": "Float64",
        "amount_max_7d": "Float64",
        "night_share_30d": "Float64",
        "declines_7d": "Int64",
    }
    assert (merchant.name, merchant.join_keys, merchant.ttl_seconds) == (
        "merchant_risk",
        ("merchant_id",),
        30 * 86400,
    )
    assert len(card.sha256) == 64 and card.sha256 != merchant.sha256


def _retrieve(example: FeastExample, tmp_path: Path, **kwargs: object) -> Retrieval:
    options: dict = {"features": ["card_activity:txn_count_7d"], **kwargs}
    return client.retrieve(
        python=None,
        repo=options.pop("repo", example.repo),
        entity_files=options.pop("entity_files", list(example.transaction_files[:1])),
        timestamp_column="event_time",
        output=tmp_path / "out.parquet",
        **options,
    )


def test_an_unknown_feature_reference_names_it_and_the_features_that_exist(
    example: FeastExample, tmp_path: Path
) -> None:
    with pytest.raises(FeatureStoreError) as caught:
        _retrieve(example, tmp_path, features=["card_activity:txn_count_7d", "card_activity:txn_count_90d"])
    assert caught.value.kind == "unknown_feature" and not caught.value.retryable
    message = str(caught.value)
    assert "'card_activity:txn_count_90d'" in message
    assert "card_activity (txn_count_7d, amount_mean_7d" in message and "merchant_risk (" in message
    assert not (tmp_path / "out.parquet").exists()


def test_an_unknown_feature_service_names_it_and_the_services_that_exist(
    example: FeastExample, tmp_path: Path
) -> None:
    with pytest.raises(FeatureStoreError) as caught:
        _retrieve(example, tmp_path, features=None, feature_service="fraud_features_v2")
    assert caught.value.kind == "unknown_feature"
    assert "'fraud_features_v2'" in str(caught.value) and "feature services: fraud_features" in str(
        caught.value
    )


def test_a_missing_join_key_column_is_named_with_its_view(example: FeastExample, tmp_path: Path) -> None:
    entities = pq.read_table(example.transaction_files[0]).drop_columns(["merchant_id"])
    pq.write_table(entities, tmp_path / "entities.parquet")
    with pytest.raises(FeatureStoreError) as caught:
        _retrieve(
            example,
            tmp_path,
            features=None,
            feature_service=FEATURE_SERVICE,
            entity_files=[tmp_path / "entities.parquet"],
        )
    assert caught.value.kind == "missing_entity_column" and not caught.value.retryable
    assert "'merchant_id'" in str(caught.value) and "merchant_risk" in str(caught.value)
    assert "transaction_id, card_id, event_time" in str(caught.value)


@pytest.fixture
def card_source_gone(example: FeastExample) -> Iterator[Path]:
    aside = example.card_activity.with_suffix(".aside")
    example.card_activity.rename(aside)
    try:
        yield example.card_activity
    finally:
        aside.rename(example.card_activity)


def test_a_missing_offline_source_is_unreachable_and_retryable(
    example: FeastExample, tmp_path: Path, card_source_gone: Path
) -> None:
    with pytest.raises(FeatureStoreUnavailable) as caught:
        _retrieve(example, tmp_path)
    assert caught.value.kind == "offline_store_unreachable" and caught.value.retryable
    assert "card_activity" in str(caught.value) and str(card_source_gone) in str(caught.value)


def test_the_file_offline_store_is_refused_because_it_drops_rows(
    example: FeastExample, tmp_path: Path
) -> None:
    # The same registry (absolute path) through a feature_store.yaml that names the file store.
    repo = tmp_path / "repo"
    repo.mkdir()
    yaml = (example.repo / "feature_store.yaml").read_text()
    (repo / "feature_store.yaml").write_text(yaml.replace("type: duckdb", "type: file"))
    with pytest.raises(FeatureStoreError) as caught:
        _retrieve(example, tmp_path, repo=repo)
    assert caught.value.kind == "offline_store_drops_rows" and not caught.value.retryable
    assert "'file'" in str(caught.value) and "drops" in str(caught.value) and "duckdb" in str(caught.value)


def test_the_definition_hash_survives_a_fresh_apply_and_changes_with_a_dtype(
    example: FeastExample, retrieval: Retrieval, tmp_path: Path
) -> None:
    # The same definitions applied again, into a new registry (new registry timestamps).
    repo = tmp_path / "repo"
    write_repo(repo, example.card_activity, example.merchant_risk)
    client.apply(python=None, repo=repo)
    both = ["card_activity:amount_mean_7d", "merchant_risk:merchant_risk_score"]
    again = _retrieve(example, tmp_path, repo=repo, features=both)
    assert [v.sha256 for v in again.views] == [v.sha256 for v in retrieval.views]
    features = repo / "features.py"
    features.write_text(
        features.read_text()
        .replace('Field(name="amount_mean_7d", dtype=Float64)', 'Field(name="amount_mean_7d", dtype=Float32)')
        .replace("from feast.types import Float64, Int64", "from feast.types import Float32, Float64, Int64")
    )
    client.apply(python=None, repo=repo)
    changed = _retrieve(example, tmp_path, repo=repo, features=both)
    assert changed.views[0].schema["amount_mean_7d"] == "Float32"
    assert changed.views[0].sha256 != retrieval.views[0].sha256
    assert changed.views[1].sha256 == retrieval.views[1].sha256
    assert str(pq.read_table(changed.output).schema.field("amount_mean_7d").type) == "float"


def test_materialize_covers_the_past_first_then_goes_on_incrementally_and_serves_what_training_read(
    example: FeastExample, retrieval: Retrieval, tmp_path: Path
) -> None:
    end = datetime(2026, 3, 1, tzinfo=UTC)  # weeks after the last feature row
    first = client.materialize(
        python=None,
        repo=example.repo,
        feature_views=["card_activity", "merchant_risk"],
        end=end,
        cover_from=datetime.combine(START, datetime.min.time(), UTC),
    )
    assert first["views"]["card_activity"] == {
        "start": "2025-12-30T00:00:00+00:00",
        "end": end.isoformat(),
        "first": True,
    }
    assert first["views"]["merchant_risk"]["start"] == "2025-12-02T00:00:00+00:00"
    later = end + timedelta(days=1)
    second = client.materialize(
        python=None, repo=example.repo, feature_views=["card_activity"], end=later, cover_from=end
    )
    assert second["views"]["card_activity"] == {
        "start": end.isoformat(),
        "end": later.isoformat(),
        "first": False,
    }
    # The last day's transactions are all after the last feature rows: online = offline for them.
    served = client.online_features(
        python=None,
        repo=example.repo,
        entity_file=example.transaction_files[-1],
        output=tmp_path / "online.parquet",
        feature_service=FEATURE_SERVICE,
    )
    online = pq.read_table(served)
    day = pq.read_table(example.transaction_files[-1])
    assert online.select(day.column_names).equals(day)
    training = pq.read_table(retrieval.output).slice(2 * day.num_rows, day.num_rows)
    assert online.schema.equals(training.schema)
    features = [*CARD_FEATURES, *MERCHANT_FEATURES]
    known = pc.is_valid(training["txn_count_7d"])
    assert pc.sum(known).as_py() > 0.9 * day.num_rows
    assert online.filter(known).select(features).equals(training.filter(known).select(features))
    # Where training had no card value inside the TTL, Feast's online read still serves the last
    # value it holds, however old (it does not apply the TTL): a skew callers must know about.
    stale = online.filter(pc.invert(known))
    assert stale.num_rows > 0 and stale["txn_count_7d"].null_count == 0
    # Served `as_of` an instant, a value older than its view's TTL then is null: exactly the
    # independent as-of join of the same entities at that instant.
    instant = datetime.combine(START + timedelta(days=3), datetime.min.time(), UTC)
    expired = pq.read_table(
        client.online_features(
            python=None,
            repo=example.repo,
            entity_file=example.transaction_files[-1],
            output=tmp_path / "as_of.parquet",
            feature_service=FEATURE_SERVICE,
            as_of=instant,
        )
    ).to_pandas()
    at = day.select(["card_id", "merchant_id"]).to_pandas().assign(event_time=pd.Timestamp(instant))
    assert expired["txn_count_7d"].isna().sum() > 0
    for view, path in (("card_activity", example.card_activity), ("merchant_risk", example.merchant_risk)):
        expected = _as_of(at, pq.read_table(path).to_pandas(), view, "backward")
        for name in FEATURES[view]:
            pd.testing.assert_series_equal(
                expired[name].astype("float64"), expected[name].astype("float64"), check_names=False
            )


# Loaded by the child's interpreter as it starts (a sitecustomize on PYTHONPATH, which the client
# keeps): once the child has run as the client runs it, reports whether Feast's FeatureView was
# imported instrumented by typeguard; and, as a control, whether typeguard's own decorator still
# instruments a function of a module written here.
PROBE = """
import atexit, json, os, sys, tempfile
from pathlib import Path


def report():
    import feast.feature_view
    import typeguard._decorators

    folder = tempfile.mkdtemp()
    Path(folder, "typed.py").write_text("def twice(x: int) -> int:\\n    return 2 * x\\n")
    sys.path.insert(0, folder)
    import typed

    control = typeguard._decorators.typechecked(typed.twice)
    Path(os.environ["TRAINPIPE_PROBE"]).write_text(json.dumps({
        "feast": "typeguard" in feast.feature_view.FeatureView.__init__.__code__.co_names,
        "control": "typeguard" in control.__code__.co_names,
    }))


atexit.register(report)
"""


def test_the_child_imports_feast_without_typeguard_instrumentation(
    example: FeastExample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "probe"))
    monkeypatch.setenv("TRAINPIPE_PROBE", str(tmp_path / "probe.json"))
    out = _retrieve(example, tmp_path)
    assert out.rows > 0  # the child did its work
    assert json.loads((tmp_path / "probe.json").read_text()) == {"feast": False, "control": True}
