"""The gate's report: one self-contained HTML page per decision, logged to the candidate's run.

What a reviewer needs to agree or disagree with the verdict, on one page: the verdict and its
reason; the primary metric, the improvement and (with `gate.confidence`) its interval against
zero and `min_improvement`; every metric of both models; the guardrails; the task's own charts
(ROC and precision-recall curves for binary classification, recall per class for multiclass,
NDCG@k and MAP@k for ranking); and the slice table. Charts are inline SVG drawn by matplotlib, so
the page needs nothing else to open (MLflow's artifact viewer shows it in a sandboxed frame).
Run at execute() time only: matplotlib is imported inside.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.catalog import MAP_CUTOFFS, NDCG_CUTOFFS

if TYPE_CHECKING:
    from airflow_trainpipe.contracts.payloads import Evaluation, GateDecision

CANDIDATE, CHAMPION, BAD = "#4c72b0", "#999999", "#c44e52"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.verdict{padding:12px 16px;border-radius:6px;font-size:15px}
.promote{background:#e3f1e3;border:1px solid #6a6}.keep{background:#fbe9e9;border:1px solid #c66}
.fail{color:#c44e52;font-weight:600}.charts svg{max-width:100%;height:auto}
"""


def gate_report_html(
    decision: GateDecision,
    evaluation: Evaluation,
    task: str,
    curves: dict[str, Any] | None = None,
    comparison: Any = None,
    slice_guardrail: bool = False,
) -> str:
    """The page. `curves`: evaluation.json's ROC/PR points (binary); `comparison`: the gate's
    per-metric bar figure, embedded as it was logged; `slice_guardrail`: whether the config holds
    slices to one (a slice it did not check then had too few rows, even when none reached them)."""
    verdict = (
        ("PROMOTE" + (" (forced)" if decision.forced else "")) if decision.promote else "KEEP THE CHAMPION"
    )
    title = f"Gate report: {decision.model_name or 'model'}, run {decision.mlflow_run_id or '?'}"
    sections = [
        f"<h1>{_text(title)}</h1>",
        f'<div class="verdict {"promote" if decision.promote else "keep"}"><b>{verdict}</b>: '
        f"{_text(decision.reason)}</div>",
        "<h2>Primary metric</h2>",
        _primary_table(decision, evaluation),
    ]
    if decision.improvement_interval is not None:
        sections += [
            f"<h2>Improvement interval ({decision.confidence:.0%} paired bootstrap)</h2>",
            _svg(_interval_figure(decision)),
        ]
    sections += ["<h2>Every metric</h2>", _metrics_table(evaluation)]
    if decision.guardrails:
        sections += ["<h2>Guardrails</h2>", _guardrail_table(decision)]
    charts = _task_figures(task, evaluation, curves)
    if charts:
        sections += ["<h2>Candidate vs champion</h2>", '<div class="charts">', *map(_svg, charts), "</div>"]
    if comparison is not None:
        sections += [
            "<h2>Metrics side by side</h2>",
            f'<div class="charts">{_svg(comparison, close=False)}</div>',
        ]
    if evaluation.slices:
        sections += ["<h2>Slices</h2>", _slice_table(decision, evaluation, slice_guardrail)]
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_text(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>"
    )


def _text(value: Any) -> str:
    return html.escape(str(value))


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}" if isinstance(value, int | float) else _text(value)


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _primary_table(decision: GateDecision, evaluation: Evaluation) -> str:
    rows = [
        ("metric", _text(f"{decision.metric} ({decision.direction})")),
        ("candidate", _number(decision.candidate)),
        (
            "champion",
            _number(decision.champion)
            + (f" (version {evaluation.champion_version})" if evaluation.champion_version else ""),
        ),
        ("improvement", _number(decision.improvement)),
        ("relative improvement", _number(decision.relative_improvement)),
        (
            "required",
            _text(
                f"min_improvement {decision.min_improvement:g}, min_relative_improvement {decision.min_relative_improvement:g}"
            ),
        ),
        ("holdout rows", _number(evaluation.holdout_rows)),
    ]
    if decision.improvement_interval is not None:
        low, high = decision.improvement_interval
        rows.append(("interval", f"[{_number(low)}, {_number(high)}]"))
    return _table(("", "value"), rows)


def _metrics_table(evaluation: Evaluation) -> str:
    champion = evaluation.champion or {}
    rows = [
        (
            _text(name),
            _number(value),
            _number(champion.get(name)),
            _number(value - champion[name]) if name in champion else "-",
        )
        for name, value in evaluation.candidate.items()
    ]
    return _table(("metric", "candidate", "champion", "candidate - champion"), rows)


def _guardrail_table(decision: GateDecision) -> str:
    rows = [
        (
            _text(g.metric),
            _number(g.candidate),
            _number(g.champion),
            _number(g.regression),
            _text(
                ", ".join(
                    f"{k} {v:g}"
                    for k, v in (
                        ("max_regression", g.max_regression),
                        ("max_relative_regression", g.max_relative_regression),
                    )
                    if v is not None
                )
            ),
            "pass" if g.passed else '<span class="fail">BREACHED</span>',
        )
        for g in decision.guardrails
    ]
    return _table(("guardrail", "candidate", "champion", "worsening", "allowed", "check"), rows)


