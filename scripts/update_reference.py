"""Replace the config reference in docs/configuration.md with the one generated from the models."""

from __future__ import annotations

from pathlib import Path

from airflow_trainpipe.config.reference import BEGIN_MARKER, END_MARKER, markdown_reference

document = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
text = document.read_text()
start, end = text.index(BEGIN_MARKER), text.index(END_MARKER) + len(END_MARKER)
document.write_text(text[:start] + markdown_reference().rstrip("\n") + text[end:])
print(f"updated {document}")
