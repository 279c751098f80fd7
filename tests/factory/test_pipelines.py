"""The config -> DAG mapping, checked on the DAG objects the DAG processor would serialize."""

from __future__ import annotations

import itertools
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk import Asset, CronTriggerTimetable, PartitionedAssetTimetable
from airflow.serialization.serialized_objects import DagSerialization

from airflow_trainpipe.core.retry_policy import TRAINPIPE_RETRY_POLICY
from airflow_trainpipe.factory import build_pipeline_dags, register_pipelines
from airflow_trainpipe.factory.broken import BROKEN_TAG
from airflow_trainpipe.operators.train import DistributedTrainOperator
from tests.config.test_hostile_configs import HOSTILE_DIR
from tests.conftest import EXAMPLE_CONFIGS

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPIPE_CONFIG_CACHE", str(tmp_path / "cache"))


def _folder(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "dags" / "configs"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _dags(folder: Path) -> dict:
    return {dag.dag_id: dag for dag in build_pipeline_dags(folder, folder.parent)}


def test_example_configs_become_the_five_task_pipeline() -> None:
    dags = {dag.dag_id: dag for dag in build_pipeline_dags(EXAMPLE_CONFIGS, EXAMPLE_CONFIGS.parent)}
    assert sorted(dags) == [
        "fraud_detector", "fraud_detector_canary", "fraud_detector_delta", "fraud_detector_features",
        "fraud_detector_iceberg", "fraud_detector_sql", "fraud_detector_tuned",
        "house_prices", "search_ranking", "support_tickets", "support_tickets_finetune",
    ]  # fmt: skip
    dag = dags["fraud_detector"]
    order = ["wait_for_data", "validate_data", "train", "gate", "register"]
    assert sorted(dag.task_ids) == sorted(order)
    for upstream, downstream in itertools.pairwise(order):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    assert isinstance(dag.timetable, CronTriggerTimetable) and dag.timetable.expression == "0 2 * * *"
    assert dag.start_date == datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    assert dag.tags >= {"trainpipe", "fraud", "nightly"}
    assert dag.max_active_runs == 1 and dag.catchup is False
    for task in dag.tasks:  # the schedule section's retry defaults and the owner reach every task
        assert (task.owner, task.retries, task.retry_delay) == ("risk-ml", 2, timedelta(minutes=2))
        assert task.retry_policy is TRAINPIPE_RETRY_POLICY  # retries are spent on retryable errors only
    assert dags["house_prices"].timetable.timezone == "Europe/Amsterdam"
    dag.validate()
    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))  # what the DAG processor stores
    assert {task.task_id for task in stored.tasks if task.has_retry_policy} == set(order)


def test_train_takes_the_validated_snapshot_and_register_emits_the_model_asset() -> None:
    dag = _dags(EXAMPLE_CONFIGS)["fraud_detector"]
    train = dag.get_task("train")
    assert isinstance(train, DistributedTrainOperator)
    assert (train.validation.operator.task_id, train.validation.key) == ("validate_data", "return_value")
    assert train.data_files is None and train.data_digest is None
    [asset] = dag.get_task("register").outlets
    assert isinstance(asset, Asset)
    assert (asset.name, asset.uri) == ("fraud_detector@champion", "x-mlflow-model://fraud_detector/champion")
    assert asset.extra["model_uri"] == "models:/fraud_detector@champion"


def test_trigger_form_params_and_their_templates() -> None:
    dag = _dags(EXAMPLE_CONFIGS)["fraud_detector"]
    params = dag.params
    assert set(params.keys()) == {"partition", "hyperparameters", "force_registration"}
    assert params["force_registration"] is False and params["partition"] is None
    assert params["hyperparameters"]["learning_rate"] == 0.002 and params["hyperparameters"]["epochs"] == 3
    assert "model_args" not in params["hyperparameters"]
    # The templates the tasks render: empty form (null; "" from an API caller) -> the config's own partition.
    import jinja2

    partition = jinja2.Environment().from_string(dag.get_task("validate_data").partition)
    assert partition.render(params={"partition": None}, ds="2026-01-02") == "ds=2026-01-02"
    assert partition.render(params={"partition": ""}, ds="2026-01-02") == "ds=2026-01-02"
    assert partition.render(params={"partition": "ds=2025-12-31"}, ds="2026-01-02") == "ds=2025-12-31"
    assert dag.get_task("gate").force == "{{ params.force_registration }}"


