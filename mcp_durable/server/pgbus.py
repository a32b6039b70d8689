"""`PgSubscriptionBus`: the SDK's `SubscriptionBus` over Postgres LISTEN/NOTIFY, across replicas.

With several replicas behind a load balancer, a client listening on replica A must hear about a
call completed on replica B. Pass one bus per server, on the same database as the journal:

    bus = PgSubscriptionBus("postgresql://db/app?schema=mcp_durable")
    server = DurableServer("payments", journal=url, subscriptions=bus, lifespan=bus.lifespan)

- `publish(event)` delivers to this replica's listeners at once, then sends one `pg_notify`;
  every other bus on the same channel (same database, same `schema`) delivers it to its own
  listeners. A bus ignores the echo of its own events, so each listener sees an event once.
- `subscribe(listener)` is synchronous (the SDK's protocol); the first call starts the LISTEN
  connection in the background. To be sure of hearing events from the first moment, start it
  before serving: `lifespan=bus.lifespan` (or `async with bus:`, or `await bus.start()`).
- Delivery is fire-and-forget, as the SDK's own: no replay; while the database is unreachable
  other replicas' events are lost (local listeners still get local events), and `publish` never
  raises or waits more than `publish_timeout` seconds. Clients re-listen and refetch.

Events travel as JSON (`{"o": origin, "t": kind, "uri": …}`); a URI too long for NOTIFY's 8000
bytes is delivered locally only. The channel is `mcpd_events.<schema>` (at most 63 bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
import orjson
from mcp.server.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

try:
    import psycopg

    from ..journal.postgres import Listener, PostgresSettings
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("PgSubscriptionBus needs the Postgres driver: pip install 'mcp-durable[postgres]'") from exc

logger = logging.getLogger(__name__)

_KINDS: dict[str, ServerEvent] = {
    "tools_list_changed": ToolsListChanged(),
    "prompts_list_changed": PromptsListChanged(),
    "resources_list_changed": ResourcesListChanged(),
}
_MAX_PAYLOAD = 7900


def encode_event(origin: str, event: ServerEvent) -> str:
    if isinstance(event, ResourceUpdated):
        return orjson.dumps({"o": origin, "t": "resource_updated", "uri": event.uri}).decode()
    kind = next(name for name, value in _KINDS.items() if type(value) is type(event))
    return orjson.dumps({"o": origin, "t": kind}).decode()


def decode_event(payload: str) -> tuple[str, ServerEvent] | None:
    """(origin, event) from a NOTIFY payload; None for anything that is not ours."""
    try:
        data = orjson.loads(payload)
        kind = data["t"]
        if kind == "resource_updated":
            return str(data["o"]), ResourceUpdated(uri=str(data["uri"]))
        return str(data["o"]), _KINDS[kind]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


class PgSubscriptionBus:
    """A `SubscriptionBus` whose events reach every replica listening on the same Postgres channel."""

    def __init__(self, url: str, *, channel: str | None = None, publish_timeout: float = 2.0) -> None:
        settings = PostgresSettings.from_url(url)
        self.channel = channel or f"mcpd_events.{settings.schema}"
        self._conninfo = settings.conninfo
        self._publish_timeout = publish_timeout
        #: Names this bus in its NOTIFY payloads, so it can drop the echo of its own events.
        self.origin = uuid.uuid4().hex
        self._listeners: dict[object, Callable[[ServerEvent], None]] = {}
        self._listener = Listener(self._conninfo, self.channel, self._on_notify)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._conn_lock: asyncio.Lock | None = None
        self._users = 0

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, timeout: float = 5.0) -> bool:
        """Start listening; wait up to `timeout` for the LISTEN. Returns whether it is established
        (if not, it keeps trying in the background)."""
        self._listener.start()
        return await self._listener.wait_connected(timeout)

    @property
    def listening(self) -> bool:
        """Whether events from other replicas can arrive right now."""
        return self._listener.connected

    async def aclose(self) -> None:
        await self._listener.aclose()
        self._conn_lock = None  # made again on the loop of the next use
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> PgSubscriptionBus:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[dict[str, Any]]:
        """A server lifespan that runs the bus while the server runs (reference-counted: a
        `DurableServer` enters its lifespan once per stdio/in-memory connection)."""
        self._users += 1
        try:
            await self.start()
            yield {}
        finally:
            self._users -= 1
            if self._users == 0:
                await self.aclose()

    # -- the SubscriptionBus protocol -------------------------------------------------------------

    async def publish(self, event: ServerEvent) -> None:
        """Deliver `event` here at once, and to every other replica through Postgres."""
        self._deliver(event)
        payload = encode_event(self.origin, event)
        if len(payload.encode()) > _MAX_PAYLOAD:
            logger.warning("event too large for NOTIFY; delivered on this replica only: %.200s", payload)
        else:
            with anyio.move_on_after(self._publish_timeout):
                await self._notify(payload)
        await anyio.lowlevel.checkpoint()

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        """Register `listener` (called on the event loop, for local and remote events)."""
        token = object()
        self._listeners[token] = listener
        with contextlib.suppress(RuntimeError):  # no running loop: started by start()/publish()
            self._listener.start()

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    # -- plumbing ---------------------------------------------------------------------------------

    def _deliver(self, event: ServerEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - fan-out boundary, as the SDK's in-memory bus
                logger.exception("subscription listener raised; continuing")

    def _on_notify(self, payload: str) -> None:
        decoded = decode_event(payload)
        if decoded is None:
            return
        origin, event = decoded
        if origin != self.origin:  # our own events were delivered locally when published
            self._deliver(event)

    async def _notify(self, payload: str) -> None:
        self._listener.start()
        if self._conn_lock is None:
            self._conn_lock = asyncio.Lock()
        async with self._conn_lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                await self._conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))
            except (psycopg.Error, OSError) as exc:
                logger.warning("could not publish to other replicas (%s); delivered on this replica only", exc)
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
