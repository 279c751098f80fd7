"""The training entrypoint in-process: its arguments, the error it reports, the trainer's own choices.

Whole jobs (torchrun, DeepSpeed, MLflow, resume) run in test_resume.py; here one process is a
one-rank gloo world and each job stops at the failure under test, before any optimizer step.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
import torch.distributed as dist

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.runtime.data.reader import DataError
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.resume.checkpoint import MARKER, CheckpointError, tag_for
from airflow_trainpipe.runtime.resume.safe_load import FORCE_ENV
from airflow_trainpipe.runtime.resume.seeding import restore_rng_state
from airflow_trainpipe.runtime.train import Trainer, main
from tests.helpers.jobs import job_config_text, make_spec


@pytest.fixture(scope="module")
def one_rank_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real gloo group of this process alone (rendezvous through a file): collectives run for real."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("rendezvous") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def not_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() arms PDEATHSIG under torchrun: never in pytest itself."""
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def job(one_rank_world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What main() and the trainer change in this process is put back afterwards."""
    monkeypatch.setenv(FORCE_ENV, "0")  # main() sets it to 1; the fixture's undo removes it
    monkeypatch.setattr("deepspeed.comm.comm.cdb", None)  # DeepSpeed's handle on the test's group


@pytest.fixture(scope="module")
def data_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_day(tmp_path_factory.mktemp("data").as_uri(), date(2026, 1, 1), 120, seed=1)


def _events(capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [e for e in map(parse, capfd.readouterr().out.splitlines()) if e]


# -- arguments ---------------------------------------------------------------------------------


def test_the_spec_argument_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "the following arguments are required: --spec" in capsys.readouterr().err


def test_a_spec_file_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no-such-spec\.json"):
        main(["--spec", f"@{tmp_path / 'no-such-spec.json'}"])


def test_an_invalid_spec_is_refused_naming_the_field_and_never_retried(
    tmp_path: Path, data_files: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    document = json.loads(make_spec(tmp_path, data_files, "r").to_json())
    with pytest.raises(pydantic.ValidationError, match="run_id"):
        main(["--spec", json.dumps({**document, "run_id": ""})])
    (event,) = _events(capfd)  # every try would read the same spec: the task must fail at once
    assert event["event"] == "error" and event["retryable"] is False
    assert event["error"].startswith("unreadable TrainSpec: ValidationError:") and "run_id" in event["error"]


# -- the error event ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["inline", "file"])
def test_bad_data_is_reported_as_not_retryable_from_an_inline_or_file_spec(
    job: None, tmp_path: Path, capfd: pytest.CaptureFixture[str], form: str
) -> None:
    absent = (tmp_path / "absent.parquet").as_uri()
    text = make_spec(tmp_path, [absent], "bad_data").to_json()
    if form == "file":
        (tmp_path / "spec.json").write_text(text)
        text = f"@{tmp_path / 'spec.json'}"
    with pytest.raises(DataError, match=r"absent\.parquet"):
        main(["--spec", text])
    (event,) = _events(capfd)
    assert event["event"] == "error" and event["rank"] == 0 and event["retryable"] is False
    assert event["error"].startswith(f"DataError: cannot read {absent} as parquet")


def test_a_checkpoint_store_error_is_reported_as_retryable(
    job: None,
    tmp_path: Path,
    data_files: list[str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("airflow_trainpipe.runtime.resume.checkpoint.READ_BACKOFF_S", 0.001)
    spec = make_spec(tmp_path, data_files, "unreadable_marker")
    marker = local_path(spec.run_dir) / "checkpoints" / tag_for(10) / MARKER
    marker.mkdir(parents=True)  # every read of it fails, and not as "absent"
    with pytest.raises(CheckpointError):
        main(["--spec", spec.to_json()])
    (event,) = _events(capfd)
    assert event["retryable"] is True
    assert event["error"].startswith(
        f"CheckpointError: cannot read {spec.run_dir}/checkpoints/{tag_for(10)}/{MARKER}"
    )


def test_an_error_that_is_not_ours_is_reported_as_retryable(
    job: None, tmp_path: Path, data_files: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    # Started outside torchrun: no LOCAL_RANK, which DeepSpeed asserts when it builds the engine.
    with pytest.raises(AssertionError, match="LOCAL_RANK"):
        main(["--spec", make_spec(tmp_path, data_files, "no_torchrun").to_json()])
    (event,) = _events(capfd)
    assert event["retryable"] is True and event["error"].startswith("AssertionError: ")


# -- the trainer -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "higher_is_better"),
    [("metric: roc_auc\n  direction: maximize", True), ("metric: brier\n  direction: minimize", False)],
    ids=["roc_auc", "brier"],
)
def test_checkpoints_are_ranked_in_the_gate_metrics_direction(
    job: None, tmp_path: Path, data_files: list[str], gate: str, higher_is_better: bool
) -> None:
    text = job_config_text(tmp_path)
    config = parse_config(text.replace("metric: roc_auc\n  direction: maximize", gate))
    spec = TrainSpec(config=config, run_id="gate", data_files=data_files)
    trainer = Trainer(spec)
    assert (trainer.rank, trainer.world_size, trainer.device) == (0, 1, torch.device("cpu"))
    assert (
        trainer.higher_is_better is higher_is_better
        and trainer.checkpoints.higher_is_better is higher_is_better
    )
    assert trainer.checkpoints.root == f"{spec.run_dir}/checkpoints"


def test_the_checkpoint_client_state_carries_step_sampler_and_every_ranks_generators(
    job: None, tmp_path: Path, data_files: list[str]
) -> None:
    trainer = Trainer(make_spec(tmp_path, data_files, "client_state"))
    sampler = ResumableSampler(100, 10, 1, 1, 0, seed=4)
    sampler.step_positions()
    state = {"step": 0, "history": [{"epoch": 0}], "best": 0.5}
    random.seed(8)
    torch.manual_seed(8)
    client = trainer._client_state(state, sampler, 42)
    expected = (random.random(), torch.rand(2))

    saved = client["trainpipe"]
    assert (saved["step"], saved["history"], saved["best"]) == (42, [{"epoch": 0}], 0.5)
    assert saved["sampler"] == {"epoch": 0, "consumed": 10, "global_batch": 10, "seed": 4}
    assert state["step"] == 0 and "rng" not in state  # the loop's own state is left as it was
    assert len(saved["rng"]) == 1
    restore_rng_state(saved["rng"][0])
    drawn = (random.random(), torch.rand(2))
    assert drawn[0] == expected[0] and torch.equal(drawn[1], expected[1])
