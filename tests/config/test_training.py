"""config.training: hyperparameters and overrides, DeepSpeed, resources, checkpoints, launcher rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.kubernetes import KubernetesSection
from airflow_trainpipe.config.training import (
    CheckpointSection,
    DeepSpeedSection,
    Hyperparameters,
    Resources,
    TrainingSection,
    pod_storage_problems,
)
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS


def _flatten(exc: ValidationError) -> Iterator[tuple[str, str]]:
    for error in exc.errors():
        nested = error["ctx"]["problems"] if error["type"] == "cross_field" else [((), error["msg"])]
        for loc, message in nested:
            yield ".".join(map(str, (*error["loc"], *loc))), message.removeprefix("Value error, ")


def _located(model: type[BaseModel], data: dict[str, Any]) -> dict[str, str]:
    """{dotted location: message} of every problem of `data`, cross-field ones unpacked."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return dict(_flatten(exc))
    raise AssertionError(f"{model.__name__} accepted {data}")


def _training(**fields: Any) -> dict[str, Any]:
    return {"model": "tabular_mlp", "task": "binary_classification", **fields}


def _volumes(*paths: str) -> KubernetesSection:
    return KubernetesSection.model_validate(
        {"volumes": [{"claim": "shared", "mount_path": p} for p in paths]}
    )


def test_hyperparameter_defaults() -> None:
    h = Hyperparameters()
    assert (h.epochs, h.max_steps, h.batch_size, h.gradient_accumulation_steps) == (10, None, 256, 1)
    assert (h.learning_rate, h.weight_decay, h.warmup_steps, h.seed) == (1e-3, 0.0, 0, 42)


def test_overrides_apply_with_json_leniency_for_floats() -> None:
    merged = Hyperparameters(epochs=3).with_overrides({"learning_rate": 1, "model_args": {"dropout": 0.2}})
    assert merged.learning_rate == 1.0 and isinstance(merged.learning_rate, float)
    assert (merged.epochs, merged.model_args) == (3, {"dropout": 0.2})


@pytest.mark.parametrize(
    ("configured", "override", "limit", "expected"),
    [
        (None, {}, 100, 100),
        (50, {}, 100, 50),
        (500, {}, 100, 100),
        (None, {"max_steps": 30}, 100, 30),
        (40, {}, None, 40),
    ],
)
def test_the_smaller_step_limit_wins(
    configured: int | None, override: dict[str, int], limit: int | None, expected: int
) -> None:
    assert (
        Hyperparameters(max_steps=configured).with_overrides(override, max_steps=limit).max_steps == expected
    )


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ({"epochs": "2"}, "epochs", "Input should be a valid integer"),
        ({"epoch": 2}, "epoch", "Extra inputs are not permitted"),
        ({"learning_rate": 0}, "learning_rate", "Input should be greater than 0"),
    ],
)
def test_overrides_are_validated_like_the_yaml(override: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Hyperparameters().with_overrides(override)
    assert [(e["loc"], e["msg"]) for e in caught.value.errors()] == [((field,), message)]


def test_overrides_leave_the_original_unchanged() -> None:
    original = Hyperparameters()
    original.with_overrides({"epochs": 1}, max_steps=5)
    assert (original.epochs, original.max_steps) == (10, None)


def test_model_args_take_scalars_and_lists_of_scalars() -> None:
    args = {"hidden_sizes": [64, 32], "dropout": 0.1, "act": "relu", "bias": True}
    assert Hyperparameters(model_args=args).model_args == args
    nested = _located(Hyperparameters, {"model_args": {"hidden": {"sizes": [64]}}})
    assert {loc.rsplit(".", 1)[0] for loc in nested} == {"model_args.hidden"}
    assert nested["model_args.hidden.list[union[str,int,float,bool]]"] == "Input should be a valid list"


def test_deepspeed_defaults_are_zero_1_auto_precision_without_offload() -> None:
    ds = DeepSpeedSection()
    assert (ds.zero_stage, ds.precision, ds.offload_optimizer, ds.offload_params) == (
        1,
        "auto",
        "none",
        "none",
    )
    assert ds.gradient_clipping == 1.0


def test_offload_needs_the_zero_stage_that_shards_it() -> None:
    data = {"zero_stage": 0, "offload_optimizer": "cpu", "offload_params": "cpu"}
    assert _located(DeepSpeedSection, data) == {
        "offload_params": "needs zero_stage 3, got zero_stage 0",
        "offload_optimizer": "needs zero_stage 1, 2 or 3, got zero_stage 0",
    }
    assert DeepSpeedSection(zero_stage=3, offload_optimizer="cpu", offload_params="cpu").zero_stage == 3


@pytest.mark.parametrize("field", ["offload_optimizer", "offload_params"])
def test_nvme_offload_needs_an_nvme_path(field: str) -> None:
    assert _located(DeepSpeedSection, {"zero_stage": 3, field: "nvme", "nvme_path": ""}) == {
        "nvme_path": "nvme offload needs nvme_path, a local NVMe mount"
    }
    assert DeepSpeedSection.model_validate({"zero_stage": 3, field: "nvme", "nvme_path": "/nvme"}).nvme_path


def test_overrides_cannot_set_what_typed_fields_own_at_any_depth() -> None:
    overrides = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "overlap_comm": True}}
    assert _located(DeepSpeedSection, {"overrides": overrides}) == {
        "overrides.bf16": "is set through training.deepspeed.precision; set it there",
        "overrides.zero_optimization.stage": "is set through training.deepspeed.zero_stage; set it there",
    }


