"""The training job: `python -m airflow_trainpipe.runtime.train --spec <json | @file>` under torchrun.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; DeepSpeed reads them. The job
resumes from the newest complete checkpoint of its run directory, so a retry (a new try, a new
pod) continues where the previous attempt last checkpointed.

The Trainer is a JobSetup (setup.py: everything before the first step) with the loop and the
end. The loop orchestrates components that each own one concern: one optimizer step and the
periodic collective (steps.py), the end of an epoch (epochs.py), checkpoints (checkpoint.py),
seeds (seeding.py), time and recomputed steps (accounting.py), a trial's rungs (rungs.py), the
best epoch's weights (best.py), the end of the run (finish.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.contracts.payloads import TrainResult
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.processes import signal_on_parent_death
from airflow_trainpipe.core.storage import join
from airflow_trainpipe.core.tracking_store import PROGRESS_BAR_ENV
from airflow_trainpipe.runtime.accounting import StepHighWater, Timing
from airflow_trainpipe.runtime.best import BestEpoch
from airflow_trainpipe.runtime.collectives import checked
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import BlockStream
from airflow_trainpipe.runtime.engine import (  # first: it selects DeepSpeed's accelerator
    deepspeed,
)
from airflow_trainpipe.runtime.epochs import EpochEnd, EpochEndConfig
from airflow_trainpipe.runtime.extensions import clear_stale_build_locks, load_comm_op, use_layout_build_root
from airflow_trainpipe.runtime.finish import RunEnd, publishes
from airflow_trainpipe.runtime.resume.checkpoint import (
    tag_for,
)
from airflow_trainpipe.runtime.resume.faults import fault_point, fault_scope
from airflow_trainpipe.runtime.resume.preemption import (
    PREEMPTED_EXIT,
    Preempted,
    PreemptionNotice,
)
from airflow_trainpipe.runtime.resume.safe_load import enforce_weights_only
from airflow_trainpipe.runtime.resume.seeding import rng_state
from airflow_trainpipe.runtime.rungs import rung_values
from airflow_trainpipe.runtime.setup import JobSetup
from airflow_trainpipe.runtime.startup import StartupClock
from airflow_trainpipe.runtime.steps import PeriodicSync, StepRunner, SyncConfig, SyncOutcome
from airflow_trainpipe.runtime.tracking import Tracker

log = logging.getLogger("airflow_trainpipe.train")

SYNC_EVERY = 10  # steps between the collectives that gather losses and checkpoint decisions


class Trainer(JobSetup):
    """A job's loop and its end, once JobSetup (runtime/setup.py) has set it up."""

    def run(self) -> TrainResult | None:
        """Train to the end; rank 0 returns the result, the other ranks None."""
        start = self.start()
        try:
            state = self._loop(start.sampler, start.state, start.total_steps, start.tracker, start.high_water)
            if self.encoder.folder is not None:
                log.info(
                    "token ids: %d block(s) tokenized on this rank, the others read from %s",
                    self.encoder.tokenized,
                    self.encoder.folder,
                )
            chosen = self._best_epoch().restore(self.engine, state) if self._restores(state) else None
            return self._run_end().run(state, start.tracker, start.resumed_from, start.recomputed, chosen)
        except BaseException:
            if start.tracker:
                start.tracker.fail()  # a retry resumes into the same run and sets it RUNNING again
            raise

    def _stream(self) -> BlockStream:
        return BlockStream(
            self.prepared, self.reader, self.hp.seed, self.config.data.shuffle_buffer_rows,
            self.rank, self.world_size, self.host_group, epochs=self.hp.epochs,
            cache_bytes=self.config.data.encoded_cache_mib << 20, encoder=self.encoder,
            device=self.device if self.levers.data_on_device else None,
        )  # fmt: skip

    # -- training -----------------------------------------------------------------------------

    def _loop(
        self,
        sampler: ResumableSampler,
        state: dict[str, Any],
        total_steps: int,
        tracker: Tracker | None,
        high_water: StepHighWater,
    ) -> dict[str, Any]:
        stream = self._stream()
        steps = StepRunner(
            self.engine, stream, self.task, self.device, self.dtype, self.training.ranking_loss, self.levers
        )
        sync, epoch_end = self._sync_and_epoch_end(tracker)
        step, train_loss = state["step"], state.get("final_train_loss")
        timing = self.timing = self._timing(state)
        # A retry that resumed at a rung's end asks the study the question its attempt could not.
        stop = self._rung_on_resume(state)
        self.engine.train()
        preempted = False
        while sampler.epoch < self.hp.epochs and step < total_steps and not stop:
            while not sampler.epoch_done() and step < total_steps and not preempted and not stop:
                sync.add(steps.run(sampler, step + 1, timing))
                step += 1
                if self.rank == 0:
                    high_water.record(step)  # a local file (and a background upload): no collective
                fault_point("step", step)
                if (outcome := sync.after_step(step, total_steps, sampler, timing)) is not None:
                    train_loss, preempted = outcome.train_loss, outcome.preempted
                    self._checkpoint_after_sync(outcome, state, sampler, step, timing)
                if step < total_steps and not preempted:
                    stop = self._rung_at_step(state, sampler, step, timing, train_loss)
            if stop and not sampler.epoch_done():
                break  # pruned at a rung in steps: its checkpoint is saved
            if preempted and not sampler.epoch_done():
                state["final_train_loss"] = train_loss
                self._stop_preempted(state, sampler, step, timing, stream, high_water)
            if not sampler.epoch_done():
                self._save_rung_end(state, sampler, step, timing)
                break  # stopped by max_steps mid-epoch
            value, patience_over = epoch_end.run(state, sampler.epoch, step, timing)
            stop = stop or patience_over
            rung = self._record_rung(state, sampler.epoch + 1, step, epoch_end=True)
            sampler.next_epoch()
            state["final_train_loss"] = train_loss
            self._save(state, sampler, step, timing, metric=value)
            if rung is not None:
                stop = self._pruned(state, rung) or stop
            if preempted:  # signalled on an epoch's last step: its epoch end was the save
                self._stop_preempted(state, sampler, step, timing, stream, high_water)
        stream.close()
        with timing.measure("checkpoint_s"):
            self.checkpoints.complete_pending()
        state.update(
            step=step,
            stopped_early=stop and not state.get("pruned", False),
            final_train_loss=train_loss,
            compute_seconds=timing.compute_s(),
            device_seconds=timing.device_s(),
            timing=timing.summary(step),
        )
        if self.rank == 0:
            high_water.flush()
        return state

    def _sync_and_epoch_end(self, tracker: Tracker | None) -> tuple[PeriodicSync, EpochEnd]:
        factor, base = self.lr_factor, self.hp.learning_rate
        sync = PeriodicSync(
            SyncConfig(every=SYNC_EVERY, checkpoint_every=self.checkpoints.cfg.every_steps),
            self.checkpoints,
            self.world_size,
            tracker,
            self.notice,
            group=self.host_group,
            learning_rate=lambda step: base * factor(step - 1),  # LambdaLR counts from 0
        )
        epoch_end = EpochEnd(
            EpochEndConfig(
                self.gate_metric, self.higher_is_better, self.hp.early_stopping_patience, prefix=self.scored
            ),
            self._evaluate,
            tracker,
        )
        return sync, epoch_end

    def _timing(self, state: dict[str, Any]) -> Timing:
        """This attempt's clock, carrying the time earlier attempts spent; its start-up counts."""
        # A checkpoint from before device-seconds were kept counts its time once per configured process.
        earlier_device = state.get(
            "device_seconds", state["compute_seconds"] * self.training.resources.nproc_per_node
        )
        startup = self.clock.total() if self.clock else 0.0
        state["startup_device_seconds"] = state.get("startup_device_seconds", 0.0) + startup * self.world_size
        return Timing(
            first_step=state["step"],
            earlier_compute_s=state["compute_seconds"],
            world_size=self.world_size,
            earlier_device_s=earlier_device,
            startup_s=startup,
            startup=self.clock.rounded() if self.clock else {},
        )

    # -- a tuning trial's rungs ------------------------------------------------------------------

    def _record_rung(self, state: dict[str, Any], epochs_done: int, step: int, epoch_end: bool) -> int | None:
        """The rung that ends here, its objective kept in the state the next checkpoint saves."""
        if self.rungs is None or (end := self.rungs.ending(epochs_done, step, epoch_end)) is None:
            return None
        # Mid-epoch, the collective evaluation scores every rank's shard now.
        metrics = state["history"][-1] if epoch_end else self._evaluate()
        value = metrics[self.rungs.metric]
        state.setdefault("rungs", {})[str(end)] = float(value)
        state["last_rung_step"] = step
        return end

    def _pruned(self, state: dict[str, Any], end: int) -> bool:
        """Collective: rank 0 asks the study; every rank gets the answer (or the error)."""
        assert self.rungs is not None and self.timing is not None
        rungs = self.rungs
        # Timed apart (loading the study, the storage's round trips; 0.12 s a rung on the tests'
        # small job): a job without rungs never spends it, so the full-budget estimate leaves it out.
        asked = self.timing.study_s
        with self.timing.measure("study_s"):
            prune = bool(self.from_rank0(lambda: rungs.decide(rung_values(state), end), Exception))
        # Kept in the state beside compute_seconds: the next checkpoint carries it into a resumed
        # attempt, whose estimate must leave out the round trips of the attempts before it too.
        state["study_device_seconds"] = (
            state.get("study_device_seconds", 0.0) + (self.timing.study_s - asked) * self.world_size
        )
        state["pruned"] = prune
        return prune

    def _rung_at_step(
        self, state: dict[str, Any], sampler: ResumableSampler, step: int, timing: Timing, train_loss: Any
    ) -> bool:
        """A rung in steps that ends at `step` (before the full budget): score, save, decide."""
        if self.rungs is None or self.rungs.ending(sampler.epoch, step, epoch_end=False) is None:
            return False
        with timing.measure("eval_s"):
            end = self._record_rung(state, sampler.epoch, step, epoch_end=False)
        assert end is not None
        state["final_train_loss"] = train_loss
        self._save_rung_end(state, sampler, step, timing)
        return self._pruned(state, end)

    def _rung_on_resume(self, state: dict[str, Any]) -> bool:
        """Collective, on a resumed trial: report what the study lacks; decide again only when the
        checkpoint stands exactly at a rung's end (the attempt may have died before asking)."""
        values = rung_values(state)
        if self.rungs is None or not values:
            return False
        # Exactly at the rung's end: its checkpoint. Mid-epoch after it: the study already answered.
        at_rung_end = state["step"] == state.get("last_rung_step")
        return self._pruned(state, max(values)) if at_rung_end else False

    def _stop_preempted(
        self,
        state: dict[str, Any],
        sampler: ResumableSampler,
        step: int,
        timing: Timing,
        stream: BlockStream,
        high_water: StepHighWater,
    ) -> None:
        """Collective: every rank stopped after the same step; checkpoint it, then end the job."""
        assert self.notice is not None  # only a rank with a notice can have been signalled
        stopped_s = self.notice.seconds_since_signal()  # rank 0's: the step it finished first
        if self.checkpoints.last_saved_step != step:
            self._save(state, sampler, step, timing)
        self.checkpoints.complete_pending()  # uploads included: the marker is what a retry needs
        self.notice.saved.set()
        stream.close()
        uri = join(self.checkpoints.root, tag_for(step))
        if self.rank == 0:
            high_water.flush()
            seconds = round(self.notice.seconds_since_signal(), 3)
            emit(
                "preempted",
                step=step,
                checkpoint=uri,
                signal_to_stopped_s=round(stopped_s, 3),
                signal_to_saved_s=seconds,
            )
            log.warning("preempted: checkpoint %s complete %.1f s after SIGTERM", uri, seconds)
        raise Preempted(
            f"stopped by SIGTERM after step {step}; checkpoint {uri} is complete, another try resumes from it"
        )

    def _save_rung_end(
        self, state: dict[str, Any], sampler: ResumableSampler, step: int, timing: Timing
    ) -> None:
        """A tuning trial's rung that ends mid-epoch: the next rung continues from exactly here."""
        if self.spec.trial is not None and self.checkpoints.last_saved_step != step:
            self._save(state, sampler, step, timing)

    def _checkpoint_after_sync(
        self,
        outcome: SyncOutcome,
        state: dict[str, Any],
        sampler: ResumableSampler,
        step: int,
        timing: Timing,
    ) -> None:
        if outcome.complete_pending:
            with timing.measure("checkpoint_s"):
                self.checkpoints.complete_pending()
        if outcome.save:
            self._save(state, sampler, step, timing)

    def _save(
        self,
        state: dict[str, Any],
        sampler: ResumableSampler,
        step: int,
        timing: Timing,
        metric: float | None = None,
    ) -> None:
        """Collective: a checkpoint of this step (epoch ends carry the holdout metric)."""
        with timing.measure("checkpoint_s"):
            state["compute_seconds"], state["device_seconds"] = timing.compute_s(), timing.device_s()
            self.checkpoints.save(
                self.engine,
                step,
                self._client_state(state, sampler, step),
                metric=metric,
                extra={
                    "global_batch": sampler.global_batch,
                    "parameter_layout": self.layout,
                    "data": self.data,
                },
            )

    def _client_state(self, state: dict[str, Any], sampler: ResumableSampler, step: int) -> dict[str, Any]:
        rng: list[Any] = [None] * self.world_size
        dist.all_gather_object(rng, rng_state(), group=self.host_group)
        return {"trainpipe": {**state, "step": step, "sampler": sampler.state_dict(), "rng": rng}}

    def _evaluate(self) -> dict[str, float]:
        return self.holdout.evaluate(self.engine, self.device, self.dtype)

    def _restores(self, state: dict[str, Any]) -> bool:
        """`training.restore_best`, for a run that publishes a model (a pruned trial does not)."""
        return self.training.restore_best and publishes(self.spec, state)

    def _best_epoch(self) -> BestEpoch:
        return BestEpoch(
            self.checkpoints,
            self.gate_metric,
            self.higher_is_better,
            self._evaluate,
            self.from_rank0,
            self.world_size,
            self.training.deepspeed.zero_stage,
        )

    def _run_end(self) -> RunEnd:
        return RunEnd(
            spec=self.spec,
            prepared=self.prepared,
            reader=self.reader,
            engine=self.engine,
            device=self.device,
            dtype=self.dtype,
            world_size=self.world_size,
            host_group=self.host_group,
            scored=self.scored,
            build_model=self._build_model,
            evaluate=self._evaluate,
            pretrained=self.pretrained,
            pinned=self.pinned,
            timing=self.timing,
        )


