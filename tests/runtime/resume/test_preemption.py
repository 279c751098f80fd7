"""SIGTERM a real 2-rank DeepSpeed job: it checkpoints the step every rank stopped at and the next
try recomputes nothing; a save that outlasts the grace is abandoned and the previous checkpoint
stays the one resumed from; the job's launcher dying SIGTERMs it too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from signal import SIGKILL, SIGTERM

import psutil
import pytest

from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.launchers.local import Line, LocalLauncher
from airflow_trainpipe.runtime.resume.checkpoint import MARKER, tag_for
from tests.helpers.jobs import EVERY_STEPS, JobRun, make_spec, run_job, uninterrupted_run


def _complete_steps(spec: TrainSpec) -> list[int]:
    root = local_path(spec.run_dir) / "checkpoints"
    return sorted(int(d.name.removeprefix("step_")) for d in root.glob("step_*") if (d / MARKER).exists())


def _events(run: JobRun, kind: str) -> list[dict]:
    return [event for event in map(parse, run.output) if event is not None and event["event"] == kind]


def _assert_resumes_without_recomputing(spec: TrainSpec, stopped_at: int, reference: JobRun) -> None:
    resumed = run_job(spec)
    assert resumed.code == 0, resumed.text[-3000:]
    assert resumed.start["resumed_from"] == stopped_at
    assert resumed.start["steps_recomputed"] == 0
    assert resumed.result["weights_sha256"] == reference.result["weights_sha256"]


@pytest.mark.slow
def test_sigterm_checkpoints_where_the_ranks_stopped_and_the_retry_recomputes_nothing(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]
) -> None:
    reference = uninterrupted_run(tmp_path_factory, job_files)
    spec = make_spec(tmp_path, job_files, "preempted")

    signalled = []

    def preempt(line: Line, launcher: LocalLauncher) -> None:
        event = line.event or {}
        if not signalled and event.get("event") == "progress" and event["step"] >= EVERY_STEPS:
            launcher.process.send_signal(SIGTERM)  # as a pod's PID 1 gets it: torchrun forwards it
            signalled.append(event["step"])

    stopped = run_job(spec, on_line=preempt, forked=False)  # the signal a pod's PID 1, torchrun, gets
    assert signalled, stopped.text[-3000:]
    (preempted,) = _events(stopped, "preempted")
    assert stopped.code != 0 and _events(stopped, "error") == [] and _events(stopped, "result") == []
    assert preempted["signal_to_saved_s"] < spec.config.training.checkpoint.preemption_grace
    step = preempted["step"]
    # Stopped at the first sync after the signal (sent after the step-10 sync): with this job's
    # short steps the stride stays 10, so the epoch end at step 19 (a slower machine: 15).
    assert EVERY_STEPS < step <= 2 * EVERY_STEPS, stopped.text[-3000:]
    assert preempted["checkpoint"] == f"{spec.run_dir}/checkpoints/{tag_for(step)}"
    assert _complete_steps(spec)[-1] == step
    _assert_resumes_without_recomputing(spec, step, reference)


@pytest.mark.slow
def test_a_save_that_outlasts_the_grace_is_abandoned_and_the_previous_checkpoint_stays(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    spec = make_spec(tmp_path, job_files, "abandoned", preemption_grace=2)
    # Both ranks hang inside step 19's save (files written, marker not) when the operator's
    # on_kill stops the job: SIGTERM to every process, SIGKILL after the termination grace.
    paused, stopped = [], []

    def stop_when_both_paused(line: Line, launcher: LocalLauncher) -> None:
        if "TRAINPIPE PAUSED save:19" in line.text:
            paused.append(line.text)
        if len(paused) == 2 and not stopped:
            launcher.stop(spec.config.training.checkpoint.termination_grace_s)
            stopped.append(True)

    run = run_job(spec, env={"TRAINPIPE_PAUSE_AT": "save:19"}, on_line=stop_when_both_paused)
    text = run.text
    assert run.code != 0 and stopped, text[-3000:]
    assert text.count("preemption save abandoned after 2 s") == 2, text[-3000:]  # each rank's own clock
    # What a retry resumes from (test_resume.py resumes such a directory bit-exact).
    assert _complete_steps(spec) == [10]
    assert not (local_path(spec.run_dir) / "checkpoints" / tag_for(19) / MARKER).exists()


# The Airflow task process, standing in: it launches the job, relays its output, and is SIGKILLed.
TASK_PROCESS = """
import sys
from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.launchers.local import Line, LocalLauncher
from airflow_trainpipe.contracts.train_spec import TrainSpec
launcher = LocalLauncher(TrainSpec.from_json(open(sys.argv[1]).read()), 2)
launcher.start()
print("torchrun", launcher.process.pid, flush=True)
for line in launcher.lines():
    print(line.text, flush=True)
"""


@pytest.mark.slow
def test_a_killed_task_process_leaves_a_checkpoint_not_a_training_orphan(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    spec = make_spec(tmp_path / "root", job_files, "task_killed")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json())
    task = subprocess.Popen(
        [sys.executable, "-c", TASK_PROCESS, str(spec_file)], stdout=subprocess.PIPE, text=True
    )
    assert task.stdout is not None
    torchrun = psutil.Process(int(task.stdout.readline().split()[1]))
    for line in task.stdout:
        if '"event": "progress"' in line:
            task.send_signal(SIGKILL)  # as Airflow's supervisor or the OOM killer would
            break
    task.wait(timeout=30)
    task.stdout.close()
    # torchrun got SIGTERM from the kernel (PR_SET_PDEATHSIG) and the ranks saved before exiting.
    torchrun.wait(timeout=spec.config.training.checkpoint.termination_grace_s)
    # A checkpoint of the step the ranks stopped at, not only the periodic one (the first test
    # resumes such a checkpoint with nothing recomputed).
    assert _complete_steps(spec)[-1] > EVERY_STEPS
