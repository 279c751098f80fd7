"""`trainpipe`: command-line entry point.

Each subcommand imports what it needs inside its handler: `trainpipe check` runs in CI and
pre-commit hooks and must stay as light as the DAG processor (no Airflow, torch or mlflow).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trainpipe.examples.synthetic import Problem


def _config_files(paths: Sequence[str]) -> Iterator[Path]:
    from airflow_trainpipe.config import CONFIG_SUFFIXES

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Not only regular files: a directory, FIFO or broken symlink named *.yaml is
            # reported as the DAG processor reports it, never silently skipped (nor opened).
            yield from sorted(p for p in path.rglob("*") if p.suffix in CONFIG_SUFFIXES)
        else:
            yield path


def _check(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.config.files import printable_name
    from airflow_trainpipe.config.loader import duplicate_pipeline
    from airflow_trainpipe.core.exceptions import ConfigError

    files = list(_config_files(args.paths))
    missing = [printable_name(p) for p in files if not p.exists() and not p.is_symlink()]
    for name in missing:
        print(f"{name}: no such file or directory", file=sys.stderr)
    files = [p for p in files if p.exists() or p.is_symlink()]
    if not files and not missing:
        print(f"no *.yaml or *.yml config files under {' '.join(args.paths)}", file=sys.stderr)
        return 1

    failed = bool(missing)
    owners: dict[str, str] = {}
    for path in files:
        name = printable_name(path)
        try:
            config = load_config(path)
        except ConfigError as exc:
            failed = True
            for problem in exc.problems:
                print(problem)
            continue
        if config.pipeline in owners:
            failed = True
            print(duplicate_pipeline(name, config.pipeline, owners[config.pipeline]))
        else:
            owners[config.pipeline] = name
        if args.verbose:
            print(f"{name}: ok ({config.pipeline})")
    if not failed:
        print(f"{len(files)} config(s) ok", file=sys.stderr)
    return 1 if failed else 0


def _train(args: argparse.Namespace) -> int:
    """The same job the operator runs, without Airflow: for debugging a training run."""
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.data.freeze import snapshot_for_date
    from airflow_trainpipe.data.snapshots.manifests import load_manifest

    try:
        config = load_config(args.config)
        manifest = None
        if args.data:
            files, digest = args.data, None
        elif args.snapshot:
            manifest = load_manifest(config.data, args.snapshot)
            files, digest = manifest.file_uris, manifest.digest
        else:
            manifest = snapshot_for_date(config, args.ds)
            files, digest = manifest.file_uris, manifest.digest
    except TrainpipeError as exc:
        return _failed(args.config, exc)
    spec = TrainSpec(
        config=config,
        run_id=args.run_id,
        data_files=files,
        data_digest=digest,
        manifest=manifest,
        hyperparameters=config.training.hyperparameters,
        tags={"trainpipe.launched_by": "cli"},
    )
    spec = spec.limited_to(args.max_steps) if args.max_steps else spec
    nproc = args.nproc or config.training.resources.nproc_per_node
    print(
        f"run directory {spec.run_dir}; {len(files)} data file(s){f' (snapshot {digest})' if digest else ''}; torchrun with {nproc} process(es)",
        file=sys.stderr,
    )
    return _run_job(spec, nproc, verbose=args.verbose)


def _tune(args: argparse.Namespace) -> int:
    """The pipeline's study without Airflow; its last line is one JSON object."""
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.data.freeze import snapshot_for_date
    from airflow_trainpipe.tuning.local import tune_locally
    from airflow_trainpipe.tuning.study import storage_url

    try:
        config = load_config(args.config)
        if config.tuning is None:
            print(f"{args.config}: pipeline {config.pipeline} has no `tuning` section", file=sys.stderr)
            return 2
        manifest = snapshot_for_date(config, args.ds)
        base = TrainSpec(
            config=config,
            run_id=args.run_id or f"tune-{args.ds}",
            data_files=manifest.file_uris,
            data_digest=manifest.digest,
            manifest=manifest,
            hyperparameters=config.training.hyperparameters,
            tags={"trainpipe.launched_by": "cli"},
        )
        nproc = args.nproc or config.tuning.nproc_per_trial or config.training.resources.nproc_per_node
        done = tune_locally(config, base, args.storage or storage_url(config), nproc, verbose=args.verbose)
    except TrainpipeError as exc:
        return _failed(args.config, exc)
    summary = done.summary
    print(
        f"study {summary.study_name}: best {summary.metric} {summary.best} (trial {summary.best_trial}) "
        f"with {summary.best_params}; {summary.pruned_at_first_rung} of {summary.trials} stopped at the first rung",
        file=sys.stderr,
    )
    print(json.dumps(summary.line(done.baseline)), flush=True)
    return 0 if summary.candidate is not None else 1


