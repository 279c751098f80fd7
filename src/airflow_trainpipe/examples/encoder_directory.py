"""A small Hugging Face format encoder directory made from a config, to try `training.pretrained`
without a model hub (nothing is downloaded): a WordPiece tokenizer trained on the given texts and
a randomly initialised encoder, both saved with `save_pretrained` (safetensors). The tests and the
benchmarks fine-tune from it; `trainpipe make-encoder` writes one from a day of data.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def save_encoder_directory(
    path: Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 400,
    hidden_size: int = 32,
    layers: int = 1,
    heads: int = 2,
    positions: int = 128,
    intermediate_size: int | None = None,
    seed: int = 0,
    architecture: str = "bert",
    dropout: float = 0.0,
) -> Path:
    """A `bert` (or `distilbert`) encoder and its WordPiece tokenizer, saved with save_pretrained.
    No dropout by default: its masks depend on the rank layout, which a resume on another world
    size changes."""
    import torch
    from tokenizers import processors
    from transformers import AutoModel, BertConfig, DistilBertConfig, PreTrainedTokenizerFast

    tokenizer = _wordpiece(list(texts), vocab_size)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    config: Any
    if architecture == "distilbert":
        config = DistilBertConfig(
            vocab_size=tokenizer.get_vocab_size(), dim=hidden_size, n_layers=layers, n_heads=heads,
            hidden_dim=intermediate_size or 2 * hidden_size, max_position_embeddings=positions, pad_token_id=0,
            dropout=dropout, attention_dropout=dropout,
        )  # fmt: skip
    else:
        config = BertConfig(
            vocab_size=tokenizer.get_vocab_size(), hidden_size=hidden_size, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=intermediate_size or 2 * hidden_size, max_position_embeddings=positions,
            pad_token_id=0, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        )  # fmt: skip
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(str(path))
    return path


def _wordpiece(texts: list[str], vocab_size: int) -> Any:
    """A BERT WordPiece tokenizer of `texts`, the same bytes for the same texts.

    As a run fits its own (runtime/data/text.py, which examples/ may not import), not with
    WordPieceTrainer: it numbers pieces in hash-map order, so the same texts gave another
    tokenizer.json at every call and a directory written again no longer matched a run's pin.
    A `##`-continuation BPE whose alphabet is numbered first, in sorted order, read as a WordPiece.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    alphabet = sorted({c for c in normalizer.normalize_str("\n".join(texts)) if not c.isspace()})
    fitted = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
    fitted.normalizer = normalizer
    fitted.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    fitted.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[*specials, *(f"##{c}" for c in alphabet)],
            initial_alphabet=alphabet,
            continuing_subword_prefix="##",
            show_progress=False,
        ),
    )
    tokenizer = Tokenizer(
        models.WordPiece(fitted.get_vocab(), unk_token="[UNK]", continuing_subword_prefix="##")
    )
    tokenizer.add_special_tokens(specials)
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, fitted.pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer
