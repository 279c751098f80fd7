"""Names that are part of stored bytes: a fitted transform's format id and the hash keys that decide
which rows a run holds out, validates a trial on, and groups for ranking.

They are spelled once, here, because changing one silently changes what every later run computes:
another format id makes every logged model's transform unreadable, another key moves rows between
the training, validation and holdout splits (so a champion and a candidate would no longer be
scored on comparable rows) and renumbers ranking groups. pandas' row hash takes a key of exactly 16
bytes: `split_key` builds it from the whole seed (a text prefix cut to 16 characters once dropped a
seed's last digit, so seeds 0-9 gave one split).
"""

from __future__ import annotations

import hashlib

TRANSFORM_FORMAT = "trainpipe.transform/1"
"""The `format` of a fitted transform document (runtime/data/fitting.py writes it; FittedTransform reads it)."""

GROUP_HASH_KEY = "trainpipe.group0"
"""The 16-byte key of a ranking group's codes (runtime/data/transform.py)."""


def split_key(split: str, seed: int) -> str:
    """The 16-character hash key of `split` ("holdout" or "validation") drawn with `seed`."""
    return hashlib.blake2b(f"trainpipe.{split}:{seed}".encode(), digest_size=8).hexdigest()
