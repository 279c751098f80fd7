"""Text columns in validation: strings only (invalid UTF-8 in a CSV reads as binary and is named),
blank rows, the longest text, and the length profile drift is scored on."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.data.validation.validate import validate_snapshot
from airflow_trainpipe.examples.synthetic import support_tickets
from tests.conftest import EXAMPLE_CONFIGS


def _config(data: Path, extra: str = ""):
    text = (EXAMPLE_CONFIGS / "support_tickets.yaml").read_text()
    text = text.replace("uri: data/support_tickets", f"uri: {data.as_uri()}\n  format: csv")
    return parse_config(text.replace("validation:\n", f"validation:\n{extra}", 1))


def _write_csv(data: Path, day: str, table: pa.Table) -> None:
    (data / f"ds={day}").mkdir(parents=True)
    pcsv.write_csv(table, data / f"ds={day}" / "part-00000.csv")


def test_invalid_utf8_in_a_csv_stops_validation_naming_the_text_column(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_csv(data, "2026-01-01", support_tickets(date(2026, 1, 1), 1200, seed=1))
    path = data / "ds=2026-01-01" / "part-00000.csv"
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"refund", b"ref\xffund", 1))  # one row's body: no longer UTF-8
    config = _config(data)
    manifest = resolve_snapshot(config.data, "ds=2026-01-01")
    assert manifest.columns["body"] == "binary" and manifest.rows == 1200  # no row dropped
    report = validate_snapshot(config, "ds=2026-01-01", manifest, reference=None, previous=None)
    failed = [c for c in report.checks if not c.passed]
    assert (failed[0].kind, failed[0].name, failed[0].column) == ("schema", "column type", "body")
    assert failed[0].message == "text column 'body' is binary, expected strings"
    # Nothing else is judged on the column: its expectation is reported not run, not as a crash.
    assert {c.column for c in failed} == {"body"}


def test_blank_rows_and_the_longest_text_are_checked_and_the_length_profile_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tickets = support_tickets(date(2026, 1, 1), 1000, seed=1)
    bodies = tickets.column("body").to_pylist()
    bodies[:300] = [None] * 100 + ["   "] * 100 + [""] * 100
    bodies[300] = "x" * 5000
    _write_csv(
        data,
        "2026-01-01",
        tickets.set_column(tickets.schema.get_field_index("body"), "body", pa.array(bodies)),
    )
    config = _config(data, "  text: {max_empty_fraction: 0.25, max_chars: 4000}\n")
    manifest = resolve_snapshot(config.data, "ds=2026-01-01")
    report = validate_snapshot(config, "ds=2026-01-01", manifest, reference=None, previous=None)
    text = {(c.name, c.column): c for c in report.checks if c.kind == "text"}
    blank = text[("blank_fraction", "body")]
    assert (blank.passed, blank.observed) == (
        False,
        0.3,
    ) and blank.message == "body: 300 of 1000 row(s) hold no text (null or blank)"
    assert text[("blank_fraction", "subject")].passed
    longest = text[("max_chars", "body")]
    assert (longest.passed, longest.observed) == (False, 5000)
    profile = report.profiles["body"]
    assert profile["kind"] == "text" and profile["blank"] == 300 and profile["edges"][-1] >= 1
