"""One optimizer step through a real DeepSpeed engine, and the periodic collective's cadence and votes."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import MicroBatch
from airflow_trainpipe.runtime.engine import deepspeed
from airflow_trainpipe.runtime.models.inputs import ModelInputs
from airflow_trainpipe.runtime.resume.checkpoint import CheckpointManager, _PendingSave, tag_for
from airflow_trainpipe.runtime.steps import PeriodicSync, StepRunner, SyncConfig, SyncOutcome

if TYPE_CHECKING:
    from airflow_trainpipe.runtime.tracking import Tracker

ROWS, GLOBAL_BATCH = 60, 4  # 15 steps per epoch on one rank


# A one-rank group, and the comm op loaded as a job loads it (tests/runtime/conftest.py).
pytestmark = pytest.mark.usefixtures("jobs_comm_op", "one_rank_world")


# -- StepRunner --------------------------------------------------------------------------------


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeed (ZeRO off, fp32, no clipping) around a 3-input linear model with plain SGD, 2 micro-batches per step."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr("deepspeed.comm.comm.cdb", None)  # DeepSpeed's view of the group ends with the test
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0,  # DeepSpeed's default clips at norm 1
        "zero_optimization": {"stage": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return deepspeed.initialize(model=model, optimizer=optimizer, config=config)[0]


class _Rows:
    """Stream rows held in memory, by position (the real stream's ordering has tests of its own)."""

    def __init__(self, task: str):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(16, 3)).astype(np.float32)
        self.y = (
            (rng.random(16) > 0.5).astype(np.float32)
            if task == "binary_classification"
            else self.x.sum(1) + 1
        )

    inputs = ModelInputs(3, [], [])

    def take_step(
        self, epoch: int, global_range: tuple[int, int], ranges: list[tuple[int, int]]
    ) -> list[MicroBatch]:
        return [
            MicroBatch(self.x[a:b], self.y[a:b], np.zeros((b - a, 0), np.int64), self.x[a:b])
            for a, b in ranges
        ]


def _bce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (F.softplus(z) - y * z).mean()  # -y log sigmoid(z) - (1 - y) log(1 - sigmoid(z))


