"""`trainpipe render`: the Kubernetes manifests of a pipeline's training job, without a cluster."""

from __future__ import annotations

import argparse
import sys

from airflow_trainpipe.cli.common import at_least, failed, iso_day, today


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
        return failed(args.config, exc)
    if args.task == "canary":
        return _canary(args, config)
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
    docs = manifests(spec, RunLabels(config.pipeline, args.task, run_id, args.try_number))
    print(f"# trainpipe render {args.config}: run {run_id}, try {args.try_number}, data {', '.join(files)}")

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    sys.stdout.write(yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False, width=120))
    return 0


def _canary(args: argparse.Namespace, config: object) -> int:
    """The KServe InferenceService of each canary step, then the rollback's (canary/kserve.py)."""
    import yaml

    from airflow_trainpipe.canary.kserve import inference_services
    from airflow_trainpipe.config import PipelineConfig

    assert isinstance(config, PipelineConfig)
    if config.canary is None:
        print(f"{args.config}: no canary section; add one to render its steps", file=sys.stderr)
        return 1
    if not args.version or not args.storage_uri:
        print(
            "--task canary needs --version and --storage-uri (where the version's model files are)",
            file=sys.stderr,
        )
        return 1
    docs = inference_services(config, args.version, args.storage_uri, args.namespace, args.service_account)
    print(
        f"# trainpipe render {args.config} --task canary: version {args.version}, {len(docs) - 1} step(s), then the rollback"
    )
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, width=120))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    render = commands.add_parser(
        "render", help="print the Kubernetes manifests the train task submits (launcher kubernetes)"
    )
    render.add_argument("config", help="pipeline config file")
    render.add_argument(
        "--task",
        default="train",
        choices=("train", "canary"),
        help="task whose manifests to print: train (its pods) or canary (KServe InferenceServices, one per step)",
    )
    render.add_argument("--version", help="--task canary: the model version in canary")
    render.add_argument(
        "--storage-uri", help="--task canary: where that version's MLflow model files are (s3://...)"
    )
    render.add_argument("--namespace", help="--task canary: the InferenceService's namespace")
    render.add_argument(
        "--service-account", help="--task canary: the predictor's service account (storage credentials)"
    )
    render.add_argument(
        "--ds",
        type=iso_day,
        default=today(),
        help="date of the sample run (renders data.partition; default: today, UTC)",
    )
    render.add_argument("--run-id", help="run id (default: scheduled__<ds>T00:00:00+00:00)")
    render.add_argument(
        "--try-number", type=at_least(1), default=1, help="try whose names and labels to render"
    )
    render.add_argument(
        "--data", nargs="+", metavar="URI", help="data files (default: a sample file of the partition)"
    )
    render.set_defaults(handler=_render)