def _failed(config: str, exc: Exception) -> int:
    """A config that does not load names its own file; any other error is prefixed with it."""
    from airflow_trainpipe.core.exceptions import ConfigError

    print(exc if isinstance(exc, ConfigError) else f"{config}: {exc}", file=sys.stderr)
    return 1


def _run_job(spec: Any, nproc: int, *, verbose: bool, env: dict[str, str] | None = None) -> int:
    """The training job under torchrun here, its progress printed as the train task logs it."""
    from airflow_trainpipe.launchers.local import LocalLauncher
    from airflow_trainpipe.launchers.watcher import JobWatcher

    launcher = LocalLauncher(spec, nproc, env=env)
    watcher = JobWatcher(show_raw=False, tail=40)
    launcher.start()
    try:
        for line in launcher.lines():
            if (shown := watcher.feed(line.text)) is not None:
                print(shown, flush=True)
            elif verbose and line.event is None:
                print(line.text, file=sys.stderr)
        code = launcher.wait()
    except KeyboardInterrupt:
        launcher.kill()
        return 130
    if code != 0 and not verbose:
        print(f"training job exited with code {code}; its last output:", file=sys.stderr)
        print("\n".join(watcher.tail), file=sys.stderr)
    return code


def _make_data(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from airflow_trainpipe.examples.synthetic import Problem

    try:
        start = date.fromisoformat(args.start)
        problems: dict[date, list[Problem]] = {}
        for text in args.problem:
            day, sep, spec = text.partition("=")
            if not sep:
                raise ValueError(
                    f"--problem {text!r}: expected DAY=KIND[:ARGS], e.g. 2026-01-03=drift:amount"
                )
            problems.setdefault(date.fromisoformat(day), []).append(Problem.parse(spec))
        days = [start + timedelta(days=i) for i in range(args.days)]
        if stray := sorted(set(problems) - set(days)):
            raise ValueError(
                f"--problem for {stray[0]}, which is not among the {args.days} day(s) from {start}"
            )
        if args.sqlite:
            _make_data_sqlite(args, days, problems)
        elif args.iceberg:
            _make_data_iceberg(args, days, problems)
        elif args.delta:
            _make_data_delta(args, days, problems)
        elif args.feast:
            _make_data_feast(args, days, problems)
        else:
            _make_data_files(args, days, problems)
    except ValueError as exc:
        print(f"trainpipe make-data: {exc}", file=sys.stderr)
        return 2
    return 0


def _make_data_files(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    from airflow_trainpipe.examples.synthetic import write_day

    root = args.out if "://" in args.out else Path(args.out).resolve().as_uri()
    for day in days:
        files = write_day(
            root,
            day,
            args.rows,
            seed=args.seed,
            files=args.files,
            problems=problems.get(day, ()),
            kind=args.kind,
        )
        injected = ", ".join(map(str, problems.get(day, ()))) or "clean"
        print(f"{files[0].rsplit('/', 2)[0]}/ds={day}: {len(files)} file(s), {injected}")


def _write_table_days(
    args: argparse.Namespace,
    days: list[date],
    problems: dict[date, list[Problem]],
    write: Callable[[date, list[Problem]], str],
    one_day: str,
) -> None:
    """Each day written into a table by `write`, which says what it wrote."""
    if args.files != 1:
        raise ValueError(f"--files splits Parquet days (--out); {one_day}")
    for day in days:
        wrote = write(day, problems.get(day, []))
        print(f"{wrote}, {', '.join(map(str, problems.get(day, ()))) or 'clean'}")


def _make_data_sqlite(
    args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]
) -> None:
    """The days as rows of one table of an SQLite database, and the Airflow connection to it."""
    import shlex

    from airflow_trainpipe.examples.synthetic import (
        DAY_COLUMN,
        WAREHOUSE_CONN_ID,
        sqlite_connection_uri,
        write_day_sqlite,
    )

    path = Path(args.sqlite).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        rows = write_day_sqlite(path, day, args.rows, seed=args.seed, problems=injected, kind=args.kind)
        return f"{path} table {args.kind} {DAY_COLUMN}={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "an SQLite database is one file")
    print(
        f"Airflow connection to it (dags/configs/fraud_detector_sql.yaml reads {WAREHOUSE_CONN_ID}):\n"
        f"export AIRFLOW_CONN_{WAREHOUSE_CONN_ID.upper()}={shlex.quote(sqlite_connection_uri(path))}"
    )


def _make_data_iceberg(
    args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]
) -> None:
    """The days as a table of an Iceberg SQL catalog on SQLite, and the Airflow connection to it."""
    import shlex

    from airflow_trainpipe.examples.iceberg_table import (
        LAKE_CONN_ID,
        TIME_COLUMN,
        connection,
        write_day_iceberg,
    )

    folder = Path(args.iceberg).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        table, rows = write_day_iceberg(
            folder, day, args.rows, seed=args.seed, problems=injected, kind=args.kind
        )
        return f"{folder} table {table} day({TIME_COLUMN})={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "an Iceberg day is one data file")
    print(
        f"Airflow connection to its catalog (dags/configs/fraud_detector_iceberg.yaml reads {LAKE_CONN_ID}):\n"
        f"export AIRFLOW_CONN_{LAKE_CONN_ID.upper()}={shlex.quote(connection(folder))}"
    )