def test_overrides_of_unmodelled_settings_are_kept() -> None:
    overrides = {"zero_optimization": {"overlap_comm": True}, "steps_per_print": 10}
    assert DeepSpeedSection(overrides=overrides).overrides == overrides


@pytest.mark.parametrize(
    ("resources", "nproc"),
    [
        ({}, 1),
        ({"gpus_per_node": 4}, 4),
        ({"gpus_per_node": 4, "processes_per_node": 2}, 2),
        ({"processes_per_node": 3}, 3),
    ],
)
def test_processes_per_node_default_to_one_per_gpu_or_one_on_cpu(
    resources: dict[str, int], nproc: int
) -> None:
    assert Resources.model_validate(resources).nproc_per_node == nproc


def test_no_more_processes_than_gpus() -> None:
    assert _located(Resources, {"gpus_per_node": 2, "processes_per_node": 3}) == {
        "processes_per_node": "3 exceeds gpus_per_node 2; use one process per GPU"
    }


def test_checkpoints_default_to_every_200_steps_under_trainpipe_home() -> None:
    checkpoint = CheckpointSection()
    assert (checkpoint.uri, checkpoint.every_steps, checkpoint.every_minutes) == ("checkpoints", 200, None)
    assert (checkpoint.keep_last, checkpoint.keep_best, checkpoint.async_upload) == (2, True, True)


def test_a_time_interval_alone_is_enough_but_some_interval_is_needed() -> None:
    assert CheckpointSection.model_validate({"every_steps": None, "every_minutes": 7.5}).every_minutes == 7.5
    assert _located(CheckpointSection, {"every_steps": None}) == {
        "every_steps": "set every_steps, every_minutes or both; without one nothing could be resumed"
    }


def test_checkpoint_compression_is_none_or_zstd_and_a_bad_value_names_its_field() -> None:
    assert CheckpointSection().compression == "none"
    assert CheckpointSection.model_validate({"compression": "zstd"}).compression == "zstd"
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    with pytest.raises(ConfigError) as caught:
        parse_config(text.replace("    async: true\n", "    async: true\n    compression: gzip\n"), "x.yaml")
    [problem] = [str(p) for p in caught.value.problems]
    assert problem.startswith("x.yaml:") and problem.endswith(
        ": training.checkpoint.compression: Input should be 'none' or 'zstd', got 'gzip'"
    )


def test_async_upload_is_spelled_async_in_the_config() -> None:
    assert CheckpointSection.model_validate({"async": False}).async_upload is False
    assert _located(CheckpointSection, {"async_upload": False}) == {
        "async_upload": "Extra inputs are not permitted"
    }


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "pkg.models:build",
            "'pkg.models:build' looks like an import path; configs name registered models only.",
        ),
        ("pkg/model", "'pkg/model' looks like an import path"),
        ("TabularMLP", "a model name is lower_snake_case, got 'TabularMLP'"),
        ("tabular_mpl", "unknown model 'tabular_mpl' (did you mean 'tabular_mlp'?); available: tabular_mlp"),
    ],
)
def test_models_are_registered_names(model: str, message: str) -> None:
    [(field, found)] = _located(TrainingSection, _training(model=model)).items()
    assert field == "model" and found.startswith(message)


@pytest.mark.parametrize("image", ["", "registry/trainer 1.0", "trainer:1.0\n"])
def test_an_image_is_one_reference_without_whitespace(image: str) -> None:
    assert _located(TrainingSection, _training(image=image)) == {
        "image": f"expected a container image reference such as registry/trainer:1.0, got {image!r}"
    }


def test_kubernetes_needs_an_image_and_storage_the_pods_can_reach() -> None:
    assert _located(TrainingSection, _training(launcher="kubernetes")) == {
        "image": "launcher kubernetes needs `image`, the trainer container image",
        "checkpoint.uri": "'checkpoints' is relative to the Airflow worker's TRAINPIPE_HOME, which pods do not "
        "see; use s3://... or file:// on a volume in training.kubernetes.volumes",
    }


def test_a_kubernetes_job_on_a_mounted_volume_is_fine() -> None:
    training = TrainingSection.model_validate(
        _training(
            launcher="kubernetes",
            image="registry/trainer:1.0",
            resources={"nodes": 3},
            kubernetes={"min_nodes": 2, "volumes": [{"claim": "ckpt", "mount_path": "/ckpt"}]},
            checkpoint={"uri": "file:///ckpt/runs"},
        )
    )
    assert (training.resources.nodes, training.kubernetes.min_nodes) == (3, 2)


