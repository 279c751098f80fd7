"""`trainpipe promote | rollback | reproduce`: a registered model after training, by hand."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC

from airflow_trainpipe.cli.common import answering_soon_from_mlflow, at_least, run_job, stdout_log


def _move_alias(args: argparse.Namespace) -> int:
    """`promote` and `rollback`: the registry's aliases, moved as the register task moves them."""
    import getpass

    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry import aliases

    hook = MlflowHook(args.conn_id)
    actor = args.by or getpass.getuser()
    # Each alias keeps its own rollback target: moving @staging must not overwrite the version
    # @champion would roll back to.
    previous_alias = args.previous_alias or f"previous_{args.alias}"

    def load_online(version: str) -> None:  # as the register and promote tasks do, before moving
        from airflow_trainpipe.registry.online_features import load_version_online

        load_version_online(hook, args.model, version, stdout_log())

    try:
        with answering_soon_from_mlflow():
            if args.command == "promote":
                move = aliases.promote(
                    hook, args.model, args.version, actor=actor, reason=args.reason,
                    alias=args.alias, previous_alias=previous_alias, prepare=load_online,
                )  # fmt: skip
            else:
                move = aliases.rollback(
                    hook, args.model, actor=actor, reason=args.reason,
                    alias=args.alias, previous_alias=previous_alias, prepare=load_online,
                )  # fmt: skip
    except TrainpipeError as exc:
        print(f"trainpipe {args.command}: {exc}", file=sys.stderr)
        return 1
    print(move.describe())
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    promote = commands.add_parser(
        "promote", help="make a model version the champion (the old one becomes previous_champion)"
    )
    promote.add_argument("model", help="registered model name")
    promote.add_argument("version", help="the version to promote")
    rollback = commands.add_parser(
        "rollback", help="point the champion back at previous_champion (which is then removed)"
    )
    rollback.add_argument("model", help="registered model name")
    for command in (promote, rollback):
        command.add_argument("--reason", required=True, help="why: recorded on the versions")
        command.add_argument("--by", help="who: recorded on the versions (default: the OS user)")
        command.add_argument("--alias", default="champion", help="the serving alias (default champion)")
        command.add_argument(
            "--previous-alias",
            help="the alias the replaced version goes to, and a rollback returns from "
            "(default previous_<alias>: previous_champion for the champion)",
        )
        command.add_argument(
            "--conn-id", default="mlflow_default", help="Airflow connection of the MLflow server "
            "(undefined mlflow_default: the embedded store under TRAINPIPE_HOME)",
        )  # fmt: skip
        command.set_defaults(handler=_move_alias)
    reproduce = commands.add_parser(
        "reproduce",
        help="train a registered model version again from its run's logged spec; exit 0 and print "
        "'identical' only for the same weights and metrics",
    )
    reproduce.add_argument(
        "reference", metavar="MODEL@ALIAS|MODEL/VERSION", help="e.g. fraud_detector@champion"
    )
    reproduce.add_argument(
        "--nproc", type=at_least(0), help="processes (default or 0: the original run's world size)"
    )
    reproduce.add_argument(
        "--conn-id", default="mlflow_default", help="Airflow connection of the MLflow server"
    )
    reproduce.add_argument("-v", "--verbose", action="store_true", help="also print the job's raw output")
    reproduce.set_defaults(handler=_reproduce)


def _reproduce(args: argparse.Namespace) -> int:
    """Train a registered version again from its run's spec; exit 0 only for the same model."""
    from datetime import datetime

    from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.core.storage import filesystem, join
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry.reproduce import compare, logged_version, reproduction_spec

    hook = MlflowHook(args.conn_id)
    try:
        logged = logged_version(hook, args.reference)
        run_id = f"reproduce-{logged.run_id[:12]}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
        spec = reproduction_spec(logged, run_id)
    except TrainpipeError as exc:
        print(f"trainpipe reproduce: {exc}", file=sys.stderr)
        return 1
    nproc = args.nproc or int(logged.result["world_size"])
    print(
        f"reproducing {logged.model_name} version {logged.version} (MLflow run {logged.run_id}): "
        f"{len(spec.data_files)} data file(s) of snapshot {spec.data_digest}, {nproc} process(es), run {run_id}",
        flush=True,
    )
    code = run_job(spec, nproc, verbose=args.verbose, env=hook.environment())
    if code != 0:
        return code
    fs, path = filesystem(join(spec.run_dir, RESULT_ARTIFACT))
    comparison = compare(logged, json.loads(fs.cat_file(path)))
    print(comparison.table())
    if comparison.identical:
        print("identical: the same weights and every metric, bit for bit")
        return 0
    print("DIFFERENT; likely causes:\n" + "\n".join(f"  - {cause}" for cause in comparison.causes))
    return 1
