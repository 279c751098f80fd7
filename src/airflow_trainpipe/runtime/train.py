"""The training job: `python -m airflow_trainpipe.runtime.train --spec <json | @file>` under torchrun.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; DeepSpeed reads them. The job
resumes from the newest complete checkpoint of its run directory, so a retry (a new try, a new
pod) continues where the previous attempt last checkpointed.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

# DeepSpeed picks its accelerator when first imported: say "cpu" before that on a CPU machine.
if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
    os.environ["DS_ACCELERATOR"] = "cpu"

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402

from airflow_trainpipe import __version__  # noqa: E402
from airflow_trainpipe.config.catalog import METRICS  # noqa: E402
from airflow_trainpipe.config.training import Hyperparameters  # noqa: E402
from airflow_trainpipe.digest import content_digest  # noqa: E402
from airflow_trainpipe.events import emit  # noqa: E402
from airflow_trainpipe.runtime.accounting import StepHighWater, Timing  # noqa: E402
from airflow_trainpipe.runtime.checkpoint import CheckpointError, CheckpointManager  # noqa: E402
from airflow_trainpipe.runtime.data import DataError, Dataset, load_dataset  # noqa: E402
from airflow_trainpipe.runtime.evaluation import evaluate_final  # noqa: E402
from airflow_trainpipe.runtime.extensions import clear_stale_build_locks  # noqa: E402
from airflow_trainpipe.runtime.faults import fault_point  # noqa: E402
from airflow_trainpipe.runtime.metrics import compute_metrics  # noqa: E402
from airflow_trainpipe.runtime.models import build_model  # noqa: E402
from airflow_trainpipe.runtime.safe_load import enforce_weights_only  # noqa: E402
from airflow_trainpipe.runtime.sampler import ResumableSampler  # noqa: E402
from airflow_trainpipe.runtime.tracking import Tracker, flatten  # noqa: E402
from airflow_trainpipe.storage import filesystem, join  # noqa: E402
from airflow_trainpipe.train_spec import TrainSpec  # noqa: E402

log = logging.getLogger("airflow_trainpipe.train")

PREDICTION_SAMPLE = 1000  # holdout rows whose predictions the job logs for the serving check
SYNC_EVERY = 10  # steps between the collectives that gather losses and checkpoint decisions


def deepspeed_config(spec: TrainSpec, hp: Hyperparameters, global_batch: int, world_size: int, *, universal: bool, on_gpu: bool) -> dict[str, Any]:
    """`hp` are the run's effective hyperparameters (config plus the run's overrides)."""
    ds = spec.config.training.deepspeed
    precision = ds.precision
    if precision == "auto":
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": ds.offload_optimizer, **({"nvme_path": ds.nvme_path} if ds.offload_optimizer == "nvme" else {})}
    if ds.offload_params != "none":
        zero["offload_param"] = {"device": ds.offload_params, **({"nvme_path": ds.nvme_path} if ds.offload_params == "nvme" else {})}
    config: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": global_batch // hp.gradient_accumulation_steps // world_size,
        "gradient_accumulation_steps": hp.gradient_accumulation_steps,
        "gradient_clipping": ds.gradient_clipping,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        # A torch optimizer instance is passed in, so ZeRO must accept a "client" optimizer.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
        "checkpoint": {"load_universal": universal},
    }
    return _merge(config, ds.overrides)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def _rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain numbers: checkpoints load weights-only
    (runtime/safe_load.py), which refuses numpy arrays and other pickled objects."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    version, python_state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64), "gauss": gauss},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state((saved["name"], saved["keys"].numpy().astype(np.uint32), saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, spec: TrainSpec):
        self.spec = spec
        self.config = spec.config
        self.training = spec.config.training
        hp = self.training.hyperparameters.model_copy(update=spec.hyperparameter_overrides)
        self.hp = hp
        self.on_gpu = torch.cuda.is_available() and self.training.resources.gpus_per_node > 0
        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", self.local_rank) if self.on_gpu else torch.device("cpu")
        if self.on_gpu:
            torch.cuda.set_device(self.device)
        self.task = self.training.task
        self.gate_metric = self.config.gate.metric
        self.higher_is_better = METRICS[self.task][self.gate_metric] == "maximize"
        self.run_dir = spec.run_dir
        self.checkpoints = CheckpointManager(
            self.training.checkpoint, self.run_dir, rank=self.rank, local_rank=self.local_rank,
            world_size=self.world_size, higher_is_better=self.higher_is_better,
        )

    # -- setup --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        _seed(self.hp.seed)
        data = load_dataset(self.spec.data_files, self.config.data, self.config.features, self.task, self.spec.manifest)
        resume = self._broadcast(self.checkpoints.latest_complete() if self.rank == 0 else None)
        global_batch = int(resume.marker["global_batch"]) if resume else self.hp.batch_size * self.hp.gradient_accumulation_steps * self.world_size
        universal = bool(resume) and resume.world_size != self.world_size and self.training.deepspeed.zero_stage > 0
        self.ds_config = deepspeed_config(self.spec, self.hp, global_batch, self.world_size, universal=universal, on_gpu=self.on_gpu)
        self.dtype = torch.bfloat16 if self.ds_config["bf16"]["enabled"] else torch.float16 if self.ds_config["fp16"]["enabled"] else torch.float32

        model = self._build_model(data)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.hp.learning_rate, weight_decay=self.hp.weight_decay)
        warmup = self.hp.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config)

        sampler = ResumableSampler(len(data.train_y), global_batch, self.hp.gradient_accumulation_steps, self.world_size, self.rank, self.hp.seed)
        state: dict[str, Any] = {"step": 0, "history": [], "compute_seconds": 0.0, "device_seconds": 0.0, "best": None, "stale_epochs": 0}
        resumed_from, recomputed = 0, 0
        progress = StepHighWater(self.run_dir)
        if resume:
            directory, tag = self.checkpoints.fetch(resume)
            if universal:
                tag = self.checkpoints.to_universal(resume)
            path, client = self.engine.load_checkpoint(directory, tag=tag)
            if path is None:
                raise CheckpointError(f"DeepSpeed could not load checkpoint {resume.uri}")
            state = client["trainpipe"]
            sampler.load_state_dict(state["sampler"])
            if resume.world_size == self.world_size:
                _set_rng_state(state["rng"][self.rank])
            resumed_from = state["step"]
            recomputed = max(0, self._broadcast(progress.high_water() if self.rank == 0 else None) - resumed_from)
            if self.rank == 0:
                log.warning("resumed from %s at step %d (world size %d -> %d)", resume.uri, resumed_from, resume.world_size, self.world_size)

        tracker = self._tracker() if self.rank == 0 else None
        if tracker:
            params = flatten("", self.config.model_dump(mode="json", by_alias=True), {})
            params.update(flatten("deepspeed_config", self.ds_config, {}))
            params.update({"world_size": str(self.world_size), "global_batch": str(global_batch), "data_files": str(len(self.spec.data_files))})
            tracker.log_params_once(params)
            digest = self.spec.data_digest or content_digest(self.spec.data_files)
            tracker.set_tags({"trainpipe.data_digest": digest, "trainpipe.world_size": str(self.world_size), "trainpipe.resumed_from_step": str(resumed_from),
                              "trainpipe.config_hash": self.config.content_hash, "trainpipe.code_version": __version__,
                              "trainpipe.transform_hash": data.transform.hash})
            tracker.log_data_input(f"{self.config.pipeline}-snapshot", self.spec.data_files[0].rsplit("/", 1)[0], digest)
        total_steps = min(self.hp.max_steps or 1 << 62, self.spec.max_steps or 1 << 62, self.hp.epochs * sampler.steps_per_epoch)
        if self.rank == 0:
            emit("start", total_steps=total_steps, resumed_from=resumed_from, steps_recomputed=recomputed, world_size=self.world_size,
                 global_batch=global_batch, train_rows=len(data.train_y), holdout_rows=len(data.holdout_y), mlflow_run_id=tracker.run_id if tracker else None)

        try:
            state = self._loop(data, sampler, state, total_steps, tracker, progress)
            result = self._finish(data, state, tracker, resumed_from, recomputed)
        except BaseException:
            if tracker:
                tracker.fail()  # a retry resumes into the same run and sets it RUNNING again
            raise
        return result

    def _build_model(self, data: Dataset) -> torch.nn.Module:
        return build_model(self.training.model, num_numeric=data.transform.num_dense,
                           cardinalities=data.transform.cardinalities, task=self.task, **self.hp.model_args)

    def _tracker(self) -> Tracker:
        tags = {"trainpipe.pipeline": self.config.pipeline, "trainpipe.run_id": self.spec.run_id, **self.spec.tags}
        return Tracker(experiment=self.config.pipeline, run_dir=self.run_dir, run_name=self.spec.run_id, run_id=self.spec.mlflow_run_id, tags=tags)

    def _broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # -- training -----------------------------------------------------------------------------

    def _loop(self, data: Dataset, sampler: ResumableSampler, state: dict[str, Any], total_steps: int,
              tracker: Tracker | None, progress: StepHighWater) -> dict[str, Any]:
        train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
        loss_fn = torch.nn.BCEWithLogitsLoss() if self.task == "binary_classification" else torch.nn.MSELoss()
        step, stop, train_loss = state["step"], False, state.get("final_train_loss")
        # A checkpoint from before device-seconds were kept counts its time once per configured process.
        earlier_device = state.get("device_seconds", state["compute_seconds"] * self.training.resources.nproc_per_node)
        timing = Timing(first_step=step, earlier_compute_s=state["compute_seconds"], world_size=self.world_size,
                        earlier_device_s=earlier_device)
        local_losses: list[float] = []
        self.engine.train()
        while sampler.epoch < self.hp.epochs and step < total_steps and not stop:
            while not sampler.epoch_done() and step < total_steps:
                t0 = time.perf_counter()
                batches = sampler.step_batches()
                inputs = [(train_x[i].to(self.device, self.dtype), train_y[i].to(self.device)) for i in batches]
                timing.data_wait_s += time.perf_counter() - t0
                loss_sum = 0.0
                for k, (x, y) in enumerate(inputs):
                    loss = loss_fn(self.engine(x).float().squeeze(1), y)
                    self.engine.backward(loss)
                    if k == len(inputs) - 1:
                        fault_point("mid_step", step + 1)
                    self.engine.step()
                    loss_sum += loss.item()
                step += 1
                local_losses.append(loss_sum / len(inputs))
                if self.rank == 0:
                    progress.record(step)  # a local file (and a background upload): no collective
                fault_point("step", step)
                # One collective every SYNC_EVERY steps instead of one per step: on a latency-bound
                # job a gloo round trip costs as much as a third of a step. Every rank reaches the
                # same sync steps, since all conditions below are deterministic.
                by_steps = bool(self.checkpoints.cfg.every_steps) and step % self.checkpoints.cfg.every_steps == 0
                if not (step % SYNC_EVERY == 0 or by_steps or step == total_steps or sampler.epoch_done()):
                    continue
                stats = torch.tensor([*local_losses, float(self.checkpoints.due(step)), float(self.checkpoints.pending_ready())], dtype=torch.float64)
                dist.all_reduce(stats)
                first = step - len(local_losses) + 1
                losses = {first + i: v / self.world_size for i, v in enumerate(stats[:-2].tolist())}
                local_losses = []
                train_loss = losses[step]
                if self.rank == 0:
                    rate = (step - timing.first_step) * sampler.global_batch / max(timing.elapsed(), 1e-9)
                    for at, value in losses.items():
                        tracker.log_metrics({"train_loss": value}, at)
                        emit("step", step=at, loss=value)
                    tracker.log_metrics({"samples_per_s": rate}, step)
                    eta = (total_steps - step) * timing.elapsed() / max(step - timing.first_step, 1)
                    emit("progress", step=step, total_steps=total_steps, epoch=sampler.epoch, loss=train_loss,
                         samples_per_s=round(rate, 1), eta_s=round(eta, 1))
                if stats[-1].item() == self.world_size:
                    with timing.measure("checkpoint_s"):
                        self.checkpoints.complete_pending()
                if (by_steps or stats[-2].item() > 0) and not sampler.epoch_done():
                    with timing.measure("checkpoint_s"):
                        state["compute_seconds"], state["device_seconds"] = timing.compute_s(), timing.device_s()
                        self.checkpoints.save(self.engine, step, self._client_state(state, sampler, step),
                                              extra={"global_batch": sampler.global_batch})
            if not sampler.epoch_done():
                break  # stopped by max_steps mid-epoch
            with timing.measure("eval_s"):
                metrics = self._evaluate(data)
            state["history"].append({"epoch": sampler.epoch, "step": step, **metrics})
            value = metrics[self.gate_metric]
            improved = state["best"] is None or (value > state["best"] if self.higher_is_better else value < state["best"])
            state["best"] = value if improved else state["best"]
            state["stale_epochs"] = 0 if improved else state["stale_epochs"] + 1
            if tracker:
                tracker.log_metrics({f"holdout_{k}": v for k, v in metrics.items()}, step, flush=True)
                emit("epoch", epoch=sampler.epoch, step=step, **{f"holdout_{k}": v for k, v in metrics.items()})
            patience = self.hp.early_stopping_patience
            stop = bool(patience and state["stale_epochs"] >= patience)
            sampler.next_epoch()
            with timing.measure("checkpoint_s"):
                state["compute_seconds"], state["device_seconds"] = timing.compute_s(), timing.device_s()
                state["final_train_loss"] = train_loss
                self.checkpoints.save(self.engine, step, self._client_state(state, sampler, step), metric=value,
                                      extra={"global_batch": sampler.global_batch})
        with timing.measure("checkpoint_s"):
            self.checkpoints.complete_pending()
        state.update(step=step, stopped_early=stop, final_train_loss=train_loss, compute_seconds=timing.compute_s(),
                     device_seconds=timing.device_s())
        if self.rank == 0:
            progress.flush()
        state["timing"] = timing.summary(step)
        return state

    def _client_state(self, state: dict[str, Any], sampler: ResumableSampler, step: int) -> dict[str, Any]:
        rng: list[Any] = [None] * self.world_size
        dist.all_gather_object(rng, _rng_state())
        return {"trainpipe": {**state, "step": step, "sampler": sampler.state_dict(), "rng": rng}}

    def _predict(self, x: np.ndarray) -> np.ndarray:
        """Every rank runs the same batches (ZeRO-3 gathers parameters inside forward)."""
        self.engine.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, len(x), 4096):
                chunk = torch.from_numpy(x[start : start + 4096]).to(self.device, self.dtype)
                outputs.append(self.engine(chunk).float().squeeze(1).cpu())
        self.engine.train()
        return torch.cat(outputs).numpy().astype(np.float64)

    def _evaluate(self, data: Dataset) -> dict[str, float]:
        prediction = data.transform.predictions(self._predict(data.holdout_x))
        return compute_metrics(self.task, data.transform.label_values(data.holdout_y), prediction)

    # -- end ----------------------------------------------------------------------------------

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        module = self.engine.module
        if self.training.deepspeed.zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
        return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}

    def _finish(self, data: Dataset, state: dict[str, Any], tracker: Tracker | None, resumed_from: int, recomputed: int) -> dict[str, Any]:
        metrics = state["history"][-1] if state["history"] and state["history"][-1]["step"] == state["step"] else {"step": state["step"], **self._evaluate(data)}
        # The job's own predictions on the first holdout rows, computed by the training engine on
        # every rank (ZeRO-3 gathers inside forward): what the logged model must reproduce from
        # the same raw rows.
        sample = data.transform.predictions(self._predict(data.holdout_x[:PREDICTION_SAMPLE]))
        weights = self._full_state_dict()
        if self.rank != 0:
            return {}
        digest = hashlib.sha256()
        for key in sorted(weights):
            digest.update(key.encode())
            digest.update(weights[key].numpy().tobytes())
        compute_hours = state["device_seconds"] / 3600  # the world size each attempt actually ran with
        holdout = {k: v for k, v in metrics.items() if k not in ("epoch", "step")}
        result = {
            "final_step": state["step"],
            "final_train_loss": state.get("final_train_loss"),
            "holdout_metrics": holdout,
            "weights_sha256": digest.hexdigest(),
            "resumed_from_step": resumed_from,
            "steps_recomputed": recomputed,
            "epochs_completed": len(state["history"]),
            "stopped_early": state.get("stopped_early", False),
            "world_size": self.world_size,
            f"compute_hours_{'gpu' if self.on_gpu else 'cpu'}": compute_hours,
            "timing": state["timing"],
            "mlflow_run_id": tracker.run_id,
            "mlflow_experiment_id": tracker.experiment_id,
            "transform_hash": data.transform.hash,
        }
        model = self._build_model(data)
        model.load_state_dict(weights)
        model.eval()
        tracker.log_metrics({**{f"holdout_{k}": v for k, v in holdout.items()}, f"{'gpu' if self.on_gpu else 'cpu'}_hours": compute_hours}, state["step"], flush=True)
        tracker.log_dict(data.transform.document, "transform.json")
        tracker.log_dict({"rows": len(sample), "predictions": sample.tolist()}, "holdout_predictions.json")
        # Candidate and champion scored by one function on the same raw holdout rows (the gate's input).
        result["evaluation"] = evaluate_final(model, data.transform, data.holdout_table, self.config, tracker, state["step"])
        result["model_uri"] = tracker.log_model(model, data.transform, data.holdout_table.select(data.transform.input_names).slice(0, 5).to_pandas())
        tracker.log_dict(result, "result.json")
        tracker.finish("FINISHED")
        fs, path = filesystem(join(self.run_dir, "result.json"))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, json.dumps(result, indent=1, sort_keys=True).encode())
        emit("result", **result)
        return result


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when its parent (torchrun) dies, whatever killed it."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def main(argv: list[str] | None = None) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
        _die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m airflow_trainpipe.runtime.train")
    parser.add_argument("--spec", required=True, help="TrainSpec JSON, or @path to a file holding it")
    args = parser.parse_args(argv)
    text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
    spec = TrainSpec.from_json(text)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    enforce_weights_only()  # before anything is loaded: no checkpoint or model is ever unpickled
    clear_stale_build_locks()  # before DeepSpeed builds or loads its ops (init_distributed)
    try:
        Trainer(spec).run()
    except Exception as exc:
        # A structured line, so the launcher can say why the job failed without digging through
        # torchrun's failure summary; the traceback still follows on stderr. Bad data does not
        # fix itself: the launcher fails the task without retries.
        emit("error", rank=int(rank), error=f"{type(exc).__name__}: {exc}", retryable=not isinstance(exc, DataError))
        raise
    dist.barrier()
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
