"""The KServe manifests of a canary, validated offline and strictly against KServe's own CRD schema
(tests/canary/kserve/README.md: the source and its license)."""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_trainpipe.canary.kserve import inference_services, service_name
from airflow_trainpipe.config.loader import parse_config
from tests.conftest import EXAMPLE_CONFIGS

SCHEMA = Path(__file__).parent / "kserve" / "inferenceservice-v1beta1.schema.json.gz"
STORAGE = "s3://mlflow/1/models/m-0123/artifacts"


def _closed(node: Any) -> Any:
    """Strict: an object whose properties the schema lists accepts no other key."""
    if isinstance(node, dict):
        node = {k: _closed(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


@pytest.fixture(scope="module")
def validator():
    import jsonschema

    schema = _closed(json.loads(gzip.decompress(SCHEMA.read_bytes())))
    return jsonschema.Draft7Validator(schema)


def _config(steps: str = "[5, 25, 100]"):
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text() + f"\ncanary:\n  steps: {steps}\n"
    return parse_config(text, "fraud.yaml")


def _errors(validator, manifest: dict) -> list[str]:
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(manifest)]


def test_every_step_and_the_rollback_validate_strictly(validator) -> None:
    manifests = inference_services(_config(), "7", STORAGE, namespace="ml", service_account="mlflow-reader")
    assert [m["metadata"]["annotations"]["trainpipe/canary-stage"] for m in manifests] == [
        "step 1", "step 2", "step 3", "rollback"]  # fmt: skip
    assert [m["spec"]["predictor"].get("canaryTrafficPercent") for m in manifests] == [5, 25, None, 0]
    for manifest in manifests:
        assert _errors(validator, manifest) == []
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])
        assert manifest["spec"]["predictor"]["model"]["storageUri"] == STORAGE


def test_the_validator_rejects_a_broken_manifest(validator) -> None:
    manifest = inference_services(_config(), "7", STORAGE)[0]
    unknown = copy.deepcopy(manifest)
    unknown["spec"]["predictor"]["canaryTrafficPercentage"] = 5
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["predictor"]["canaryTrafficPercent"] = "5%"
    assert any("canaryTrafficPercentage" in e for e in _errors(validator, unknown))
    assert any("canaryTrafficPercent" in e for e in _errors(validator, wrong_type))


def test_a_small_share_still_gets_traffic_and_names_are_dns_labels() -> None:
    manifests = inference_services(_config("[0.5, 100]"), "3", STORAGE)
    assert manifests[0]["spec"]["predictor"]["canaryTrafficPercent"] == 1
    assert service_name("Fraud_Detector.v2") == "fraud-detector-v2"
    assert service_name("2026_model") == "m-2026-model"


def test_trainpipe_render_prints_the_canary_manifests(tmp_path: Path) -> None:
    config = tmp_path / "fraud.yaml"
    config.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text() + "\ncanary:\n  steps: [10, 100]\n"
    )
    done = subprocess.run(
        [str(Path(sys.executable).parent / "trainpipe"), "render", str(config), "--task", "canary",
         "--version", "4", "--storage-uri", STORAGE],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [d["spec"]["predictor"].get("canaryTrafficPercent") for d in documents] == [10, None, 0]
    missing = subprocess.run(
        [str(Path(sys.executable).parent / "trainpipe"), "render", str(config), "--task", "canary"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 1 and "needs --version and --storage-uri" in missing.stderr
