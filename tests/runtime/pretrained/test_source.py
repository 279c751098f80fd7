"""A run's pretrained bytes are pinned once: a retry reads the same ones or stops, an alias is
resolved to its version, a registry reference that names nothing stops the run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.pretrained.errors import PretrainedError
from airflow_trainpipe.runtime.pretrained.source import fetch, pinned_directory, read_pin
from tests.helpers.pretrained import save_encoder_directory

TEXTS = ["my order never arrived", "the app crashes at login", "please change my billing address"] * 40


@pytest.fixture
def encoder(tmp_path: Path) -> Path:
    return save_encoder_directory(tmp_path / "encoder", TEXTS)


def test_the_first_read_pins_the_bytes_and_a_retry_reads_the_pin(encoder: Path, tmp_path: Path) -> None:
    run_dir = (tmp_path / "run").as_uri()
    path, pin = pinned_directory(encoder.as_uri(), run_dir)
    assert path == encoder and pin.source == encoder.as_uri() and len(pin.sha256) == 64
    assert read_pin(run_dir) == pin
    assert pinned_directory("file:///elsewhere", run_dir) == (encoder, pin)  # the pin, not the config


def test_bytes_that_changed_since_the_pin_stop_the_run(encoder: Path, tmp_path: Path) -> None:
    run_dir = (tmp_path / "run").as_uri()
    _, pin = pinned_directory(encoder.as_uri(), run_dir)
    (encoder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(PretrainedError, match=r"tokenizer_config\.json differ") as caught:
        fetch(pin)
    assert "not those this run pinned" in str(caught.value) and not caught.value.retryable


def test_a_file_removed_since_the_pin_stops_the_run(encoder: Path, tmp_path: Path) -> None:
    _, pin = pinned_directory(encoder.as_uri(), (tmp_path / "run").as_uri())
    shutil.rmtree(encoder)
    with pytest.raises(PretrainedError, match="does not exist"):
        fetch(pin)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("models:/no_such_model@champion", "no version with alias 'champion' of 'no_such_model'"),
        ("models:/no_such_model/3", "models:/no_such_model/3: the registry has no such version"),
    ],
)
def test_a_registered_version_that_does_not_exist(
    trainpipe_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str, message: str
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{trainpipe_home / 'mlflow.db'}")
    with pytest.raises(PretrainedError, match=message):
        pinned_directory(uri, (tmp_path / "run").as_uri())


def test_two_trials_pinning_together_read_the_first_pin(encoder: Path, tmp_path: Path) -> None:
    from airflow_trainpipe.contracts.train_spec import PretrainedPin
    from airflow_trainpipe.runtime.pretrained.source import write_pin

    study_dir = (tmp_path / "study").as_uri()
    first = PretrainedPin(uri="models:/m@champion", source="models:/m/3", sha256="a" * 64)
    second = PretrainedPin(uri="models:/m@champion", source="models:/m/4", sha256="b" * 64)
    assert write_pin(study_dir, first) == first
    assert write_pin(study_dir, second) == first  # the alias moved between the two: both read version 3
    assert read_pin(study_dir) == first
