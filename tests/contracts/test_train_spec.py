"""The launcher <-> entrypoint contract: where a run's checkpoints live."""

from __future__ import annotations

import posixpath
import random
import string
from pathlib import Path

import pytest

from airflow_trainpipe.contracts.train_spec import TrainSpec, run_dir_name
from tests.helpers.jobs import job_config


def _spec(tmp_path: Path, run_id: str) -> TrainSpec:
    return TrainSpec(config=job_config(tmp_path), run_id=run_id, data_files=["file:///data/part-0.parquet"])


@pytest.mark.parametrize(
    "run_id", [".", "..", "...", ".hidden", "../other_run", "a/../../b", "/abs", "~", "a\\b", "\x00", "é"]
)
def test_run_directory_is_one_visible_segment_under_the_pipeline_folder(tmp_path: Path, run_id: str) -> None:
    name = run_dir_name(run_id)
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert not name.startswith("."), name  # neither `.`, `..` nor hidden
    run_dir = _spec(tmp_path, run_id).run_dir
    pipeline_root = f"{tmp_path.as_uri()}/fraud_detector"
    assert (
        posixpath.normpath(run_dir.removeprefix("file://"))
        == f"{pipeline_root.removeprefix('file://')}/{name}"
    )


def test_run_ids_that_one_substitute_character_merged_get_distinct_directories() -> None:
    # `_` for every odd character mapped all of these to one directory: one run resumed another's checkpoints.
    ids = [
        "manual__2026-01-01T00:00:00+00:00",
        "manual__2026-01-01T00_00_00_00_00",
        "manual__2026-01-01T00:00:00_00:00",
        "a~3Ab",
        "a:b",
        "a_b",
        ".x",
        "~2Ex",
        "x.",
    ]
    assert len({run_dir_name(i) for i in ids}) == len(ids)


def test_airflow_run_ids_stay_readable() -> None:
    assert (
        run_dir_name("scheduled__2026-01-03T02:00:00+00:00") == "scheduled__2026-01-03T02~3A00~3A00~2B00~3A00"
    )
    assert run_dir_name("e2e_manual_1") == "e2e_manual_1"


def test_long_run_ids_are_shortened_and_stay_distinct() -> None:
    base = "x" * 300
    names = {run_dir_name(base + suffix) for suffix in ("a", "b", ":")}
    assert len(names) == 3
    assert all(len(n) <= 200 for n in names)
    # `~~` marks a shortened name; a full encoding never contains it (a `~` is always `~XX`).
    assert all("~~" in n for n in names)
    assert "~~" not in run_dir_name("~~" + "x" * 50)


def test_encoding_is_injective_on_random_ids() -> None:
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + "._-~:+/ %\\é\x00"
    ids = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(20_000)}
    assert len({run_dir_name(i) for i in ids}) == len(ids)
