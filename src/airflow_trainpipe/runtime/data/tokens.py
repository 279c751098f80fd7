"""A block's rows of one side (training, holdout or validation) and their model inputs, with the
text tokenized once per snapshot: token ids are cached on this node by (snapshot, tokenizers).

Tokenizing is the costliest part of encoding text (a 1M-row column takes ~13 s in `tokenizers`'
own batch encode on this machine's kind), and the stream reads every block once an epoch, the
holdout once an evaluation. The first read of a block tokenizes all its rows and writes their ids
to `<TRAINPIPE_HOME>/tokens/<key>/<file>-<row group>.npy` (a temporary name, then renamed: a
reader never sees half a file); every later read, this attempt's or a retry's on this node, loads
them. The key hashes the snapshot's identity and every tokenizer's sha256, so a new snapshot or a
new fit never reads another's ids; ids are a function of those two, so a cached block and a fresh
one are the same bytes, and a resumed job ends bit-exact with an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from airflow_trainpipe.core.storage import trainpipe_home
from airflow_trainpipe.runtime.data.blocks import Block, BlockReader
from airflow_trainpipe.runtime.data.transform import FittedTransform

SIDES = ("train", "holdout", "validation")


def cache_folder(snapshot: str, transform: FittedTransform) -> Path:
    """This node's folder of token ids for a snapshot tokenized by the transform's tokenizers."""
    key = "|".join([snapshot, *(t["tokenizer_sha256"] for t in transform.text)])
    return trainpipe_home() / "tokens" / hashlib.sha256(key.encode()).hexdigest()[:24]


class BlockEncoder:
    def __init__(self, reader: BlockReader, transform: FittedTransform, snapshot: str):
        self.reader, self.transform = reader, transform
        self.folder = cache_folder(snapshot, transform) if transform.text else None
        self.tokenized = 0  # blocks this process tokenized itself (not read from the cache)

    def side(self, block: Block, side: str) -> tuple[pa.Table, np.ndarray]:
        """The block's rows of `side` and their float32 model inputs."""
        table = self.reader.read(block)
        holdout, validation = self.reader.sides(block, table)
        mask = {"train": ~holdout & ~validation, "holdout": holdout, "validation": validation}[side]
        rows = table.filter(pa.array(mask))
        if self.folder is None:
            return rows, self.transform.features(rows)
        tokens = {name: ids[mask] for name, ids in self._tokens(block, table).items()}
        return rows, self.transform.features(rows, tokens)

    def _tokens(self, block: Block, table: pa.Table) -> dict[str, np.ndarray]:
        assert self.folder is not None
        ids: dict[str, np.ndarray] = {}
        for text in self.transform.text:
            path = self.folder / f"{text['name']}-{block.file}-{block.row_group}.npy"
            try:
                ids[text["name"]] = np.load(path).astype(np.float32)
            except (FileNotFoundError, ValueError, EOFError):
                ids[text["name"]] = self.transform.text_encoder(text["name"]).ids(table)
                self._store(path, ids[text["name"]])
        return ids

    def _store(self, path: Path, ids: np.ndarray) -> None:
        self.tokenized += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        with partial.open("wb") as handle:
            np.save(handle, ids.astype(np.int32))
        os.replace(partial, path)
