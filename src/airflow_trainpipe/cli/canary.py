"""`trainpipe canary-replay`: a day's rows, sent one per request to a pipeline's local canary."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.cli.common import at_least, failed, iso_day, today

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = commands.add_parser(
        "canary-replay",
        help="send a day's rows (its snapshot, feature columns only) one per request to every local "
        "canary of the pipeline, now serving or starting later, until Ctrl-C; then each canary's "
        "answers and the classes they named (predicted_label)",
    )
    replay.add_argument("config", help="the pipeline's YAML config (its canary.backend must be local)")
    replay.add_argument(
        "--ds", type=iso_day, default=today(), help="the day whose rows are sent (default: today, UTC)"
    )
    replay.add_argument("--per-second", type=float, default=20.0, help="requests a second, per canary")
    replay.add_argument("--rows", type=at_least(1), default=5000, help="at most this many rows, sent in turn")
    replay.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace) -> int:
    import threading

    from airflow_trainpipe.canary.callers import call_every_canary
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.core.storage import trainpipe_home

    try:
        config = load_config(args.config)
        if config.canary is None or config.canary.backend != "local":
            print(
                f"{args.config}: canary-replay calls a local canary; set `canary.backend: local`",
                file=sys.stderr,
            )
            return 1
        rows = replay_rows(config, args.ds, args.rows)
    except TrainpipeError as exc:
        return failed(args.config, exc)
    state = trainpipe_home() / "canary" / config.pipeline
    print(
        f"replaying {len(rows)} rows of {args.ds} to the canaries of {config.pipeline} ({state})", flush=True
    )
    for line in decision_lines(config, args.per_second):
        print(line, flush=True)
    stop = threading.Event()
    try:
        call_every_canary(state, rows, args.per_second, stop)
    except KeyboardInterrupt:
        stop.set()
    return 0


def decision_lines(config: PipelineConfig, per_second: float) -> list[str]:
    """How many requests each check needs to decide at `canary.confidence`, against what a step
    collects at `per_second` (every request counts: the candidate shadow-scores the champion's)."""
    from airflow_trainpipe.canary.confidence import decision_budget

    canary = config.canary
    assert canary is not None
    step = round(per_second * canary.step_duration.total_seconds())
    lines = [
        f"a step of {canary.step_duration.total_seconds():g} s at {per_second:g} requests/s collects about "
        f"{step} requests; at {canary.confidence:g} confidence each check needs (undecided at the end: "
        f"{canary.undecided}):"
    ]
    for check, case, needed in decision_budget(canary.checks, canary.confidence):
        enough = (
            "never"
            if needed is None
            else f"{needed} requests" + (" (more than a step)" if needed > step else "")
        )
        lines.append(f"  {check} {case}: {enough}")
    return lines


def replay_rows(config: PipelineConfig, ds: str, limit: int) -> list[dict[str, Any]]:
    """The first `limit` rows of the day's snapshot, as a caller of the model has them: the
    feature columns only (no label, no partition column)."""
    import json

    import pyarrow as pa

    from airflow_trainpipe.data.freeze import snapshot_for_date
    from airflow_trainpipe.runtime.data.reader import iter_batches

    manifest = snapshot_for_date(config, ds)
    batches, rows = [], 0
    for batch in iter_batches(manifest.file_uris, manifest.format, config.data.features.all):
        batches.append(batch)
        rows += batch.num_rows
        if rows >= limit:  # the rest of the day is not read
            break
    table = pa.concat_tables(batches, promote_options="permissive").slice(0, limit)
    return json.loads(table.to_pandas().to_json(orient="records"))
