"""What a training run leaves on its MLflow run, by name: the files the tasks, `trainpipe
reproduce` and the gate read back, and the library versions its lineage records.

The job writes them and the tasks read them in other processes, so the names live here, below
both, instead of in one side that the other would have to import.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

SPEC_ARTIFACT = "spec.json"
"""The validated TrainSpec the job ran: what `trainpipe reproduce` trains again from."""
RESULT_ARTIFACT = "result.json"
"""The job's TrainResult (also written to the run directory for the launcher)."""
TRANSFORM_ARTIFACT = "transform.json"
"""The fitted transform (its tokenizers among it): validation reads the champion's vocabulary."""
EVALUATION_ARTIFACT = "evaluation.json"
"""The final evaluation: candidate and champion on the same holdout, curves, slices."""
GATE_REPORT_ARTIFACT = "gate/report.html"
"""The gate's HTML report, logged to the candidate's run (the Gate report link)."""
GATE_DECISION_ARTIFACT = "gate/decision.json"
"""The gate's decision (GateDecision.as_dict()), beside its report."""
GATE_CHART_ARTIFACT = "gate/comparison.png"
"""The gate's candidate-vs-champion chart."""
CANARY_REPORT_ARTIFACT = "canary/report.html"
"""The canary's HTML report, logged to the version's run (the version's `trainpipe.canary.report` tag)."""

LIBRARIES = ("torch", "deepspeed", "numpy", "pyarrow", "pandas", "mlflow")


def library_versions() -> dict[str, str]:
    """The versions a model's numbers can depend on (read from package metadata: no imports)."""
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


HEAD_CONFIG_FILE = "trainpipe.json"
"""In a fine-tuned model's Hugging Face directory (the `hf` artifact): what a plain encoder has no
place for (the model kind, the task, the classes, the text input, where it was fine-tuned from),
beside `trainpipe_head.safetensors` (runtime/pretrained/export.py writes it, directory.py reads it)."""
