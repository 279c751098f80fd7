"""Fitting and applying the declared transforms of dags/configs/fraud_detector.yaml.

`python benchmarks/fit_bench.py [ROWS]`: writes ROWS synthetic transactions as parquet files of
100,000 rows, then times the fit stage (`runtime.prepare.fit`: streaming, two passes, as `amount` clips)
and encoding every block's training rows one block at a time (what the ranks' streams do,
here on one process), and reports the rows per second of each and the peak RSS.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import fit
from airflow_trainpipe.runtime.data.reader import data_columns

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    config = load_config(REPO / "dags/configs/fraud_detector.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for day in range(0, rows, 100_000):
            files += write_day(
                Path(tmp).as_uri(),
                date(2026, 1, 1) + timedelta(days=day // 100_000),
                min(100_000, rows - day),
                seed=1,
            )
        started = time.perf_counter()
        prepared = fit(files, config.data, config.features, config.training.task)
        transform = prepared.transform
        fit_s = time.perf_counter() - started
        reader = BlockReader(files, prepared.identities, config.data, data_columns(config.data))
        started = time.perf_counter()
        for block in prepared.blocks:
            transform.features(reader.parts(block)[0])
        encode_s = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{rows:,} rows in {len(files)} files: fit {fit_s:.2f} s ({rows / fit_s:,.0f} rows/s), "
        f"read + encode by block {encode_s:.2f} s ({rows / encode_s:,.0f} rows/s), peak RSS {peak_mib:,.0f} MiB, "
        f"transform {transform.hash[:19]}... ({len(transform.to_json()):,} bytes)"
    )


if __name__ == "__main__":
    main()
