"""Positions in the epoch's stream of training rows, resumable, the same on every world size.

A global batch is the next `global_batch` positions of the epoch's stream (runtime.stream),
split into micro-batches and then across ranks. The only state is (epoch, consumed), counted in
samples, so a checkpoint taken on 2 ranks resumes on 1 or 3 with the very same global batches,
and a same-size resume is bit-exact.
"""

from __future__ import annotations

from airflow_trainpipe.core.exceptions import TrainingJobError


class ResumableSampler:
    def __init__(
        self, num_rows: int, global_batch: int, accumulation: int, world_size: int, rank: int, seed: int
    ):
        if global_batch % (accumulation * world_size):
            raise TrainingJobError(
                f"global batch {global_batch} does not split into {accumulation} micro-batch(es) "
                f"x {world_size} rank(s); choose a world size that divides {global_batch // accumulation}"
            )
        if num_rows < global_batch:
            raise TrainingJobError(
                f"{num_rows} training rows are fewer than one global batch of {global_batch}"
            )
        self.num_rows, self.global_batch, self.accumulation = num_rows, global_batch, accumulation
        self.world_size, self.rank, self.seed = world_size, rank, seed
        self.micro_batch = global_batch // accumulation // world_size
        self.epoch, self.consumed = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_rows // self.global_batch

    @property
    def step_in_epoch(self) -> int:
        return self.consumed // self.global_batch

    def epoch_done(self) -> bool:
        return self.step_in_epoch >= self.steps_per_epoch

    def next_epoch(self) -> None:
        self.epoch, self.consumed = self.epoch + 1, 0

    def step_positions(self) -> tuple[tuple[int, int], list[tuple[int, int]]]:
        """The next optimizer step: its global batch's stream positions [start, stop), and this
        rank's micro-batches within it."""
        start = self.consumed
        micro_global = self.global_batch // self.accumulation
        ranges = []
        for k in range(self.accumulation):
            offset = start + k * micro_global + self.rank * self.micro_batch
            ranges.append((offset, offset + self.micro_batch))
        self.consumed += self.global_batch
        return (start, start + self.global_batch), ranges

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "global_batch": self.global_batch,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["global_batch"] != self.global_batch or state["seed"] != self.seed:
            raise TrainingJobError(
                f"checkpoint sampler {state} does not match global batch {self.global_batch}, seed {self.seed}"
            )
        self.epoch, self.consumed = state["epoch"], state["consumed"]
