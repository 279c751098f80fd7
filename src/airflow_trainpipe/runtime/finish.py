"""The end of a training run: final metrics, the job's own predictions, the consolidated weights,
the logged model and its evaluation against the champion, and the result published.

A component of its own, as EpochEnd is for an epoch's end: the Trainer hands it what the run built
(the engine, the prepared data, the reader) and calls `run` once, on every rank. Its first part
is collective (every rank predicts, gathers weights and memory figures); from the weights on, rank
0 alone logs and evaluates, the others return None.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT, TRANSFORM_ARTIFACT
from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.contracts.payloads import TrainResult
from airflow_trainpipe.contracts.train_spec import PretrainedPin, TrainSpec
from airflow_trainpipe.core.storage import filesystem, join
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData
from airflow_trainpipe.runtime.engine import full_state_dict, weights_sha256
from airflow_trainpipe.runtime.evaluation.final import evaluate_final
from airflow_trainpipe.runtime.evaluation.holdout import first_holdout_rows, holdout_tables
from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory
from airflow_trainpipe.runtime.pretrained.export import save_hf_directory
from airflow_trainpipe.runtime.rungs import rung_values
from airflow_trainpipe.runtime.startup import Laps
from airflow_trainpipe.runtime.tracking import Tracker

PREDICTION_SAMPLE = 1000  # holdout rows whose predictions the job logs for the serving check


@dataclass
class RunEnd:
    spec: TrainSpec
    prepared: PreparedData
    reader: BlockReader
    engine: Any
    device: torch.device
    dtype: torch.dtype
    world_size: int
    host_group: Any
    """The gloo group the runtime's collectives use (None: the default group, on a CPU job)."""
    scored: str
    """What the metrics are named after: `holdout`, or `validation` in a tuning trial."""
    build_model: Callable[[], torch.nn.Module]
    evaluate: Callable[[], dict[str, float]]
    pretrained: PretrainedDirectory | None = None
    """The directory the model was fine-tuned from: the model is logged as a Hugging Face
    directory too, with its tokenizer files."""
    pinned: PretrainedPin | None = None
    """Its pin: the result names it (lineage)."""
    timing: Timing | None = None
    """The loop's clock: the end's own time counts in the device-hours too."""

    def run(
        self,
        state: dict[str, Any],
        tracker: Tracker | None,
        resumed_from: int,
        recomputed: int,
        chosen: dict[str, Any] | None = None,
    ) -> TrainResult | None:
        """Collective, then rank 0 alone: final metrics, the logged model, candidate vs champion.
        `chosen`: the scored entry of the weights the engine holds when `training.restore_best`
        chose them (runtime/best.py); None: the weights the loop ended on."""
        loop_end = time.monotonic()
        laps = self.laps = Laps()
        last = (
            state["history"][-1]
            if state["history"] and state["history"][-1]["step"] == state["step"]
            else None
        )
        scored = chosen or last  # the metrics (validation, or holdout without it) of what is published
        publishing = publishes(self.spec, state)
        # Final weights not scored at an epoch end (max_steps, a rung): a published candidate's
        # holdout metrics are its scoring below, the same rows through the same metrics, not a
        # second pass of the engine over the holdout (it was a third of the end).
        if scored is None and not (publishing and self.scored == "holdout"):
            scored = {"step": state["step"], **self.evaluate()}
        # An epoch end's metrics are in MLflow already (at their step); a scoring of weights no
        # epoch ended on (here, or restore_best's of a run stopped mid-epoch) is logged here, so no
        # step holds two values of one validation metric.
        fresh = scored is not None and all(e["step"] != scored["step"] for e in state["history"])
        laps.lap("final_metrics")
        weights = full_state_dict(self.engine, self.spec.config.training.deepspeed.zero_stage)
        peak_rss = self._gather_peak_rss()
        laps.lap("weights")
        if tracker is None:
            return None
        weights_step = scored["step"] if scored is not None else state["step"]
        published, sample = (
            self._candidate(weights, tracker, state["step"])
            if publishing
            else ({"evaluation": None, "model_uri": None}, None)
        )
        metrics = self._split_metrics(scored, published["evaluation"])
        device_s = self.timing.device_s() if self.timing else state["device_seconds"]
        hours = device_s / 3600  # the world size each attempt actually ran with
        device = "gpu" if self.device.type == "cuda" else "cpu"
        logged = metrics if fresh or self.scored == "holdout" else {"holdout": metrics["holdout"]}
        self._log_final(tracker, logged, {f"{device}_hours": hours}, state["step"], sample)
        laps.lap("final_logging")
        # Rank 0's end, counted for every process: the others wait for it at the barrier.
        end_s = time.monotonic() - loop_end
        reported = metrics["validation"] if self.spec.trial is not None else metrics["holdout"]
        fields = self._fields(state, reported, weights, peak_rss, resumed_from, recomputed, tracker)
        fields.update(published)
        fields.update(
            {
                f"compute_hours_{device}": hours,
                "end_compute_hours": end_s * self.world_size / 3600,
                "validation_metrics": metrics["validation"] if self.scored == "validation" else {},
                "weights_step": weights_step if publishing else None,
            }
        )
        fields["timing"] = {**state["timing"], "end_s": end_s, "end": laps.rounded()}
        result = TrainResult.model_validate(fields)
        self._publish(result, tracker)
        return result

    def _split_metrics(
        self, scored: dict[str, Any] | None, evaluation: dict[str, Any] | None
    ) -> dict[str, dict[str, float]]:
        """The published weights' metrics by split: `holdout` (the gate's rows, scored once, at the
        end, beside the champion) and `validation` (what chose them); a split not scored is {}."""
        epoch = {k: v for k, v in (scored or {}).items() if k not in ("epoch", "step")}
        candidate = evaluation["candidate"] if evaluation is not None else None
        if self.scored == "holdout":  # no validation split: the epochs read the holdout too
            return {"holdout": epoch or dict(candidate or {}), "validation": {}}
        return {"holdout": dict(candidate or {}), "validation": epoch}

    def _fields(
        self,
        state: dict[str, Any],
        holdout: dict[str, float],
        weights: dict[str, Any],
        peak_rss: list[float],
        resumed_from: int,
        recomputed: int,
        tracker: Tracker,
    ) -> dict[str, Any]:
        """The result's fields that the end does not time."""
        peak_rss[0] = _peak_rss_mib()  # after the final evaluation: the others only wait
        return {
            "final_step": state["step"],
            "final_train_loss": state.get("final_train_loss"),
            "holdout_metrics": holdout,
            "weights_sha256": weights_sha256(weights),
            "resumed_from_step": resumed_from,
            "steps_recomputed": recomputed,
            "epochs_completed": len(state["history"]),
            "stopped_early": state.get("stopped_early", False),
            "world_size": self.world_size,
            "startup_compute_hours": state.get("startup_device_seconds", 0.0) / 3600,
            "study_compute_hours": state.get("study_device_seconds", 0.0) / 3600,
            "peak_rss_mib": peak_rss,
            **_trial_fields(state),
            "mlflow_run_id": tracker.run_id,
            "mlflow_experiment_id": tracker.experiment_id,
            "transform_hash": self.prepared.transform.hash,
            "metrics_split": "validation" if self.spec.trial is not None else "holdout",
            "pretrained": (
                self.pinned.model_dump(include={"uri", "source", "sha256"})
                if self.pinned is not None
                else None
            ),
        }

    def _candidate(
        self, weights: dict[str, Any], tracker: Tracker, step: int
    ) -> tuple[dict[str, Any], np.ndarray]:
        """The logged model and its evaluation against the champion (the gate's input), and its
        predictions of the first holdout rows: what the logged model must reproduce from them."""
        model = self.build_model()
        model.load_state_dict(weights)
        model.eval()
        device = scoring_device(model, self.device)
        self.laps.lap("candidate_built")
        # Candidate and champion scored by one function on the same raw holdout rows; the holdout
        # is read and predicted once, the sample being its first rows.
        evaluation, prediction = evaluate_final(
            model,
            self.prepared.transform,
            lambda: holdout_tables(self.prepared, self.reader),
            self.spec.config,
            tracker,
            step,
            laps=self.laps,
            device=device,
        )
        first_rows = first_holdout_rows(self.prepared, self.reader, PREDICTION_SAMPLE)
        model_uri = self._log_model(model.cpu(), tracker, first_rows)
        return {"evaluation": evaluation, "model_uri": model_uri}, prediction[:PREDICTION_SAMPLE]

    def _log_model(self, model: torch.nn.Module, tracker: Tracker, first_rows: Any) -> str:
        transform = self.prepared.transform
        example = first_rows.select(transform.input_names).slice(0, 5).to_pandas()
        if self.pretrained is None:
            return tracker.log_model(model, transform, example, laps=self.laps)
        with tempfile.TemporaryDirectory(prefix="trainpipe-hf-") as tmp:
            directory = save_hf_directory(model, self.pretrained, transform, Path(tmp, "hf"))
            self.laps.lap("hf_directory")
            return tracker.log_model(model, transform, example, hf_directory=directory, laps=self.laps)

    def _log_final(
        self,
        tracker: Tracker,
        metrics: dict[str, dict[str, float]],
        hours: dict[str, float],
        step: int,
        sample: Any,
    ) -> None:
        """The published weights' metrics of each split and the device hours, the fitted
        transform, the job's own predictions (when it publishes a model)."""
        named = {f"{split}_{k}": v for split, values in metrics.items() for k, v in values.items()}
        tracker.log_metrics({**named, **hours}, step, flush=True)
        tracker.log_dict(self.prepared.transform.document, TRANSFORM_ARTIFACT)
        if sample is not None:
            tracker.log_dict(
                {"rows": len(sample), "predictions": sample.tolist()}, "holdout_predictions.json"
            )

    def _gather_peak_rss(self) -> list[float]:
        """Collective: every rank's peak resident memory so far."""
        peak_rss: list[Any] = [None] * self.world_size
        dist.all_gather_object(peak_rss, _peak_rss_mib(), group=self.host_group)
        return peak_rss

    def _publish(self, result: TrainResult, tracker: Tracker) -> None:
        """The result on the MLflow run, as result.json in the run directory, and as the `result` event."""
        payload = result.to_xcom()
        tracker.log_dict(payload, RESULT_ARTIFACT)
        tracker.finish("FINISHED")
        fs, path = filesystem(join(self.spec.run_dir, RESULT_ARTIFACT))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, json.dumps(payload, indent=1, sort_keys=True).encode())
        emit("result", **payload)


def publishes(spec: TrainSpec, state: dict[str, Any]) -> bool:
    """The run logs a model and scores it against the champion: every run but a tuning trial
    short of its full budget, or one its pruner stopped (the same on every rank)."""
    return spec.trial is None or (spec.trial.final and not state.get("pruned", False))


def scoring_device(model: torch.nn.Module, device: torch.device) -> torch.device | None:
    """Where the end scores the candidate and the champion: the training device when both whole
    fp32 models fit beside what the engine holds there (in batches of the serving size), else the
    CPU (None). On one H100 the holdout of a ~100M encoder went from minutes on the host to seconds."""
    if device.type != "cuda":
        return None
    weights = sum(p.numel() * 4 for p in model.parameters())
    free, _ = torch.cuda.mem_get_info(device)
    return device if free > 4 * weights + (4 << 30) else None  # both models, and activations


def _trial_fields(state: dict[str, Any]) -> dict[str, Any]:
    """A tuning trial's rung values (every attempt's, from the checkpointed state) and whether
    the study's pruner stopped it."""
    return {
        "rungs": [{"resource": r, "value": v} for r, v in sorted(rung_values(state).items())],
        "pruned": bool(state.get("pruned", False)),
    }


def _peak_rss_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
