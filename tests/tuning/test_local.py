"""`trainpipe tune`: the study without Airflow, killed mid-way and run again.

The first run is SIGKILLed (its whole process group, the warm parent its one-rank jobs are forked
from included) while the second trial is mid-rung with a complete checkpoint; the second run with the same arguments finds the
same study: the finished trial is not trained again, the interrupted trial continues from its
checkpoint, the study goes on with the next trial, and the last line is the study's JSON summary.

Three trials (trial 0 completes both rungs, 1 and 2 are pruned at the first) are what that needs:
each further one is another training job. That the summary's best is the best complete trial
whatever their order is tests/tuning/test_study.py's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import date
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import EXAMPLE_CONFIGS

TRIALS = 3
RUN = "tune-2026-01-02"


def _config(path: Path) -> None:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text())
    config["training"]["hyperparameters"].update(batch_size=64, epochs=3)
    config["training"]["checkpoint"].update(every_steps=5, keep_last=2)
    config["tuning"]["space"].pop("batch_size")
    config["tuning"]["budget"].update(trials=TRIALS)
    path.write_text(yaml.safe_dump(config))


def _tune(config: Path, env: dict[str, str], parallel: int = 1) -> subprocess.Popen[str]:
    command = [
        str(Path(sys.executable).parent / "trainpipe"),
        "tune",
        str(config),
        "--ds",
        "2026-01-02",
        "--max-parallel",
        str(parallel),
        "-v",
    ]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _finished(home: Path) -> dict[int, tuple[str, float | None, object]]:
    import optuna

    study = optuna.load_study(
        study_name=f"fraud_detector_tuned:{RUN}",
        storage=f"sqlite:///{home / 'optuna' / 'fraud_detector_tuned.db'}",
    )
    return {
        t.number: (t.state.name, t.value, t.datetime_complete)
        for t in study.get_trials()
        if t.state.is_finished()
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_study_resumes_without_repeating_finished_trials(tmp_path: Path) -> None:
    from airflow_trainpipe.examples.synthetic import write_day

    home = tmp_path / "home"
    write_day((home / "data" / "card_transactions").as_uri(), date(2026, 1, 2), 3000, seed=2)
    config = tmp_path / "tuned.yaml"
    _config(config)
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)

    first = _tune(config, env)
    seen = []
    assert first.stdout is not None
    for line in first.stdout:  # slots run in order: trial 1 starts once trial 0 ended
        seen.append(line)
        if f"{RUN}.trial-001/checkpoints/step_000000015" in line and line.startswith("checkpoint complete"):
            job = psutil.Process(first.pid).children(recursive=True)
            # The CLI and its warm parent die; the trial's job (forked from it, a session of its
            # own) gets SIGTERM from the kernel and checkpoints the step it stops at before exiting.
            os.killpg(first.pid, signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -signal.SIGKILL, "".join(seen)[-4000:]
    _, alive = psutil.wait_procs(job, timeout=60)
    assert alive == []
    before = _finished(home)
    assert sorted(before) == [0]

    second = _tune(config, env)
    output, _ = second.communicate(timeout=400)
    assert second.returncode == 0, output[-6000:]
    summary = json.loads(output.strip().splitlines()[-1])
    after = _finished(home)
    assert sorted(after) == list(range(TRIALS))  # one trial per slot: nothing started twice
    assert {n: after[n] for n in before} == before  # finished trials untouched (state, value, end time)
    # The rerun's first job is trial 1's interrupted rung, from the mid-epoch checkpoint its
    # SIGTERMed job wrote (the periodic one at 15, or where it stopped after it): the finished
    # trial was read back, not trained again.
    started = [line for line in output.splitlines() if line.startswith("training started")]
    resumed = re.search(r"resuming from step (\d+) \(0 step\(s\) to recompute\)", started[0])
    assert resumed is not None and int(resumed.group(1)) >= 15, started
    # The rerun says so of the trial it read back, and Optuna's INFO line for each opening of
    # the study stays out of the output.
    assert re.search(
        r"^trial 0 \(slot 0\): \w+ \[.*\] \{.*\} \(ended in an earlier run of this study: not trained again\)$",
        output,
        re.MULTILINE,
    ), output[-4000:]
    assert "Using an existing study" not in output
    assert set(summary) == {
        "trials", "pruned", "best", "baseline", "direction", "compute_hours", "full_budget_compute_hours",
        "startup_compute_hours", "wall_s",
    }  # fmt: skip
    assert summary["trials"] == TRIALS and summary["direction"] == "maximize"
    assert summary["pruned"] == sum(state == "PRUNED" for state, _, _ in after.values())
    assert summary["best"] == max(v for s, v, _ in after.values() if s == "COMPLETE" and v is not None)
    assert summary["baseline"] is not None and 0.5 < summary["baseline"] < 1.0
    assert 0 < summary["compute_hours"] <= summary["full_budget_compute_hours"]
    assert 0 < summary["startup_compute_hours"] < summary["compute_hours"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trials_run_side_by_side_and_a_crashed_one_stops_no_other(tmp_path: Path) -> None:
    """max_parallel 2: two trials' jobs train at once; trial 1's job dies (every rank SIGKILLs
    itself mid-rung), the study records it failed and the other trials run to their end."""
    import optuna

    from airflow_trainpipe.examples.synthetic import write_day

    home = tmp_path / "home"
    write_day((home / "data" / "card_transactions").as_uri(), date(2026, 1, 2), 3000, seed=2)
    config = tmp_path / "tuned.yaml"
    _config(config)
    env = {**os.environ, "TRAINPIPE_HOME": str(home), "TRAINPIPE_CRASH_AT": "step:12"}
    env.update(TRAINPIPE_FAULT_RUN=f"{RUN}.trial-001")
    env.pop("MLFLOW_TRACKING_URI", None)
    process = _tune(config, env, parallel=2)
    output, _ = process.communicate(timeout=500)
    assert process.returncode == 0, output[-6000:]
    study = optuna.load_study(
        study_name=f"fraud_detector_tuned:{RUN}",
        storage=f"sqlite:///{home / 'optuna' / 'fraud_detector_tuned.db'}",
    )
    # Two slots ask the study at once: which one draws trial number 1 is a race.
    trials = {t.number: t for t in study.get_trials()}
    # What the slots and their jobs said of each trial (the output's tail is the baseline's job).
    said = "\n".join(s for s in output.splitlines() if re.search(r"slot \d|TRAINPIPE |[Ee]rror|Traceback", s))
    assert sorted(trials) == list(range(TRIALS)), said
    assert trials[1].state == optuna.trial.TrialState.FAIL, said
    crashed = trials[1].user_attrs["slot"]
    # The job's exit as torchrun's agent reports a rank's death (the command's 1), and the trial it
    # was (launchers/runner.py).
    assert re.search(
        rf"trial of slot {crashed}: failed: TrainingJobError: training job exited with code 1 "
        rf"\[{re.escape(RUN)}\.trial-001",
        output,
    ), said
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    states = {n: (t.state.name, t.user_attrs.get("slot")) for n, t in trials.items()}
    assert all(trials[n].state in ended for n in (0, 2)), f"{states}\n{said}"
    # Side by side: trial 1 started before trial 0 ended (two jobs of one process each at once).
    assert trials[1].datetime_start < trials[0].datetime_complete
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary["trials"] == TRIALS and summary["best"] is not None
    # Every one-rank trial and the baseline were forked from the warm parent, none started as the
    # torchrun command: its ranks' interpreter and imports are the fork's, not a fresh
    # interpreter's seconds (runtime/startup.py; its `torchrun` phase is the agent's rendezvous).
    assert "warm parent: torch, DeepSpeed, MLflow and Optuna imported once" in output
    results = [json.loads(path.read_text()) for path in (home / "checkpoints").rglob("result.json")]
    assert len(results) >= 3, [r.get("mlflow_run_id") for r in results]  # two trials' rungs and the baseline
    for result in results:
        startup = result["timing"]["startup"]
        assert startup["interpreter_and_imports"] < 1.0, startup
