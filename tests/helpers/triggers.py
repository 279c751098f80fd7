"""Running a trigger as the triggerer would, for one event."""

from __future__ import annotations

import asyncio

from airflow.triggers.base import BaseTrigger


def first_event(trigger: BaseTrigger, timeout: float) -> dict | None:
    """The payload of the trigger's first event, or None when it fires none within `timeout`
    seconds (it is still waiting)."""

    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    async def bounded() -> dict | None:
        try:
            return await asyncio.wait_for(first(), timeout)
        except TimeoutError:
            return None

    return asyncio.run(bounded())
