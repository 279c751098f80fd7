"""The epoch's stream of training rows: every row once per epoch, the same global batches on 1, 2
and 3 real gloo ranks, each rank reading only its share of the blocks, memory bounded by chunks."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import transactions
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData, fit
from airflow_trainpipe.runtime.data.reader import data_columns
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import BlockStream
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.ranks import run_ranks

CONFIG = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
GLOBAL_BATCH, ACCUMULATION, BUFFER, SEED = 48, 2, 200, 11


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], PreparedData]:
    """1500 rows in two files of 100-row row groups: 15 blocks, chunks of three blocks."""
    root = tmp_path_factory.mktemp("stream")
    table = transactions(date(2026, 1, 1), 1500, seed=4)
    files = []
    for part, (start, rows) in enumerate([(0, 800), (800, 700)]):
        pq.write_table(table.slice(start, rows), root / f"part-{part}.parquet", row_group_size=100)
        files.append((root / f"part-{part}.parquet").as_uri())
    return files, fit(files, CONFIG.data, CONFIG.features, "binary_classification")


def _stream(
    files: list[str],
    prepared: PreparedData,
    rank: int = 0,
    world_size: int = 1,
    epochs: int | None = 2,
    cache_bytes: int = 0,
) -> BlockStream:
    reader = BlockReader(files, prepared.identities, CONFIG.data, data_columns(CONFIG.data))
    return BlockStream(
        prepared, reader, SEED, BUFFER, rank, world_size, epochs=epochs, cache_bytes=cache_bytes
    )


def _steps(
    stream: BlockStream, rank: int, world_size: int, epochs: int = 2, state: dict[str, int] | None = None
) -> list[np.ndarray]:
    """This rank's rows of every step, micro-batches concatenated, x and y side by side."""
    sampler = ResumableSampler(
        sum(b.train_rows for b in stream.blocks),
        GLOBAL_BATCH,
        ACCUMULATION,
        world_size,
        rank,
        SEED,
    )
    if state:
        sampler.load_state_dict(state)
    rows = []
    while sampler.epoch < epochs:
        while not sampler.epoch_done():
            epoch = sampler.epoch
            batches = stream.take(epoch, *sampler.step_positions())
            assert len(stream.loaded) <= 2
            rows.append(np.concatenate([np.column_stack([x, y]) for x, y in batches]))
        sampler.next_epoch()
    return rows


def test_each_epoch_takes_every_training_row_once_in_a_new_order(
    snapshot: tuple[list[str], PreparedData],
) -> None:
    files, prepared = snapshot
    stream = _stream(files, prepared)
    assert len(stream.blocks) == 15
    stream.start_epoch(0)
    assert [len(chunk) for chunk in stream.chunks] == [3, 3, 3, 3, 3]
    steps = _steps(stream, 0, 1)
    per_epoch = prepared.train_rows // GLOBAL_BATCH
    epochs = [np.concatenate(steps[:per_epoch]), np.concatenate(steps[per_epoch:])]
    reader = stream.reader
    everything = np.concatenate(
        [
            np.column_stack([prepared.transform.features(t), prepared.transform.labels(t)])
            for t in (reader.parts(b)[0] for b in prepared.blocks)
        ]
    )
    for rows in epochs:
        assert len(rows) == per_epoch * GLOBAL_BATCH
        # No row twice: the dropped tail is the only difference from all training rows.
        assert (
            len(np.unique(rows, axis=0))
            == len(rows)
            == len(np.unique(everything, axis=0)) - (prepared.train_rows % GLOBAL_BATCH)
        )
        assert set(map(bytes, rows)) <= set(map(bytes, everything))
    assert not np.array_equal(epochs[0][:GLOBAL_BATCH], epochs[1][:GLOBAL_BATCH])


def test_a_resumed_stream_continues_with_the_same_rows(snapshot: tuple[list[str], PreparedData]) -> None:
    files, prepared = snapshot
    straight = _steps(_stream(files, prepared), 0, 1)
    per_epoch = prepared.train_rows // GLOBAL_BATCH
    state = {"epoch": 0, "consumed": 7 * GLOBAL_BATCH, "global_batch": GLOBAL_BATCH, "seed": SEED}
    resumed = _steps(_stream(files, prepared), 0, 1, state=state)
    assert len(resumed) == 2 * per_epoch - 7
    assert all(np.array_equal(a, b) for a, b in zip(resumed, straight[7:], strict=True))


