"""`training.restore_best`: a run publishes its best epoch's weights, not its last.

The epoch ends score the validation split and remember the best step (runtime/epochs.py); that
step's checkpoint outlives pruning (`checkpoint.keep_best`). At the end, when the loop stopped on
other weights, every rank loads that checkpoint the way a resume does, optimizer state included:
what is published is then bit for bit what the run held at its best epoch (ZeRO-3 shards
included), and a retry after the best epoch, or `trainpipe reproduce`, ends on the same weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_trainpipe.runtime.resume.checkpoint import CheckpointError, CheckpointManager

log = logging.getLogger(__name__)


@dataclass
class BestEpoch:
    checkpoints: CheckpointManager
    metric: str
    """The gate's metric: the one the epochs are compared by (as EpochEnd compares them)."""
    higher_is_better: bool
    evaluate: Callable[[], dict[str, float]]
    """Collective: the engine's current weights scored on the split the epochs were scored on."""
    from_rank0: Callable[[Callable[[], Any], type[BaseException]], Any]
    """JobSetup.from_rank0: rank 0 reads and verifies the checkpoint, every rank gets it."""
    world_size: int
    zero_stage: int

    def restore(self, engine: Any, state: dict[str, Any]) -> dict[str, Any] | None:
        """Collective: the scored entry (`step` and metrics) of the weights the run ends with, the
        best epoch's loaded into `engine` when the loop stopped on others; None when no epoch
        ended (nothing was scored to choose by)."""
        history = state["history"]
        if not history:
            return None
        best = self._best(history, state.get("best_step"))
        if history[-1]["step"] == state["step"]:
            final = history[-1]
        else:
            # Stopped mid-epoch (max_steps): the final weights are scored as well, and kept when
            # the best epoch's are not strictly better (EpochEnd's rule: ties keep the earlier).
            final = {"step": state["step"], **self.evaluate()}
            if not self._better(best[self.metric], final[self.metric]):
                return final
        if best["step"] == final["step"]:
            return final
        self._load(engine, best["step"])
        log.warning(
            "restore_best: publishing step %d (%s %.6g), not the last step %d (%s %.6g)",
            best["step"], self.metric, best[self.metric], final["step"], self.metric, final[self.metric],
        )  # fmt: skip
        return best

    def _better(self, value: float, than: float) -> bool:
        return value > than if self.higher_is_better else value < than

    def _best(self, history: list[dict[str, Any]], best_step: int | None) -> dict[str, Any]:
        if best_step is not None:
            return next(entry for entry in history if entry["step"] == best_step)
        best = history[0]  # a checkpoint from before best_step was kept: the same rule, replayed
        for entry in history[1:]:
            if self._better(entry[self.metric], best[self.metric]):
                best = entry
        return best

    def _load(self, engine: Any, step: int) -> None:
        checkpoint = self.from_rank0(lambda: self.checkpoints.complete_at(step), CheckpointError)
        directory, tag = self.checkpoints.fetch(checkpoint)
        # Saved by an attempt of another world size: through a universal checkpoint, as a resume
        # across world sizes loads (the engine's flag follows the checkpoint, not the resume).
        universal = checkpoint.world_size != self.world_size and self.zero_stage > 0
        if universal:
            tag = self.checkpoints.to_universal(checkpoint)
        engine._config.load_universal_checkpoint = universal
        path, _ = engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load the best epoch's checkpoint {checkpoint.uri}")
