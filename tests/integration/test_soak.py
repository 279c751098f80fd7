"""The chaos soak in small (`make soak` runs the long one, scripts/soak.py): on the shared e2e
stack, a fault-free reference run and one run struck on each of its tries in turn: a SIGKILL of
a rank, a SIGTERM of the whole job, then a corrupted newest checkpoint in the S3 bucket. Airflow's
retries recover each try, and the run ends with the reference run's weights.

One run struck three times recovers through the same retries and resumes as three runs struck
once, and pays one run's start-up, validation, gate and registration instead of three.

The shared stack's scheduler creates no runs, so the runs are posted through the REST API with
distinct logical dates (one at a time: the faults strike the run in flight).
"""

from __future__ import annotations

import pytest

from tests.helpers.chaos import fault_schedule
from tests.helpers.soak import EVERY_STEPS, Soak, summarize
from tests.integration.conftest import BUCKET, Stack

pytestmark = pytest.mark.slow

KINDS = ["rank_sigkill", "job_sigterm", "corrupt_checkpoint"]
# A quarter of `make soak`'s rows (~190 steps, ~6 s of training) keeps the 2 runs near 2 minutes.
ROWS = 16_000
# Each fault strikes at a drawn checkpoint up to here and past where the previous try stopped:
# the three strike within the first ~100 steps, so the last try still has steps to train.
STRIKE_BY = 60


def test_a_run_recovers_from_a_fault_on_each_try_with_the_fault_free_weights(stack: Stack) -> None:
    _, *faults = fault_schedule(1 + len(KINDS), 19, EVERY_STEPS, STRIKE_BY, kinds=[None, *KINDS])
    # A 1 s retry delay still lets a corrupted checkpoint be corrupted before the retry reads it
    # (the corruption follows the job's SIGKILL within milliseconds; a retry starts seconds later).
    soak = Soak(
        stack, [[], faults], scheduled=False, bucket=BUCKET, rows=ROWS, retry_delay="1s", expectations=False
    )
    records = soak.run()
    report = "\n".join(summarize(records, 2).lines)
    reference, struck = records
    assert reference.state == "success" and reference.tries == 1, report
    assert reference.steps_recomputed == 0, report
    assert [said.startswith("MISSED") for said in struck.injected] == [False] * len(KINDS), report
    assert struck.state == "success", report
    assert struck.tries >= 1 + len(KINDS), report  # each fault failed a try; a retry recovered
    assert struck.weights_sha256 == reference.weights_sha256, report
    assert struck.struck_at == sorted(set(struck.struck_at)), report  # each try trained past the last
    assert "the retry skipped the corrupt checkpoint" in struck.notes, report
    # The last try resumed from the checkpoint before the corrupted newest one.
    assert struck.resumed_from_step is not None, report
    assert struck.resumed_from_step < struck.struck_at[-1], report
    assert report.splitlines()[-1].startswith("soak: 2/2 runs succeeded, "), report