def test_train_applies_only_the_form_values_that_change_something(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    train = _dags(EXAMPLE_CONFIGS)["fraud_detector"].get_task("train")
    train.hyperparameter_overrides = (
        '{"epochs": 3, "learning_rate": 1, "max_steps": null}'  # as rendered by | tojson
    )
    assert train._overrides() == {"learning_rate": 1.0}
    train.hyperparameter_overrides = "{'batch_size': 64}"  # a dict rendered without native templating
    assert train._overrides() == {"batch_size": 64}
    train.hyperparameter_overrides = '{"epochs": 0}'
    with pytest.raises(AirflowFailException, match="epochs"):
        train._overrides()
    train.hyperparameter_overrides = '{"epoch": 4}'
    with pytest.raises(AirflowFailException, match="epoch"):
        train._overrides()
    train.hyperparameter_overrides = "{epochs: 4"
    with pytest.raises(AirflowFailException, match="neither JSON nor a literal"):
        train._overrides()
    train.hyperparameter_overrides = "[4]"
    with pytest.raises(AirflowFailException, match="must be a mapping, got \\[4\\]"):
        train._overrides()


def test_doc_md_describes_the_pipeline_without_secrets() -> None:
    dags = _dags(EXAMPLE_CONFIGS)
    doc = dags["fraud_detector"].doc_md
    assert "configs/fraud_detector.yaml" in doc
    assert "`roc_auc` (maximize)" in doc and "fraud_detector@champion" in doc and "ZeRO-1" in doc
    kubernetes = dags["house_prices"]
    # house_prices runs on Kubernetes with env values and secret references: none reach the docs.
    from airflow_trainpipe.config import load_config

    k8s = load_config(EXAMPLE_CONFIGS / "house_prices.yaml").training.kubernetes
    hidden = [*k8s.env.values(), *k8s.env_from, *k8s.registry_auth, *(ref.source for ref in k8s.env_keys)]
    assert hidden
    for value in hidden:
        assert str(value) not in kubernetes.doc_md


def test_asset_schedule_by_name_or_uri(tmp_path: Path) -> None:
    by_name = FRAUD.replace(
        'cron: "0 2 * * *"          # 02:00 UTC, after the upstream export lands', "asset: upstream@champion"
    )
    by_uri = by_name.replace("pipeline: fraud_detector", "pipeline: by_uri").replace(
        "asset: upstream@champion", "asset: s3://bucket/exports"
    )
    dags = _dags(_folder(tmp_path, **{"a.yaml": by_name, "b.yaml": by_uri}))
    assert dags["fraud_detector"].timetable.asset_condition == Asset.ref(name="upstream@champion")
    assert dags["by_uri"].timetable.asset_condition == Asset.ref(uri="s3://bucket/exports")


@pytest.mark.parametrize(
    ("granularity", "upstream_key", "run_key"),
    [
        ("key", "2026-01-03", "2026-01-03"),
        ("day", "2026-01-03T05:00:00", "2026-01-03"),
        ("hour", "2026-01-03T05:00:00", "2026-01-03T05"),
    ],
)
def test_a_partitioned_asset_starts_one_run_per_partition(
    tmp_path: Path, granularity: str, upstream_key: str, run_key: str
) -> None:
    text = FRAUD.replace(
        'cron: "0 2 * * *"          # 02:00 UTC, after the upstream export lands',
        f"asset: card_transactions_days\n  asset_partitions: {granularity}",
    ).replace('partition: "ds={{ ds }}"', 'partition: "ds={{ partition_key }}"')
    dag = _dags(_folder(tmp_path, **{"fraud_detector.yaml": text}))["fraud_detector"]
    timetable = dag.timetable
    assert isinstance(timetable, PartitionedAssetTimetable)
    assert timetable.asset_condition == Asset.ref(name="card_transactions_days")
    # The scheduler maps keys with the stored (deserialized) timetable's mapper.
    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
    assert stored.partitioned
    assert stored.get_partition_mapper(name="card_transactions_days").to_downstream(upstream_key) == run_key
    assert "each partition of asset `card_transactions_days` that lands" in dag.doc_md


def test_a_broken_config_becomes_a_stand_in_and_the_others_still_load(tmp_path: Path) -> None:
    broken = FRAUD.replace("pipeline: fraud_detector", "pipeline: fraud_typo").replace(
        "metric: roc_auc", "metric: roc_acu"
    )
    folder = _folder(
        tmp_path,
        **{
            "fraud_detector.yaml": FRAUD,
            "fraud_typo.yaml": broken,
            "not_yaml.yaml": "pipeline: [unclosed\n",
            "house_prices.yml": (EXAMPLE_CONFIGS / "house_prices.yaml").read_text(),
        },
    )
    dags = _dags(folder)
    assert sorted(dags) == ["broken_config__not_yaml", "fraud_detector", "fraud_typo", "house_prices"]
    typo = dags["fraud_typo"]  # under the id the file declares: the pipeline's own page shows the error
    assert BROKEN_TAG in typo.tags and typo.timetable.can_be_scheduled is False
    assert typo.description.startswith("BROKEN CONFIG configs/fraud_typo.yaml: gate.metric:")
    assert "did you mean 'roc_auc'" in typo.description
    assert "configs/fraud_typo.yaml:" in typo.doc_md and "gate.metric" in typo.doc_md
    assert typo.dag_display_name == "fraud_typo [broken config: configs/fraud_typo.yaml]"
    assert dags["broken_config__not_yaml"].description.startswith(
        "BROKEN CONFIG configs/not_yaml.yaml: <document>: invalid YAML"
    )
    assert BROKEN_TAG not in dags["fraud_detector"].tags
    [task] = typo.tasks
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"configs/fraud_typo.yaml:.*gate.metric"):
        task.execute({})


