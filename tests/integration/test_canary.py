"""The canary through Airflow's own dag.test(): real training, real `mlflow models serve` processes,
the real router, and real traffic replayed from the day's rows while the steps wait in the triggerer."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.canary.callers import CanaryCaller
from airflow_trainpipe.examples.synthetic import write_day
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import run_factory_pipeline
from tests.helpers.canary_models import day_rows

CANARY = {
    "steps": [20, 100],
    "step_duration": "8s",
    "poll_interval": "1s",
    # An 8 s step sees ~240 requests: enough to hold an error rate below 0.05 at 95% (73 needed),
    # not below the default 0.01 (381 needed: docs/canary.md).
    "checks": {"min_requests": 20, "max_error_rate": 0.05, "latency": {"percentile": 95, "max_ms": 3000}},
}
TASKS = ["wait_for_data", "validate_data", "train", "gate", "register",
         "canary.start", "canary.step_1", "canary.step_2", "canary.promote"]  # fmt: skip


def _config() -> dict:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["pipeline"] = "fraud_canary"
    config["data"]["wait"] = {"marker": "_SUCCESS", "mode": "poke", "poke_interval": "1s", "timeout": "1m"}
    config["canary"] = CANARY
    return config


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_first_model_is_promoted_without_a_canary_the_next_walks_every_step_and_a_third_is_rolled_back(
    airflow_env: dict[str, str], smtp_server
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.canary.local import LocalCanary
    from airflow_trainpipe.config.canary import LocalServing

    home = Path(airflow_env["TRAINPIPE_HOME"])
    for day in (date(2026, 1, 2), date(2026, 1, 3), date(2026, 1, 4)):
        write_day((home / "data" / "card_transactions").as_uri(), day, 3000, seed=day.day)
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    try:
        # No champion yet: nothing to canary against; canary.promote makes the first one.
        run, output = run_factory_pipeline(airflow_env, _config(), "2026-01-02")
        assert run["tasks"]["canary.start"] == "skipped", output[-6000:]
        assert run["tasks"]["canary.promote"] == "success", output[-6000:]
        first = client.get_model_version_by_alias("fraud_canary", "champion")
        assert first.tags["trainpipe.canary.result"] == "no_champion"

        # The next day's model serves beside it while the day's rows arrive as requests.
        traffic = CanaryCaller(
            home / "canary" / "fraud_canary" / f"v{int(first.version) + 1}",
            day_rows(home, "2026-01-03"),
            per_second=50,
        )
        traffic.start()
        # Forced past the gate: whether a day's model beats the last is not what is tested here.
        run, output = run_factory_pipeline(
            airflow_env, _config(), "2026-01-03", run_conf={"force_registration": True}
        )
        traffic.stop()
        assert run["tasks"] == dict.fromkeys(TASKS, "success"), output[-8000:]
        second = client.get_model_version_by_alias("fraud_canary", "champion")
        assert int(second.version) == int(first.version) + 1
        assert second.tags["trainpipe.canary.result"] == "promoted"
        assert str(client.get_model_version_by_alias("fraud_canary", "previous_champion").version) == str(
            first.version
        )
        assert "canary" not in client.get_registered_model("fraud_canary").aliases
        assert "step 1: 20% of the traffic on version" in output
        assert '"disagreement": ' in output and "running trigger in line" in output
        assert traffic.statuses and set(traffic.statuses) == {200}

        # Day 3's candidate ranks as well as ever (its roc_auc is threshold-free) but flags at a
        # mistyped fixed threshold: on live traffic it decides differently from the champion.
        broken = _config()
        broken["evaluation"]["threshold"] = 0.99
        broken["notify"] = {
            "email": ["ml-oncall@example.com"],
            "events": ["failure"],
            "smtp_conn_id": "smtp_test",
            "from_email": "trainpipe@example.com",
        }
        env = {**airflow_env, "AIRFLOW_CONN_SMTP_TEST": smtp_server.connection_json()}
        traffic = CanaryCaller(
            home / "canary" / "fraud_canary" / f"v{int(second.version) + 1}",
            day_rows(home, "2026-01-04"),
            per_second=50,
        )
        traffic.start()
        run, output = run_factory_pipeline(env, broken, "2026-01-04", run_conf={"force_registration": True})
        traffic.stop()
        assert run["tasks"]["canary.step_1"] == "failed", output[-8000:]
        assert run["tasks"]["canary.step_2"] == run["tasks"]["canary.promote"] == "upstream_failed"
        assert "failed: disagreement" in output
        assert int(client.get_model_version_by_alias("fraud_canary", "champion").version) == int(
            second.version
        )
        third = client.get_model_version(name="fraud_canary", version=str(int(second.version) + 1))
        assert third.tags["trainpipe.canary.result"] == "rolled_back"
        assert third.tags["trainpipe.canary.failed"].startswith("disagreement")
        assert "canary" not in client.get_registered_model("fraud_canary").aliases
        mail = smtp_server.inbox.wait_for("task canary.step_1 failed", timeout=30)
        assert "disagreement" in mail.html
    finally:
        for state in (home / "canary" / "fraud_canary").glob("v*"):
            LocalCanary(state, LocalServing()).stop()
