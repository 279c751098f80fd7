"""Loader behaviour that the broken-config fixtures do not show one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config, parse_config
from airflow_trainpipe.core.exceptions import ConfigError, TrainpipeError
from tests.conftest import EXAMPLE_CONFIGS

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "x.yaml")
    return [str(p) for p in caught.value.problems]


def test_all_problems_of_a_file_are_reported_together() -> None:
    text = FRAUD.replace("zero_stage: 1", "zero_stage: 9").replace("epochs: 3", "epochs: -3")
    text = text.replace("owner: risk-ml", "ownr: risk-ml")
    problems = _problems(text)
    assert len(problems) == 3
    assert any("training.deepspeed.zero_stage" in p for p in problems)
    assert any("training.hyperparameters.epochs" in p for p in problems)
    assert any("did you mean 'owner'" in p for p in problems)
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == sorted(lines), "problems are reported in file order"


def test_yaml_anchors_and_merge_keys_are_supported() -> None:
    text = (
        FRAUD.replace(
            "  volume:\n    min_rows: 1000\n    max_change: 0.5",
            "  volume: &volume\n    min_rows: 1000\n    max_change: 0.5",
        )
        + "x_volume_copy: *volume\n"
    )
    # The alias resolves, so the only problem is the unknown top-level key it was put under.
    assert [p.split(": ")[1] for p in _problems(text)] == ["x_volume_copy"]


def test_quoted_iso_dates_are_accepted() -> None:
    config = parse_config(FRAUD.replace("start_date: 2026-01-01", 'start_date: "2026-01-01"'))
    assert str(config.schedule.start_date) == "2026-01-01"


def test_duration_forms() -> None:
    for text, seconds in (("90", 90), ("90s", 90), ("1h30m", 5400), ("0.5m", 30), ("2d", 172800)):
        config = parse_config(FRAUD.replace("retry_delay: 2m", f"retry_delay: {text}"))
        assert config.schedule.retry_delay.total_seconds() == seconds


def test_asset_schedule_instead_of_cron() -> None:
    text = FRAUD.replace('  cron: "0 2 * * *"', "  asset: s3://bucket/card_transactions")
    config = parse_config(text)
    assert config.schedule.cron is None and config.schedule.asset == "s3://bucket/card_transactions"


def test_environment_is_never_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWNER", "someone")
    problems = _problems(FRAUD.replace("owner: risk-ml", "owner: $OWNER"))
    assert "environment variable reference" in problems[0]


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert str(caught.value).startswith(f"{missing}: <document>: cannot read file")


def test_empty_file_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="expected a mapping of config sections, got an empty file"):
        load_config(empty)


def test_config_error_is_a_trainpipe_error() -> None:
    assert issubclass(ConfigError, TrainpipeError)


def test_plugin_models_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from airflow_trainpipe.config import catalog

    plugin = EntryPoint("gbdt_net", "some_pkg.models:build", catalog.MODEL_ENTRY_POINT_GROUP)
    monkeypatch.setattr(catalog, "entry_points", lambda group: [plugin] if group == plugin.group else [])
    catalog.available_models.cache_clear()
    try:
        config = parse_config(FRAUD.replace("model: tabular_mlp", "model: gbdt_net"))
        assert config.training.model == "gbdt_net"
        assert (
            "available: gbdt_net, tabular_mlp"
            in _problems(FRAUD.replace("model: tabular_mlp", "model: nope"))[0]
        )
    finally:
        catalog.available_models.cache_clear()


class _BuggyModel:
    """Stands in for the config model with a bug no check foresaw."""

    error: BaseException = RecursionError("maximum recursion depth exceeded")

    @classmethod
    def model_validate(cls, data: object) -> None:
        raise cls.error


def test_an_unexpected_exception_is_a_config_error_naming_the_file(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_trainpipe.config import loader

    monkeypatch.setattr(loader, "PipelineConfig", _BuggyModel)
    with pytest.raises(ConfigError) as caught:
        parse_config(FRAUD, "x.yaml")
    assert str(caught.value) == (
        "x.yaml: <document>: unexpected RecursionError while loading it: "
        "maximum recursion depth exceeded; the traceback is logged"
    )
    assert isinstance(caught.value.__cause__, RecursionError)
    [record] = [r for r in caplog.records if r.name == loader.__name__]
    assert "x.yaml" in record.getMessage() and record.exc_info[0] is RecursionError


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupts_are_not_config_errors(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    from airflow_trainpipe.config import loader

    monkeypatch.setattr(loader, "PipelineConfig", _BuggyModel)
    monkeypatch.setattr(_BuggyModel, "error", error)
    with pytest.raises(type(error)):
        parse_config(FRAUD, "x.yaml")


def test_a_config_error_carries_the_declared_pipeline_name() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(FRAUD.replace("metric: roc_auc", "metric: roc_acu"), "x.yaml")
    assert caught.value.pipeline == "fraud_detector"  # the stand-in DAG may take over that id
    with pytest.raises(ConfigError) as caught:
        parse_config("pipeline: [1, 2]\n", "x.yaml")
    assert caught.value.pipeline is None


def test_several_documents_are_one_located_problem() -> None:
    assert _problems("pipeline: a\n---\npipeline: b\n") == [
        "x.yaml:2:1: <document>: invalid YAML: a second document starts here; a config file is one YAML document"
    ]


def test_an_anchor_defined_twice_names_both_lines() -> None:
    assert _problems("pipeline: x\na: &a 1\nb: &a 2\n") == [
        "x.yaml:3:4: <document>: invalid YAML: anchor &a is defined again (first on line 2)"
    ]


def test_forbidden_characters_are_located() -> None:
    assert _problems("pipeline: é\x00\n") == [
        "x.yaml:1:12: <document>: invalid YAML: unacceptable character #x0000: "
        "control characters are not allowed"
    ]
    assert _problems("pipeline: a\n\x1b[31m: red\n")[0].startswith(
        "x.yaml:2:1: <document>: invalid YAML: unacceptable character #x001b"
    )


def test_text_with_a_lone_surrogate_is_a_config_error() -> None:
    assert _problems("pipeline: a\nowner: \ud800\n") == [
        "x.yaml:2:8: <document>: invalid character U+D800 (surrogates not allowed)"
    ]


def test_keys_that_are_not_strings_are_named_briefly() -> None:
    problems = _problems(FRAUD + f"? [{', '.join(['x'] * 2000)}]\n: 1\n? {'9' * 5000}\n: 2\n")
    assert any(p.endswith("<document>: keys must be strings, got a sequence") for p in problems)
    [huge] = [p for p in problems if "got '999" in p]
    assert huge.endswith("… (5,002 characters)") and len(huge) < 200  # repr: 5,000 digits and quotes


def test_a_huge_scalar_is_quoted_briefly() -> None:
    [problem] = _problems(FRAUD.replace("epochs: 3", f"epochs: '{'3' * 100_000}'"))
    assert "training.hyperparameters.epochs: Input should be a valid integer, got '3333" in problem
    assert len(problem) < 250


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2026-13-01", "invalid value: not a valid timestamp: month must be in 1..12"),
        (
            "1" * 5000,
            "invalid value: not a valid int: Exceeds the limit (4300 digits) for integer string conversion",
        ),
        ("!!bool maybe", "invalid value: not a valid bool"),
        ("!!timestamp now", "invalid value: not a valid timestamp"),
        ("!!int ten", "invalid value: not a valid int: invalid literal for int()"),
    ],
)
def test_scalars_yaml_cannot_construct_are_located(value: str, message: str) -> None:
    [problem] = _problems(FRAUD.replace("start_date: 2026-01-01", f"start_date: {value}"))
    assert problem.startswith("x.yaml:9:15: schedule.start_date: " + message)


def test_a_problem_inside_one_kind_of_a_source_is_named_as_written() -> None:
    """pydantic puts the union member's tag in the location (`data.source.sql.order_by`); the
    file has no such key, so the problem is named, located and explained without it."""
    sql = "  source:\n    kind: sql\n    conn_id: warehouse\n    query: SELECT 1\n    order_by: [a b]\n"
    (problem,) = _problems(FRAUD.replace("  format: parquet\n", sql))
    line = FRAUD[: FRAUD.index("  format: parquet\n")].count("\n") + 5
    assert problem.startswith(
        f"x.yaml:{line}:15: data.source.order_by: order_by column 'a b' is not a plain identifier"
    )
    (problem,) = _problems(
        FRAUD.replace("  format: parquet\n", sql.replace("[a b]", "[id]\n    batch_row: 10"))
    )
    assert problem.startswith(f"x.yaml:{line + 1}:5: data.source.batch_row: unknown key 'batch_row'")
    assert problem.endswith(
        "(did you mean 'batch_rows'?); allowed keys: kind, conn_id, query, order_by, batch_rows, file_rows"
    )


def test_an_iceberg_source_s_problems_are_located_and_explained() -> None:
    """A table without its namespace is refused with what the field expects; a missing catalog
    connection names the field; an unknown key lists the iceberg kind's keys."""
    iceberg = (
        "  source:\n    kind: iceberg\n    conn_id: lake\n    table: card_transactions\n"
        "    time_column: event_time\n    order_by: [transaction_id]\n"
    )
    fraud = FRAUD.replace("    marker: _SUCCESS", "")  # a table has no marker file
    line = fraud[: fraud.index("  format: parquet\n")].count("\n") + 4
    (problem,) = _problems(fraud.replace("  format: parquet\n", iceberg))
    assert problem.startswith(
        f"x.yaml:{line}:12: data.source.table: expected the table's identifier in the catalog, "
        "`namespace.table`"
    ), problem
    assert problem.endswith(", got 'card_transactions'")
    edited = iceberg.replace("    conn_id: lake\n", "").replace(
        "card_transactions\n", "sales.card_transactions\n    snapshot: 3\n"
    )
    missing, unknown = _problems(fraud.replace("  format: parquet\n", edited))
    assert ": data.source.conn_id: required field is missing; expected: Airflow connection of type" in missing
    assert ": data.source.snapshot: unknown key 'snapshot'" in unknown
    assert unknown.endswith(
        "allowed keys: kind, conn_id, table, time_column, order_by, columns, batch_rows, file_rows"
    )