def test_launcher_rules_are_reported_together() -> None:
    data = _training(resources={"nodes": 2}, kubernetes={"min_nodes": 3}, deepspeed={"precision": "fp16"})
    assert _located(TrainingSection, data) == {
        "kubernetes.min_nodes": "3 exceeds resources.nodes 2",
        "resources.nodes": "launcher local runs on one node, got 2; use launcher kubernetes for several nodes",
        "deepspeed.precision": "fp16 needs GPUs (resources.gpus_per_node > 0); use fp32, bf16 or auto on CPU",
    }


@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16"])
def test_cpu_training_takes_auto_fp32_or_bf16(precision: str) -> None:
    assert (
        TrainingSection.model_validate(_training(deepspeed={"precision": precision})).deepspeed.precision
        == precision
    )


@pytest.mark.parametrize(
    ("uri", "mounts"),
    [
        ("s3://bucket/x", ()),
        ("file:///data", ("/data",)),
        ("file:///data/x", ("/data/",)),
        ("file:///any/x", ("/",)),
    ],
)
def test_pods_reach_s3_and_files_under_a_mount(uri: str, mounts: tuple[str, ...]) -> None:
    assert pod_storage_problems(uri, _volumes(*mounts), ("data", "uri")) == []


def test_a_sibling_of_a_mount_is_not_on_it() -> None:
    assert pod_storage_problems("file:///data2/x", _volumes("/data", "/ckpt"), ("checkpoint", "uri")) == [
        (
            ("checkpoint", "uri"),
            "file:///data2/x is not on a volume the pods mount (training.kubernetes.volumes: /data, /ckpt)",
        )
    ]


def test_without_volumes_no_file_uri_is_reachable() -> None:
    [(loc, message)] = pod_storage_problems("file:///data/x", _volumes(), ("data", "uri"))
    assert loc == ("data", "uri") and message.endswith("(training.kubernetes.volumes: none)")


@pytest.mark.parametrize(
    "uri", ["file:///data/../etc/ckpt", "file:///data/./../etc", "file:///data/%2E%2E/etc"]
)
def test_a_path_that_climbs_out_of_a_mount_is_not_on_it(uri: str) -> None:
    [(loc, message)] = pod_storage_problems(uri, _volumes("/data"), ("checkpoint", "uri"))
    assert loc == ("checkpoint", "uri") and message.startswith(f"{uri} is not on a volume the pods mount")


@pytest.mark.parametrize(("grace", "torchrun", "kill"), [(30, 35, 40), (0.5, 6, 11), (90.2, 96, 101)])
def test_the_launchers_wait_longer_than_the_ranks_preemption_grace(
    grace: float, torchrun: int, kill: int
) -> None:
    checkpoint = CheckpointSection.model_validate({"preemption_grace": grace})
    assert (checkpoint.shutdown_timeout_s, checkpoint.termination_grace_s) == (torchrun, kill)


@pytest.mark.parametrize("grace", [0, -5, "soon"])
def test_the_preemption_grace_is_a_positive_number_of_seconds(grace: object) -> None:
    with pytest.raises(ValidationError, match="preemption_grace"):
        CheckpointSection.model_validate({"preemption_grace": grace})


@pytest.mark.parametrize(
    "uri",
    [
        "encoders/base",
        "file:///models/base",
        "s3://models/base",
        "models:/router/3",
        "models:/router@champion",
    ],
)
def test_pretrained_takes_a_directory_uri_or_a_registered_version(uri: str) -> None:
    assert TrainingSection.model_validate(_training(pretrained=uri)).pretrained == uri


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("models:/router", "expected models:/NAME/VERSION or models:/NAME@ALIAS"),
        ("models:/router/latest", "expected models:/NAME/VERSION or models:/NAME@ALIAS"),
        ("/models/base", "write an absolute local path as a URI: file:///models/base"),
        ("hf://bert-base-uncased", "unsupported scheme hf://"),
    ],
)
def test_a_pretrained_uri_that_is_neither_is_refused(uri: str, message: str) -> None:
    assert message in _located(TrainingSection, _training(pretrained=uri))["pretrained"]


def test_pods_read_a_pretrained_directory_from_s3_a_volume_or_the_registry() -> None:
    pods = {"launcher": "kubernetes", "image": "registry/trainer:1", "checkpoint": {"uri": "s3://b/ckpt"}}
    assert (
        "TRAINPIPE_HOME, which pods do not see"
        in _located(TrainingSection, _training(**pods, pretrained="encoders/base"))["pretrained"]
    )
    for uri in ("s3://models/base", "models:/router@champion"):
        assert TrainingSection.model_validate(_training(**pods, pretrained=uri)).pretrained == uri


def test_restore_best_needs_the_best_checkpoint_kept() -> None:
    import yaml

    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["training"].setdefault("checkpoint", {})["keep_best"] = False
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump(config), "fraud.yaml")
    [problem] = caught.value.problems
    assert problem.path == "training.restore_best" and "checkpoint.keep_best" in problem.message
    config["training"]["restore_best"] = False
    assert parse_config(yaml.safe_dump(config)).training.restore_best is False
