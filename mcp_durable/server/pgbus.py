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

Events travel as JSON (`{"o": origin, "t": kind, "uri": …, "p": principal}`); a URI too long for
NOTIFY's 8000 bytes is delivered locally only. The channel is `mcpd_events.<schema>` (at most
63 bytes).

Events scoped to a principal (a journal record's changes may only reach its principal and
admins) must not reach every listener of another replica. For them (the `ScopedSubscriptionBus`
protocol of server/ports.py, through which `DurableServer` forwards its record changes):

- `forward(event, principal=p)` sends to the other replicas only (the caller delivers locally
  its own way). It is synchronous and never yields — it can run inside the engine's change
  listener — and a background task sends the NOTIFYs in order.
- `subscribe_scoped(listener)` receives, with their principal, the scoped events of other
  replicas; plain `subscribe` listeners never see scoped events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
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
_MAX_OUTBOX = 10_000

ScopedListener = Callable[[ServerEvent, str], None]


def encode_event(origin: str, event: ServerEvent, principal: str | None = None) -> str:
    data: dict[str, str] = {"o": origin}
    if isinstance(event, ResourceUpdated):
        data.update(t="resource_updated", uri=event.uri)
    else:
        data["t"] = next(name for name, value in _KINDS.items() if type(value) is type(event))
    if principal is not None:
        data["p"] = principal
    return orjson.dumps(data).decode()


def decode_event(payload: str) -> tuple[str, ServerEvent, str | None] | None:
    """(origin, event, principal or None) from a NOTIFY payload; None for anything not ours."""
    try:
        data = orjson.loads(payload)
        kind = data["t"]
        event = ResourceUpdated(uri=str(data["uri"])) if kind == "resource_updated" else _KINDS[kind]
        principal = data.get("p")
        return str(data["o"]), event, None if principal is None else str(principal)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
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
        self._scoped: dict[object, ScopedListener] = {}
        self._outbox: deque[str] = deque()
        self._outbox_ready: asyncio.Event | None = None
        self._sender: asyncio.Task[None] | None = None
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
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
        self._outbox.clear()
        self._outbox_ready = None
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

    # -- scoped events ----------------------------------------------------------------------------

    def forward(self, event: ServerEvent, *, principal: str | None = None) -> None:
        """Send `event` to the other replicas only, scoped to `principal` if given. Never yields;
        needs a running event loop. Dropped (logged) if too large or the queue is full."""
        payload = encode_event(self.origin, event, principal)
        if len(payload.encode()) > _MAX_PAYLOAD or len(self._outbox) >= _MAX_OUTBOX:
            logger.warning("event not forwarded to other replicas (too large or queue full): %.200s", payload)
            return
        self._outbox.append(payload)
        if self._sender is None or self._sender.done():
            self._outbox_ready = asyncio.Event()
            self._sender = asyncio.get_running_loop().create_task(self._send_forever(), name="pgbus sender")
        assert self._outbox_ready is not None
        self._outbox_ready.set()

    def subscribe_scoped(self, listener: ScopedListener) -> Callable[[], None]:
        """Register `listener(event, principal)` for other replicas' scoped events."""
        token = object()
        self._scoped[token] = listener
        with contextlib.suppress(RuntimeError):
            self._listener.start()

        def unsubscribe() -> None:
            self._scoped.pop(token, None)

        return unsubscribe

    async def _send_forever(self) -> None:
        ready = self._outbox_ready
        assert ready is not None
        while True:
            while self._outbox:
                with anyio.move_on_after(self._publish_timeout):
                    await self._notify(self._outbox.popleft())
            ready.clear()
            await ready.wait()

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
        origin, event, principal = decoded
        if origin == self.origin:
            return  # our own events were delivered locally when published
        if principal is None:
            self._deliver(event)
            return
        for listener in list(self._scoped.values()):
            try:
                listener(event, principal)
            except Exception:  # noqa: BLE001 - fan-out boundary
                logger.exception("scoped subscription listener raised; continuing")

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
