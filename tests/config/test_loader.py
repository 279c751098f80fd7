"""Loader behaviour that the broken-config fixtures do not show one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config, parse_config
from airflow_trainpipe.exceptions import ConfigError, TrainpipeError
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
    text = FRAUD.replace(
        "  volume:\n    min_rows: 1000\n    max_change: 0.5",
        "  volume: &volume\n    min_rows: 1000\n    max_change: 0.5",
    ) + "x_volume_copy: *volume\n"
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
        assert "available: gbdt_net, tabular_mlp" in _problems(FRAUD.replace("model: tabular_mlp", "model: nope"))[0]
    finally:
        catalog.available_models.cache_clear()
