from __future__ import annotations

import subprocess
import sys

from airflow_trainpipe.contracts.events import parse


def test_parse_finds_the_event_after_another_ranks_partial_line() -> None:
    assert parse('some warning without newlineTRAINPIPE {"event": "step", "step": 3}') == {
        "event": "step",
        "step": 3,
    }
    assert parse("plain log text") is None
    assert parse("TRAINPIPE {broken") is None


def test_concurrent_writers_never_split_an_event_line() -> None:
    # Eight processes emit 300 events each into one pipe, as ranks share torchrun's stdout.
    code = (
        "import sys; from airflow_trainpipe.contracts.events import emit\n"
        "for i in range(300): emit('step', rank=int(sys.argv[1]), step=i, pad='x' * 200)\n"
    )
    writers = " & ".join(f'{sys.executable} -c "{code}" {r}' for r in range(8))
    out = subprocess.run(
        ["bash", "-c", f"({writers}; wait) | cat"], capture_output=True, text=True, check=True
    ).stdout
    events = [parse(line) for line in out.splitlines()]
    assert len(events) == 2400 and all(e is not None for e in events)
