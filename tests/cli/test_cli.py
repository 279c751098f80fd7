"""`trainpipe` command line: check, schema, --version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_trainpipe
from airflow_trainpipe.cli import main
from airflow_trainpipe.config import load_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from tests.config.test_hostile_configs import HOSTILE, HOSTILE_DIR, make_generated
from tests.conftest import EXAMPLE_CONFIGS


def test_check_example_configs_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLE_CONFIGS)]) == 0
    assert "11 config(s) ok" in capsys.readouterr().err


def test_check_reports_duplicate_pipeline_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "a.yaml")
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "b.yml")
    assert main(["check", str(tmp_path)]) == 1
    assert (
        f"{tmp_path / 'b.yml'}: pipeline: 'fraud_detector' is already defined by {tmp_path / 'a.yaml'}"
        in capsys.readouterr().out
    )


def test_check_missing_path_and_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "nope.yaml")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["check", str(tmp_path)]) == 1
    assert "no *.yaml or *.yml config files" in capsys.readouterr().err


def test_check_mixes_good_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "good.yaml")
    (tmp_path / "bad.yaml").write_text(
        (EXAMPLE_CONFIGS / "house_prices.yaml").read_text().replace("zero_stage: 2", "zero_stage: 5")
    )
    assert main(["check", "-v", str(tmp_path), str(tmp_path / "gone.yaml")]) == 1
    said = capsys.readouterr()
    assert f"{tmp_path / 'good.yaml'}: ok (fraud_detector)" in said.out
    assert f"{tmp_path / 'bad.yaml'}:" in said.out and "training.deepspeed.zero_stage" in said.out
    # The tally at the end counts the missing file among the broken ones.
    assert said.err.splitlines()[-1] == "2 of 3 config(s) have problems; 1 ok"


def test_schema_prints_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "airflow-trainpipe pipeline config"
    assert set(schema["required"]) == {"pipeline", "schedule", "data", "training", "gate"}


def test_console_script_version() -> None:
    script = Path(sys.executable).parent / "trainpipe"
    out = subprocess.run([str(script), "--version"], check=True, capture_output=True, text=True).stdout
    assert out.strip() == f"trainpipe {airflow_trainpipe.__version__}"


def test_train_with_a_broken_config_exits_1_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text().replace("zero_stage: 1", "zero_stage: 7")
    )
    assert main(["train", str(broken), "--run-id", "x"]) == 1
    assert f"{broken}:" in capsys.readouterr().err


def test_train_without_data_for_the_date_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {tmp_path.as_uri()}")
    )
    assert main(["train", str(config), "--run-id", "x", "--ds", "2026-03-04"]) == 1
    assert f"no *.parquet files under {tmp_path.as_uri()}/ds=2026-03-04" in capsys.readouterr().err


def test_train_from_an_unknown_snapshot_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {tmp_path.as_uri()}")
    )
    digest = "0123" * 16
    assert main(["train", str(config), "--run-id", "x", "--snapshot", f"sha256:{digest}"]) == 1
    assert f"no snapshot with digest sha256:{digest} under {tmp_path.as_uri()}" in capsys.readouterr().err
    # The digest as some tools print it, without its prefix, is the same snapshot (it was taken
    # for a manifest altered after validation).
    assert main(["train", str(config), "--run-id", "x", "--snapshot", digest.upper()]) == 1
    assert f"no snapshot with digest sha256:{digest} under {tmp_path.as_uri()}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["train", "c.yaml", "--run-id", "x", "--ds", "2026-13-45"],
            "argument --ds: '2026-13-45' is not a day",
        ),
        (["tune", "c.yaml", "--ds", "yesterday"], "argument --ds: 'yesterday' is not a day (YYYY-MM-DD)"),
        (["render", "c.yaml", "--ds", "2026-02-30"], "argument --ds: '2026-02-30' is not a day"),
        (
            ["train", "c.yaml", "--run-id", "x", "--nproc", "-1"],
            "argument --nproc: '-1' is not an integer of at least 1",
        ),
        (
            ["reproduce", "m@champion", "--nproc", "-1"],
            "argument --nproc: '-1' is not an integer of at least 0",
        ),
        (["train", "c.yaml", "--run-id", "x", "--snapshot", "6cc8"], "'6cc8' is not a snapshot digest"),
        (["make-data", "--out", "d", "--days", "0"], "argument --days: '0' is not an integer of at least 1"),
        (
            ["make-data", "--out", "d", "--rows", "-5"],
            "argument --rows: '-5' is not an integer of at least 1",
        ),
    ],
)
def test_a_mistyped_argument_is_a_usage_error_not_a_traceback(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and expected in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["promote", "m", "1", "--reason", "x", "--conn-id", "nope"],
        ["rollback", "m", "--reason", "x", "--conn-id", "nope"],
        ["snapshots", "gc", str(EXAMPLE_CONFIGS), "--conn-id", "nope"],
    ],
)
def test_a_connection_that_is_not_defined_is_named_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"trainpipe {argv[0]}: ") and "nope" in err and "Traceback" not in err


@pytest.mark.slow
def test_train_runs_the_job_and_the_same_run_id_resumes(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.jobs import EVERY_STEPS

    config = tmp_path / "c.yaml"
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    data_root = job_files[0].rsplit("/", 2)[0]
    config.write_text(
        text.replace("uri: checkpoints", f"uri: {tmp_path.as_uri()}")
        .replace("every_steps: 100", f"every_steps: {EVERY_STEPS}")
        .replace("batch_size: 256", "batch_size: 24")
        .replace("uri: data/card_transactions", f"uri: {data_root}")
    )
    assert main(["train", str(config), "--run-id", "debug", "--max-steps", "12", "--data", *job_files]) == 0
    first = capsys.readouterr().out
    assert "training started: 12 steps on 2 rank(s)" in first and "training finished at step 12" in first
    result = json.loads((tmp_path / "fraud_detector" / "debug" / "result.json").read_text())
    assert result["final_step"] == 12 and result["resumed_from_step"] == 0
    # The second run names the data by its digest, as when reproducing a model from its lineage tag.
    manifest = resolve_snapshot(load_config(config).data, "ds=2026-01-01")
    assert manifest.file_uris == job_files
    assert (
        main(
            [
                "train",
                str(config),
                "--run-id",
                "debug",
                "--max-steps",
                "15",
                "--nproc",
                "1",
                "--snapshot",
                manifest.digest,
            ]
        )
        == 0
    )
    second = capsys.readouterr().out
    assert "resuming from step 10" in second and "training finished at step 15" in second


@pytest.mark.slow
def test_train_failure_shows_the_jobs_last_output(
    tmp_path: Path, trainpipe_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: checkpoints", f"uri: {tmp_path.as_uri()}")
    )
    not_parquet = tmp_path / "part-00000.parquet"
    not_parquet.write_text("this is not a parquet file")
    assert main(["train", str(config), "--run-id", "r", "--data", not_parquet.as_uri()]) != 0
    captured = capsys.readouterr()
    assert (
        f"training failed on rank 0: DataError: cannot read {not_parquet.as_uri()} as parquet" in captured.out
    )
    assert "training job exited with code" in captured.err


@pytest.mark.timeout(60)
def test_check_cli_reports_every_hostile_file_located(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in HOSTILE_DIR.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    generated = make_generated(tmp_path)
    assert main(["check", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    out = captured.out.splitlines()
    assert all(line.startswith(f"{tmp_path}/") for line in out), [
        line[:200] for line in out if not line.startswith(str(tmp_path))
    ]
    reported = {line[len(str(tmp_path)) + 1 :].split(":", 1)[0] for line in out}
    missing = {*HOSTILE, *generated} - reported
    assert not missing, f"not reported: {sorted(missing)}"


def test_make_encoder_writes_a_directory_training_pretrained_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory

    data = tmp_path / "tickets"
    assert (
        main(
            [
                "make-data",
                "--kind",
                "support_tickets",
                "--out",
                str(data),
                "--start",
                "2026-01-01",
                "--rows",
                "400",
            ]
        )
        == 0
    )
    out = tmp_path / "encoder"
    assert (
        main(
            [
                "make-encoder",
                "--data",
                str(data),
                "--columns",
                "subject",
                "body",
                "--out",
                str(out),
                "--vocab-size",
                "300",
            ]
        )
        == 0
    )
    said = capsys.readouterr()
    assert f"{out}: a 2-layer encoder (hidden 64)" in said.out and "Writing model shards" not in said.err
    PretrainedDirectory(out, str(out)).check(max_length=128)
    assert (
        main(["make-encoder", "--data", str(tmp_path / "nothing"), "--columns", "body", "--out", str(out)])
        == 2
    )
    assert "trainpipe make-encoder: no Parquet files under" in capsys.readouterr().err
    # Written again from the same rows, the directory is the same bytes: a run that pinned it
    # resumes (WordPieceTrainer gave another tokenizer.json every time).
    again = tmp_path / "again"
    argv = ["make-encoder", "--data", str(data), "--columns", "subject", "body", "--vocab-size", "300"]
    assert main([*argv, "--out", str(again)]) == 0
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    capsys.readouterr()
    for mistake, message in (
        (["--columns", "subject", "bodyy"], "lacks column(s) bodyy"),
        (["--columns", "message_length"], "column 'message_length' holds int64, not text"),
        (
            ["--columns", "body", "--hidden-size", "30", "--heads", "4"],
            "--hidden-size 30 is not a multiple of --heads 4",
        ),
    ):
        assert main(["make-encoder", "--data", str(data), "--out", str(tmp_path / "x"), *mistake]) == 2
        assert "trainpipe make-encoder: " in (err := capsys.readouterr().err) and message in err, err


def test_promote_gives_up_on_an_mlflow_that_keeps_failing_after_two_retries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow's client retried 7 times with doubling backoff: over 4 minutes of silence before a
    person at the terminal heard that the server was down."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    requests: list[str] = []

    class Down(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
        monkeypatch.setenv(
            "AIRFLOW_CONN_MLFLOW_DEFAULT",
            json.dumps({"conn_type": "mlflow", "host": "http://127.0.0.1", "port": server.server_port}),
        )
        assert main(["promote", "fraud_detector", "2", "--reason", "x"]) == 1
    finally:
        server.shutdown()
    assert len(requests) == 3, requests  # the request and two retries
    # For the command only: what the process starts next (a job, a stack) keeps MLflow's default.
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    assert "trainpipe promote: cannot read fraud_detector version 2" in capsys.readouterr().err


def test_a_bad_retention_age_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshots", "gc", str(EXAMPLE_CONFIGS), "--keep", "30x"]) == 2
    assert capsys.readouterr().err == (
        "trainpipe snapshots gc: --keep '30x': expected a duration such as 30s, 5m, 1h30m or a number "
        "of seconds, got '30x'\n"
    )  # not pydantic's validator chain and documentation URL
