"""The chaos soak in small (`make soak` runs the long one, scripts/soak.py): on the shared e2e
stack, a fault-free reference run and one run each struck by a SIGKILL of a rank, a SIGTERM of
the whole job, and a corrupted newest checkpoint in the S3 bucket. Airflow's retries recover
every run, and every run ends with the reference run's weights.

The shared stack's scheduler creates no runs, so the runs are posted through the REST API with
distinct logical dates (one at a time: the fault strikes the run in flight).
"""

from __future__ import annotations

import pytest

from tests.helpers.chaos import fault_schedule
from tests.helpers.soak import EVERY_STEPS, Soak, summarize
from tests.integration.conftest import BUCKET, Stack

pytestmark = pytest.mark.slow

KINDS = [None, "rank_sigkill", "job_sigterm", "corrupt_checkpoint"]
# A quarter of `make soak`'s rows (~200 steps, ~6 s of training) keeps the 4 runs near 5 minutes;
# the faults strike in the first half of the run.
ROWS = 16_000
STRIKE_BY = 100


def test_runs_recover_from_faults_with_the_fault_free_weights(stack: Stack) -> None:
    faults = fault_schedule(len(KINDS), 19, EVERY_STEPS, STRIKE_BY, kinds=KINDS)
    # A 1 s retry delay still lets a corrupted checkpoint be corrupted before the retry reads it
    # (the corruption follows the job's SIGKILL within milliseconds; a retry starts seconds later).
    soak = Soak(
        stack, faults, scheduled=False, bucket=BUCKET, rows=ROWS, retry_delay="1s", expectations=False
    )
    records = soak.run()
    report = "\n".join(summarize(records, len(faults)).lines)
    reference = records[0]
    assert reference.state == "success" and reference.tries == 1, report
    assert reference.steps_recomputed == 0, report
    for record in records[1:]:
        assert not record.injected.startswith("MISSED"), report
        assert record.state == "success", report
        assert record.tries >= 2, report  # the fault failed a try; a retry recovered
        assert record.weights_sha256 == reference.weights_sha256, report
    corrupt = records[3]
    assert "the retry skipped the corrupt checkpoint" in corrupt.notes, report
    # It resumed from the checkpoint before the corrupted newest one.
    assert corrupt.struck_at is not None and corrupt.resumed_from_step is not None, report
    assert corrupt.resumed_from_step < corrupt.struck_at, report
    assert report.splitlines()[-1].startswith(f"soak: {len(KINDS)}/{len(KINDS)} runs succeeded, "), report
