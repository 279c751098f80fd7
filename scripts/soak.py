"""`make soak`: the chaos soak of issue 19 on a stack of its own.

Starts the e2e stack of tests/integration/conftest.py (`airflow standalone` the way `make up`
starts it, a real `mlflow server`, a moto S3 server, all on 127.0.0.1) with the scheduler
creating runs, writes the soak pipeline into its dags folder and lets the scheduler run
SOAK_RUNS catchup runs of it under a fault schedule drawn from SOAK_SEED (tests/helpers/soak.py,
tests/helpers/chaos.py). Prints a per-run table and ends with
`soak: S/N runs succeeded, R steps recomputed, W% wall overhead`; exits 1 if a run failed or
trained other weights than the fault-free run.

`--pipelines N` (`make soak-many`) runs the many-pipelines soak instead (tests/helpers/soak_many.py):
N pipelines at once on the PostgreSQL stack, their outcomes checked, `## Many pipelines` written.

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
    parser.add_argument(
        "--benchmarks", type=Path, help="write the result as the `## Chaos soak` section of this file"
    )
    parser.add_argument(
        "--pipelines",
        type=int,
        help="the many-pipelines soak instead (tests/helpers/soak_many.py): this many pipelines at "
        "once on the PostgreSQL stack; writes `## Many pipelines` with --benchmarks",
    )
    args = parser.parse_args()
    if args.pipelines:
        return many(args)
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
            [[fault] if fault.kind else [] for fault in faults],  # one fault a run
            scheduled=True,
            bucket=BUCKET,
            say=lambda s: print(s, flush=True),
        )
        records = soak.run()
    summary = summarize(records, len(faults))
    (root / "soak.json").write_text(json.dumps([asdict(r) for r in records], indent=1, default=str))
    print(f"soak took {time.monotonic() - started:.0f}s; records in {root / 'soak.json'}")
    print("\n".join(summary.lines), flush=True)
    if args.benchmarks:
        write_section(args.benchmarks, summary.lines, args, time.monotonic() - started)
    return 0 if summary.ok else 1


def many(args: argparse.Namespace) -> int:
    """N pipelines triggered at once on `make up DB=postgres`'s stack, three of them faulted."""
    from tests.helpers.soak_many import ManySoak, fleet, report
    from tests.integration.conftest import load_up, running_stack

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    root = args.state.resolve() / ("many-" + time.strftime("%Y%m%dT%H%M%S"))
    root.mkdir(parents=True)
    plans = fleet(args.pipelines, args.seed)
    print(f"soak: {args.pipelines} pipelines, seed {args.seed}, state in {root}", flush=True)
    print("faults: " + ", ".join(f"{p.pipeline} {p.fault}" for p in plans if p.fault), flush=True)
    started = time.monotonic()
    with running_stack(root, database="postgres") as stack:
        print(f"stack up in {time.monotonic() - started:.0f}s: airflow {stack.url}", flush=True)
        os.environ.update(stack.mlflow.client_env())  # the checks read the registry as a user would
        os.environ["TRAINPIPE_HOME"] = str(stack.home)  # and the snapshots the stack's tasks stored
        soak = ManySoak(stack, plans, load_up(), say=lambda s: print(s, flush=True))
        soak.run()
        result = report(soak)
    outcomes = [asdict(o) for o in soak.outcomes.values()]
    (root / "soak-many.json").write_text(json.dumps(outcomes, indent=1, default=str))
    print("\n".join(result.lines), flush=True)
    if args.benchmarks:
        section = [
            "## Many pipelines on one Airflow (issue 51)",
            "",
            f"_Measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC by `scripts/soak.py --pipelines "
            f"{args.pipelines} --seed {args.seed}` (what `make soak-many` runs) "
            f"({(time.monotonic() - started) / 60:.0f} min, stack startup included; {_machine()})._",
            "",
            "N pipelines made from the examples (binary on files, SQL and Delta; multiclass text; ranking),",
            "triggered back to back on `make up DB=postgres`'s stack (`airflow standalone`, LocalExecutor,",
            "PostgreSQL metadata DB, a real `mlflow server`), every train task in the `trainpipe_training`",
            "pool that `trainpipe pools --apply` sized to the host's cores. Three seeded faults: a rank",
            "SIGKILLed after a checkpoint, the MLflow server down 5 s while a job trains, a day with nulls.",
            "*train_s*: the train task's first try start to last try end; *run_s*: the DAG run's.",
            "*ideal packing*: the slot-seconds the train tries held over the pool's slots, plus the",
            "shortest lead-in before a train and the shortest tail after one (a lower bound, these task times).",
            "",
            "```",
            *result.lines,
            "```",
            "",
        ]
        replace_section(args.benchmarks, "## Many pipelines", section)
    return 0 if result.ok else 1


def _machine() -> str:
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, no GPU"


def replace_section(path: Path, title: str, section: list[str]) -> None:
    """Replace (or append) the BENCHMARKS.md section whose heading starts with `title`; `make
    bench` keeps the soaks' sections as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    before, marker, after = text.partition("\n" + title)
    rest = after.split("\n## ", 1)[1] if marker and "\n## " in after else None
    body = before.rstrip("\n") + "\n\n" + "\n".join(section)
    path.write_text(body + ("\n## " + rest if rest else ""))


def write_section(path: Path, lines: list[str], args: argparse.Namespace, elapsed_s: float) -> None:
    """Replace (or add) BENCHMARKS.md's `## Chaos soak` section; `make bench` keeps it as it is."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    section = [
        "## Chaos soak (issue 19)",
        "",
        f"_Measured {stamp} UTC by `scripts/soak.py --runs {args.runs} --seed {args.seed}` (what "
        f"`make soak SOAK_RUNS={args.runs} SOAK_SEED={args.seed}` runs) "
        f"({elapsed_s / 60:.0f} min, stack startup included; {_machine()})._",
        "",
        "Scheduled catchup runs of one pipeline (fraud_detector on one fixed 64,000-row partition,",
        "~800 steps on 2 ranks, checkpoints every 10 steps on a moto `s3://` bucket, `retries: 3`) on",
        "`airflow standalone` + `mlflow server` + moto, all on 127.0.0.1. Run 1 is the fault-free",
        "reference; every other run is struck by one seeded fault once its newest complete checkpoint",
        "reaches the step after `@`; Airflow's retries recover (docs/architecture.md, *Chaos soak*).",
        "*recomp*: the run's `steps_recomputed`; *train_s*: the train task's first try start to last",
        "try end; W compares the faulted runs' mean *train_s* with the reference's.",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    replace_section(path, "## Chaos soak", section)


if __name__ == "__main__":
    sys.exit(main())
