"""`trainpipe snapshots gc`: delete the frozen files no snapshot worth keeping reads."""

from __future__ import annotations

import argparse
import sys

from airflow_trainpipe.cli.common import answering_soon_from_mlflow, config_files


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    snapshots = commands.add_parser("snapshots", help="the frozen snapshot store (snapshots.uri)")
    actions = snapshots.add_subparsers(dest="action", required=True, metavar="ACTION")
    gc = actions.add_parser(
        "gc",
        help="delete the store's files that no registered model version, no run younger than "
        "--keep and no recent use reads (a dry run unless --delete)",
    )
    gc.add_argument(
        "paths", nargs="*", default=["dags/configs"], metavar="PATH",
        help="configs (files or folders) whose snapshots.uri stores to collect (default: dags/configs)",
    )  # fmt: skip
    gc.add_argument(
        "--keep", default="30d", help="retention age of runs and uses, e.g. 30d, 12h (default: 30d)"
    )
    gc.add_argument("--delete", action="store_true", help="delete (default: only print what would go)")
    gc.add_argument("--conn-id", default="mlflow_default", help="Airflow connection of the MLflow server")
    gc.add_argument("--storage-conn-id", help="Airflow connection of the store (e.g. aws_default)")
    gc.set_defaults(handler=_snapshots_gc)


def _snapshots_gc(args: argparse.Namespace) -> int:
    """Collect each store the configs name; nothing is deleted when a registry read fails."""
    import time

    from pydantic import TypeAdapter, ValidationError

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.config.types import PositiveDuration
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.core.storage import resolve
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry import retention

    try:
        keep = TypeAdapter(PositiveDuration).validate_python(args.keep)
    except ValidationError as exc:  # its first message alone: not pydantic's validator chain and URL
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        print(f"trainpipe snapshots gc: --keep {args.keep!r}: {reason}", file=sys.stderr)
        return 2
    try:
        stores = sorted({resolve(load_config(p).snapshots.uri) for p in config_files(args.paths)})
    except TrainpipeError as exc:
        print(f"trainpipe snapshots gc: {exc}", file=sys.stderr)
        return 1
    now = time.time()
    for store in stores:
        try:
            used = retention.uses(store, args.storage_conn_id)
            with answering_soon_from_mlflow():
                referenced = retention.referenced_digests(used, MlflowHook(args.conn_id), keep, now)
            plan = retention.plan(store, used, referenced, keep, now, args.storage_conn_id)
        except TrainpipeError as exc:
            print(f"trainpipe snapshots gc: {store}: {exc}; nothing deleted", file=sys.stderr)
            return 1
        print(retention.describe(plan, args.delete))
        if args.delete:
            retention.apply(plan, args.storage_conn_id)
    return 0
