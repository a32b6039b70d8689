"""One LISTEN connection, kept alive in the background, dispatching NOTIFY payloads in-process.

Used by the Postgres journal (wake-ups of waiters on a call in flight) and by
`PgSubscriptionBus` (resource change events across replicas). It owns a dedicated connection
(LISTEN is per session, so it cannot come from a pool) and a task that:

    connect ─▶ LISTEN ─▶ on_state(True) ─▶ dispatch payloads … (every `health_interval`: SELECT 1)
       ▲                                                               │ connection lost
       └──────────── sleep (backoff up to 1 s) ◀── on_state(False) ◀──┘

Notifications sent while the connection is down are lost (NOTIFY has no replay), so users
treat `on_state` transitions as "anything may have changed" and re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg

from .schema import quote_ident

logger = logging.getLogger(__name__)


class Listener:
    """LISTEN on `channel` over its own connection; call `on_message(payload)` for each NOTIFY.

    `on_state(connected)` is called when the LISTEN is established and when it is lost.
    Callbacks run on the event loop and must not raise.
    """

    def __init__(
        self,
        conninfo: str,
        channel: str,
        on_message: Callable[[str], None],
        on_state: Callable[[bool], None] = lambda connected: None,
        *,
        health_interval: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._on_message = on_message
        self._on_state = on_state
        self._health_interval = health_interval
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.connected = False
        #: How many times the LISTEN was (re-)established; tests and stats read it.
        self.connections = 0

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Start the background task (idempotent). Needs a running asyncio loop."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._ready = asyncio.Event()  # fresh: a listener restarted may run on another loop
            self._task = loop.create_task(self._run(), name=f"listen {self._channel}")

    async def wait_connected(self, timeout: float) -> bool:
        """Wait until the LISTEN is established (or `timeout`); returns whether it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self.connected

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._set_connected(False)

    def _set_connected(self, connected: bool) -> None:
        if connected == self.connected:
            return
        self.connected = connected
        if connected:
            self.connections += 1
            self._ready.set()
        else:
            self._ready.clear()
        try:
            self._on_state(connected)
        except Exception:  # noqa: BLE001 - a callback must not stop the listener
            logger.exception("listener state callback raised")

    async def _run(self) -> None:
        delay = 0.1
        while True:
            before = self.connections
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                if self.connected:
                    logger.warning("lost LISTEN %s: %s; reconnecting", self._channel, exc)
            finally:
                self._set_connected(False)
            if self.connections > before:
                delay = 0.1  # it worked until now: try again at once, then back off
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {quote_ident(self._channel)}")
            self._set_connected(True)
            while True:
                async for notify in conn.notifies(timeout=self._health_interval):
                    try:
                        self._on_message(notify.payload)
                    except Exception:  # noqa: BLE001 - one bad payload must not stop the listener
                        logger.exception("NOTIFY handler raised")
                # A quiet channel: make sure the session is still alive (a dead server whose
                # socket did not close would otherwise go unnoticed); a hung probe counts as lost.
                try:
                    await asyncio.wait_for(conn.execute("SELECT 1"), self._health_interval)
                except TimeoutError as exc:
                    raise psycopg.OperationalError("LISTEN connection did not answer a probe") from exc