def _rank_worker(
    store: str,
    rank: int,
    world_size: int,
    prepared_file: str,
    files: list[str],
    out: str,
    cache_bytes: int = 0,
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    prepared = PreparedData.from_json(Path(prepared_file).read_text())
    stream = _stream(files, prepared, rank, world_size, cache_bytes=cache_bytes)
    steps = _steps(stream, rank, world_size)
    np.savez(out, *steps, rows_read=np.array(stream.rows_read))
    dist.destroy_process_group()


def _caching_rank_worker(
    store: str, rank: int, world_size: int, prepared_file: str, files: list[str], out: str
) -> None:
    _rank_worker(store, rank, world_size, prepared_file, files, out, cache_bytes=1 << 20)


@pytest.mark.parametrize(("world_size", "cached"), [(2, False), (3, False), (2, True)])
def test_ranks_read_their_share_and_assemble_the_one_rank_batches(
    snapshot: tuple[list[str], PreparedData], tmp_path: Path, world_size: int, cached: bool
) -> None:
    files, prepared = snapshot
    alone = _stream(files, prepared)
    expected = _steps(alone, 0, 1)
    worker = _caching_rank_worker if cached else _rank_worker
    outs = run_ranks(tmp_path, worker, files, prepared, world_size, ".npz")
    ranks = [dict(np.load(out)) for out in outs]
    micro = GLOBAL_BATCH // ACCUMULATION // world_size
    for step, rows in enumerate(expected):
        # Micro-batch k of the global batch is rank 0's k-th, then rank 1's, ...
        parts = [ranks[r][f"arr_{step}"] for r in range(world_size)]
        assembled = np.concatenate(
            [p[k * micro : (k + 1) * micro] for k in range(ACCUMULATION) for p in parts]
        )
        assert np.array_equal(assembled, rows), f"step {step}"
    read = [int(r["rows_read"]) for r in ranks]
    # Every block read once per epoch by one rank; kept in memory, once per run.
    assert sum(read) == (alone.rows_read // 2 if cached else alone.rows_read)
    assert max(read) < sum(read) * 0.75


def test_the_next_chunk_is_read_in_the_background_and_its_errors_reach_the_training_thread(
    snapshot: tuple[list[str], PreparedData], tmp_path: Path
) -> None:
    import shutil
    import threading

    from airflow_trainpipe.runtime.data.blocks import file_identity
    from airflow_trainpipe.runtime.data.reader import ChangedDataError

    files, prepared = snapshot
    copies = []
    for uri in files:  # the module's files stay intact for the other tests
        shutil.copy(uri.removeprefix("file://"), tmp_path / uri.rsplit("/", 1)[1])
        copies.append((tmp_path / uri.rsplit("/", 1)[1]).as_uri())
    stream = _stream(copies, prepared)
    stream.reader.identities = [file_identity(uri, "parquet") for uri in copies]
    readers: list[str] = []
    rewritten = threading.Event()
    encode = stream._encode

    def recording(block):  # the prefetch thread reads only once the files were rewritten
        readers.append(threading.current_thread().name)
        if readers[-1] != "MainThread":
            rewritten.wait(30)
        return encode(block)

    stream._encode = recording  # type: ignore[method-assign]
    stream.start_epoch(0)
    stream.take(0, (0, GLOBAL_BATCH), [(0, GLOBAL_BATCH)])
    assert readers[: len(stream.chunks[0])] == ["MainThread"] * len(stream.chunks[0])
    for uri in copies:
        path = uri.removeprefix("file://")
        pq.write_table(pq.read_table(path).slice(0, 10), path)
    rewritten.set()
    end = int(stream.ends[0])
    with pytest.raises(ChangedDataError, match="changed since the fit stage read it"):
        stream.take(0, (end, end + GLOBAL_BATCH), [(end, end + GLOBAL_BATCH)])
    stream.close()
    assert readers[len(stream.chunks[0]) :] == ["block-prefetch_0"]  # the read that failed


@pytest.mark.parametrize(("epochs", "read_on_the_training_thread"), [(2, 3), (None, 6)])
def test_the_next_epochs_first_chunk_is_read_while_the_last_one_trains(
    snapshot: tuple[list[str], PreparedData], epochs: int | None, read_on_the_training_thread: int
) -> None:
    """Knowing the epochs, only the run's very first chunk (3 blocks) is read on the training
    thread; without, the first chunk of every epoch is. The rows are the same either way."""
    import threading

    files, prepared = snapshot
    stream = _stream(files, prepared, epochs=epochs)
    readers: list[str] = []
    encode = stream._encode

    def recording(block):
        readers.append(threading.current_thread().name)
        return encode(block)

    stream._encode = recording  # type: ignore[method-assign]
    steps = _steps(stream, 0, 1)
    stream.close()
    assert readers.count("MainThread") == read_on_the_training_thread
    assert len(readers) == 2 * len(stream.blocks)  # nothing read twice, nothing beyond the last epoch
    reference = _steps(_stream(files, prepared, epochs=1), 0, 1)
    assert all(np.array_equal(a, b) for a, b in zip(steps, reference, strict=True))


def test_a_snapshot_that_fits_the_cache_is_read_once_and_streams_the_same_rows(
    snapshot: tuple[list[str], PreparedData],
) -> None:
    files, prepared = snapshot
    encoded = prepared.train_rows * (prepared.transform.width + 1) * 4
    assert _stream(files, prepared, cache_bytes=encoded - 1).cache is None  # all or nothing
    streamed = _stream(files, prepared)
    cached = _stream(files, prepared, cache_bytes=encoded)
    reference, steps = _steps(streamed, 0, 1), _steps(cached, 0, 1)
    assert all(np.array_equal(a, b) for a, b in zip(steps, reference, strict=True))
    assert streamed.rows_read == 2 * prepared.train_rows
    assert cached.rows_read == prepared.train_rows  # the second epoch read nothing
    assert cached.cache is not None and len(cached.cache) == len(cached.blocks)


def test_a_ranking_stream_moves_whole_queries_and_takes_every_row_once(tmp_path: Path) -> None:
    from airflow_trainpipe.examples.synthetic import search_results
    from airflow_trainpipe.runtime.data.stream import _group_permutation

    config = load_config(EXAMPLE_CONFIGS / "search_ranking.yaml")
    table = search_results(date(2026, 1, 1), 1500, seed=4)
    # Rows of a query scattered within each 100-row group, as a warehouse export may leave them.
    table = table.take(np.random.default_rng(0).permutation(table.num_rows))
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=100)
    files = [(tmp_path / "part-0.parquet").as_uri()]
    prepared = fit(files, config.data, config.features, "ranking")
    reader = BlockReader(files, prepared.identities, config.data, data_columns(config.data))
    stream = BlockStream(prepared, reader, SEED, BUFFER, epochs=1)
    assert stream.row_width == prepared.transform.width + 2  # relevance, query code
    sampler = ResumableSampler(prepared.train_rows, 50, 1, 1, 0, SEED)
    rows = []
    while not sampler.epoch_done():
        [(x, y)] = stream.take(0, *sampler.step_positions())
        rows.append(np.column_stack([x, y]))
    taken = np.concatenate(rows)
    # A query's rows of one block come one after the other, wherever the file put them: the
    # stream has at most one run of a code per (block, query), where a row shuffle has ~1 per row.
    pairs = sum(
        len(np.unique(prepared.transform.group_codes(reader.parts(b)[0], bits=24))) for b in prepared.blocks
    )
    runs = np.count_nonzero(np.diff(taken[:, -1])) + 1
    assert runs <= pairs < len(taken) * 0.6
    # Every training row once: the dropped tail is the only difference.
    assert len(np.unique(taken, axis=0)) == len(taken) == prepared.train_rows - prepared.train_rows % 50
    # The permutation moves runs of a code as a whole, in a seeded order.
    order = _group_permutation(np.random.default_rng(1), np.array([5.0, 5, 3, 3, 3, 8]))
    assert sorted(order.tolist()) == list(range(6))
    moved = np.array([5.0, 5, 3, 3, 3, 8])[order]
    assert np.count_nonzero(np.diff(moved)) == 2


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30], ids=["streamed", "cached"])
def test_rows_cut_on_the_device_are_the_rows_the_host_cuts(
    snapshot: tuple[list[str], PreparedData], cache_bytes: int
) -> None:
    """training.speed.data_on_device, with the CPU as the device: each chunk copied once, the
    micro-batches cut there by position are the host's, through a resumed first epoch too (which
    fills the cache late, so its device copy is made again)."""
    import torch

    files, prepared = snapshot
    reader = BlockReader(files, prepared.identities, CONFIG.data, data_columns(CONFIG.data))
    host, device = (
        BlockStream(prepared, reader, SEED, BUFFER, epochs=3, cache_bytes=cache_bytes, device=d)
        for d in (None, torch.device("cpu"))
    )
    sampler = ResumableSampler(prepared.train_rows, GLOBAL_BATCH, ACCUMULATION, 1, 0, SEED)
    # Resumed at step 7: the blocks of the chunks before were never read by this attempt.
    sampler.load_state_dict({**sampler.state_dict(), "consumed": 7 * GLOBAL_BATCH})
    steps = 0
    while sampler.epoch < 3:  # blocks the second epoch keeps are read from the cache in the third
        while not sampler.epoch_done():
            positions = sampler.step_positions()
            expected, got = (
                host.take_step(sampler.epoch, *positions),
                device.take_step(sampler.epoch, *positions),
            )
            for a, b in zip(expected, got, strict=True):
                assert isinstance(a.x, np.ndarray) and isinstance(b.x, torch.Tensor)
                np.testing.assert_array_equal(b.x.numpy(), a.x)
                np.testing.assert_array_equal(b.y.numpy(), a.y)
                np.testing.assert_array_equal(b.lengths, a.lengths)
            steps += 1
        sampler.next_epoch()
    assert steps > 40
    assert (device.cache is not None) == bool(cache_bytes)
