"""PollingTrigger: the loop the package's deferrable waits share.

Each trigger's readiness check is blocking I/O (fsspec, a database driver, delta-rs), so it runs in
a worker thread: the triggerer's event loop serves every deferred task of the deployment and must
never block. The check's answer or error ends the wait as an event the task reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow_trainpipe.data.sources.sql import SqlWindow


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


class WindowRowsTrigger(PollingTrigger):
    """A table source's wait (`delta`, `iceberg`): fires once the table holds `min_rows` rows in
    the run's window. The source travels as its config (a dict), the window as ISO timestamps;
    subclasses give `_ready()`."""

    def __init__(
        self,
        *,
        source: dict[str, Any],
        window_start: str,
        window_end: str,
        min_rows: int,
        poke_interval: float = 300.0,
    ) -> None:
        super().__init__()
        self.source = source
        self.window_start = window_start
        self.window_end = window_end
        self.min_rows = min_rows
        self.poke_interval = poke_interval

    def _arguments(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "min_rows": self.min_rows,
            "poke_interval": self.poke_interval,
        }

    def _window(self) -> SqlWindow:
        from airflow_trainpipe.data.sources.sql import SqlWindow

        return SqlWindow(datetime.fromisoformat(self.window_start), datetime.fromisoformat(self.window_end))