def _mse(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((z - y) ** 2).mean()


@pytest.mark.parametrize(("task", "loss"), [("binary_classification", _bce), ("regression", _mse)])
def test_a_step_returns_the_mean_micro_batch_loss_and_applies_their_mean_gradient(
    engine: Any, task: str, loss: Any
) -> None:
    reference = copy.deepcopy(engine.module)
    rows = _Rows(task)
    sampler = ResumableSampler(16, 8, 2, 1, 0, seed=3)
    timing = Timing(0, 0.0)

    stream: Any = rows
    returned = StepRunner(engine, stream, task, torch.device("cpu"), torch.float32).run(sampler, 1, timing)

    x, y = torch.from_numpy(rows.x), torch.from_numpy(rows.y)
    losses = [loss(reference(x[a:b]).squeeze(1), y[a:b]) for a, b in [(0, 4), (4, 8)]]
    assert returned == pytest.approx(sum(v.item() for v in losses) / 2, rel=1e-6)
    (sum(losses) / 2).backward()  # DeepSpeed averages the micro-batch gradients over accumulation
    with torch.no_grad():
        for weight, before in zip(engine.module.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(weight, before - 0.1 * before.grad)
    assert engine.global_steps == 1 and sampler.step_in_epoch == 1
    assert timing.data_wait_s > 0.0


# -- PeriodicSync ------------------------------------------------------------------------------


def _sync(
    tmp_path: Path, sync: SyncConfig, checkpoint: CheckpointSection, tracker: Any = None
) -> PeriodicSync:
    manager = CheckpointManager(
        checkpoint, tmp_path.as_uri(), rank=0, local_rank=0, world_size=1, higher_is_better=True
    )
    return PeriodicSync(sync, manager, world_size=1, tracker=tracker)


def _drive(
    sync: PeriodicSync, steps: int, total_steps: int, timing: Timing | None = None
) -> dict[int, SyncOutcome]:
    """Steps 1..steps of the first epoch, with loss step/100; the outcomes of the sync steps."""
    sampler = ResumableSampler(ROWS, GLOBAL_BATCH, 1, 1, 0, seed=1)
    timing = timing or Timing(0, 0.0)
    outcomes = {}
    for step in range(1, steps + 1):
        sampler.step_positions()
        sync.add(step / 100)
        if (outcome := sync.after_step(step, total_steps, sampler, timing)) is not None:
            outcomes[step] = outcome
    return outcomes


def test_the_collective_runs_every_n_steps_on_checkpoint_steps_and_at_the_epoch_end(tmp_path: Path) -> None:
    sync = _sync(tmp_path, SyncConfig(every=6, checkpoint_every=5), CheckpointSection(every_steps=5))
    outcomes = _drive(sync, 15, total_steps=30)
    assert sorted(outcomes) == [5, 6, 10, 12, 15]
    assert {step: o.train_loss for step, o in outcomes.items()} == pytest.approx(
        {5: 0.05, 6: 0.06, 10: 0.10, 12: 0.12, 15: 0.15}
    )
    # Saves on checkpoint steps, but not at the epoch end (15): the loop saves there, with the metric.
    assert [step for step, o in outcomes.items() if o.save] == [5, 10]
    assert not any(o.complete_pending for o in outcomes.values())  # nothing was being saved


def test_the_last_step_syncs_even_between_intervals(tmp_path: Path) -> None:
    sync = _sync(tmp_path, SyncConfig(every=5), CheckpointSection(every_steps=100))
    outcomes = _drive(sync, 7, total_steps=7)
    assert sorted(outcomes) == [5, 7] and not outcomes[7].save


def test_a_checkpoint_due_by_minutes_waits_for_the_next_sync_step(tmp_path: Path) -> None:
    sync = _sync(tmp_path, SyncConfig(every=6), CheckpointSection(every_steps=None, every_minutes=1e-6))
    time.sleep(0.01)  # due on this rank's clock from step 1 on
    outcomes = _drive(sync, 15, total_steps=30)
    assert sorted(outcomes) == [6, 12, 15]
    assert [step for step, o in outcomes.items() if o.save] == [6, 12]


def test_a_finished_background_save_is_voted_ready_for_its_marker(tmp_path: Path) -> None:
    sync = _sync(tmp_path, SyncConfig(every=3), CheckpointSection(every_steps=100))
    sync.checkpoints._pending = _PendingSave(tag_for(2), 2, None, {})  # hashed and uploaded: no thread left
    assert _drive(sync, 3, total_steps=30)[3].complete_pending


def test_rank_zero_reports_every_steps_loss_and_the_progress_at_each_sync(
    tmp_path: Path, tracker: Tracker, capfd: pytest.CaptureFixture[str]
) -> None:
    sync = _sync(tmp_path, SyncConfig(every=10), CheckpointSection(every_steps=100), tracker)
    _drive(sync, 10, total_steps=30, timing=Timing(0, 0.0, started=time.monotonic() - 5.0))
    tracker.flush()

    losses = tracker.client.get_metric_history(tracker.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in losses) == [(s, pytest.approx(s / 100)) for s in range(1, 11)]
    (rate,) = tracker.client.get_metric_history(tracker.run_id, "samples_per_s")
    assert rate.step == 10 and rate.value == pytest.approx(10 * GLOBAL_BATCH / 5.0, rel=0.05)
    events = [e for e in map(parse, capfd.readouterr().out.splitlines()) if e]
    assert [(e["event"], e["step"]) for e in events] == [("step", s) for s in range(1, 11)] + [
        ("progress", 10)
    ]
    progress = events[-1]
    assert (progress["total_steps"], progress["epoch"], progress["loss"]) == (30, 0, pytest.approx(0.1))
    assert progress["samples_per_s"] == pytest.approx(8.0, abs=0.5)
    assert progress["eta_s"] == pytest.approx((30 - 10) * 5.0 / 10, abs=0.5)  # 20 steps at 0.5 s each


class _Signalled:
    """A PreemptionNotice as the loop sees it once SIGTERM came (no handler installed here)."""

    signalled = True


def test_a_sigterm_is_acted_on_at_the_next_sync_by_every_rank(tmp_path: Path) -> None:
    sync = _sync(tmp_path, SyncConfig(every=5), CheckpointSection(every_steps=100))
    assert not any(o.preempted for o in _drive(sync, 5, total_steps=30).values())
    sync.notice = _Signalled()  # type: ignore[assignment]
    sync._losses = []
    outcomes = _drive(sync, 5, total_steps=30)
    assert sorted(outcomes) == [5] and outcomes[5].preempted


@pytest.mark.parametrize(("step_s", "stride"), [(0.001, 10), (0.15, 5), (0.4, 2), (0.6, 1), (30.0, 1)])
def test_long_steps_sync_more_often_so_a_sigterm_waits_about_a_second_at_most(
    tmp_path: Path, step_s: float, stride: int
) -> None:
    sync = _sync(tmp_path, SyncConfig(every=10, latency_s=1.0), CheckpointSection(every_steps=100))
    assert sync._stride_for(step_s) == stride
