"""Text quality on rows the pipeline never saw (issue 50, item 6): the support_tickets example's
text encoder trained from scratch by the real job, before and after the validation split / best
epoch / LR decay change, against TF-IDF + logistic regression on the same rows.

- data: one snapshot day of support tickets (the job's rows: its holdout, validation split and
  training rows, as the job splits them) and a kept-aside day written from another seed, which no
  job, tokenizer or baseline reads before it is scored;
- before: the example's config, 8 epochs, with `data.validation: null`, `training.restore_best:
  false` and `lr_schedule: constant` (epochs scored on the gate's holdout, the last one registered,
  a constant rate after warm-up), as the job behaved before the change;
- after: the same config with the change's defaults (validation split 0.1, the best epoch's weights
  registered; `lr_schedule: auto`, a constant rate from scratch: linear decay is a fine-tune's
  default, and an extra row, `TRAINPIPE_TEXT_QUALITY_EXTRA="after, linear decay:lr_schedule=linear"`,
  measures it here);
- both through the one job runner the operator and `trainpipe train` use (launchers/runner.py:
  torchrun, 2 ranks, DeepSpeed on gloo, MLflow); each run's logged model is loaded with
  `mlflow.pyfunc.load_model` and predicts the kept-aside rows from their raw columns;
- baseline: scikit-learn TF-IDF (word 1-2 grams, sublinear tf) of subject + body, the text the
  encoder reads, and a multinomial logistic regression.

`python benchmarks/text_quality_bench.py` prints the section; `make bench ONLY=text_quality` writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
NPROC, EPOCHS = 2, 8
SNAPSHOT_DAY, SNAPSHOT_ROWS, SNAPSHOT_SEED = date(2026, 1, 1), 11_000, 11
KEPT_DAY, KEPT_ROWS, KEPT_SEED = date(2026, 1, 2), 3_000, 23
C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
BEFORE = {"data.validation": None, "training.restore_best": False, "lr_schedule": "constant"}
PREDICTED_LABEL = "predicted_label"  # contracts/predictions.py; never read, only skipped
# Extra rows, each one knob a user would turn, named `label:key=value,key=value` and separated by
# `;`, e.g. TRAINPIPE_TEXT_QUALITY_EXTRA="lr 5e-4:learning_rate=0.0005". Empty: the headline rows.
EXTRA = os.environ.get("TRAINPIPE_TEXT_QUALITY_EXTRA", "")


def _config(tmp: Path, before: bool, **hyperparameters: object) -> str:
    config = yaml.safe_load((REPO / "dags/configs/support_tickets.yaml").read_text())
    config["training"]["checkpoint"]["uri"] = (tmp / "checkpoints").as_uri()
    config["training"]["hyperparameters"].update(epochs=EPOCHS, **hyperparameters)
    if before:
        config["data"]["validation"] = None
        config["training"]["restore_best"] = False
        config["training"]["hyperparameters"]["lr_schedule"] = "constant"
    return yaml.safe_dump(config, sort_keys=False)


@contextlib.contextmanager
def _home(home: Path) -> Iterator[str]:
    """TRAINPIPE_HOME and MLflow's tracking URI of this bench alone (its jobs and this process),
    the caller's restored after."""
    import mlflow

    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    saved = {k: os.environ.get(k) for k in ("TRAINPIPE_HOME", "MLFLOW_TRACKING_URI")}
    previous_uri = mlflow.get_tracking_uri()
    os.environ["TRAINPIPE_HOME"] = str(home)
    uri = os.environ["MLFLOW_TRACKING_URI"] = default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        mlflow.set_tracking_uri(previous_uri)


def _write(tmp: Path) -> tuple[list[str], list[str]]:
    from airflow_trainpipe.examples.synthetic import write_day

    snapshot = write_day((tmp / "snapshot").as_uri(), SNAPSHOT_DAY, SNAPSHOT_ROWS, seed=SNAPSHOT_SEED,
                         kind="support_tickets")  # fmt: skip
    kept = write_day(
        (tmp / "kept_aside").as_uri(), KEPT_DAY, KEPT_ROWS, seed=KEPT_SEED, kind="support_tickets"
    )
    return snapshot, kept


