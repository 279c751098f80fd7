from __future__ import annotations

from airflow_trainpipe.registry.canary_report import canary_report_html

STEPS = [
    {"step": 1, "percent": 5.0, "status": "held", "failed": [], "examples": [],
     "figures": {"requests": 120, "error_rate": 0.0, "disagreement": 0.01}},
    {"step": 2, "percent": 25.0, "status": "failed", "failed": ["disagreement 0.4000 > 0.05 (<b>x</b>)"],
     "figures": {"requests": 90, "error_rate": 0.0, "disagreement": 0.4, "latency_p99_ms": 12.5},
     "examples": [{"t": 1.0, "row": 0, "champion": 0.9, "candidate": 0.1}]},
]  # fmt: skip
TRAFFIC = [
    {"t": 10.0 + i, "champion": 9, "candidate": 1, "percent": 5.0 if i < 3 else 25.0} for i in range(6)
]


def test_the_report_shows_the_outcome_every_step_the_traffic_and_the_disagreements() -> None:
    page = canary_report_html("fraud", "7", "6", "rolled_back", STEPS, TRAFFIC, {"max_disagreement": 0.05},
                              ["disagreement 0.4000 > 0.05 (<b>x</b>)"])  # fmt: skip
    assert "ROLLED BACK" in page and "version 7 beside version 6" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # text from the log is escaped
    assert page.count("<tr>") >= 1 + 2 + 1 + 1  # the steps' header and rows, the example's header and row
    assert "latency_p99_ms" in page  # a figure only one step has is still a column
    assert "<svg" in page and "% on the candidate" in page


def test_a_promoted_canary_without_traffic_still_reports() -> None:
    page = canary_report_html("fraud", "7", "6", "promoted", STEPS[:1], [], {})
    assert "PROMOTED" in page and "<svg" not in page


def test_a_disagreeing_row_shows_each_model_s_predicted_label_beside_its_answer() -> None:
    example = {"t": 1.0, "row": 0, "champion": {"probability": 0.61, "predicted_label": 1},
               "candidate": {"probability": 0.12, "predicted_label": 0},
               "champion_label": 1, "candidate_label": 0}  # fmt: skip
    steps = [{**STEPS[1], "examples": [example]}]
    page = canary_report_html("fraud", "7", "6", "rolled_back", steps, [], {})
    assert "champion (v6) predicted_label</th><th>candidate (v7) predicted_label" in page
    assert "<td>0</td><td>1</td><td>0</td><td>{&#x27;probability&#x27;: 0.61" in page
    old = canary_report_html("fraud", "7", "6", "rolled_back", STEPS, [], {})  # an event without labels
    assert "<td>0</td><td>-</td><td>-</td><td>0.9</td><td>0.1</td>" in old


def test_each_step_shows_the_interval_each_check_decided_on() -> None:
    checks = [
        {"check": "error_rate", "value": 0.0, "interval": [0.0, 0.0188], "threshold": 0.05, "decision": "holds",
         "requests": 200},
        {"check": "latency_p99_ms", "value": 12.5, "interval": [11.0, None], "threshold": 500.0,
         "decision": "undecided", "requests": 200},
        {"check": "disagreement", "value": 0.4, "interval": [0.3, 0.5], "threshold": 0.05, "decision": "fails",
         "rows": 90},
    ]  # fmt: skip
    page = canary_report_html("m", "2", "1", "rolled_back", [{**STEPS[1], "checks": checks}], [], {}, ["x"])
    assert "How sure each step was" in page
    assert "[0, 0.0188]" in page and "[11, -]" in page  # `-`: too few requests to bound a p99
    assert '<span class="fail">fails</span>' in page and "90 rows" in page and "200 requests" in page
    assert "How sure each step was" not in canary_report_html("m", "2", "1", "promoted", STEPS, [], {})