def test_two_configs_claiming_one_pipeline_name(tmp_path: Path) -> None:
    dags = _dags(_folder(tmp_path, **{"a.yaml": FRAUD, "b.yaml": FRAUD}))
    assert sorted(dags) == ["broken_config__b", "fraud_detector"]
    assert "'fraud_detector' is already defined by configs/a.yaml" in dags["broken_config__b"].description


def test_register_pipelines_binds_dags_in_the_namespace(tmp_path: Path) -> None:
    folder = _folder(tmp_path, **{"x.yaml": FRAUD})
    namespace: dict = {}
    register_pipelines(folder, namespace)
    assert list(namespace) == ["fraud_detector"]
    shutil.rmtree(folder)
    assert register_pipelines(folder, {}) == []  # a missing folder is an empty one


def test_a_dag_that_fails_to_build_becomes_its_own_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_trainpipe.factory import pipelines

    real_doc = pipelines.pipeline_doc

    def doc_with_a_bug(config, source, asset_name):  # type: ignore[no-untyped-def]
        if config.pipeline == "house_prices":
            raise KeyError("gpu")
        return real_doc(config, source, asset_name)

    monkeypatch.setattr(pipelines, "pipeline_doc", doc_with_a_bug)
    dags = _dags(
        _folder(tmp_path, **{"a.yaml": FRAUD, "b.yaml": (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()})
    )
    assert sorted(dags) == ["fraud_detector", "house_prices"]
    assert BROKEN_TAG not in dags["fraud_detector"].tags
    stand_in = dags["house_prices"]  # the pipeline's own page shows it
    assert BROKEN_TAG in stand_in.tags
    assert stand_in.description == (
        "BROKEN CONFIG configs/b.yaml: <document>: unexpected KeyError while building its DAG: "
        "'gpu'; the traceback is logged"
    )
    assert any(
        r.exc_info and r.exc_info[0] is KeyError and "configs/b.yaml" in r.getMessage()
        for r in caplog.records
    )


def test_hostile_neighbours_leave_the_valid_pipeline_alone(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        **{
            "fraud_detector.yaml": FRAUD,
            "cycle.yaml": "pipeline: evil\ntags: &x [*x]\n",
            "bomb.yaml": (HOSTILE_DIR / "billion_laughs.yaml").read_text(),
            "deep.yaml": "pipeline: evil\ntags: " + "[" * 20_000 + "]" * 20_000 + "\n",
            "a b.yaml": "pipeline: [\n",
            "a_b.yaml": "pipeline: [\n",
            "bad_name.yaml": FRAUD.replace("pipeline: fraud_detector", "pipeline: 'no spaces please'"),
        },
    )
    (folder / "x.yaml").mkdir()
    dags = _dags(folder)
    [hashed] = [
        dag_id for dag_id in dags if dag_id.startswith("broken_config__a_b__")
    ]  # `a b` and `a_b` clean alike
    assert sorted(dags) == sorted(
        [
            "broken_config__a_b",
            hashed,
            "broken_config__bad_name",
            "broken_config__bomb",
            "broken_config__cycle",
            "broken_config__deep",
            "broken_config__x",
            "fraud_detector",
        ]
    )
    assert "configs/a_b.yaml" in dags[hashed].description
    assert BROKEN_TAG not in dags["fraud_detector"].tags
    assert "alias *x refers to a node that contains it" in dags["broken_config__cycle"].description
    assert "nesting depth 33 is over the limit of 32 levels" in dags["broken_config__deep"].description
    assert "is a directory" in dags["broken_config__x"].description
    assert dags["broken_config__bad_name"].description.startswith(
        "BROKEN CONFIG configs/bad_name.yaml: pipeline:"
    )
    for dag in dags.values():
        DagSerialization.to_dict(dag)  # what the DAG processor stores


APPROVED = (
    FRAUD.replace("  retry_delay: 2m\n", "  retry_delay: 2m\n  deadline: 6h\n").replace(
        "\nregister:\n", "\nregister:\n  approval: required\n  approval_timeout: 2h\n  approvers: [alice]\n"
    )
    + "\nnotify:\n  email: [ml-oncall@example.com]\n  events: [failure, promotion, approval_needed, deadline_missed]\n"
)


def test_approval_adds_approve_and_promote_and_the_asset_moves_with_the_champion(tmp_path: Path) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    dag = _dags(_folder(tmp_path, **{"fraud.yaml": APPROVED}))["fraud_detector"]
    order = ["wait_for_data", "validate_data", "train", "gate", "register", "approve", "promote"]
    assert sorted(dag.task_ids) == sorted(order)
    for upstream, downstream in itertools.pairwise(order):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    approve = dag.get_task("approve")
    assert isinstance(approve, ApprovalOperator)
    # The schedule's retries (the example's 2), as every task: the retry policy keeps a request
    # nobody answered in time from being asked again (tests/operators/test_approval.py).
    assert (approve.defaults, approve.response_timeout, approve.retries) == (
        ["Reject"],
        timedelta(hours=2),
        2,
    )
    assert approve.assigned_users == [{"id": "alice", "name": "alice"}]
    assert list(approve.params.keys()) == ["reason"]
    assert dag.get_task("register").outlets == []
    [asset] = dag.get_task("promote").outlets
    assert asset.name == "fraud_detector@champion"
    dag.validate()
    DagSerialization.from_dict(DagSerialization.to_dict(dag))


CANARY = "\ncanary:\n  steps: [5, 25, 100]\n  step_duration: 15m\n"


@pytest.mark.parametrize("approval", [False, True])
def test_a_canary_group_promotes_after_its_last_step(tmp_path: Path, approval: bool) -> None:
    from airflow_trainpipe.operators.canary import CanaryPromoteOperator, CanaryStepOperator

    dag = _dags(_folder(tmp_path, **{"fraud.yaml": (APPROVED if approval else FRAUD) + CANARY}))[
        "fraud_detector"
    ]
    staged = ["register", "approve"] if approval else ["register"]
    group = ["canary.start", "canary.step_1", "canary.step_2", "canary.step_3", "canary.promote"]
    order = ["wait_for_data", "validate_data", "train", "gate", *staged, *group]
    assert sorted(dag.task_ids) == sorted(order)  # no `promote` beside approve: the canary's promotes
    for upstream, downstream in itertools.pairwise(order):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    steps = [dag.get_task(f"canary.step_{n}") for n in (1, 2, 3)]
    assert all(isinstance(s, CanaryStepOperator) and s.retries == 0 for s in steps)
    assert [s.step for s in steps] == [1, 2, 3]
    promote = dag.get_task("canary.promote")
    assert isinstance(promote, CanaryPromoteOperator) and promote.trigger_rule == "none_failed"
    assert dag.get_task("register").outlets == [] and not dag.get_task("register").on_success_callback
    [asset] = promote.outlets
    assert asset.name == "fraud_detector@champion"
    if approval:
        assert [n.event for n in promote.on_success_callback] == ["promotion"]
    assert dag.task_group_dict["canary"].children.keys() == set(group)
    dag.validate()
    DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_notify_wires_failure_promotion_approval_and_deadline(tmp_path: Path) -> None:
    from airflow.sdk import DeadlineReference

    from airflow_trainpipe.notifications.deadline import CALLBACK_PATH
    from airflow_trainpipe.notifications.email import PipelineEmailNotifier

    dag = _dags(_folder(tmp_path, **{"fraud.yaml": APPROVED}))["fraud_detector"]
    for task in dag.tasks:  # a failure anywhere, after its retries, is announced
        [notifier] = task.on_failure_callback
        assert isinstance(notifier, PipelineEmailNotifier) and notifier.event == "failure"
    assert [n.event for n in dag.get_task("promote").on_success_callback] == ["promotion"]
    assert not dag.get_task("register").on_success_callback  # with approval, register only stages
    assert [n.event for n in dag.get_task("approve").notifiers] == ["approval_needed"]
    [alert] = dag.deadline
    assert alert.interval == timedelta(hours=6) and alert.reference == DeadlineReference.DAGRUN_LOGICAL_DATE
    assert alert.callback.path == CALLBACK_PATH
    assert alert.callback.kwargs["email"] == ["ml-oncall@example.com"]
    # Without a notify section nothing is attached.
    plain = _dags(EXAMPLE_CONFIGS)["fraud_detector"]
    assert all(not t.on_failure_callback for t in plain.tasks) and not plain.deadline
    assert not plain.get_task("register").on_success_callback


def test_a_tuned_pipeline_runs_its_trials_as_mapped_tasks_before_train(tmp_path: Path) -> None:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from airflow_trainpipe.factory import params

    dags = _dags(
        _folder(tmp_path, **{"tuned.yaml": (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text()})
    )
    dag = dags["fraud_detector_tuned"]
    order = ["wait_for_data", "validate_data", "tune_start", "trial", "tune", "train", "gate", "register"]
    assert sorted(dag.task_ids) == sorted(order)
    for upstream, downstream in itertools.pairwise(order):
        assert upstream in dag.get_task(downstream).upstream_task_ids
    trial = dag.get_task("trial")
    assert isinstance(trial, MappedOperator)
    assert trial.expand_input.value == {"slot": list(range(16))}  # one task instance per trial
    assert trial.partial_kwargs["max_active_tis_per_dagrun"] == 2
    assert dag.get_task("tune").trigger_rule == "all_done_min_one_success"  # pruned or failed trials end
    train = dag.get_task("train")
    assert train.trigger_rule == "none_failed"  # trains alone when the form turned tuning off
    assert train.tuned == "{{ ti.xcom_pull(task_ids='tune') | tojson }}"
    assert dag.params[params.TUNE] is True and dag.get_task("tune_start").enabled == params.tune_template()
    dag.validate()
    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert sorted(stored.task_ids) == sorted(order)


def test_training_takes_pool_slots_by_the_config_and_the_light_tasks_stay_in_the_default_pool(
    tmp_path: Path,
) -> None:
    from airflow.task.priority_strategy import get_weight_rule_from_priority_weight_strategy

    tuned = (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text()
    assert "\ntuning:" in tuned
    tuned = tuned.replace("\ntuning:", "\ntuning:\n  priority_weight: 2\n#", 1)  # its trials run 1 rank
    nightly = FRAUD.replace("pipeline: fraud_detector", "pipeline: nightly").replace(
        "\ntraining:\n", "\ntraining:\n  priority_weight: 10\n", 1
    )
    dags = _dags(_folder(tmp_path, **{"tuned.yaml": tuned, "nightly.yaml": nightly}))
    for dag_id, task_id, slots, weight in [
        ("nightly", "train", 2, 10),
        ("fraud_detector_tuned", "train", 2, 1),
        ("fraud_detector_tuned", "trial", 1, 2),
    ]:
        stored = DagSerialization.from_dict(
            DagSerialization.to_dict(dags[dag_id])
        )  # as the scheduler sees it
        task = stored.get_task(task_id)
        # The weight the scheduler orders by is the config's: `downstream` would add gate's, register's...
        rule = get_weight_rule_from_priority_weight_strategy(type(task.weight_rule))
        got = (task.pool, task.pool_slots, task.priority_weight, rule)
        assert got == ("trainpipe_training", slots, weight, "absolute"), (dag_id, task_id)
        others = {t.task_id: t.pool for t in stored.tasks if t.task_id not in ("train", "trial")}
        assert set(others.values()) == {"default_pool"}, others
