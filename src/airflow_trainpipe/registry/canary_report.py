"""The canary's report: one self-contained HTML page per version, logged to the version's run.

What a reviewer needs to agree with a promotion or a rollback: the outcome and what failed; the
traffic over time (requests per interval, by the model that answered, and the candidate's share);
every step's figures beside its thresholds, and the interval each check decided on; and rows
where the two models decided differently.
Built from plain values (the operator reads the router's log), so it imports nothing of canary/.
Run at execute() time only: matplotlib is imported inside.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_trainpipe.registry.gate_report import (
    _STYLE,
    CANDIDATE,
    CHAMPION,
    _number,
    _pyplot,
    _svg,
    _table,
    _text,
)


def canary_report_html(
    model_name: str,
    version: str,
    champion_version: str,
    outcome: str,
    steps: list[dict[str, Any]],
    traffic: list[dict[str, Any]],
    checks: dict[str, Any],
    failed: list[str] | None = None,
) -> str:
    """`steps`: each step's event (step, percent, status, figures, failed, examples), in order;
    `traffic`: [{"t", "champion", "candidate", "percent"}] per interval; `checks`: the config's."""
    promoted = outcome == "promoted"
    title = f"Canary report: {model_name} version {version} beside version {champion_version}"
    verdict = "PROMOTED" if promoted else "ROLLED BACK"
    sections = [
        f"<h1>{_text(title)}</h1>",
        f'<div class="verdict {"promote" if promoted else "keep"}"><b>{verdict}</b>'
        + (f": {_text('; '.join(failed))}" if failed else "")
        + "</div>",
        "<h2>Steps</h2>",
        _steps_table(steps),
        *(["<h2>How sure each step was</h2>", _decisions_table(steps)] if _has_decisions(steps) else []),
        "<h2>Checks</h2>",
        f"<pre>{_text(json.dumps(checks, indent=1))}</pre>",
    ]
    if traffic:
        sections += ["<h2>Traffic</h2>", f'<div class="charts">{_svg(_traffic_figure(traffic))}</div>']
    examples = [e for s in steps for e in s.get("examples", [])]
    if examples:
        sections += [
            "<h2>Rows the two models decided differently</h2>",
            _examples_table(examples, version, champion_version),
        ]
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{_text(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>"
    )


def _examples_table(examples: list[dict[str, Any]], version: str, champion_version: str) -> str:
    """Each disagreeing row's predicted class by each model (its `predicted_label`), then their whole
    answers; an event of a canary from before the label column has the answers only."""
    rows = [
        (
            _text(e["row"]),
            _text(e.get("champion_label", "-")),
            _text(e.get("candidate_label", "-")),
            _text(e["champion"]),
            _text(e["candidate"]),
        )
        for e in examples
    ]
    header = (
        "row of the request",
        f"champion (v{champion_version}) predicted_label",
        f"candidate (v{version}) predicted_label",
        "champion's answer",
        "candidate's answer",
    )
    return _table(header, rows)


def _steps_table(steps: list[dict[str, Any]]) -> str:
    names: list[str] = []
    for step in steps:
        names += [n for n in step.get("figures", {}) if n not in names]
    rows = []
    for step in steps:
        held = step.get("status") == "held"
        check = (
            "held" if held else '<span class="fail">' + _text("; ".join(step.get("failed", []))) + "</span>"
        )
        figures = step.get("figures", {})
        rows.append(
            (_text(step["step"]), _number(step["percent"]), *(_number(figures.get(n)) for n in names), check)
        )
    return _table(("step", "% on candidate", *names, "verdict"), rows)


def _has_decisions(steps: list[dict[str, Any]]) -> bool:
    return any(step.get("checks") for step in steps)


def _decisions_table(steps: list[dict[str, Any]]) -> str:
    """Each step's checks as decided: the figure, its interval at `canary.confidence` (`-`: no
    bound, too few requests for it), the threshold, the decision, and what it was counted over."""
    rows = []
    for step in steps:
        for check in step.get("checks", []):
            low, high = check["interval"]
            count = next((f"{v} {k}" for k, v in check.items() if k in ("requests", "rows", "scores")), "-")
            decision = check["decision"]
            shown = _text(decision) if decision != "fails" else f'<span class="fail">{_text(decision)}</span>'
            rows.append(
                (
                    _text(step["step"]),
                    _text(check["check"]),
                    _number(check["value"]),
                    f"[{_number(low)}, {_number(high)}]",
                    _number(check["threshold"]),
                    shown,
                    _text(count),
                )
            )
    return _table(("step", "check", "figure", "interval", "threshold", "decision", "over"), rows)


def _traffic_figure(traffic: list[dict[str, Any]]) -> Any:
    plt = _pyplot()
    start = traffic[0]["t"]
    x = [point["t"] - start for point in traffic]
    figure, axis = plt.subplots(figsize=(8, 3))
    axis.stackplot(
        x,
        [p["champion"] for p in traffic],
        [p["candidate"] for p in traffic],
        labels=["answered by the champion", "answered by the candidate"],
        colors=[CHAMPION, CANDIDATE],
        step="post",
    )
    axis.set_xlabel("seconds since the canary started")
    axis.set_ylabel("requests")
    share = axis.twinx()
    share.step(x, [p["percent"] for p in traffic], where="post", color="#333", linewidth=1)
    share.set_ylabel("% on the candidate")
    share.set_ylim(0, 105)
    axis.legend(loc="upper left", fontsize=8)
    return figure
