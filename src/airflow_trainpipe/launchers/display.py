"""Human-readable lines for the job's events, shared by the task log and `trainpipe train`."""

from __future__ import annotations

from typing import Any


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _running(event: dict[str, Any]) -> str:
    """What the engine runs (the start event reads it off the engine): dtype and speed levers."""
    speed = event.get("speed")
    if not speed:
        return ""
    parts = [str(event["dtype"])] if event.get("dtype") else []
    parts.append("fused AdamW" if speed.get("fused_optimizer") else "AdamW")
    if speed.get("attention"):
        parts.append(f"{speed['attention']} attention")
    flags = {
        "compiled": "compiled",
        "fused_qkv": "fused QKV",
        "immediate_grad_update": "immediate grad update",
        "group_by_length": "grouped by length",
        "packing": "packed text",
        "data_on_device": "rows on the device",
    }
    parts += [shown for key, shown in flags.items() if speed.get(key)]
    return "; " + ", ".join(parts)


def describe(event: dict[str, Any]) -> str | None:
    """One line per event worth showing; None for per-step noise."""
    kind = event.get("event")
    if kind == "start":
        resumed = (
            f", resuming from step {event['resumed_from']} ({event['steps_recomputed']} step(s) to recompute)"
            if event.get("resumed_from")
            else ""
        )
        validation = f" / {event['validation_rows']} validation" if event.get("validation_rows") else ""
        return (
            f"training started: {event['total_steps']} steps on {event['world_size']} rank(s), global batch "
            f"{event['global_batch']}, {event['train_rows']} training{validation} / {event['holdout_rows']} "
            f"holdout rows{resumed}{_running(event)}"
        )
    if kind == "progress":
        total = event["total_steps"]
        return (
            f"step {event['step']}/{total} ({100 * event['step'] / total:.0f}%) epoch {event['epoch']} "
            f"loss {event['loss']:.4f} | {event['samples_per_s']:,.0f} samples/s | ETA {_duration(event['eta_s'])}"
        )
    if kind == "checkpoint":
        return f"checkpoint complete: step {event['step']} at {event['uri']}"
    if kind == "preempted":
        return (
            f"preempted: stopped after step {event['step']}, checkpoint {event['checkpoint']} complete "
            f"{event['signal_to_saved_s']} s after SIGTERM"
        )
    if kind == "epoch":
        scored = "validation" if any(k.startswith("validation_") for k in event) else "holdout"
        metrics = ", ".join(
            f"{k.removeprefix(scored + '_')}={v:.4f}" for k, v in event.items() if k.startswith(scored + "_")
        )
        return f"epoch {event['epoch']} done at step {event['step']}: {scored} {metrics}"
    if kind == "result":
        published = event.get("weights_step")
        best = (
            f" (the best epoch's weights, of step {published})"
            if published is not None and published != event["final_step"]
            else ""
        )
        return (
            f"training finished at step {event['final_step']}: weights sha256 {event['weights_sha256'][:16]}...{best}, "
            f"MLflow run {event['mlflow_run_id']}"
        )
    if kind == "error":
        return f"training failed on rank {event['rank']}: {event['error']}"
    return None
