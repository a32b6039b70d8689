"""Periodic background jobs of a server (recovery, retention): run now, then every `interval` seconds.

A job's failure (the journal down, a disk full) is logged and the job runs again at the next
interval: background work never stops the server or surfaces to a caller.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)


async def run_every(interval: float, job: Callable[[], Awaitable[object]], what: str, *, at_start: bool = True) -> None:
    """Run `job` at once (or after one interval, unless `at_start`) and then every `interval` seconds
    (counted from the end of a run), until cancelled."""
    if not at_start:
        await anyio.sleep(interval)
    while True:
        try:
            await job()
        except Exception:  # noqa: BLE001 - logged; tried again next interval
            logger.warning("background %s failed; retrying in %.0f s", what, interval, exc_info=True)
        await anyio.sleep(interval)


def check_interval(name: str, value: float | None) -> float | None:
    """`value` if it is None (off) or positive seconds; else `ConfigError`."""
    from ..errors import ConfigError

    if value is not None and not value > 0:
        raise ConfigError(f"{name} must be positive seconds or None (off), not {value!r}")
    return value