TORCHRUN_FIXED_SHUTDOWN_S = 30  # what a torchrun without --shutdown-timeout waits before SIGKILL


def shutdown_timeout_note(asked_s: int, parser: argparse.ArgumentParser | None = None) -> str | None:
    """A torchrun without `--shutdown-timeout` (torch 2.11's: the launchers pass it as
    PET_SHUTDOWN_TIMEOUT, which that torchrun ignores) SIGKILLs the ranks 30 s after it forwards a
    SIGTERM, whatever the config asks. The job runs anyway (a save cut short is never resumed
    from); this says so, once, when the config asks for longer. `parser`: torchrun's (a test's)."""
    if parser is None:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
    if any("--shutdown-timeout" in action.option_strings for action in parser._actions):
        return None
    if asked_s <= TORCHRUN_FIXED_SHUTDOWN_S:
        return None
    return (
        f"torchrun of torch {torch.__version__} has no --shutdown-timeout: after a SIGTERM it "
        f"SIGKILLs the ranks within its own {TORCHRUN_FIXED_SHUTDOWN_S} s, not the {asked_s} s that "
        "training.checkpoint.preemption_grace asks for; a preemption save that needs longer is "
        "abandoned and the retry resumes from the checkpoint before it (torch 2.13, the pinned one, honours it)"
    )


