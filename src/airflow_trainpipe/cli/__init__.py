"""`trainpipe`: command-line entry point, one module per command group.

check (check, schema), training (train, tune), render, make_data, make_encoder, models (promote, rollback,
reproduce), snapshots (snapshots gc), canary (canary-replay), pools. Each subcommand imports what it needs inside its handler:
`trainpipe check` runs in CI and pre-commit hooks and must stay as light as the DAG processor
(no Airflow, torch or mlflow).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from airflow_trainpipe import __version__
    from airflow_trainpipe.cli import (
        canary,
        check,
        make_data,
        make_encoder,
        models,
        pools,
        render,
        snapshots,
        training,
    )

    parser = argparse.ArgumentParser(
        prog="trainpipe", description="YAML-declared ML retrain pipelines for Airflow."
    )
    parser.add_argument("--version", action="version", version=f"trainpipe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (check, training, make_data, make_encoder, render, models, snapshots, canary, pools):
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except Exception as exc:
        # A --conn-id that names no Airflow connection is the user's to fix, not a traceback
        # (matched by name: the CLI does not import Airflow for commands that do not need it).
        if type(exc).__name__ != "AirflowNotFoundException":
            raise
        print(f"trainpipe {args.command}: {exc}", file=sys.stderr)
        return 1
