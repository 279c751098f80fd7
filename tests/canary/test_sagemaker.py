"""The SageMaker backend on moto's server (a process of its own on 127.0.0.1): variant weights
shifted and restored through the amazon provider's connection, a step's figures from CloudWatch,
and an alarm forced into ALARM failing the step in the trigger.

What moto leaves untested: it does not implement `UpdateEndpoint` (swapping an endpoint config:
not used here, the variants are deployed beforehand), computes no percentile statistics (the
latency check runs with `latency: null`; on AWS, ModelLatency's pXX comes from CloudWatch), and
publishes no SageMaker metrics of its own: the test puts the per-variant figures a real endpoint
publishes, then reads them back through CloudWatch's API as the backend does on AWS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from airflow_trainpipe.canary.local import ServingError
from airflow_trainpipe.canary.sagemaker import SageMakerCanary
from airflow_trainpipe.config.canary import CanaryChecks, CanarySection
from airflow_trainpipe.triggers.canary_step import CanaryStepTrigger
from tests.helpers.moto_server import MotoServer, start_moto_server
from tests.helpers.triggers import first_event

ENDPOINT = "fraud-detector"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto_server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def aws(moto: MotoServer, monkeypatch: pytest.MonkeyPatch):
    """The `aws_default` connection to moto's server, and an endpoint with two production variants."""
    import boto3

    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    extra = {"endpoint_url": moto.url, "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))
    sagemaker = boto3.client("sagemaker", endpoint_url=moto.url, region_name="us-east-1")
    role = "arn:aws:iam::123456789012:role/sagemaker"
    variants = []
    for variant in ("champion", "canary"):
        sagemaker.create_model(
            ModelName=f"fraud-{variant}", ExecutionRoleArn=role,
            PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/fraud:1"},
        )  # fmt: skip
        variants.append({"VariantName": variant, "ModelName": f"fraud-{variant}", "InitialInstanceCount": 1,
                         "InstanceType": "ml.m5.large", "InitialVariantWeight": 1.0})  # fmt: skip
    sagemaker.create_endpoint_config(EndpointConfigName="fraud-two-variants", ProductionVariants=variants)
    sagemaker.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName="fraud-two-variants")
    cloudwatch = boto3.client("cloudwatch", endpoint_url=moto.url, region_name="us-east-1")
    yield sagemaker, cloudwatch
    sagemaker.delete_endpoint(EndpointName=ENDPOINT)
    sagemaker.delete_endpoint_config(EndpointConfigName="fraud-two-variants")
    for variant in ("champion", "canary"):
        sagemaker.delete_model(ModelName=f"fraud-{variant}")


def _section(**checks: object) -> CanarySection:
    return CanarySection.model_validate(
        {
            "backend": "sagemaker",
            "sagemaker": {"endpoint_name": ENDPOINT, "alarms": ["fraud-canary-5xx"]},
            "checks": {"max_disagreement": None, "latency": None, "min_requests": 50, **checks},
        }
    )


def _publish(cloudwatch, invocations: int, errors: int) -> None:
    """What SageMaker publishes per variant each minute (moto publishes none itself)."""
    dimensions = [{"Name": "EndpointName", "Value": ENDPOINT}, {"Name": "VariantName", "Value": "canary"}]
    cloudwatch.put_metric_data(
        Namespace="AWS/SageMaker",
        MetricData=[
            {"MetricName": "Invocations", "Dimensions": dimensions, "Value": invocations, "Timestamp": datetime.now(UTC)},
            {"MetricName": "Invocation5XXErrors", "Dimensions": dimensions, "Value": errors, "Timestamp": datetime.now(UTC)},
        ],
    )  # fmt: skip


def _trigger(section: CanarySection, since: float, until: float) -> CanaryStepTrigger:
    assert section.sagemaker is not None
    return CanaryStepTrigger(
        requests_log="", since=since, until=until, checks=section.checks.model_dump(mode="json"),
        thresholds={}, poll_interval=0.2, sagemaker=section.sagemaker.model_dump(mode="json"),
    )  # fmt: skip


def test_weights_shift_step_by_step_and_a_rollback_restores_them(aws) -> None:
    section = _section()
    assert section.sagemaker is not None
    canary = SageMakerCanary(section.sagemaker)
    assert canary.start() == f"sagemaker:{ENDPOINT}"
    assert canary.weights() == {"champion": 100.0, "canary": 0.0}
    canary.set_percent(25.0)
    assert canary.weights() == {"champion": 75.0, "canary": 25.0}
    canary.rollback()
    assert canary.weights() == {"champion": 100.0, "canary": 0.0}
    canary.promote()
    assert canary.weights() == {"champion": 0.0, "canary": 100.0}


def test_a_step_is_judged_on_the_candidate_variants_cloudwatch_figures(aws) -> None:
    _, cloudwatch = aws
    section = _section(max_error_rate=0.05)  # 0 of 120 holds it at 95% (0.01 would take 381)
    since = time.time() - 1
    _publish(cloudwatch, invocations=120, errors=0)
    held = first_event(_trigger(section, since, time.time() + 1), timeout=20)
    assert held is not None and held["status"] == "held", held
    assert held["figures"]["requests"] == 120
    _publish(cloudwatch, invocations=80, errors=30)
    failed = first_event(_trigger(section, since, time.time() + 3600), timeout=20)
    assert failed is not None and failed["failed"] == [
        "error_rate 0.15 [0.1071, 0.2061] > 0.05 (200 requests)"
    ]


def test_an_alarm_in_alarm_fails_the_step_at_once(aws) -> None:
    _, cloudwatch = aws
    cloudwatch.put_metric_alarm(
        AlarmName="fraud-canary-5xx", Namespace="AWS/SageMaker", MetricName="Invocation5XXErrors",
        Statistic="Sum", Period=60, EvaluationPeriods=1, Threshold=1.0, ComparisonOperator="GreaterThanThreshold",
    )  # fmt: skip
    section = _section(min_requests=10_000)  # the figures alone never decide this step
    since = time.time()
    assert first_event(_trigger(section, since, since + 3600), timeout=1.5) is None  # OK: keeps waiting
    cloudwatch.set_alarm_state(AlarmName="fraud-canary-5xx", StateValue="ALARM", StateReason="5xx on canary")
    event = first_event(_trigger(section, since, since + 3600), timeout=20)
    assert event is not None and event["status"] == "failed"
    assert event["failed"] == ["alarm fraud-canary-5xx is in ALARM: 5xx on canary"]


def test_an_endpoint_without_the_variants_is_named(aws) -> None:
    section = CanarySection.model_validate(
        {"backend": "sagemaker", "sagemaker": {"endpoint_name": "no-such-endpoint"},
         "checks": {"max_disagreement": None}}
    )  # fmt: skip
    assert section.sagemaker is not None
    with pytest.raises(ServingError, match="no-such-endpoint"):
        SageMakerCanary(section.sagemaker).start()
    renamed = section.sagemaker.model_copy(update={"endpoint_name": ENDPOINT, "candidate_variant": "blue"})
    with pytest.raises(ServingError, match=r"needs it InService with \['blue', 'champion'\]"):
        SageMakerCanary(renamed).start()


def test_the_sagemaker_backend_refuses_checks_it_cannot_measure() -> None:
    with pytest.raises(ValueError, match="SageMaker variants never score one request twice"):
        CanarySection.model_validate({"backend": "sagemaker", "sagemaker": {"endpoint_name": ENDPOINT}})
    assert CanaryChecks().max_disagreement == 0.05
