"""`features.text`: how each text column becomes token ids, with a tokenizer trained on the run.

A text column of `data.features.text` is one text input of the model (its token ids and
attention mask), tokenized by a tokenizer the run trains on its training split only, like every
fitted transform: the Hugging Face `tokenizers` library's WordPiece or BPE, never a downloaded
vocabulary. A column with `pair_with` is the second segment of another column's input instead:
`[CLS] subject [SEP] body [SEP]` with segment ids 0 then 1, one tokenizer trained on both.
The tokenizer ships inside the fitted transform as the library's own JSON.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.model_args import ENCODER_SHAPE_ARGS
from airflow_trainpipe.config.suggest import closest, did_you_mean
from airflow_trainpipe.config.training import TrainingSection
from airflow_trainpipe.config.types import ColumnName

TOKENIZER_FIELDS = ("tokenizer", "vocab_size", "min_frequency", "lowercase", "normalization", "max_length")
"""What a paired column takes from the column it pairs with."""


MAX_CHARS_PER_TOKEN = 128
"""Text past `max_length x 128` characters is never read: no token of it could fit (a WordPiece
word longer than 100 characters is one unknown token), and a 1 MB row costs what a short one does."""


BYTE_LEVEL_BASE = 256 + 5
"""A byte-level BPE starts from every byte and the 5 special tokens, before its first merge."""


class TextTransform(Section):
    """One text column: tokenized, truncated to `max_length` tokens, padded per batch."""

    tokenizer: Literal["wordpiece", "bpe"] = "wordpiece"
    """`wordpiece` (BERT's: words split into known pieces, `[UNK]` for the rest) or `bpe`
    (byte-level byte-pair encoding: every byte sequence has tokens, so nothing is unknown)."""

    vocab_size: int = Field(default=8000, ge=100, le=1_000_000)
    """Tokens in the trained vocabulary, special tokens included; the training text must hold
    enough distinct pieces to fill it, or the run stops naming the column."""

    min_frequency: int = Field(default=2, ge=1)
    """A piece enters the vocabulary only when it occurs at least this often in the training text."""

    lowercase: bool = True
    """Lowercase the text before tokenizing (training, scoring and serving alike)."""

    normalization: Literal["nfkc", "nfc", "none"] = "nfkc"
    """Unicode normalization before tokenizing: `nfkc` folds compatibility forms (full-width
    letters, ligatures) into one spelling; `nfc` only composes accents; `none` leaves the text."""

    max_length: int = Field(default=128, ge=8, le=8192)
    """Tokens per row, special tokens included; longer text is truncated (with `pair_with`, the
    longer segment first). Batches are padded to their longest row, not to this."""

    pair_with: ColumnName | None = None
    """Another text column whose input this one joins as the second segment (`[SEP]` between,
    segment ids 1): that column's tokenizer and `max_length` apply to both, so set none of them
    here."""

    @model_validator(mode="after")
    def _bpe_has_room(self) -> TextTransform:
        if self.tokenizer == "bpe" and self.vocab_size <= BYTE_LEVEL_BASE:
            field_problems(
                [
                    (
                        ("vocab_size",),
                        f"a byte-level bpe holds the 256 bytes and 5 special tokens before any merge: "
                        f"vocab_size must be more than {BYTE_LEVEL_BASE}",
                    )
                ]
            )
        return self


def tokenizer_fields_set(transform: TextTransform) -> list[str]:
    """The `TOKENIZER_FIELDS` a transform sets. Compared with the defaults, not with the fields a
    file set: a config dumped whole (the train spec carries it so) must read back alike."""
    return [f for f in TOKENIZER_FIELDS if getattr(transform, f) != TextTransform.model_fields[f].default]


def text_problems(
    text_columns: list[str], other_columns: list[str], transforms: dict[str, TextTransform]
) -> FieldProblems:
    """`features.text` against `data.features.text`: every transform names a text column, and a
    pairing names another text column that is itself no second segment."""
    problems: FieldProblems = []
    for name, transform in transforms.items():
        where = ("features", "text", name)
        if name not in text_columns:
            # A near miss may be misspelt on either side: the column list is as likely wrong.
            near = closest(name, text_columns)
            hint = (
                "it is a numeric or categorical feature in data.features"
                if name in other_columns
                else "it is not a text feature in data.features"
                + (f" (data.features.text has {near!r}: one of the two names is misspelt)" if near else "")
            )
            problems.append((where, f"no text transform for {name!r}: {hint}"))
            continue
        problems += _pairing_problems(name, transform, text_columns, transforms)
    return problems


def _pairing_problems(
    name: str, transform: TextTransform, text_columns: list[str], transforms: dict[str, TextTransform]
) -> FieldProblems:
    partner = transform.pair_with
    if partner is None:
        return []
    where = ("features", "text", name, "pair_with")
    if partner == name:
        return [(where, f"{name!r} cannot pair with itself")]
    if partner not in text_columns:
        return [
            (
                where,
                f"{partner!r} is not a text feature in data.features{did_you_mean(partner, text_columns)}",
            )
        ]
    if (transforms.get(partner) or TextTransform()).pair_with is not None:
        return [(where, f"{partner!r} is itself the second segment of another input; pair with a first one")]
    if taken := tokenizer_fields_set(transform):
        return [
            (("features", "text", name, taken[0]), f"{name!r} pairs with {partner!r}, whose tokenizer and "
             f"max_length apply: remove {', '.join(taken)} here and set them on {partner!r}")
        ]  # fmt: skip
    if [other for other, t in transforms.items() if t.pair_with == partner and other != name]:
        return [(where, f"{partner!r} already has a second segment; an input holds at most two")]
    return []


def longest_input(text_columns: list[str], transforms: dict[str, TextTransform]) -> int:
    """The most tokens a row of any text input holds: each input's first column's max_length (a
    paired second column is cut to its partner's, and has none of its own)."""
    return max(
        (transforms.get(name) or TextTransform()).max_length
        for name, _ in text_inputs(text_columns, transforms)
    )


def text_inputs(text_columns: list[str], transforms: dict[str, TextTransform]) -> list[tuple[str, list[str]]]:
    """The model's text inputs, in `data.features.text` order: (name, its columns), a paired
    column as the second column of its partner's input."""
    second = {t.pair_with: name for name, t in transforms.items() if t.pair_with is not None}
    return [
        (name, [name, *([second[name]] if name in second else [])])
        for name in text_columns
        if (transforms.get(name) or TextTransform()).pair_with is None
    ]


def text_model_problems(
    training: TrainingSection, text_columns: list[str], transforms: dict[str, TextTransform]
) -> FieldProblems:
    """A text model is given text, a tabular one none, and each text input fits the encoder's positions."""
    problems: FieldProblems = []
    model = training.model
    if model == "text_encoder" and not text_columns:
        problems.append((("training", "model"), "text_encoder reads text: declare data.features.text"))
    if model == "tabular_mlp" and text_columns:
        problems.append(
            (
                ("data", "features", "text"),
                "tabular_mlp reads no text: use training.model text_encoder, "
                "or a model plugin that reads text",
            )
        )
    if training.pretrained is not None:
        return problems + pretrained_encoder_problems(training, text_columns, transforms)
    if model == "text_encoder":
        positions = training.hyperparameters.model_args.get("max_position_embeddings", 512)
        # Per input: a paired column's segment is cut to its partner's max_length, its own unset.
        for name, _ in text_inputs(text_columns, transforms):
            length = (transforms.get(name) or TextTransform()).max_length
            if isinstance(positions, int) and length > positions:
                problems.append(
                    (
                        ("features", "text", name, "max_length"),
                        f"{length} tokens is more than the encoder's {positions} positions "
                        "(training.hyperparameters.model_args.max_position_embeddings)",
                    )
                )
    return problems


def pretrained_encoder_problems(
    training: TrainingSection, text_columns: list[str], transforms: dict[str, TextTransform]
) -> FieldProblems:
    """A pretrained directory brings the encoder's shape and tokenizer: the config sets neither, one input."""
    where, model = ("training", "pretrained"), training.model
    if model != "text_encoder":
        return [
            (
                where,
                f"a pretrained directory is read by model text_encoder; {model!r} builds its own weights",
            )
        ]
    inputs = text_inputs(text_columns, transforms)
    if len(inputs) != 1:
        names = ", ".join(name for name, _ in inputs)
        return [
            (
                where,
                f"a pretrained encoder reads one text input (a column, or two joined with pair_with); "
                f"data.features.text gives {len(inputs)}: {names}",
            )
        ]
    problems: FieldProblems = []
    for key in sorted(set(training.hyperparameters.model_args) & set(ENCODER_SHAPE_ARGS)):
        problems.append(
            (
                ("training", "hyperparameters", "model_args", key),
                f"comes from the pretrained directory's config.json ({training.pretrained}); remove it",
            )
        )
    for name, transform in transforms.items():
        for field in tokenizer_fields_set(transform):
            if field != "max_length":
                problems.append(
                    (
                        ("features", "text", name, field),
                        f"the pretrained directory's tokenizer applies ({training.pretrained}); "
                        "remove it (max_length and pair_with still apply)",
                    )
                )
    return problems
