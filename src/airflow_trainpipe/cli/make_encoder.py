"""`trainpipe make-encoder`: a small Hugging Face format encoder directory (config, safetensors
weights, a tokenizer trained on the given text columns), to try `training.pretrained` where no
model hub can be reached (examples/encoder_directory.py). Its weights are a random init: a
stand-in for the encoder a team would fine-tune, not a pretrained language model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airflow_trainpipe.cli.common import at_least


def _make_encoder(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from airflow_trainpipe.core.storage import resolve
    from airflow_trainpipe.examples.encoder_directory import save_encoder_directory
    from airflow_trainpipe.runtime.data.reader import DataError, read_table

    if args.hidden_size % args.heads:
        print(
            f"trainpipe make-encoder: --hidden-size {args.hidden_size} is not a multiple of --heads {args.heads}",
            file=sys.stderr,
        )
        return 2
    uri = resolve(args.data if "://" in args.data else Path(args.data).resolve().as_uri())
    try:
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(uri)
        files = sorted(f for f in fs.find(root) if f.endswith(".parquet"))
        if not files:
            raise ValueError(f"no Parquet files under {args.data}")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        uris = [f"{protocol}://{f}" if protocol != "file" else Path(f).as_uri() for f in files]
        table = read_table(uris, "parquet", args.columns)
        for column in args.columns:
            kind = table.schema.field(column).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise ValueError(f"column {column!r} holds {kind}, not text")
    except (ValueError, KeyError, pa.ArrowInvalid, DataError) as exc:
        print(f"trainpipe make-encoder: {exc}", file=sys.stderr)
        return 2
    texts = [
        " ".join(t for t in row if t)
        for row in zip(*(table.column(c).to_pylist() for c in args.columns), strict=True)
    ]
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": one line, then the result
    path = save_encoder_directory(
        Path(args.out), texts, vocab_size=args.vocab_size, hidden_size=args.hidden_size, layers=args.layers,
        heads=args.heads, positions=args.max_positions, seed=args.seed,
    )  # fmt: skip
    print(
        f"{path}: a {args.layers}-layer encoder (hidden {args.hidden_size}) and a WordPiece of {len(texts)} rows"
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "make-encoder",
        help="write a small Hugging Face encoder directory (random weights, a tokenizer trained on text "
        "columns) to try training.pretrained offline",
    )
    parser.add_argument(
        "--data", required=True, help="a folder (or URI) of Parquet files holding the text columns"
    )
    parser.add_argument(
        "--columns", nargs="+", required=True, help="the text columns the tokenizer is trained on"
    )
    parser.add_argument(
        "--out", required=True, help="the directory to write (config.json, model.safetensors, ...)"
    )
    parser.add_argument(
        "--vocab-size", type=at_least(1), default=2000, help="WordPiece vocabulary (default 2000)"
    )
    parser.add_argument("--hidden-size", type=at_least(1), default=64, help="encoder width (default 64)")
    parser.add_argument("--layers", type=at_least(1), default=2, help="transformer layers (default 2)")
    parser.add_argument("--heads", type=at_least(1), default=2, help="attention heads (default 2)")
    parser.add_argument(
        "--max-positions", type=at_least(1), default=512, help="positions the encoder reads (default 512)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.set_defaults(handler=_make_encoder)
