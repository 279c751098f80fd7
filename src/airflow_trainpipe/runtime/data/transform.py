"""The fitted feature transform: one small JSON document, applied identically everywhere.

Training, holdout evaluation, champion scoring and the logged MLflow model (runtime.serving)
all call `FittedTransform.features` on raw rows, so the feature logic exists once. The
document is versioned (`format`) and identified by the sha256 of its canonical JSON.

Model input layout: the dense block first (per numeric column its value and optional missing
indicator; per one-hot column one input per kept value plus `other`; categorical missing
indicators), then one embedding index per `index` / `hash` column (0 = unknown or missing), then
per text input `max_length` token ids, 0-padded (runtime.data.text). A transform without text
has no `text` key, so its document and hash are those of the tabular format before text existed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trainpipe.contracts.formats import GROUP_HASH_KEY, TRANSFORM_FORMAT
from airflow_trainpipe.core.exceptions import TrainpipeError

FORMAT = TRANSFORM_FORMAT
_GROUP_HASH_KEY = GROUP_HASH_KEY  # pandas takes exactly 16 bytes


class TransformError(TrainpipeError):
    """Rows cannot be transformed: a required column is absent or a value is refused as declared."""


def canonical_json(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)


def bucket_of(values: list[str], buckets: int) -> np.ndarray:
    """Stable across processes and versions: blake2b-64 of the UTF-8 value, modulo `buckets`."""
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little") % buckets
            for v in values
        ],
        dtype=np.int64,
    )


def prepare_numeric(column: pa.ChunkedArray | pa.Array, name: str, log1p: bool) -> np.ndarray:
    """float64 values; null, NaN, infinite (and <= -1 under log1p) become NaN."""
    try:
        values = column.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TransformError(f"column {name!r} is not numeric ({column.type})") from exc
    if log1p:
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.log1p(values)
    values[~np.isfinite(values)] = np.nan
    return values


def as_strings(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.cast(pa.string())


def class_indices(column: pa.ChunkedArray | pa.Array, classes: list[str]) -> np.ndarray:
    """Each raw label's position in a multiclass model's `classes`, -1 for one not among them."""
    position = pc.index_in(as_strings(column), value_set=pa.array(classes, pa.string()))
    return pc.fill_null(position, -1).to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class FittedTransform:
    document: dict[str, Any]
    _hash: str = field(init=False, repr=False, compare=False, default="")
    _encoders: dict[str, Any] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.document.get("format") != FORMAT:
            raise TransformError(
                f"unsupported transform format {self.document.get('format')!r}; this version reads {FORMAT!r}"
            )
        object.__setattr__(
            self, "_hash", "sha256:" + hashlib.sha256(canonical_json(self.document).encode()).hexdigest()
        )

    # -- identity ------------------------------------------------------------------------------

    @property
    def hash(self) -> str:
        return self._hash

    def to_json(self) -> str:
        return canonical_json(self.document)

    @classmethod
    def from_json(cls, text: str) -> FittedTransform:
        return cls(json.loads(text))

    # -- shape ---------------------------------------------------------------------------------

    @property
    def columns(self) -> list[dict[str, Any]]:
        return self.document["columns"]

    @property
    def task(self) -> str:
        return self.document["label"]["task"]

    @property
    def classes(self) -> list[str] | None:
        """A multiclass label's classes (as strings), in the order of the model's outputs."""
        return self.document["label"].get("classes")

    @property
    def num_outputs(self) -> int:
        """Network outputs per row: one logit per class (multiclass), else one."""
        return len(self.classes) if self.classes else 1

    @property
    def group(self) -> str | None:
        """A ranking task's query column."""
        return self.document["label"].get("group")

    @property
    def num_dense(self) -> int:
        width = 0
        for fitted in self.columns:
            width += int(fitted["missing_indicator"])
            if fitted["kind"] == "numeric":
                width += 1
            elif fitted["encode"] == "one_hot":
                width += len(fitted["categories"]) + 1
        return width

    @property
    def width(self) -> int:
        """Columns of `features()`: the dense inputs, one code per embedded column, the token ids."""
        return self.num_dense + len(self.cardinalities) + sum(t["max_length"] for t in self.text)

    @property
    def text(self) -> list[dict[str, Any]]:
        """The fitted text inputs (runtime.data.text.fitted_input), in input order."""
        return self.document.get("text", [])

    def text_encoder(self, name: str) -> Any:
        """The text input's tokenizer, loaded once per transform from its JSON."""
        if name not in self._encoders:
            from airflow_trainpipe.runtime.data.text import TextEncoder

            self._encoders[name] = TextEncoder(next(t for t in self.text if t["name"] == name))
        return self._encoders[name]

    @property
    def cardinalities(self) -> list[int]:
        return [
            len(s["categories"]) + 1 if s["encode"] == "index" else s["buckets"] + 1
            for s in self.columns
            if s["kind"] == "categorical" and s["encode"] != "one_hot"
        ]

    @property
    def input_names(self) -> list[str]:
        """The raw columns a row to score holds: the tabular features, then the text columns."""
        return [s["name"] for s in self.columns] + [c for t in self.text for c in t["columns"]]

    # -- applying ------------------------------------------------------------------------------

    def features(self, table: pa.Table, tokens: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """float32 (rows, width) model inputs of raw rows. `tokens`: each text input's ids of these
        rows, already computed (runtime.data.tokens); else the text is tokenized here."""
        tabular = self._tabular(table)
        if not self.text:
            return tabular
        ids = [
            tokens[t["name"]] if tokens is not None else self._token_ids(t["name"], table) for t in self.text
        ]
        return np.concatenate([tabular, *ids], axis=1).astype(np.float32, copy=False)

    def _token_ids(self, name: str, table: pa.Table) -> np.ndarray:
        encoder = self.text_encoder(name)
        for column in encoder.columns:
            if column not in table.column_names:
                raise TransformError(
                    f"required text column {column!r} is missing from the rows to transform "
                    f"(they have: {', '.join(table.column_names) or 'no columns'})"
                )
        try:
            return encoder.ids(table)  # type: ignore[no-any-return]
        except TrainpipeError as exc:
            raise TransformError(f"text input {name!r}: {exc}") from exc

    def _tabular(self, table: pa.Table) -> np.ndarray:
        rows = table.num_rows
        dense: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        for fitted in self.columns:
            name = fitted["name"]
            if name in table.column_names:
                column = table.column(name)
            elif fitted["optional"]:
                column = pa.nulls(rows, pa.float64() if fitted["kind"] == "numeric" else pa.string())
            else:
                raise TransformError(
                    f"required column {name!r} is missing from the rows to transform "
                    f"(they have: {', '.join(table.column_names) or 'no columns'})"
                )
            if fitted["kind"] == "numeric":
                values, missing = self._numeric(fitted, column)
                dense.append(values[:, None])
            else:
                block, code, missing = self._categorical(fitted, column)
                if block is not None:
                    dense.append(block)
                if code is not None:
                    codes.append(code[:, None])
            if fitted["missing_indicator"]:
                dense.append(missing.astype(np.float64)[:, None])
        parts = dense + codes
        if not parts:
            return np.zeros((rows, 0), np.float32)
        return np.concatenate(parts, axis=1).astype(np.float32)

    @staticmethod
    def _numeric(fitted: dict[str, Any], column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        values = prepare_numeric(column, fitted["name"], fitted["log1p"])
        missing = np.isnan(values)
        if fitted["clip"] is not None:
            low, high = fitted["clip"]
            values = np.clip(values, low, high)
        if missing.any():
            if fitted["fill"] is None:
                raise TransformError(
                    f"column {fitted['name']!r} has {int(missing.sum())} missing value(s) and declares fill: error"
                )
            values = np.where(missing, fitted["fill"], values)
        return (values - fitted["center"]) / fitted["scale"], missing

    @staticmethod
    def _categorical(
        fitted: dict[str, Any], column: pa.ChunkedArray
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        strings = as_strings(column)
        missing = strings.is_null().to_numpy(zero_copy_only=False)
        if fitted["missing"] == "error" and missing.any():
            raise TransformError(
                f"column {fitted['name']!r} has {int(missing.sum())} missing value(s) and declares missing: error"
            )
        if fitted["encode"] == "hash":
            encoded = strings.dictionary_encode()
            buckets = bucket_of(encoded.dictionary.to_pylist(), fitted["buckets"]) + 1
            indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            code = np.where(indices >= 0, buckets[np.maximum(indices, 0)] if buckets.size else 0, 0)
            return None, code.astype(np.float64), missing
        position = pc.index_in(strings, value_set=pa.array(fitted["categories"], pa.string()))
        position = pc.fill_null(position, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        if fitted["encode"] == "index":
            return None, (position + 1).astype(np.float64), missing
        width = len(fitted["categories"]) + 1
        block = np.zeros((len(position), width))
        block[np.arange(len(position)), np.where(position >= 0, position, width - 1)] = 1.0  # last: `other`
        return block, None, missing

    # -- labels and outputs --------------------------------------------------------------------

    def labels(self, table: pa.Table) -> np.ndarray:
        """Training targets: the label standardised for regression, 0/1 for binary classification,
        the class index for multiclass (-1: a class the training rows never held), the relevance
        for ranking."""
        label = self.document["label"]
        column = table.column(label["name"])
        if self.classes:
            return class_indices(column, self.classes).astype(np.float32)
        values = prepare_numeric(column, label["name"], log1p=False)
        return ((values - label["mean"]) / label["std"]).astype(np.float32)

    def group_codes(self, table: pa.Table, bits: int = 53) -> np.ndarray:
        """A ranking row's group as an integer-valued float64: a hash of the value, cut to `bits`
        so it is exact as a float (24 bits for a float32 training column, where two groups
        sharing a code within one micro-batch are rare enough not to matter)."""
        import pandas as pd

        keys = table.column(self.document["label"]["group"]).to_pandas().astype(str)
        hashed = pd.util.hash_pandas_object(keys, index=False, hash_key=_GROUP_HASH_KEY).to_numpy()
        return (hashed >> np.uint64(64 - bits)).astype(np.float64)

    def label_values(self, targets: np.ndarray) -> np.ndarray:
        label = self.document["label"]
        return np.asarray(targets, np.float64) * label["std"] + label["mean"]

    def predictions(self, outputs: np.ndarray) -> np.ndarray:
        """Network outputs to what a consumer wants: P(class 1), per-class probabilities, ranking
        scores, or values in the label's units."""
        outputs = np.asarray(outputs, np.float64)
        if self.task == "binary_classification":
            return 1 / (1 + np.exp(-outputs))
        if self.task == "multiclass_classification":
            shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
            return shifted / shifted.sum(axis=1, keepdims=True)  # (rows, classes) probabilities
        if self.task == "ranking":
            return outputs  # scores: only their order within a group means anything
        return self.label_values(outputs)
