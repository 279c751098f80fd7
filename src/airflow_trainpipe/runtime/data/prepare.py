"""The fit stage: once per run, one pass over the snapshot before any rank trains.

It checks every file's bytes against the validated manifest, splits off the holdout, fits the
transforms on the training rows, and records the block index (every block's place and its
training and holdout row counts) that the ranks stream by. Rank 0 runs it and hands the result to
the others, so the transform cannot depend on the world size; the result is written to the run
directory, so a retry (on any world size, on another node) reuses it instead of fitting again,
as long as the data, the config sections it depends on and every file's identity are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from airflow_trainpipe.config.data import DataSection, ValidationSplit
from airflow_trainpipe.config.features import FeaturesSection
from airflow_trainpipe.config.text import text_inputs
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.storage import filesystem, join
from airflow_trainpipe.runtime.data.blocks import Block, BlockReader, file_identity, scan_blocks
from airflow_trainpipe.runtime.data.fitting import TransformFitter
from airflow_trainpipe.runtime.data.reader import DataError, HoldoutSplit, check_label, data_columns
from airflow_trainpipe.runtime.data.text import TextFitter
from airflow_trainpipe.runtime.data.transform import FORMAT, FittedTransform

log = logging.getLogger(__name__)

PREPARED_FILE = "prepared.json"


class PretrainedText(Protocol):
    """A pretrained directory as the fit sees it (runtime.pretrained.directory.PretrainedDirectory):
    its tokenizer is the text input's, and its bytes are part of what the fit depends on."""

    sha256: str

    def text_input(self, name: str, columns: list[str], max_length: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class PreparedData:
    key: str
    """What the fit depended on (files, data digest, config sections, transform format)."""

    transform: FittedTransform
    blocks: list[Block]
    identities: list[str]
    """Each data file's size and modification stamp when the fit read it."""

    fit_seconds: float

    @property
    def train_rows(self) -> int:
        return sum(b.train_rows for b in self.blocks)

    @property
    def holdout_rows(self) -> int:
        return sum(b.holdout_rows for b in self.blocks)

    @property
    def validation_rows(self) -> int:
        return sum(b.validation_rows for b in self.blocks)

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "transform": json.loads(self.transform.to_json()),
                "blocks": [b.to_list() for b in self.blocks],
                "identities": self.identities,
                "fit_seconds": self.fit_seconds,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> PreparedData:
        doc = json.loads(text)
        return cls(
            key=doc["key"],
            transform=FittedTransform.from_json(json.dumps(doc["transform"])),
            blocks=[Block.from_list(b) for b in doc["blocks"]],
            identities=doc["identities"],
            fit_seconds=doc["fit_seconds"],
        )


def prepared_key(
    files: list[str],
    data: DataSection,
    features: FeaturesSection,
    task: str,
    manifest: Manifest | None,
    validation: ValidationSplit | None = None,
    pretrained: PretrainedText | None = None,
) -> str:
    document: dict[str, Any] = {
        "files": files,
        "digest": manifest.digest if manifest is not None else None,
        "data": data.model_dump(mode="json", by_alias=True),
        "features": features.model_dump(mode="json", by_alias=True),
        "task": task,
        "transform_format": FORMAT,
        # Only a tuning trial's fit depends on it: the keys of every other run stay as they were.
        **({"validation": validation.model_dump(mode="json")} if validation is not None else {}),
        **({"pretrained": pretrained.sha256} if pretrained is not None else {}),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def fit(
    files: list[str],
    data: DataSection,
    features: FeaturesSection,
    task: str,
    manifest: Manifest | None = None,
    validation: ValidationSplit | None = None,
    pretrained: PretrainedText | None = None,
) -> PreparedData:
    """Fit on the training rows only: each block's holdout (and validation) rows are dropped first."""
    started = time.perf_counter()
    columns = data_columns(data)
    # Stamped before the bytes are read: a file replaced during the scan fails the later block reads.
    identities = [file_identity(uri, data.format) for uri in files]
    fitter, split = TransformFitter(data, features, task), HoldoutSplit(data, validation)
    blocks: list[Block] = []
    position = 0
    for file_index, group, table in scan_blocks(files, data.format, columns, manifest):
        check_label(table, data.label)
        held, validating = split.sides_at(table, position)
        train = table.filter(pa.array(~held & ~validating))
        fitter.update(train)
        blocks.append(
            Block(file_index, group, position, train.num_rows, int(held.sum()), int(validating.sum()))
        )
        position += table.num_rows
    reader = BlockReader(files, identities, data, columns, validation)
    if fitter.needs_second_pass:
        fitter.start_second_pass()
        for block in blocks:
            fitter.update_clipped(reader.parts(block)[0])
    train_rows = sum(b.train_rows for b in blocks)
    holdout_rows = sum(b.holdout_rows for b in blocks)
    if train_rows == 0 or holdout_rows == 0:
        raise DataError(f"holdout split left {train_rows} training and {holdout_rows} holdout rows")
    if validation is not None and not sum(b.validation_rows for b in blocks):
        raise DataError(
            f"the validation split (data.validation.fraction {validation.fraction:g}) left no rows of "
            f"{train_rows} training rows: raise the fraction, add rows, or set data.validation: null"
        )
    return PreparedData(
        key=prepared_key(files, data, features, task, manifest, validation, pretrained),
        transform=fitter.result(_fit_text(data, features, reader, blocks, pretrained)),
        blocks=blocks,
        identities=identities,
        fit_seconds=time.perf_counter() - started,
    )


def _fit_text(
    data: DataSection,
    features: FeaturesSection,
    reader: BlockReader,
    blocks: list[Block],
    pretrained: PretrainedText | None = None,
) -> list[dict[str, Any]]:
    """Each text input's tokenizer, trained on the training rows: one more pass per input (the
    trainer consumes one stream of text). A pretrained directory's tokenizer is its own."""
    fitted = []
    for name, columns in text_inputs(data.features.text, features.text):
        if pretrained is not None:
            fitted.append(pretrained.text_input(name, columns, features.text_transform(name).max_length))
            continue

        def tables(columns: list[str] = columns) -> Iterator[pa.Table]:
            return (reader.parts(block)[0].select(columns) for block in blocks if block.train_rows)

        fitted.append(TextFitter(name, columns, features.text_transform(name)).fit(tables))
    return fitted


def prepare(
    files: list[str],
    data: DataSection,
    features: FeaturesSection,
    task: str,
    manifest: Manifest | None,
    run_dir: str,
    validation: ValidationSplit | None = None,
    pretrained: PretrainedText | None = None,
) -> PreparedData:
    """The run's fit: the one an earlier attempt saved when it still holds, else a new one (saved).
    `pretrained`: the directory whose tokenizer the text input uses (runtime.pretrained)."""
    fs, path = filesystem(join(run_dir, PREPARED_FILE))
    key = prepared_key(files, data, features, task, manifest, validation, pretrained)
    if fs.exists(path):
        try:
            saved = PreparedData.from_json(fs.cat_file(path).decode())
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", path, exc)
        else:
            if saved.key == key and saved.identities == [file_identity(uri, data.format) for uri in files]:
                log.info("reusing the fit of an earlier attempt (%s)", path)
                return saved
            log.warning("refitting: %s was fitted on other data or config", path)
    prepared = fit(files, data, features, task, manifest, validation, pretrained)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    # Written whole to a temporary name, then renamed: an attempt killed mid-write leaves no
    # half file for the next one to trust (object stores publish a PUT whole anyway).
    fs.pipe_file(f"{path}.tmp", prepared.to_json().encode())
    fs.mv(f"{path}.tmp", path)
    log.info(
        "fitted the transforms on %d training rows in %d blocks in %.1f s",
        prepared.train_rows,
        len(prepared.blocks),
        prepared.fit_seconds,
    )
    return prepared
