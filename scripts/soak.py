"""`make soak`: the chaos soak of issue 19 on a stack of its own.

Starts the e2e stack of tests/integration/conftest.py (`airflow standalone` the way `make up`
starts it, a real `mlflow server`, a moto S3 server, all on 127.0.0.1) with the scheduler
creating runs, writes the soak pipeline into its dags folder and lets the scheduler run
SOAK_RUNS catchup runs of it under a fault schedule drawn from SOAK_SEED (tests/helpers/soak.py,
tests/helpers/chaos.py). Prints a per-run table and ends with
`soak: S/N runs succeeded, R steps recomputed, W% wall overhead`; exits 1 if a run failed or
trained other weights than the fault-free run.

State (Airflow home, logs, MLflow store) stays in var/soak/<time>/ for a look afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers and tests.integration.conftest hold the stack and the soak


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)  # the stack's `finally` stops its processes


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill`, and a background job, whose SIGINT is ignored
    signal.signal(signal.SIGHUP, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("SOAK_RUNS", "20")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "19")))
    parser.add_argument("--state", type=Path, default=REPO / "var" / "soak")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs: at least 2 (the fault-free reference and one faulted run)")

    from tests.helpers.chaos import fault_schedule
    from tests.helpers.soak import EVERY_STEPS, STRIKE_BY, Soak, summarize
    from tests.integration.conftest import BUCKET, running_stack

    # DeepSpeed's JIT-built CPU op, cached per virtualenv as the tests cache it (tests/conftest.py):
    # the default cache is shared by every venv of the user, whose builds evict each other (~40 s each).
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    root = args.state.resolve() / time.strftime("%Y%m%dT%H%M%S")
    root.mkdir(parents=True)
    faults = fault_schedule(args.runs, args.seed, EVERY_STEPS, STRIKE_BY)
    print(f"soak: {args.runs} runs, seed {args.seed}, state in {root}", flush=True)
    print("schedule: " + ", ".join(str(f) for f in faults), flush=True)
    started = time.monotonic()
    with running_stack(root, scheduled_runs=True) as stack:
        print(
            f"stack up in {time.monotonic() - started:.0f}s: airflow {stack.url}, mlflow {stack.mlflow.url}, s3 {stack.s3.url}",
            flush=True,
        )
        soak = Soak(
            stack,
            faults,
            scheduled=True,
            bucket=BUCKET,
            say=lambda s: print(s, flush=True),
        )
        records = soak.run()
    summary = summarize(records, len(faults))
    (root / "soak.json").write_text(json.dumps([asdict(r) for r in records], indent=1, default=str))
    print(f"soak took {time.monotonic() - started:.0f}s; records in {root / 'soak.json'}")
    print("\n".join(summary.lines), flush=True)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
