"""The training rows of an epoch as one stream, the same on every world size, read in shares.

Order. Each epoch visits the blocks (Parquet row groups) in a seeded permutation and cuts that
sequence into chunks of consecutive blocks holding at least `buffer_rows` training rows; each
chunk's rows are permuted in full with a seed of (seed, epoch, chunk). The stream is the chunks
one after another, so its order depends on the data, the seed and the buffer only: global batch
k is stream positions [k*G, (k+1)*G) on 1, 2 or 3 ranks alike, and the sampler's (epoch,
consumed) is the whole resume state. A snapshot smaller than the buffer is one chunk: a full
permutation, as before streaming existed.

Reading. Each rank reads and encodes every W-th block of a chunk (its share), and one all-gather
over a gloo group assembles the encoded chunk on every rank, so the I/O and decoding are divided
by the world size while each rank still takes its micro-batches at its positions of every global
batch. The chunk's permutation is applied to an index, not to the rows: loading a chunk copies
nothing after the all-gather, and each micro-batch copies out its own rows. Memory holds at most
the two chunks a global batch can straddle, plus this rank's share of the next chunk, whatever
the snapshot's size.

Prefetch. Once a chunk is assembled, a background thread reads and encodes this rank's share of
the next chunk while the steps run: the epoch's next one or, after its last, the first of the
next epoch (a layout depends only on the seed and the epoch). The next load is then only its
all-gather, which stays on the training thread: collectives must be issued in the same order on
every rank. What is encoded does not depend on when, so the stream is the same with or without
it.

Cache. When the encoded training rows of the whole snapshot fit in `cache_bytes`
(`data.encoded_cache_mib`), every rank copies each chunk's blocks, as assembled, into one array
of the whole snapshot, and from the second epoch on a chunk is that array and an index into it:
no read, no decode, no all-gather, no copy. The
bytes are the ones a read would produce, so the stream is the same; a larger snapshot streams
every epoch and memory stays bounded by the chunks, as above.

Device. With `device` (a GPU rank's, `training.speed.data_on_device`) each chunk's rows are
copied to the device once, as the chunk loads (the cache once, whole), and `take_step` cuts its
micro-batches there: a step moves only its row positions to the device, not its rows. Each
micro-batch also carries its rows' text lengths, counted on the host from the host rows, so the
step knows its padded widths without reading the device.

Statistical quality vs a full permutation: a batch draws its rows from the blocks of one or two
chunks, not from the whole snapshot. With blocks that are random samples of the data that is
the same thing; with data sorted within its files (by time, by user), rows of one batch are
correlated the way one buffer's blocks are, which a larger `data.shuffle_buffer_rows` dilutes.
Each row is still seen exactly once per epoch, and the chunk composition changes every epoch.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from airflow_trainpipe.runtime.data.blocks import Block, BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData
from airflow_trainpipe.runtime.data.tokens import BlockEncoder
from airflow_trainpipe.runtime.models.inputs import ModelInputs, text_lengths

_ORDER_STREAM = 0x0B10C5  # separates the block-order draws from the per-chunk permutations


def _group_permutation(rng: np.random.Generator, codes: np.ndarray) -> np.ndarray:
    """A permutation of rows that moves runs of one group code (a ranking group's rows in a
    block) as a whole, in a seeded order: the positions of each run, run after run."""
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(codes)])
    order = rng.permutation(len(starts))
    moved, lengths = starts[order], sizes[order]
    before = np.cumsum(lengths) - lengths  # where each moved run lands
    return np.repeat(moved - before, lengths) + np.arange(len(codes))


class Chunk:
    """One chunk's rows as gathered (every rank's share side by side, x and label columns
    together) and, per stream position, the row that holds it: permuting the index instead of
    the rows keeps the load at a few integer operations per row, and each micro-batch copies out
    only its own rows."""

    __slots__ = ("end", "index", "on_device", "rows", "start")

    def __init__(
        self, start: int, rows: np.ndarray, index: np.ndarray, on_device: torch.Tensor | None = None
    ):
        self.start, self.end, self.rows, self.index = start, start + len(index), rows, index
        self.on_device = on_device  # `rows` on the device, when the stream has one

    def positions(self, start: int, stop: int) -> np.ndarray:
        return self.index[start - self.start : stop - self.start]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step: inputs, targets (numpy on the host, or tensors on the stream's
    device), each row's non-pad token count per text input, (rows, text inputs), and the inputs
    on the host (what packing reads; `x` itself when the micro-batch is cut on the host)."""

    x: Any
    y: Any
    lengths: np.ndarray
    host_x: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)


