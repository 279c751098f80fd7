"""`trainpipe train` (one training job here, as the DAG's train task would run it) and `trainpipe
tune` (the DAG's study without a scheduler)."""

from __future__ import annotations

import argparse
import json
import sys

from airflow_trainpipe.cli.common import CLI_TAGS, at_least, failed, iso_day, run_job, snapshot_digest, today


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
        if args.snapshot:
            manifest = load_manifest(config.data, args.snapshot)
        elif not args.data:
            manifest = snapshot_for_date(config, args.ds)
    except TrainpipeError as exc:
        return failed(args.config, exc)
    spec = TrainSpec.from_manifest(config, args.run_id, manifest, args.data, tags=CLI_TAGS)
    spec = spec.limited_to(args.max_steps) if args.max_steps else spec
    nproc = args.nproc or config.training.resources.nproc_per_node
    digest = spec.data_digest
    print(
        f"run directory {spec.run_dir}; {len(spec.data_files)} data file(s){f' (snapshot {digest})' if digest else ''}; torchrun with {nproc} process(es)",
        file=sys.stderr,
    )
    return run_job(spec, nproc, verbose=args.verbose)


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
        base = TrainSpec.from_manifest(config, args.run_id or f"tune-{args.ds}", manifest, tags=CLI_TAGS)
        nproc = args.nproc or config.trial_nproc_per_node
        done = tune_locally(
            config,
            base,
            args.storage or storage_url(config),
            nproc,
            verbose=args.verbose,
            max_parallel=args.max_parallel,
        )
    except TrainpipeError as exc:
        return failed(args.config, exc)
    summary = done.summary
    print(
        f"study {summary.study_name}: best {summary.metric} {summary.best} (trial {summary.best_trial}) "
        f"with {summary.best_params}; {summary.pruned_at_first_rung} of {summary.trials} stopped at the first rung",
        file=sys.stderr,
    )
    print(json.dumps(summary.line(done.baseline)), flush=True)
    return 0 if summary.candidate is not None else 1


def _add_train(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = commands.add_parser(
        "train", help="run a pipeline's training job locally under torchrun (no Airflow needed)"
    )
    train.add_argument("config", help="pipeline config file")
    train.add_argument(
        "--run-id", required=True, help="run id: the same id resumes from that run's checkpoints"
    )
    train.add_argument("--nproc", type=at_least(1), help="processes (default: training.resources)")
    train.add_argument("--max-steps", type=at_least(1), help="stop after this many optimizer steps")
    train.add_argument(
        "--ds", type=iso_day, default=today(), help="date that renders data.partition (default: today, UTC)"
    )
    source = train.add_mutually_exclusive_group()
    source.add_argument(
        "--data", nargs="+", metavar="URI", help="train on these files instead of the partition"
    )
    source.add_argument(
        "--snapshot",
        metavar="DIGEST",
        type=snapshot_digest,
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
    tune.add_argument(
        "--ds", type=iso_day, default=today(), help="date that renders data.partition (default: today, UTC)"
    )
    tune.add_argument(
        "--run-id", help="names the study and its run directories (default tune-<ds>); the same id resumes it"
    )
    tune.add_argument(
        "--storage", help="Optuna storage URL (default: an SQLite file under TRAINPIPE_HOME/optuna)"
    )
    tune.add_argument(
        "--nproc", type=at_least(1), help="processes per trial (default: tuning.nproc_per_trial)"
    )
    tune.add_argument(
        "--max-parallel",
        type=at_least(1),
        help="trials at once, each its own job (default: tuning.budget.max_parallel)",
    )
    tune.add_argument("-v", "--verbose", action="store_true", help="also print each job's progress")
    tune.set_defaults(handler=_tune)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_train(commands)
    _add_tune(commands)
