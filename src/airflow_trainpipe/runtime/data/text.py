"""Text inputs: the tokenizers a run trains on its training split, and text turned into token ids.

Each text input (a text column, or two paired columns) gets a Hugging Face `tokenizers`
tokenizer, trained from the training rows only (streamed a batch at a time: the trainer keeps word
counts, not the text) and stored, as the library's own JSON, inside the fitted transform: the
training job, the holdout, the champion's scoring and the served model all tokenize with the very
same document. Its post-processor adds `[CLS] a [SEP]` (`[CLS] a [SEP] b [SEP]` for a pair, segment
ids 0 then 1) and truncation keeps `max_length` tokens (the longer segment of a pair is cut first).

Token ids travel as float32 columns of the model's input row (exact below 2^24: a vocabulary is at
most 1M tokens), padded with the id of `[PAD]` (0 in a fitted tokenizer, the model's own in a
pretrained one); the attention mask and the segment ids follow
from the ids (`MappedInputs`), so the row stays one flat array for the stream, the all-gather and
the export.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_trainpipe.config.text import MAX_CHARS_PER_TOKEN, TextTransform
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.runtime.data.reader import DataError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # trained first: [PAD] is id 0
# C0 control characters but tab and newlines, and DEL: a NUL byte in a text is no token.
_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"


def _normalizer(transform: TextTransform) -> Any:
    from tokenizers import Regex, normalizers

    steps: list[Any] = [normalizers.Replace(Regex(_CONTROL), "")]
    if transform.normalization == "nfkc":
        steps.append(normalizers.NFKC())
    elif transform.normalization == "nfc":
        steps.append(normalizers.NFC())
    if transform.lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps)


def new_tokenizer(transform: TextTransform, alphabet: list[str] | None = None) -> tuple[Any, Any]:
    """An untrained tokenizer of the declared kind and its trainer; `alphabet`: a WordPiece
    fit's characters after normalization (`TextFitter.alphabet`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    trainer: Any
    if transform.tokenizer == "wordpiece":
        # What WordPieceTrainer does (a BPE fit with `##` continuations, loaded as a WordPiece of
        # its vocabulary: `as_wordpiece`), made deterministic. The trainer numbers a `##c` piece
        # when it first meets it, walking the words in hash-map order, and breaks ties between
        # equally frequent merges by those numbers: 4 fits of one text gave 4 tokenizers
        # (measured). Every `##c` of the alphabet, given in sorted order first, has its number
        # before the walk; the fit is then the same every time.
        alphabet = alphabet or []
        tokenizer = Tokenizer(models.BPE(unk_token=UNK, continuing_subword_prefix="##"))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=transform.vocab_size,
            min_frequency=transform.min_frequency,
            special_tokens=[*SPECIAL_TOKENS, *(f"##{c}" for c in alphabet)],
            initial_alphabet=alphabet,
            continuing_subword_prefix="##",
            show_progress=False,
        )
    else:  # byte-level BPE: every byte sequence has tokens, nothing is unknown
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=transform.vocab_size,
            min_frequency=transform.min_frequency,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    tokenizer.normalizer = _normalizer(transform)
    return tokenizer, trainer


def as_wordpiece(trained: Any) -> Any:
    """A WordPiece tokenizer of a `##`-continuation BPE's vocabulary, its ids kept."""
    from tokenizers import Tokenizer, decoders, models

    tokenizer = Tokenizer(
        models.WordPiece(
            trained.get_vocab(), unk_token=UNK, continuing_subword_prefix="##", max_input_chars_per_word=100
        )
    )
    # The `##c` pieces were the trainer's special tokens only to be numbered first: here they are
    # vocabulary, and only the real special tokens are special.
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.normalizer = trained.normalizer
    tokenizer.pre_tokenizer = trained.pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def texts_of(column: pa.ChunkedArray | pa.Array, max_length: int) -> list[str]:
    """A text column as Python strings: null as empty, each cut to what `max_length` tokens can
    hold (`MAX_CHARS_PER_TOKEN` characters a token)."""
    limit = max_length * MAX_CHARS_PER_TOKEN
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"text column holds {column.type}, not strings")
    return ["" if text is None else text[:limit] for text in column.to_pylist()]


