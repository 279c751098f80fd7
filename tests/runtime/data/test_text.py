"""Tokenizers trained on the run's text: deterministic, shipped as the library's JSON, and safe on
hostile text."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pyarrow as pa
import pytest

from airflow_trainpipe.config.text import MAX_CHARS_PER_TOKEN, TextTransform
from airflow_trainpipe.examples.synthetic import support_tickets
from airflow_trainpipe.runtime.data.reader import DataError
from airflow_trainpipe.runtime.data.text import CLS, PAD, UNK, TextEncoder, TextFitter

TICKETS = support_tickets(date(2026, 1, 1), 1500, seed=3)


def _fit(kind: str, columns: list[str], vocab_size: int = 400, max_length: int = 48) -> dict:
    transform = TextTransform(tokenizer=kind, vocab_size=vocab_size, max_length=max_length)
    return TextFitter(columns[0], columns, transform).fit(lambda: [TICKETS.slice(0, 700), TICKETS.slice(700)])


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_a_fit_is_the_same_every_time_and_ships_as_the_library_s_json(kind: str) -> None:
    from tokenizers import Tokenizer

    first, second = _fit(kind, ["subject", "body"]), _fit(kind, ["subject", "body"])
    # WordPieceTrainer numbers its pieces in hash-map order (4 fits, 4 tokenizers): ours does not.
    assert first["tokenizer_sha256"] == second["tokenizer_sha256"]
    assert first["tokenizer"] == second["tokenizer"]
    assert first["vocab_size"] == 400 and first["pad_id"] == 0
    reloaded = Tokenizer.from_str(first["tokenizer"])  # the library reads it back: no pickle anywhere
    assert json.loads(first["tokenizer"])["model"]["type"] == ("WordPiece" if kind == "wordpiece" else "BPE")
    assert reloaded.token_to_id(PAD) == 0 and reloaded.token_to_id(CLS) is not None


def test_a_pair_is_one_input_with_segments_and_truncation_keeps_max_length() -> None:
    fitted = _fit("wordpiece", ["subject", "body"], max_length=24)
    encoder = TextEncoder(fitted)
    ids = encoder.ids(TICKETS.slice(0, 50))
    assert ids.shape == (50, 24) and ids.dtype == np.float32
    sep, cls = fitted["sep_id"], encoder.tokenizer.token_to_id(CLS)
    for row in ids.astype(int):
        real = row[row != 0]
        assert real[0] == cls and real[-1] == sep and (real == sep).sum() == 2  # [CLS] a [SEP] b [SEP]
        assert (row[len(real) :] == 0).all()  # padded after the text, never inside it
    decoded = encoder.tokenizer.decode([int(i) for i in ids[0] if i])
    assert decoded.split()[0] == TICKETS.column("subject")[0].as_py().lower().split()[0]


def test_a_vocabulary_the_text_cannot_fill_stops_the_fit_naming_the_input_and_what_it_yields() -> None:
    with pytest.raises(DataError) as caught:
        _fit("wordpiece", ["subject"], vocab_size=50_000)
    message = str(caught.value)
    assert message.startswith(
        "features.text.subject.vocab_size is 50000, but the training text of 'subject' yields "
    )
    assert "lower vocab_size to" in message


def test_hostile_text_neither_crashes_nor_drops_rows() -> None:
    fitted = _fit("wordpiece", ["body"])
    huge = "refund " * 200_000  # 1.4 MB in one row
    rows = pa.table({"body": ["ok \x00 refund\x07", None, "", huge, "tout va très bien"]})
    encoder = TextEncoder(fitted)
    ids = encoder.ids(rows)
    assert ids.shape == (5, 48)  # every row kept, in order
    tokens = [encoder.tokenizer.decode([int(i) for i in row if i]) for row in ids]
    assert tokens[0] == "ok refund"  # NUL and BEL are no tokens
    assert tokens[1] == tokens[2] == ""  # null reads as empty: [CLS] [SEP]
    assert (ids[3] != 0).all()  # truncated to max_length, not refused
    assert encoder.unknown_rate(rows) > 0  # the French words are beyond this vocabulary: [UNK]
    assert fitted["unk_id"] == encoder.tokenizer.token_to_id(UNK)
    # Text beyond what max_length tokens can hold is never read: a row whose first
    # MAX_CHARS_PER_TOKEN x max_length characters are one word (a single [UNK]) encodes as that
    # word alone, though words that would fill every token follow it.
    limit = MAX_CHARS_PER_TOKEN * 48
    assert len(huge) > limit
    word = "a" * limit
    alone = encoder.ids(pa.table({"body": [word]}))
    followed = encoder.ids(pa.table({"body": [word + " refund" * 1000]}))
    assert (alone != 0).sum() == 3  # [CLS] [UNK] [SEP]
    assert (followed == alone).all()


def test_a_text_column_that_is_not_strings_is_named() -> None:
    transform = TextTransform(vocab_size=300)
    with pytest.raises(DataError, match=r"text column 'body': text column holds int64, not strings"):
        TextFitter("body", ["body"], transform).fit(lambda: [pa.table({"body": [1, 2, 3]})])


def test_byte_level_bpe_reads_any_text_without_unknowns() -> None:
    fitted = _fit("bpe", ["body"], vocab_size=400)
    encoder = TextEncoder(fitted)
    rows = pa.table({"body": ["Überweisung fehlgeschlagen 🙂", "plain refund"]})
    assert encoder.unknown_rate(rows) == 0.0 and fitted["unk_id"] is None
    assert encoder.tokenizer.decode([int(i) for i in encoder.ids(rows)[0] if i]).strip() == (
        "überweisung fehlgeschlagen 🙂"
    )