def to_device(
    rows: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Host rows on `device`, copied from pinned memory without blocking the host (a copy from
    pageable memory first waits for every kernel queued before it); a tensor there already, as is."""
    tensor = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(rows)
    if tensor.device.type == "cpu" and device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, dtype, non_blocking=True)


class EncodedCache:
    """Every training row of the snapshot, encoded, in one array, block b's rows from `at[b]` on.
    Filled as the first epoch assembles its chunks; a chunk whose blocks are all here is then this
    array and an index into it, with no copy at all."""

    def __init__(self, blocks: list[Block], row_width: int):
        starts = np.cumsum([0, *(b.train_rows for b in blocks)])
        self.at = {b: int(s) for b, s in zip(blocks, starts[:-1], strict=True)}
        self.rows = np.empty((int(starts[-1]), row_width), np.float32)  # pages are touched as it fills
        self.filled: set[Block] = set()

    def __len__(self) -> int:
        return len(self.filled)

    def holds(self, blocks: list[Block]) -> bool:
        return all(b in self.filled for b in blocks)

    def keep(self, blocks: list[Block], rows: np.ndarray, offsets: list[int]) -> None:
        for block, offset in zip(blocks, offsets, strict=True):
            at = self.at[block]
            self.rows[at : at + block.train_rows] = rows[offset : offset + block.train_rows]
            self.filled.add(block)


class BlockStream:
    def __init__(
        self,
        prepared: PreparedData,
        reader: BlockReader,
        seed: int,
        buffer_rows: int,
        rank: int = 0,
        world_size: int = 1,
        group: Any = None,
        epochs: int | None = None,
        cache_bytes: int = 0,
        encoder: BlockEncoder | None = None,
        device: torch.device | None = None,
    ):
        """`encoder`: reads and encodes blocks, caching token ids (default: one keyed by the fit).
        `device`: where `take_step` cuts micro-batches (None: on the host, as numpy)."""
        self.transform, self.reader = prepared.transform, reader
        self.encoder = encoder or BlockEncoder(reader, prepared.transform, prepared.key)
        self.blocks = [b for b in prepared.blocks if b.train_rows]
        self.seed, self.buffer_rows = seed, buffer_rows
        self.rank, self.world_size, self.group = rank, world_size, group
        self.epochs = epochs  # known: the last chunk of an epoch prefetches the next epoch's first
        self.width = prepared.transform.width
        self.inputs = ModelInputs.of(prepared.transform)
        self.device = device
        self._cache_on_device: tuple[int, torch.Tensor] | None = None  # (blocks held, copy)
        # After the inputs, the target: the label, or for ranking (relevance, group code).
        self.targets = 2 if prepared.transform.task == "ranking" else 1
        self.row_width = self.width + self.targets
        self.epoch: int | None = None
        self.chunks: list[list[Block]] = []
        self.ends = np.zeros(0, np.int64)
        self.loaded: dict[int, Chunk] = {}
        self.rows_read = 0  # training rows this rank read and encoded itself
        self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="block-prefetch")
        self._prefetched: tuple[tuple[int, int], Future[list[np.ndarray]]] | None = None
        # All or nothing, decided from the block index alone so that every rank decides alike: a
        # partial cache would rarely hold a whole chunk (the chunks are new subsets every epoch).
        encoded = sum(b.train_rows for b in self.blocks) * self.row_width * 4
        self.cache = EncodedCache(self.blocks, self.row_width) if 0 < encoded <= cache_bytes else None

    def start_epoch(self, epoch: int) -> None:
        self.chunks = self._layout(epoch)
        self.ends = np.cumsum([sum(b.train_rows for b in chunk) for chunk in self.chunks])
        self.epoch, self.loaded = epoch, {}
        if self._prefetched is not None and self._prefetched[0][0] != epoch:
            self._prefetched = None

    def _layout(self, epoch: int) -> list[list[Block]]:
        """The epoch's chunks: the blocks in a seeded order, cut after every `buffer_rows` rows."""
        order = np.random.default_rng([self.seed, epoch, _ORDER_STREAM]).permutation(len(self.blocks))
        chunks, current, rows = [], [], 0
        for index in order:
            current.append(self.blocks[index])
            rows += self.blocks[index].train_rows
            if rows >= self.buffer_rows:
                chunks.append(current)
                current, rows = [], 0
        if current:
            chunks.append(current)
        return chunks

    def take(
        self, epoch: int, global_range: tuple[int, int], ranges: list[tuple[int, int]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Collective: the rows at this rank's `ranges` of the global batch at `global_range`."""
        if epoch != self.epoch:
            self.start_epoch(epoch)
        first, last = global_range
        needed = range(self._chunk_of(first), self._chunk_of(last - 1) + 1)
        self.loaded = {c: chunk for c, chunk in self.loaded.items() if c in needed}
        for c in needed:  # every rank loads the same chunks in the same order: they are collectives
            if c not in self.loaded:
                self.loaded[c] = self._load(c)
        return [self._rows(start, stop) for start, stop in ranges]

    def take_step(
        self, epoch: int, global_range: tuple[int, int], ranges: list[tuple[int, int]]
    ) -> list[MicroBatch]:
        """Collective: `take`'s rows as micro-batches with their text lengths, cut on the device
        when the stream has one."""
        host = self.take(epoch, global_range, ranges)
        if self.device is None:
            return [MicroBatch(x, y, text_lengths(x, self.inputs), x) for x, y in host]
        return [
            MicroBatch(*self._device_rows(start, stop), text_lengths(x, self.inputs), x)
            for (start, stop), (x, _) in zip(ranges, host, strict=True)
        ]

    def _chunk_of(self, position: int) -> int:
        return int(np.searchsorted(self.ends, position, side="right"))

    def _rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for chunk in sorted(self.loaded.values(), key=lambda c: c.start):
            lo, hi = max(start, chunk.start), min(stop, chunk.end)
            if lo < hi:
                positions = chunk.positions(lo, hi)
                xs.append(chunk.rows[positions, : self.width])
                ys.append(
                    chunk.rows[positions, self.width]
                    if self.targets == 1
                    else chunk.rows[positions, self.width :]
                )
        return (xs[0], ys[0]) if len(xs) == 1 else (np.concatenate(xs), np.concatenate(ys))

    def _device_rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows at stream positions [start, stop) cut from the chunks' device copies: only
        the positions travel (pinned, asynchronously: the host does not wait for the device)."""
        assert self.device is not None
        xs, ys = [], []
        for chunk in sorted(self.loaded.values(), key=lambda c: c.start):
            lo, hi = max(start, chunk.start), min(stop, chunk.end)
            if lo < hi:
                assert chunk.on_device is not None
                rows = chunk.on_device[to_device(chunk.positions(lo, hi), self.device)]
                xs.append(rows[:, : self.width])
                ys.append(rows[:, self.width] if self.targets == 1 else rows[:, self.width :])
        return (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))

    def _chunk_on_device(self, rows: np.ndarray) -> torch.Tensor:
        """A chunk's rows on the device: the cache is copied once, whole; a gathered chunk once."""
        assert self.device is not None
        if self.cache is not None and rows is self.cache.rows:
            # Copied again when blocks were kept since (a resumed first epoch fills it late).
            if self._cache_on_device is None or self._cache_on_device[0] != len(self.cache):
                self._cache_on_device = (len(self.cache), torch.from_numpy(rows).to(self.device, copy=True))
            return self._cache_on_device[1]
        # A copy even when the device is the host's (a test's): later writes to `rows` are not in it.
        return torch.from_numpy(rows).to(self.device, copy=True)

    def close(self) -> None:
        self._prefetcher.shutdown(wait=True, cancel_futures=True)

    def _load(self, c: int) -> Chunk:
        blocks = self.chunks[c]
        if self.cache is not None and self.cache.holds(blocks):
            rows, offsets = self.cache.rows, [self.cache.at[b] for b in blocks]
        else:
            rows, offsets = self._gather(self._my_share(c), blocks)
            if self.cache is not None:
                self.cache.keep(blocks, rows, offsets)
        self._prefetch_after(c)
        # The chunk's rows in block order, then permuted: position p holds row index[p] of `rows`.
        index = np.concatenate([np.arange(o, o + b.train_rows) for o, b in zip(offsets, blocks, strict=True)])
        rng = np.random.default_rng([self.seed, self.epoch or 0, c])
        start = int(self.ends[c - 1]) if c else 0
        on_device = self._chunk_on_device(rows) if self.device is not None else None
        if self.targets == 1:
            return Chunk(start, rows, index[rng.permutation(len(index))], on_device)
        return Chunk(start, rows, index[_group_permutation(rng, rows[index, -1])], on_device)

    def _prefetch_after(self, c: int) -> None:
        """Read this rank's share of the chunk after `c` in the background: the epoch's next one,
        or, at the epoch's end, the first of the next epoch (whose layout is known in advance)."""
        epoch = self.epoch or 0
        if c + 1 < len(self.chunks):
            key, blocks = (epoch, c + 1), self.chunks[c + 1]
        elif self.epochs is not None and epoch + 1 < self.epochs:
            key, blocks = (epoch + 1, 0), self._layout(epoch + 1)[0]
        else:
            return
        if self.cache is None or not self.cache.holds(blocks):
            self._prefetched = (key, self._prefetcher.submit(self._encode_share, blocks))

    def _my_share(self, c: int) -> list[np.ndarray]:
        """This rank's blocks of chunk `c`, encoded: prefetched, or read now (the first chunk, a
        resumed position). A prefetch that failed raises its error here, on the training thread."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == (self.epoch or 0, c):
            return prefetched[1].result()
        return self._encode_share(self.chunks[c])

    def _encode_share(self, blocks: list[Block]) -> list[np.ndarray]:
        return [self._encode(block) for block in blocks[self.rank :: self.world_size]]

    def _encode(self, block: Block) -> np.ndarray:
        train, features = self.encoder.side(block, "train")
        self.rows_read += train.num_rows
        rows = np.empty((train.num_rows, self.row_width), np.float32)
        rows[:, : self.width] = features
        rows[:, self.width] = self.transform.labels(train)
        if self.targets == 2:
            rows[:, -1] = self.transform.group_codes(train, bits=24)
            # A group's rows side by side, whatever the file's order: the chunk permutes groups.
            rows = rows[np.argsort(rows[:, -1], kind="stable")]
        return rows

    def _gather(self, mine: list[np.ndarray], blocks: list[Block]) -> tuple[np.ndarray, list[int]]:
        """Every rank's encoded blocks in one array, and where each block of the chunk starts in it.

        Rank r holds blocks r, r+W, r+2W, ... of the chunk; sizes come from the block index, so one
        all-gather into one preallocated array suffices, with no copy after it."""
        sizes = [[b.train_rows for b in blocks[r :: self.world_size]] for r in range(self.world_size)]
        longest = max(sum(s) for s in sizes)
        gathered = torch.empty((self.world_size, longest, self.row_width), dtype=torch.float32)
        local = gathered[0] if self.world_size == 1 else torch.empty_like(gathered[0])  # padding: never read
        if mine:
            np.concatenate(mine, out=local.numpy()[: sum(len(m) for m in mine)])
        if self.world_size > 1:
            dist.all_gather(list(gathered.unbind(0)), local, group=self.group)
        starts = [
            [r * longest + int(o) for o in np.cumsum([0, *sizes[r]])[:-1]] for r in range(self.world_size)
        ]
        # Block i of the chunk is rank i % W's (i // W)-th.
        offsets = [starts[i % self.world_size][i // self.world_size] for i in range(len(blocks))]
        return gathered.numpy().reshape(-1, self.row_width), offsets