def _make_data_delta(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    """The days as partitions of a Delta table (dags/configs/fraud_detector_delta.yaml's)."""
    from airflow_trainpipe.examples.delta_table import PARTITION_COLUMN, write_day_delta

    folder = Path(args.delta).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        rows = write_day_delta(folder, day, args.rows, seed=args.seed, problems=injected, kind=args.kind)
        return f"{folder} {PARTITION_COLUMN}={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "a Delta day is one commit")


def _make_data_feast(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    """Labelled transactions (the entity rows), card and merchant features and a Feast repo over
    them, applied with the Feast interpreter (the feature-store example)."""
    from airflow_trainpipe.data.feature_store.client import FeatureStoreError
    from airflow_trainpipe.examples.feast_repo import write_feast_example

    if args.files != 1:
        raise ValueError("--files splits Parquet days (--out); a --feast day is one file")
    if args.kind != "card_transactions":
        raise ValueError(f"--feast writes card transactions and their features, not --kind {args.kind}")
    if not days:
        raise ValueError("--feast needs --days 1 or more")
    try:
        example = write_feast_example(Path(args.feast), days[0], len(days), args.rows, args.seed, problems)
    except FeatureStoreError as exc:
        raise ValueError(str(exc)) from exc
    import pyarrow.parquet as pq

    for day, file in zip(days, example.transaction_files, strict=True):
        rows = pq.ParquetFile(file).metadata.num_rows
        print(f"{file.parent}: {rows} row(s), {', '.join(map(str, problems.get(day, ()))) or 'clean'}")
    print(f"features: {example.card_activity}, {example.merchant_risk}")
    print(f"Feast repo (applied): {example.repo}")


def _render(args: argparse.Namespace) -> int:
    """The manifests the `train` task submits with `launcher: kubernetes`, for a sample run."""
    import yaml

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.config.templates import render_partition
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.core.storage import join
    from airflow_trainpipe.data.snapshots.partitions import partition_uri
    from airflow_trainpipe.launchers.kubernetes_manifests import RunLabels, manifests

    try:
        config = load_config(args.config)
        partition = render_partition(config.data.partition, args.ds)
    except TrainpipeError as exc:
        return _failed(args.config, exc)
    if config.training.launcher != "kubernetes":
        print(
            f"{args.config}: training.launcher is {config.training.launcher!r}; only launcher kubernetes submits manifests",
            file=sys.stderr,
        )
        return 1
    run_id = args.run_id or f"scheduled__{args.ds}T00:00:00+00:00"
    # The operator lists the partition's files when the task runs; a sample file stands in here.
    files = args.data or [join(partition_uri(config.data, partition), f"part-00000.{config.data.format}")]
    spec = TrainSpec(
        config=config,
        run_id=run_id,
        data_files=files,
        hyperparameters=config.training.hyperparameters,
        tags={"airflow.dag_id": config.pipeline, "airflow.task_id": args.task},
    )
    docs = manifests(config, spec, RunLabels(config.pipeline, args.task, run_id, args.try_number))
    print(f"# trainpipe render {args.config}: run {run_id}, try {args.try_number}, data {', '.join(files)}")

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    sys.stdout.write(yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False, width=120))
    return 0


def _schema(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config.reference import json_schema, markdown_reference

    if args.format == "markdown":
        sys.stdout.write(markdown_reference())
    else:
        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def _stdout_log() -> logging.Logger:
    """The `log` the task helpers write to, printed like the command's other output (a logger of
    its own: the root logger would also print MLflow's and alembic's INFO lines)."""
    log = logging.getLogger("airflow_trainpipe.cli")
    log.handlers[:] = [logging.StreamHandler(sys.stdout)]  # today's sys.stdout (tests replace it)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def _move_alias(args: argparse.Namespace) -> int:
    """`promote` and `rollback`: the registry's aliases, moved as the register task moves them."""
    import getpass

    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry import aliases

    hook = MlflowHook(args.conn_id)
    actor = args.by or getpass.getuser()

    def load_online(version: str) -> None:  # as the register and promote tasks do, before moving
        from airflow_trainpipe.registry.online_features import load_version_online

        load_version_online(hook, args.model, version, _stdout_log())

    try:
        if args.command == "promote":
            move = aliases.promote(
                hook, args.model, args.version, actor=actor, reason=args.reason,
                alias=args.alias, previous_alias=args.previous_alias, prepare=load_online,
            )  # fmt: skip
        else:
            move = aliases.rollback(
                hook, args.model, actor=actor, reason=args.reason,
                alias=args.alias, previous_alias=args.previous_alias, prepare=load_online,
            )  # fmt: skip
    except TrainpipeError as exc:
        print(f"trainpipe {args.command}: {exc}", file=sys.stderr)
        return 1
    print(move.describe() + ("" if move.replaced or args.command == "rollback" else " already"))
    return 0


def _add_alias_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
            "--previous-alias", default="previous_champion", help="where the replaced version goes"
        )
        command.add_argument(
            "--conn-id", default="mlflow_default", help="Airflow connection of the MLflow server "
            "(undefined mlflow_default: the embedded store under TRAINPIPE_HOME)",
        )  # fmt: skip
        command.set_defaults(handler=_move_alias)


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
    code = _run_job(spec, nproc, verbose=args.verbose, env=hook.environment())
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


def _today() -> str:
    from datetime import datetime

    return datetime.now(UTC).strftime("%Y-%m-%d")


def build_parser() -> argparse.ArgumentParser:
    from airflow_trainpipe import __version__

    parser = argparse.ArgumentParser(
        prog="trainpipe", description="YAML-declared ML retrain pipelines for Airflow."
    )
    parser.add_argument("--version", action="version", version=f"trainpipe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check(commands)
    _add_train(commands)
    _add_tune(commands)
    _add_make_data(commands)
    _add_render(commands)
    _add_alias_commands(commands)
    _add_snapshots(commands)
    reproduce = commands.add_parser(
        "reproduce",
        help="train a registered model version again from its run's logged spec; exit 0 and print "
        "'identical' only for the same weights and metrics",
    )
    reproduce.add_argument(
        "reference", metavar="MODEL@ALIAS|MODEL/VERSION", help="e.g. fraud_detector@champion"
    )
    reproduce.add_argument("--nproc", type=int, help="processes (default: the original run's world size)")
    reproduce.add_argument(
        "--conn-id", default="mlflow_default", help="Airflow connection of the MLflow server"
    )
    reproduce.add_argument("-v", "--verbose", action="store_true", help="also print the job's raw output")
    reproduce.set_defaults(handler=_reproduce)
    schema = commands.add_parser("schema", help="print the config JSON Schema (for editors) or its reference")
    schema.add_argument("--format", choices=("json", "markdown"), default="json")
    schema.set_defaults(handler=_schema)
    return parser


def _add_snapshots(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

    from pydantic import TypeAdapter

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.config.types import PositiveDuration
    from airflow_trainpipe.core.exceptions import TrainpipeError
    from airflow_trainpipe.core.storage import resolve
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry import retention

    try:
        keep = TypeAdapter(PositiveDuration).validate_python(args.keep)
    except ValueError as exc:
        print(f"trainpipe snapshots gc: --keep {args.keep!r}: {exc}", file=sys.stderr)
        return 2
    try:
        stores = sorted({resolve(load_config(p).snapshots.uri) for p in _config_files(args.paths)})
    except TrainpipeError as exc:
        print(f"trainpipe snapshots gc: {exc}", file=sys.stderr)
        return 1
    now = time.time()
    for store in stores:
        try:
            used = retention.uses(store, args.storage_conn_id)
            referenced = retention.referenced_digests(used, MlflowHook(args.conn_id), keep, now)
            plan = retention.plan(store, used, referenced, keep, now, args.storage_conn_id)
        except TrainpipeError as exc:
            print(f"trainpipe snapshots gc: {store}: {exc}; nothing deleted", file=sys.stderr)
            return 1
        print(retention.describe(plan, args.delete))
        if args.delete:
            retention.apply(plan, args.storage_conn_id)
    return 0


def _add_check(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check", help="validate pipeline config files or folders (exit 1 on any problem)"
    )
    check.add_argument(
        "paths", nargs="+", metavar="PATH", help="a config file or a folder searched for *.yaml/*.yml"
    )
    check.add_argument("-v", "--verbose", action="store_true", help="also print a line for each valid file")
    check.set_defaults(handler=_check)


def _add_train(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = commands.add_parser(
        "train", help="run a pipeline's training job locally under torchrun (no Airflow needed)"
    )
    train.add_argument("config", help="pipeline config file")
    train.add_argument(
        "--run-id", required=True, help="run id: the same id resumes from that run's checkpoints"
    )
    train.add_argument("--nproc", type=int, help="processes (default: training.resources)")
    train.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    train.add_argument(
        "--ds", default=_today(), help="date that renders data.partition (default: today, UTC)"
    )
    source = train.add_mutually_exclusive_group()
    source.add_argument(
        "--data", nargs="+", metavar="URI", help="train on these files instead of the partition"
    )
    source.add_argument(
        "--snapshot",
        metavar="DIGEST",
        help="train on the files of a stored snapshot (sha256:...), e.g. to reproduce a model from its data digest tag",
    )
    train.add_argument("-v", "--verbose", action="store_true", help="also print the job's raw output")
    train.set_defaults(handler=_train)


def _add_tune(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune",
        help="run a pipeline's Optuna study locally (no Airflow needed); the last line is a JSON summary",
    )
    tune.add_argument("config", help="pipeline config file with a `tuning` section")
    tune.add_argument("--ds", default=_today(), help="date that renders data.partition (default: today, UTC)")
    tune.add_argument(
        "--run-id", help="names the study and its run directories (default tune-<ds>); the same id resumes it"
    )
    tune.add_argument(
        "--storage", help="Optuna storage URL (default: an SQLite file under TRAINPIPE_HOME/optuna)"
    )
    tune.add_argument("--nproc", type=int, help="processes per trial (default: tuning.nproc_per_trial)")
    tune.add_argument("-v", "--verbose", action="store_true", help="also print each job's progress")
    tune.set_defaults(handler=_tune)


def _add_make_data(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    make_data = commands.add_parser(
        "make-data",
        help="write synthetic daily partitions (card transactions, house sales, support tickets or search results), "
        "or the days' rows into an SQLite table or an Iceberg table, optionally with injected problems",
    )
    make_data.add_argument(
        "--kind",
        choices=("card_transactions", "house_sales", "support_tickets", "search_results"),
        default="card_transactions",
        help="card_transactions (binary is_fraud), house_sales (regression sale_price), support_tickets "
        "(multiclass team), search_results (ranking: relevance within query_id); default card_transactions",
    )
    target = make_data.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--out", help="dataset root of Parquet days ds=YYYY-MM-DD/: a folder or a URI (s3://bucket/prefix)"
    )
    target.add_argument(
        "--sqlite",
        metavar="PATH",
        help="instead, rows of table KIND (plus event_date 'YYYY-MM-DD') in this SQLite database, "
        "a day's old rows replaced; prints the Airflow connection to define (the sql source example)",
    )
    target.add_argument(
        "--iceberg",
        metavar="DIR",
        help="instead, rows of Iceberg table trainpipe.KIND (plus event_time, partitioned by its day) "
        "in a SQL catalog on DIR/catalog.db (SQLite) with its warehouse in DIR/warehouse, a day's old "
        "rows replaced; prints the Airflow connection to define (the iceberg source example)",
    )
    target.add_argument(
        "--delta",
        metavar="DIR",
        help="instead, rows of KIND (plus event_time, and ds, the partition column) in a Delta table "
        "at DIR, a day's partition replaced (the delta source example: its table, needs no connection)",
    )
    target.add_argument(
        "--feast",
        metavar="DIR",
        help="instead, card transactions (keys, no features) in DIR/transactions/ds=YYYY-MM-DD/, their card and "
        "merchant features in DIR/features/, a Feast repo over them in DIR/repo applied with $TRAINPIPE_FEAST_PYTHON",
    )
    make_data.add_argument("--start", default="2026-01-01", help="first day (default 2026-01-01)")
    make_data.add_argument("--days", type=int, default=1, help="number of daily partitions (default 1)")
    make_data.add_argument(
        "--rows", type=int, default=20_000, help="rows per day before problems (default 20000)"
    )
    make_data.add_argument(
        "--files", type=int, default=1, help="parquet files per day (default 1; --out only)"
    )
    make_data.add_argument("--seed", type=int, default=0, help="the same seed always writes the same bytes")
    make_data.add_argument(
        "--problem",
        action="append",
        default=[],
        metavar="DAY=KIND[:ARGS]",
        help="inject a problem into one day (repeatable): drop:COL, rename:COL:NEW, dtype:COL, nulls:COL[:FRACTION], "
        "out_of_range:COL[:VALUE], volume:FRACTION, drift:COL[,COL...] (--sqlite, --iceberg, --delta, --feast: not the first three; --feast: not on "
        "card_id, merchant_id, event_time)",
    )
    make_data.set_defaults(handler=_make_data)


def _add_render(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    render = commands.add_parser(
        "render", help="print the Kubernetes manifests the train task submits (launcher kubernetes)"
    )
    render.add_argument("config", help="pipeline config file")
    render.add_argument(
        "--task",
        default="train",
        choices=("train",),
        help="task whose manifests to print (only train runs in pods)",
    )
    render.add_argument(
        "--ds", default=_today(), help="date of the sample run (renders data.partition; default: today, UTC)"
    )
    render.add_argument("--run-id", help="run id (default: scheduled__<ds>T00:00:00+00:00)")
    render.add_argument("--try-number", type=int, default=1, help="try whose names and labels to render")
    render.add_argument(
        "--data", nargs="+", metavar="URI", help="data files (default: a sample file of the partition)"
    )
    render.set_defaults(handler=_render)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
