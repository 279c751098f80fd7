"""Sensors: the wait_for_data task (poke, reschedule or deferrable)."""
