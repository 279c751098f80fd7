"""Replace the config reference in README.md with the one generated from the models."""

from __future__ import annotations

from pathlib import Path

from airflow_trainpipe.config.reference import BEGIN_MARKER, END_MARKER, markdown_reference

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
start, end = text.index(BEGIN_MARKER), text.index(END_MARKER) + len(END_MARKER)
readme.write_text(text[:start] + markdown_reference().rstrip("\n") + text[end:])
print(f"updated {readme}")