def main(argv: list[str] | None = None) -> int:
    clock = StartupClock()  # the imports above are start-up too: it reads the process start times
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: end with it, saving first
        signal_on_parent_death()
    parser = argparse.ArgumentParser(prog="python -m airflow_trainpipe.runtime.train")
    parser.add_argument("--spec", required=True, help="TrainSpec JSON, or @path to a file holding it")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
        spec = TrainSpec.from_json(text)
    except Exception as exc:
        # A spec this image cannot read (a newer operator, a mismatched image) fails every try
        # alike: say so, so the task fails at once instead of retrying.
        emit(
            "error",
            rank=int(rank),
            error=f"unreadable TrainSpec: {type(exc).__name__}: {exc}",
            retryable=False,
        )
        raise
    fault_scope(spec.run_id)
    logging.basicConfig(
        level=logging.INFO, format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if "TORCHELASTIC_RUN_ID" in os.environ and rank == "0":
        note = shutdown_timeout_note(spec.config.training.checkpoint.shutdown_timeout_s)
        if note is not None:
            log.warning("%s", note)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    # The job's output is a task log, not a terminal: a progress bar prints a line at each refresh
    # (MLflow's as log_model validates its input example, transformers' "Writing model shards" as
    # a fine-tune's directory is saved). Set before transformers is imported, which reads it
    # then; a value set on the job wins.
    os.environ.setdefault(PROGRESS_BAR_ENV, "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    enforce_weights_only()  # before anything is loaded: no checkpoint or model is ever unpickled
    # From here on a SIGTERM is a notice, not an instant death (not even during the op build).
    notice = PreemptionNotice(spec.config.training.checkpoint.preemption_grace)
    use_layout_build_root()  # every op this rank loads: its own interpreter layout's builds
    clear_stale_build_locks()  # before DeepSpeed builds or loads its ops (init_distributed)
    load_comm_op()
    clock.lap("ops")
    try:
        with checked():  # TRAINPIPE_CHECK_COLLECTIVES=nccl: a GPU node's rule, kept on CPU
            trainer = Trainer(spec, notice, clock)
            trainer.run()
            dist.barrier(group=trainer.host_group)
    except Preempted:
        return PREEMPTED_EXIT  # the `preempted` event said where; not an error of the job
    except Exception as exc:
        # A structured line, so the launcher can say why the job failed without digging through
        # torchrun's failure summary; the traceback still follows on stderr. An error of ours says
        # whether a retry can help (bad data cannot); anything else is retried.
        retryable = exc.retryable if isinstance(exc, TrainpipeError) else True
        emit("error", rank=int(rank), error=f"{type(exc).__name__}: {exc}", retryable=retryable)
        raise
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is durable by now (result.json, MLflow run terminated, checkpoints marked). Skip
    # interpreter teardown: destroying the gloo process group and C++ state at exit intermittently
    # aborted a rank with "terminate called without an active exception" (seen on a 3-rank resume
    # on 2 cores), which made torchrun report a finished job as failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