class TextFitter:
    """Trains one text input's tokenizer from batches of training rows."""

    def __init__(self, name: str, columns: list[str], transform: TextTransform):
        self.name, self.columns, self.transform = name, columns, transform

    def fit(self, batches: Callable[[], Iterable[pa.Table]]) -> dict[str, Any]:
        """The fitted input: its tokenizer JSON and what applying it needs. `batches` gives the
        training rows from the start on every call (a WordPiece fit reads them twice)."""
        alphabet = self.alphabet(batches()) if self.transform.tokenizer == "wordpiece" else None
        tokenizer, trainer = new_tokenizer(self.transform, alphabet)
        tokenizer.train_from_iterator(self._texts(batches()), trainer=trainer)
        if self.transform.tokenizer == "wordpiece":
            tokenizer = as_wordpiece(tokenizer)
        trained = tokenizer.get_vocab_size()
        if trained < self.transform.vocab_size:
            raise DataError(
                f"features.text.{self.name}.vocab_size is {self.transform.vocab_size}, but the training "
                f"text of {' and '.join(map(repr, self.columns))} yields {trained} tokens (min_frequency "
                f"{self.transform.min_frequency}); lower vocab_size to {trained} or less"
            )
        return fitted_input(self.name, self.columns, self.transform, tokenizer)

    def alphabet(self, batches: Iterable[pa.Table]) -> list[str]:
        """Every character of the training text after normalization, sorted (whitespace aside:
        the pre-tokenizer splits on it). One normalizer call per batch: the text joined by
        newlines, which compose with nothing."""
        normalizer = _normalizer(self.transform)
        seen: set[str] = set()
        for texts in self._texts(batches):
            seen.update(normalizer.normalize_str("\n".join(texts)))
        return sorted(c for c in seen if not c.isspace())

    def _texts(self, batches: Iterable[pa.Table]) -> Iterator[list[str]]:
        for table in batches:
            for column in self.columns:
                try:
                    yield texts_of(table.column(column), self.transform.max_length)
                except DataError as exc:
                    raise DataError(f"text column {column!r}: {exc}") from None


def fitted_input(name: str, columns: list[str], transform: TextTransform, tokenizer: Any) -> dict[str, Any]:
    from tokenizers import processors

    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    tokenizer.enable_truncation(transform.max_length, strategy="longest_first")
    document = tokenizer.to_str()
    return {
        "name": name,
        "columns": columns,
        "kind": transform.tokenizer,
        "max_length": transform.max_length,
        "vocab_size": tokenizer.get_vocab_size(),
        "pad_id": tokenizer.token_to_id(PAD),
        "unk_id": tokenizer.token_to_id(UNK) if transform.tokenizer == "wordpiece" else None,
        "cls_id": cls_id,
        "sep_id": sep_id,
        "tokenizer": document,
        "tokenizer_sha256": hashlib.sha256(document.encode()).hexdigest(),
    }


class TextEncoder:
    """Applies one fitted text input: raw rows to (rows, max_length) float32 token ids, padded
    with the input's pad id."""

    def __init__(self, fitted: dict[str, Any]):
        from tokenizers import Tokenizer

        self.fitted = fitted
        self.name, self.columns, self.max_length = fitted["name"], fitted["columns"], fitted["max_length"]
        self.tokenizer = Tokenizer.from_str(fitted["tokenizer"])

    def ids(self, table: pa.Table) -> np.ndarray:
        first = texts_of(table.column(self.columns[0]), self.max_length)
        if len(self.columns) == 2:
            second = texts_of(table.column(self.columns[1]), self.max_length)
            encodings = self.tokenizer.encode_batch_fast(list(zip(first, second, strict=True)))
        else:
            encodings = self.tokenizer.encode_batch_fast(first)
        out = np.full((len(encodings), self.max_length), self.fitted["pad_id"], np.float32)
        for row, encoding in enumerate(encodings):
            ids = encoding.ids
            out[row, : len(ids)] = ids
        return out

    def unknown_rate(self, table: pa.Table) -> float:
        """The share of a text's tokens this tokenizer cannot read (`[UNK]`); 0 for byte-level BPE."""
        unk = self.fitted.get("unk_id")
        if unk is None or table.num_rows == 0:
            return 0.0
        ids = self.ids(table)
        specials = [self.fitted["pad_id"], self.fitted["cls_id"], self.fitted["sep_id"]]
        real = ids[~np.isin(ids, specials)]  # the text's own tokens
        return float((real == unk).sum() / max(1, real.size))


def unknown_token_checks(champion: tuple[str, dict[str, Any]], rows: pa.Table, most: float) -> list[Check]:
    """The share of each text input's tokens the champion's tokenizer reads as `[UNK]`, on `rows`:
    a vocabulary the champion cannot read is drift. A tokenizer that cannot be read fails the
    check naming the version and the cause (the candidate could not be compared with it)."""
    version, document = champion
    checks = []
    for fitted in document.get("text", []):
        columns = fitted["columns"]
        try:
            encoder = TextEncoder(fitted)
            rate = encoder.unknown_rate(rows.select(columns))
        except Exception as exc:  # any failure to read or apply it: the champion's, named
            message = (
                f"the tokenizer of champion version {version} cannot be read: {type(exc).__name__}: {exc}"
            )
            checks.append(
                Check("text", "unknown_tokens", columns[0], False, "unreadable", f"<= {most}", message)
            )
            continue
        checks.append(
            Check(
                "text",
                "unknown_tokens",
                columns[0],
                rate <= most,
                round(rate, 6),
                f"<= {most}",
                f"{' + '.join(columns)}: {rate:.2%} of the tokens are unknown to champion version {version}'s tokenizer",
            )
        )
    return checks
