"""Streaming statistics of one numeric column: exact moments and deterministic quantiles.

Both accumulate batch by batch in bounded memory and give the same numbers for the same values
in the same order, whatever the batch boundaries: fitting a transform twice on one snapshot
yields byte-identical JSON.
"""

from __future__ import annotations

import numpy as np

SKETCH_SIZE = 1 << 16


class Moments:
    """Count, mean, variance (population), min and max, merged per batch (Chan et al.)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.min, self.max = float("inf"), float("-inf")

    def update(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        n, mean = values.size, float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.min, self.max = min(self.min, float(values.min())), max(self.max, float(values.max()))

    @property
    def std(self) -> float:
        return (self.m2 / self.count) ** 0.5 if self.count else 0.0


class QuantileSketch:
    """Quantiles of a stream: exact up to `size` values, then a deterministic compactor.

    Values enter a level-0 buffer; each full buffer of exactly `size` values is sorted and pushed
    up. Two sorted buffers meeting at one level are merged and every second value is kept (the
    offset alternates per level, deterministically), and the survivors move one level up with
    twice the weight (Manku-Rajagopalan-Lindsay). The rank error stays below about
    log2(n / size) / size of n; with the default size that is under 0.03 % for a billion values,
    and memory is `size` floats per level. No random choice is ever made, so the same stream
    always gives the same quantiles.
    """

    def __init__(self, size: int = SKETCH_SIZE):
        self.size = size
        self.pending: list[np.ndarray] = []
        self.pending_count = 0
        self.levels: list[np.ndarray | None] = []
        self.flips: list[int] = []

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        while values.size:
            take = min(values.size, self.size - self.pending_count)
            self.pending.append(values[:take])
            self.pending_count += take
            values = values[take:]
            if self.pending_count == self.size:
                self._push(np.sort(np.concatenate(self.pending)), 0)
                self.pending, self.pending_count = [], 0

    def _push(self, buffer: np.ndarray, level: int) -> None:
        while True:
            if level == len(self.levels):
                self.levels.append(None)
                self.flips.append(0)
            held = self.levels[level]
            if held is None:
                self.levels[level] = buffer
                return
            merged = np.sort(np.concatenate([held, buffer]), kind="stable")
            offset = self.flips[level]
            self.flips[level] ^= 1
            self.levels[level] = None
            buffer, level = merged[offset::2], level + 1

    def quantiles(self, qs: list[float]) -> list[float | None]:
        """Inverse-CDF quantiles (numpy `inverted_cdf`): exact while the stream fits one buffer."""
        parts = [np.concatenate(self.pending)] if self.pending else []
        weights = [np.ones(self.pending_count)] if self.pending else []
        for level, buffer in enumerate(self.levels):
            if buffer is not None:
                parts.append(buffer)
                weights.append(np.full(buffer.size, float(1 << level)))
        if not parts:
            return [None for _ in qs]
        values, weight = np.concatenate(parts), np.concatenate(weights)
        order = np.argsort(values, kind="stable")
        values, cumulative = values[order], np.cumsum(weight[order])
        total = cumulative[-1]
        positions = np.searchsorted(cumulative, [q * total for q in qs], side="left")
        return [float(values[min(p, values.size - 1)]) for p in positions]
