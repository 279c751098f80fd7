"""PollingTrigger: the loop the package's deferrable waits share.

Each trigger's readiness check is blocking I/O (fsspec, a database driver, delta-rs), so it runs in
a worker thread: the triggerer's event loop serves every deferred task of the deployment and must
never block. The check's answer or error ends the wait as an event the task reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class PollingTrigger(BaseTrigger):
    """Calls `_ready()` every `poke_interval` seconds until it answers ready.

    Subclasses give `_ready()` and `_arguments()` (their constructor's keyword arguments, for
    `serialize`), and may name errors that mean "ask again" rather than "stop waiting".
    """

    poke_interval: float
    keep_waiting_on: tuple[type[BaseException], ...] = ()
    """Errors that are the store's, not the wait's (an unreachable database): asked again next interval."""

    def _ready(self) -> tuple[bool, str]:
        raise NotImplementedError

    def _arguments(self) -> dict[str, Any]:
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self._arguments()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                ready, reason = await asyncio.to_thread(self._ready)
            except self.keep_waiting_on as exc:
                ready, reason = False, str(exc)
            except Exception as exc:  # the task, not the triggerer, reports it
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if ready:
                yield TriggerEvent({"status": "ready", "message": reason})
                return
            self.log.info("waiting: %s", reason)
            await asyncio.sleep(self.poke_interval)
