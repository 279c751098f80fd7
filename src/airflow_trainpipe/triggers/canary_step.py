"""CanaryStepTrigger: a canary step waits in the triggerer, not in a worker slot.

A step lasts minutes to hours. Its window is absolute (`since`, `until`: epoch seconds), so a
triggerer or scheduler that restarts rebuilds this trigger from its serialized arguments and
judges exactly the same requests; the request log it reads is the router's file, which outlives
every Airflow process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_trainpipe.canary.checks import StepFigures, Thresholds, Verdict, judge, read_step
from airflow_trainpipe.config.canary import CanaryChecks


class CanaryStepTrigger(BaseTrigger):
    """Reads the step's figures every `poll_interval` seconds; fires once the step held (at
    `until`) or failed (as soon as a check's interval clears its threshold on enough requests)."""

    def __init__(
        self,
        *,
        requests_log: str,
        since: float,
        until: float,
        checks: dict[str, Any],
        thresholds: dict[str, float],
        poll_interval: float = 30.0,
        sagemaker: dict[str, Any] | None = None,
        confidence: float = 0.95,
        undecided: str = "fail",
    ) -> None:
        super().__init__()
        self.requests_log, self.since, self.until = requests_log, since, until
        self.checks, self.thresholds, self.poll_interval = checks, thresholds, poll_interval
        self.sagemaker = sagemaker  # the SageMaker backend's settings; None: the local router's log
        # canary.confidence and canary.undecided (defaults: a trigger serialized before they existed)
        self.confidence, self.undecided = confidence, undecided

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "requests_log": self.requests_log,
            "since": self.since,
            "until": self.until,
            "checks": self.checks,
            "thresholds": self.thresholds,
            "poll_interval": self.poll_interval,
            "sagemaker": self.sagemaker,
            "confidence": self.confidence,
            "undecided": self.undecided,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        checks = CanaryChecks.model_validate(self.checks)
        while True:
            ended = time.time() >= self.until
            try:
                figures, verdict = await asyncio.to_thread(self._judge, checks, ended)
            except Exception as exc:  # an unreadable log: the task reports it and rolls back
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if verdict.holds is not None:
                yield TriggerEvent(step_event(figures, verdict, checks))
                return
            self.log.info(
                "step so far: %s", "; ".join(d.describe() for d in verdict.checks) or figures.summary(checks)
            )
            await asyncio.sleep(max(0.05, min(self.poll_interval, self.until - time.time())))

    def _judge(self, checks: CanaryChecks, ended: bool) -> tuple[StepFigures, Verdict]:
        if self.sagemaker is not None:
            from airflow_trainpipe.canary.sagemaker import SageMakerCanary
            from airflow_trainpipe.config.canary import SageMakerServing

            percentile = checks.latency.percentile if checks.latency is not None else 99.0
            figures = SageMakerCanary(SageMakerServing.model_validate(self.sagemaker)).step_figures(
                self.since, self.until, percentile
            )
        else:
            figures = read_step(
                Path(self.requests_log), self.since, self.until, Thresholds(**self.thresholds)
            )
        return figures, judge(figures, checks, ended, self.confidence, self.undecided)


def step_event(figures: StepFigures, verdict: Verdict, checks: CanaryChecks) -> dict[str, Any]:
    return {
        "status": "held" if verdict.holds else "failed",
        "failed": list(verdict.failed),
        "figures": figures.summary(checks),
        "checks": [decision.to_dict() for decision in verdict.checks],
        "examples": figures.examples,
    }
