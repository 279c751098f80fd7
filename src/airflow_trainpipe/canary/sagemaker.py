"""The SageMaker canary backend: two production variants of one endpoint, weights shifted.

The endpoint is deployed beforehand with one production variant per model (the champion's and
the candidate's): deploying MLflow models to SageMaker images is the team's own pipeline. Here
the traffic moves with `UpdateEndpointWeightsAndCapacities` (no redeploy, no downtime), and a
step's figures come from the candidate variant's CloudWatch metrics (`AWS/SageMaker`:
Invocations, Invocation5XXErrors, ModelLatency), plus the alarms the config names: one in ALARM
fails the step. SageMaker's own rollback acts only on alarms during an endpoint update; this one
also judges error rate and latency at each step, and decides the promotion.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_trainpipe.canary.checks import StepFigures
from airflow_trainpipe.canary.local import ServingError
from airflow_trainpipe.config.canary import SageMakerServing

NAMESPACE = "AWS/SageMaker"
PERIOD_S = 60  # SageMaker publishes its endpoint metrics per minute


class SageMakerCanary:
    def __init__(self, settings: SageMakerServing):
        self.settings = settings

    def _client(self, kind: str) -> Any:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        return AwsBaseHook(aws_conn_id=self.settings.aws_conn_id, client_type=kind).get_conn()

    def start(self) -> str:
        """Checks the endpoint serves both variants; the candidate starts with no traffic."""
        endpoint = self._describe()
        variants = {v["VariantName"] for v in endpoint.get("ProductionVariants", [])}
        wanted = {self.settings.champion_variant, self.settings.candidate_variant}
        if endpoint["EndpointStatus"] != "InService" or not wanted <= variants:
            raise ServingError(
                f"SageMaker endpoint {self.settings.endpoint_name} is {endpoint['EndpointStatus']} with variants "
                f"{sorted(variants)}; the canary needs it InService with {sorted(wanted)}"
            )
        self.set_percent(0.0)
        return f"sagemaker:{self.settings.endpoint_name}"

    def set_percent(self, percent: float) -> None:
        """The candidate variant's share of the endpoint's traffic (weights are relative)."""
        self._client("sagemaker").update_endpoint_weights_and_capacities(
            EndpointName=self.settings.endpoint_name,
            DesiredWeightsAndCapacities=[
                {"VariantName": self.settings.champion_variant, "DesiredWeight": 100.0 - percent},
                {"VariantName": self.settings.candidate_variant, "DesiredWeight": percent},
            ],
        )

    def weights(self) -> dict[str, float]:
        """Each variant's current weight, as the endpoint reports it."""
        return {
            v["VariantName"]: float(v.get("CurrentWeight", 0.0))
            for v in self._describe()["ProductionVariants"]
        }

    def rollback(self) -> None:
        self.set_percent(0.0)

    def promote(self) -> None:
        self.set_percent(100.0)

    def step_figures(self, since: float, until: float, percentile: float) -> StepFigures:
        """The candidate variant's figures over [since, until), and the alarms now in ALARM."""
        cloudwatch = self._client("cloudwatch")
        start = datetime.fromtimestamp(since, UTC)
        end = min(datetime.fromtimestamp(until, UTC), datetime.now(UTC)) + timedelta(seconds=1)
        invocations = self._sum(cloudwatch, "Invocations", start, end)
        errors = self._sum(cloudwatch, "Invocation5XXErrors", start, end)
        latency = self._latency_ms(cloudwatch, start, end, percentile)
        figures = StepFigures(
            requests=int(invocations),
            served=int(invocations),
            errors=int(errors),
            latency_at_percentile_ms=latency,
            latency_unreported=latency is None and invocations > 0,
        )
        figures.alarms = self._alarms_firing(cloudwatch)
        return figures

    def _describe(self) -> dict[str, Any]:
        try:
            endpoint: dict[str, Any] = self._client("sagemaker").describe_endpoint(
                EndpointName=self.settings.endpoint_name
            )
        except Exception as exc:  # botocore's ClientError: a missing endpoint, or no access
            raise ServingError(f"SageMaker endpoint {self.settings.endpoint_name}: {exc}") from exc
        return endpoint

    def _dimensions(self) -> list[dict[str, str]]:
        return [
            {"Name": "EndpointName", "Value": self.settings.endpoint_name},
            {"Name": "VariantName", "Value": self.settings.candidate_variant},
        ]

    def _sum(self, cloudwatch: Any, metric: str, start: datetime, end: datetime) -> float:
        answer = cloudwatch.get_metric_statistics(
            Namespace=NAMESPACE, MetricName=metric, Dimensions=self._dimensions(),
            StartTime=start, EndTime=end, Period=PERIOD_S, Statistics=["Sum"],
        )  # fmt: skip
        return float(sum(point["Sum"] for point in answer["Datapoints"]))

    def _latency_ms(self, cloudwatch: Any, start: datetime, end: datetime, percentile: float) -> float | None:
        statistic = f"p{percentile:g}"
        answer = cloudwatch.get_metric_statistics(
            Namespace=NAMESPACE, MetricName="ModelLatency", Dimensions=self._dimensions(),
            StartTime=start, EndTime=end, Period=PERIOD_S, ExtendedStatistics=[statistic],
        )  # fmt: skip
        values = [
            p["ExtendedStatistics"][statistic]
            for p in answer["Datapoints"]
            if statistic in p.get("ExtendedStatistics", {})
        ]
        return max(values) / 1000 if values else None  # ModelLatency is in microseconds

    def _alarms_firing(self, cloudwatch: Any) -> list[str]:
        if not self.settings.alarms:
            return []
        answer = cloudwatch.describe_alarms(AlarmNames=self.settings.alarms)
        return [
            f"alarm {alarm['AlarmName']} is in ALARM: {alarm.get('StateReason', '')}"
            for alarm in answer["MetricAlarms"]
            if alarm["StateValue"] == "ALARM"
        ]