def _slice_table(decision: GateDecision, evaluation: Evaluation, guarded: bool) -> str:
    checks = {c.slice: c for c in decision.slice_checks}
    metric = decision.slice_checks[0].metric if decision.slice_checks else decision.metric
    rows = []
    for scored in evaluation.slices or []:
        check = checks.get(scored.slice)
        outcome = "-" if check is None else "pass" if check.passed else '<span class="fail">REGRESSED</span>'
        rows.append(
            (
                _text(scored.slice),
                _number(scored.rows),
                _number(scored.candidate.get(metric)),
                _number((scored.champion or {}).get(metric)),
                outcome
                if check is not None
                else "not held (too few rows)"
                if guarded or decision.slice_checks
                else "-",
            )
        )
    return _table(("slice", "rows", f"candidate {metric}", f"champion {metric}", "check"), rows)


# -- charts -------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _svg(figure: Any, close: bool = True) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: readable, searchable, small
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    if close:
        _pyplot().close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: without the XML prolog and DOCTYPE


def _interval_figure(decision: GateDecision) -> Any:
    plt = _pyplot()
    assert decision.improvement_interval is not None
    low, high = decision.improvement_interval
    figure, ax = plt.subplots(figsize=(7, 1.6))
    finite = [
        v for v in (low, high, decision.improvement or 0.0, decision.min_improvement) if math.isfinite(v)
    ]
    span = (max(finite) - min(finite)) or 1.0
    left = low if math.isfinite(low) else min(finite) - span
    right = high if math.isfinite(high) else max(finite) + span
    ax.plot(
        [left, right],
        [0, 0],
        color=CANDIDATE if decision.promote else BAD,
        linewidth=6,
        solid_capstyle="butt",
    )
    if decision.improvement is not None and math.isfinite(decision.improvement):
        ax.plot([decision.improvement], [0], "o", color="black", label="point improvement")
    ax.axvline(0, color="black", linewidth=1)
    if decision.min_improvement:
        ax.axvline(decision.min_improvement, color=BAD, linestyle="--", label="min_improvement")
    ax.set_yticks([])
    ax.set_xlabel(f"{decision.metric} improvement (better > 0)")
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    return figure


def _task_figures(task: str, evaluation: Evaluation, curves: dict[str, Any] | None) -> list[Any]:
    if task == "binary_classification" and curves and curves.get("candidate"):
        return [
            _curve_figure(curves, "roc", "false positive rate", "true positive rate", "ROC"),
            _curve_figure(curves, "pr", "recall", "precision", "Precision-recall"),
        ]
    if task == "multiclass_classification":
        names = [m for m in evaluation.candidate if m.startswith("recall_")]
        return (
            [_bars(evaluation, names, "recall per class", lambda m: m.removeprefix("recall_"))]
            if names
            else []
        )
    if task == "ranking":
        return [
            _at_k(evaluation, "ndcg_at_", NDCG_CUTOFFS, "NDCG@k"),
            _at_k(evaluation, "map_at_", MAP_CUTOFFS, "MAP@k"),
        ]
    return []


def _curve_figure(curves: dict[str, Any], key: str, x: str, y: str, title: str) -> Any:
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(4.6, 4))
    for model, color in (("candidate", CANDIDATE), ("champion", CHAMPION)):
        points = (curves.get(model) or {}).get(key)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, color=color, label=model, drawstyle="steps-post" if key == "pr" else "default")
    if key == "roc":
        ax.plot([0, 1], [0, 1], color="#dddddd", linestyle=":")
    ax.set(xlabel=x, ylabel=y, title=title, xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(loc="lower right" if key == "roc" else "upper right", fontsize=8)
    return figure


def _bars(evaluation: Evaluation, names: list[str], title: str, label: Any) -> Any:
    plt = _pyplot()
    champion = evaluation.champion or {}
    figure, ax = plt.subplots(figsize=(max(4.6, 0.9 * len(names)), 3.4))
    width = 0.4
    for i, name in enumerate(names):
        ax.bar(
            i - width / 2,
            evaluation.candidate[name],
            width,
            color=CANDIDATE,
            label="candidate" if i == 0 else None,
        )
        if name in champion:
            ax.bar(i + width / 2, champion[name], width, color=CHAMPION, label="champion" if i == 0 else None)
    ax.set_xticks(range(len(names)), [label(n) for n in names], fontsize=8)
    ax.set(title=title, ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return figure


def _at_k(evaluation: Evaluation, prefix: str, cutoffs: tuple[int, ...], title: str) -> Any:
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(4.6, 3.4))
    for model, metrics, color in (
        ("candidate", evaluation.candidate, CANDIDATE),
        ("champion", evaluation.champion, CHAMPION),
    ):
        if metrics:
            ax.plot(cutoffs, [metrics[f"{prefix}{k}"] for k in cutoffs], "o-", color=color, label=model)
    ax.set(xlabel="k", title=title, xticks=list(cutoffs))
    ax.legend(fontsize=8)
    return figure
