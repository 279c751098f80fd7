"""Scale (issue 15): the job's memory and speed as the snapshot grows from 1M to 16M rows.

The same job (fraud_detector features and model, 2 CPU ranks, global batch 512, 1200 steps: 614,400
rows, past the first chunks' loads) on the first 1, 4 and 16 of sixteen 1M-row Parquet files of
synthetic transactions, the sizes interleaved over the repeats so that each sees the same machine
state. Reported per size: each rank's peak RSS (rank 0's through the final candidate-vs-champion
evaluation over the whole holdout; the highest of the repeats), the fit stage's time (one pass
over everything on rank 0, two for the clipped `amount`) and training samples/s (medians).
Targets: peak RSS at 16M <= 1.2x that at 1M, and samples/s within 10%.

`python benchmarks/scale_bench.py [MILLIONS ...]` prints the table; `make bench` writes it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from train_bench import REPO, _spec  # benchmarks/ is on sys.path when run as a script; same config edits

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import transactions, write_day
from airflow_trainpipe.launchers.local import LocalLauncher
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import fit
from airflow_trainpipe.runtime.data.reader import data_columns
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import BlockStream

SIZES, STEPS, REPEATS, NPROC, FILE_ROWS = (1, 4, 16), 1200, 3, 2, 1_000_000


def _run(tmp: Path, files: list[str], run_id: str) -> tuple[dict, dict]:
    launcher = LocalLauncher(_spec(tmp, files, run_id, "[64, 32]", 1, STEPS), NPROC)
    launcher.start()
    start, result, tail = None, None, []
    for line in launcher.lines():
        tail = [*tail[-40:], line.text]
        if line.event and line.event["event"] == "start":
            start = line.event
        if line.event and line.event["event"] == "result":
            result = line.event
    if launcher.wait() != 0 or start is None or result is None:
        raise RuntimeError("training job failed:\n" + "\n".join(tail))
    return start, result


def bench_scale(sizes: tuple[int, ...] = SIZES) -> list[str]:
    lines = [
        "## Scale: memory and speed vs snapshot size (issue 15)",
        "",
        f"The job (fraud_detector, [64, 32] MLP, ZeRO-1, {NPROC} CPU ranks, global batch 512, {STEPS} steps,",
        "`data.shuffle_buffer_rows` 262,144) on 1M-row Parquet files of synthetic transactions (row",
        "groups of 65,536). Peak RSS per rank from `getrusage` (rank 0's includes the final",
        "candidate-vs-champion evaluation over the whole holdout); fit = the fit stage on rank 0;",
        f"samples/s over the training loop. {REPEATS} repeats with the sizes interleaved: the highest",
        "peak RSS, the median fit time and samples/s. Ratios are against the 1M row, same run.",
        "",
        "| rows | Parquet MiB | blocks | peak RSS rank 0 (MiB) | peak RSS rank 1 (MiB) | fit (s) | samples/s | RSS ratio (max rank) | samples/s ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        files: list[str] = []
        for day in range(max(sizes)):
            files += write_day(
                (tmp / "data").as_uri(), date(2026, 1, 1) + timedelta(days=day), FILE_ROWS, seed=day
            )
        runs: dict[int, list[tuple[dict, dict]]] = {m: [] for m in sizes}
        for repeat in range(REPEATS):
            for millions in sizes:
                runs[millions].append(_run(tmp, files[:millions], f"scale-{millions}m-{repeat}"))
        first: tuple[float, float] | None = None
        for millions in sizes:
            starts, results = zip(*runs[millions], strict=True)
            rate = statistics.median(r["timing"]["steps"] * 512 / r["timing"]["train_s"] for r in results)
            rss = [max(r["peak_rss_mib"][rank] for r in results) for rank in range(NPROC)]
            fit_s = statistics.median(s["fit_s"] for s in starts)
            first = first or (max(rss), rate)
            size = sum(Path(f.removeprefix("file://")).stat().st_size for f in files[:millions]) / 2**20
            lines.append(
                f"| {millions}M | {size:,.0f} | {starts[0]['blocks']} | {' | '.join(f'{v:,.0f}' for v in rss)} "
                f"| {fit_s:.1f} | {rate:,.0f} | **{max(rss) / first[0]:.3f}** | **{rate / first[1]:.3f}** |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        "Targets: peak RSS at 16M <= 1.2x that at 1M; samples/s within 10% (ratio >= 0.9).",
        "",
        *_shuffle_quality(),
    ]
    return lines


def _shuffle_quality(rows: int = 1_000_000, batch: int = 512) -> list[str]:
    """How far the chunked block shuffle is from a full permutation on the worst input: a file
    sorted by the column measured. Spread = std over one epoch's batches of the batch mean of the
    encoded `amount`; a full permutation's spread is the i.i.d. one, and a ratio near 1 means
    batches as mixed as a full permutation's."""
    config = load_config(REPO / "dags/configs/fraud_detector.yaml")
    lines = [
        f"Shuffle quality: one epoch over {rows:,} rows sorted by `amount` (the worst case: sorted",
        f"files), batches of {batch}. Spread = std of the batch means of encoded `amount`, as a",
        "multiple of a full permutation's (1.0 = as mixed; the last row: no shuffle at all).",
        "",
        "| shuffle | spread / full permutation's |",
        "|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp_name:
        path = Path(tmp_name) / "sorted.parquet"
        pq.write_table(
            transactions(date(2026, 1, 1), rows, seed=9).sort_by("amount"), path, row_group_size=65_536
        )
        files = [path.as_uri()]
        prepared = fit(files, config.data, config.features, config.training.task)
        reader = BlockReader(files, prepared.identities, config.data, data_columns(config.data))
        column = [c["name"] for c in prepared.transform.columns].index("amount")
        in_file_order = np.concatenate(
            [prepared.transform.features(reader.parts(b)[0])[:, column] for b in prepared.blocks]
        )
        shuffled = in_file_order[np.random.default_rng(1).permutation(len(in_file_order))]
        full = _spread(shuffled, batch)
        for buffer in (65_536, 262_144, 1_048_576):
            stream = BlockStream(prepared, reader, seed=1, buffer_rows=buffer)
            sampler = ResumableSampler(prepared.train_rows, batch, 1, 1, 0, seed=1)
            streamed = []
            while not sampler.epoch_done():
                epoch = sampler.epoch
                ((x, _),) = stream.take(epoch, *sampler.step_positions())
                streamed.append(x[:, column])
            lines.append(
                f"| buffer {buffer:,} rows | {_spread(np.concatenate(streamed), batch) / full:.2f} |"
            )
        lines.append(f"| none (file order) | {_spread(in_file_order, batch) / full:.2f} |")
    return lines


def _spread(values: np.ndarray, batch: int) -> float:
    usable = len(values) // batch * batch
    return float(values[:usable].reshape(-1, batch).mean(axis=1).std())


if __name__ == "__main__":
    print("\n".join(bench_scale(tuple(int(a) for a in sys.argv[1:]) or SIZES)))