def _table(files: list[str]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_trainpipe.core.storage import local_path

    return pa.concat_tables([pq.read_table(local_path(f)) for f in files])


def _text(frame: Any, columns: list[str]) -> list[str]:
    """The config's text columns joined: what the encoder reads as one pair, as one string."""
    return frame[columns].fillna("").astype(str).agg(" ".join, axis=1).tolist()


def _train(
    tmp: Path, snapshot: list[str], name: str, before: bool, **hyperparameters: object
) -> dict[str, Any]:
    """One job to its end; its result, its per-epoch curve from MLflow, its wall time."""
    from mlflow.tracking import MlflowClient

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.launchers.runner import Placement, run_training

    config = parse_config(_config(tmp, before, **hyperparameters))
    spec = TrainSpec.from_manifest(
        config, f"text_quality_{name}", None, snapshot
    )  # as `trainpipe train --data`
    tail: list[str] = []
    started = time.perf_counter()
    try:
        result = run_training(spec, Placement(nproc=NPROC, show_raw=True), on_line=lambda t: tail.append(t))
    except Exception as exc:
        raise RuntimeError(f"training job {name} failed:\n" + "\n".join(tail[-40:])) from exc
    seconds = time.perf_counter() - started
    prefix = "holdout" if before else "validation"
    history = MlflowClient().get_metric_history(result.mlflow_run_id, f"{prefix}_macro_f1")
    # Each epoch's value, logged at its end. The job logs the published weights' metrics again at
    # its last step when it ends (runtime/finish.py): that later entry of the last step is not an epoch's.
    curve: dict[int, float] = {}
    for m in sorted(history, key=lambda m: m.timestamp):  # stable: equal stamps keep MLflow's order
        curve.setdefault(m.step, m.value)
    if len(curve) != result.epochs_completed:
        raise RuntimeError(
            f"{name}: {len(curve)} epoch values of {prefix}_macro_f1 for {result.epochs_completed} epochs"
        )
    return {
        "result": result,
        "curve": sorted(curve.items()),
        "logged": len(history),
        "scored_on": prefix,
        "seconds": seconds,
    }


def _predict(model_uri: str, rows: Any, classes: list[str]) -> list[str]:
    """The class of highest probability in the model's answer: its per-class columns (named by the
    classes), whatever else the answer carries (a `predicted_label` column, or none)."""
    import mlflow.pyfunc
    import numpy as np

    answer = mlflow.pyfunc.load_model(model_uri).predict(rows)
    columns = [c for c in answer.columns if c != PREDICTED_LABEL]
    if sorted(map(str, columns)) != sorted(classes):
        raise RuntimeError(
            f"{model_uri} answered columns {list(answer.columns)}, expected the classes {classes}"
        )
    probabilities = answer[columns].to_numpy(dtype=float)
    return [str(columns[i]) for i in np.argmax(probabilities, axis=1)]


def _baseline(splits: dict[str, Any], kept: Any, text: list[str], label: str) -> dict[str, Any]:
    """TF-IDF + logistic regression on the kept-aside rows: C chosen by macro-F1 on the validation
    rows (fitted on the training rows), then fitted with it on those training rows (`chosen`); and
    the default C=1.0 fitted on the snapshot minus its holdout, the rows *before* trains on."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.pipeline import make_pipeline

    def fitted(c: float, frame: Any) -> Any:
        model = make_pipeline(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), LogisticRegression(C=c, max_iter=5000)
        )
        return model.fit(_text(frame, text), frame[label].astype(str))

    def f1(model: Any, frame: Any) -> float:
        return float(f1_score(frame[label].astype(str), model.predict(_text(frame, text)), average="macro"))

    models = {c: fitted(c, splits["train"]) for c in C_GRID}
    by_c = {c: f1(model, splits["validation"]) for c, model in models.items()}
    best_c = max(by_c, key=lambda c: by_c[c])  # the first of equals: the smaller C
    return {
        "validation_by_c": by_c,
        "c": best_c,
        "chosen": f1(models[best_c], kept),
        "predicted": [str(p) for p in models[best_c].predict(_text(kept, text))],
        "default_before_rows": f1(fitted(1.0, splits["before_train"]), kept),
    }


def _extras() -> list[tuple[str, dict[str, object]]]:
    rows = []
    for item in filter(None, (part.strip() for part in EXTRA.split(";"))):
        label, _, knobs = item.partition(":")
        values = {}
        for knob in knobs.split(","):
            key, _, value = knob.partition("=")
            values[key.strip()] = yaml.safe_load(value)
        rows.append((label.strip(), values))
    return rows


def _shown(name: str, found: Any) -> Any:
    print(f"text quality bench, {name}: {json.dumps(found, default=str)}", file=sys.stderr, flush=True)
    return found


def measure(tmp: Path) -> dict[str, Any]:
    import numpy as np
    from sklearn.metrics import f1_score

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.runtime.data.reader import HoldoutSplit

    snapshot, kept_files = _write(tmp)
    config = parse_config(_config(tmp, before=False))
    data, label = config.data, config.data.label
    text = list(data.features.text)
    table = _table(snapshot)
    holdout, validation = HoldoutSplit(data, data.validation_split()).sides_at(table, 0)
    frame = table.to_pandas()
    kept = _table(kept_files).to_pandas()
    classes = sorted(frame[label].astype(str).unique())
    overlap = set(frame[data.holdout.key_column]) & set(kept[data.holdout.key_column])
    if overlap:
        raise RuntimeError(f"the kept-aside rows share {len(overlap)} ticket ids with the snapshot")
    splits = {
        "train": frame[~holdout & ~validation],
        "validation": frame[validation],
        "before_train": frame[~holdout],
        "holdout": frame[holdout],
    }
    sizes = _shown("rows", {name: len(rows) for name, rows in splits.items()} | {"kept": len(kept)})
    baseline = _baseline(splits, kept, text, label)
    _shown("baseline", {k: v for k, v in baseline.items() if k != "predicted"})
    runs: dict[str, dict[str, Any]] = {}
    predictions: dict[str, list[str]] = {}
    truth = kept[label].astype(str)
    kept_rows = kept.drop(columns=[label])
    with _home(tmp / "home"):
        plan: list[tuple[str, bool, dict[str, object]]] = [("before", True, {}), ("after", False, {})] + [
            (name, False, hp) for name, hp in _extras()
        ]
        for name, before, hyperparameters in plan:
            run = _train(tmp, snapshot, name.replace(" ", "_").replace(".", ""), before, **hyperparameters)
            result = run.pop("result")
            predicted = predictions[name] = _predict(result.model_uri, kept_rows, classes)
            steps = [step for step, _ in run["curve"]]
            weights_step = result.weights_step if result.weights_step is not None else result.final_step
            runs[name] = _shown(
                name,
                {
                    **run,
                    "hyperparameters": hyperparameters,
                    "kept_macro_f1": float(f1_score(truth, predicted, average="macro")),
                    "kept_accuracy": float(np.mean(np.asarray(predicted) == truth.to_numpy())),
                    "gate_holdout_macro_f1": result.evaluation.candidate["macro_f1"]
                    if result.evaluation
                    else None,
                    "weights_step": weights_step,
                    "weights_epoch": steps.index(weights_step) + 1 if weights_step in steps else None,
                    "final_step": result.final_step,
                    "epochs": result.epochs_completed,
                },
            )
    predictions["TF-IDF + LR"] = baseline.pop("predicted")
    intervals = _shown("paired bootstrap", _paired_bootstrap(truth.tolist(), predictions, classes))
    return {"sizes": sizes, "baseline": baseline, "runs": runs, "intervals": intervals}


def _macro_f1(truth: Any, predicted: Any, classes: int) -> Any:
    """Macro-F1 of class indices, one row of `truth`/`predicted` per resample (numpy; the same
    number as scikit-learn's `f1_score(average="macro")` when every class occurs)."""
    import numpy as np

    f1 = []
    for c in range(classes):
        tp = ((truth == c) & (predicted == c)).sum(axis=-1)
        wrong = (truth == c).sum(axis=-1) + (predicted == c).sum(axis=-1)
        f1.append(np.where(wrong > 0, 2 * tp / np.maximum(wrong, 1), 0.0))
    return np.mean(f1, axis=0)


def _paired_bootstrap(
    truth: list[str], predictions: dict[str, list[str]], classes: list[str], resamples: int = 2000
) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of the macro-F1 difference of each pair, the same resampled
    kept-aside rows for both sides of a pair."""
    import numpy as np

    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[t] for t in truth])
    draws = np.random.default_rng(0).integers(0, len(y), size=(resamples, len(y)))
    scores = {name: _macro_f1(y[draws], np.array([index[p] for p in ps])[draws], len(classes))
              for name, ps in predictions.items()}  # fmt: skip
    pairs = [("after", "TF-IDF + LR"), ("before", "TF-IDF + LR"), ("after", "before")]
    return {
        f"{a} - {b}": (
            float(np.percentile(scores[a] - scores[b], 2.5)),
            float(np.percentile(scores[a] - scores[b], 97.5)),
        )
        for a, b in pairs
    }


def _curve(run: dict[str, Any]) -> str:
    return " ".join(f"{value:.3f}" for _, value in run["curve"])


def bench_text_quality() -> list[str]:
    with tempfile.TemporaryDirectory() as name:
        found = measure(Path(name))
    sizes, baseline, runs, intervals = found["sizes"], found["baseline"], found["runs"], found["intervals"]
    base = baseline["chosen"]
    before, after = runs["before"], runs["after"]
    lines = [
        "## Text quality: kept-aside tickets, the job from scratch vs TF-IDF + logistic regression (issue 50)",
        "",
        "The support_tickets example (`dags/configs/support_tickets.yaml`: its text encoder, 2 layers, hidden 64,",
        "WordPiece of 800 on subject+body; batch 128 per rank, learning rate 0.002, seed 11) trained from",
        f"scratch for {EPOCHS} epochs by the real job (launchers/runner.py: torchrun, {NPROC} CPU ranks, DeepSpeed",
        f"ZeRO-1 on gloo, MLflow), on one day of {SNAPSHOT_ROWS:,} tickets (seed {SNAPSHOT_SEED}). Scored on {KEPT_ROWS:,}",
        f"kept-aside tickets of another day and seed ({KEPT_DAY}, seed {KEPT_SEED}: no job, tokenizer or baseline saw",
        "them) through each run's logged MLflow model (`mlflow.pyfunc.load_model`, raw rows in; the class of",
        "highest probability). Rows of the snapshot: gate holdout "
        f"{sizes['holdout']:,} (20%, by ticket_id), validation {sizes['validation']:,}, training {sizes['train']:,}.",
        "",
        "- *before*: `data.validation: null`, `training.restore_best: false`, `lr_schedule: constant` (epochs",
        f"  scored on the gate's holdout, the last epoch registered, a constant rate): trains on {sizes['before_train']:,} rows.",
        "- *after*: the defaults (validation split 0.1, the best epoch's weights registered, `lr_schedule: auto`:",
        "  a constant rate from scratch; linear decay is what auto means for a fine-tune, measured in an extra row):",
        f"  trains on {sizes['train']:,} rows, chooses its epoch on {sizes['validation']:,}.",
        '- *TF-IDF + LR*: scikit-learn `TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)` of subject + " " +',
        "  body, `LogisticRegression` (lbfgs, multinomial); C chosen from "
        f"{', '.join(f'{c:g}' for c in C_GRID)} by macro-F1 on the",
        f"  validation rows (fitted on the {sizes['train']:,} training rows: "
        + ", ".join(f"C={c:g} {v:.4f}" for c, v in baseline["validation_by_c"].items())
        + f"; chose C={baseline['c']:g}),",
        f"  and that fit, on the {sizes['train']:,} training rows the *after* job trains on, is the one scored.",
        "  It reads the text alone; the encoder's model also reads the example's numeric and categorical columns.",
        "",
        f"Command: `{'TRAINPIPE_TEXT_QUALITY_EXTRA=' + repr(EXTRA) + ' ' if EXTRA else ''}make bench ONLY=text_quality` "
        f'({os.cpu_count()} cores, no GPU). Macro-F1: scikit-learn `f1_score(average="macro")`',
        "on the kept-aside rows; the curve is each epoch's macro-F1 as the job scored it (MLflow), on the holdout",
        "(*before*) or the validation split (*after*).",
        "",
        "| run | kept-aside macro-F1 | / TF-IDF + LR | accuracy | registered | gate holdout macro-F1 | per-epoch curve | wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        epoch = run["weights_epoch"]
        registered = f"epoch {epoch} (step {run['weights_step']})" if epoch else f"step {run['weights_step']}"
        knobs = ", ".join(f"{k}={v}" for k, v in run["hyperparameters"].items())
        label = f"{name} ({knobs}; extra row, not the example's settings)" if knobs else name
        gate = run["gate_holdout_macro_f1"]
        lines.append(
            f"| {label} | **{run['kept_macro_f1']:.4f}** | **{run['kept_macro_f1'] / base:.3f}** "
            f"| {run['kept_accuracy']:.4f} | {registered} | {'-' if gate is None else f'{gate:.4f}'} "
            f"| {run['scored_on']}: {_curve(run)} | {run['seconds']:.0f} |"
        )
    lines += [
        f"| TF-IDF + LR (C={baseline['c']:g}) | **{base:.4f}** | 1.000 | - | - | - | - | - |",
        f"| TF-IDF + LR (C=1, default; fitted on the {sizes['before_train']:,} rows *before* trains on) "
        f"| {baseline['default_before_rows']:.4f} | {baseline['default_before_rows'] / base:.3f} | - | - | - | - | - |",
        "",
        f"- after / TF-IDF + LR = **{after['kept_macro_f1'] / base:.3f}**, before / TF-IDF + LR = "
        f"**{before['kept_macro_f1'] / base:.3f}** (after - before: {after['kept_macro_f1'] - before['kept_macro_f1']:+.4f} macro-F1)",
        "- the same kept-aside rows resampled (paired bootstrap, 2,000 draws), 95% interval of the macro-F1 difference: "
        + "; ".join(f"{pair} [{low:+.4f}, {high:+.4f}]" for pair, (low, high) in intervals.items()),
        "",
        "Target: from scratch (after) >= 0.9x TF-IDF + logistic regression macro-F1: "
        + ("met." if after["kept_macro_f1"] >= 0.9 * base else "NOT met."),
        "",
    ]
    return lines


if __name__ == "__main__":
    print("\n".join(bench_text_quality()))
