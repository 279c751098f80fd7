"""'Did you mean' suggestions for misspelt names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest `word`, if one is near enough to be a misspelling of it."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or an empty string."""
    near = closest(word, choices)
    return f" (did you mean {near!r}?)" if near is not None else ""
