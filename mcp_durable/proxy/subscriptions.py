"""The upstream's resource subscriptions and change notifications, relayed to the proxy's clients.

The proxy subscribes the upstream to a resource once, for all its clients, on its no-capability
upstream session (`Upstream.subscribe`), while any client holds a subscription to it, and relays
each update of it to the clients holding one, and to no other:

- 2025-11-25: a `resources/subscribe` of a URI that is not `journal://…` is held per client
  connection; the first holder of a URI subscribes the upstream to it, the last one leaving
  (unsubscribing, or its connection closing) unsubscribes it. The upstream's
  `notifications/resources/updated` is sent to each connection holding its URI (bounded in time:
  a connection that does not take it in time is forgotten, as if it had unsubscribed).
- 2026-07-28: a `subscriptions/listen` stream holds the upstream URIs it names while it is open;
  an update is published on the server's subscription bus, where each listen stream delivers only
  the URIs it asked for.
- An upstream that does not declare `resources.subscribe` is never asked: a 2025-11-25
  subscription to one of its URIs is refused with a JSON-RPC error (invalid params) saying so,
  and a listen stream is acknowledged without its URIs (the honoured subset by which the
  2026-07-28 era says what a server does not deliver).
- The upstream's list changes (`notifications/{tools,resources,prompts}/list_changed`) are
  published on the bus for the listen streams that asked for them; a change of the tools after
  the proxy has listed them again (`tools_changed`). `MCPServer`'s 2025-11-25 handshake declares
  no `listChanged`, so clients of that era are not sent them: their next listing shows the change.
- Updates of `journal://…` URIs from the upstream are dropped: those URIs are the proxy's own.

The upstream's notifications (of every upstream session) are relayed in the order received, by
one worker, never inside an upstream session's read loop, so a slow client delays no call.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    SubscriptionBus,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    PromptListChangedNotification,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ServerNotification,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    ToolListChangedNotification,
    UnsubscribeRequestParams,
)

from ..errors import UpstreamUnavailableError
from ..server.results import refusal_error
from ..server.sdk_internals import connection_of
from ..uris import SCHEME
from .upstream import Upstream, serves_subscriptions

logger = logging.getLogger(__name__)

#: Seconds a relayed update may take to reach one client connection before that one is forgotten.
SEND_TIMEOUT = 2.0
#: Seconds an ended listen stream waits for the upstream to take its unsubscriptions.
RELEASE_TIMEOUT = 5.0

#: The upstream's list changes and the events that announce them on the bus.
_LIST_CHANGES: dict[type[ServerNotification], ServerEvent] = {
    ToolListChangedNotification: ToolsListChanged(),
    ResourceListChangedNotification: ResourcesListChanged(),
    PromptListChangedNotification: PromptsListChanged(),
}

Handler = Callable[[ServerRequestContext[Any, Any], Any], Awaitable[Any]]


def is_upstream_uri(uri: str) -> bool:
    """Whether `uri` is the upstream's (every URI but the proxy's own `journal://…`)."""
    return not uri.startswith(SCHEME)


class UpstreamSubscriptions:
    """Who holds which upstream resource subscription, and the upstream's notifications relayed.

    `bus` is the server's subscription bus (the one its listen streams read); `tools_changed`
    lists the upstream's tools again and applies the policies to them.
    """

    def __init__(self, upstream: Upstream, bus: SubscriptionBus, tools_changed: Callable[[], Awaitable[None]]) -> None:
        self._upstream = upstream
        self._bus = bus
        self._tools_changed = tools_changed
        #: uri -> {connection id: a session of that connection}: the 2025-11-25 holders.
        self._connections: dict[str, dict[int, Any]] = {}
        #: The connections whose closing forgets their subscriptions (registered once each).
        self._watched: set[int] = set()
        #: uri -> how many open listen streams name it: the 2026-07-28 holders.
        self._streams: Counter[str] = Counter()
        # One change of the holders (and the upstream's subscription that follows it) at a time.
        self._lock = anyio.Lock()
        self._queue: deque[ServerNotification] = deque()
        self._worker: asyncio.Task[None] | None = None

    def holders(self, uri: str) -> int:
        """How many connections and listen streams hold a subscription to `uri`."""
        return len(self._connections.get(uri, ())) + self._streams[uri]

    def install(self, lowlevel: Server[Any]) -> None:
        """Serve `resources/subscribe`, `resources/unsubscribe` and `subscriptions/listen` for
        upstream URIs on `lowlevel`, in front of the handlers registered there for the journal's."""
        local_subscribe = lowlevel.get_request_handler("resources/subscribe")
        local_unsubscribe = lowlevel.get_request_handler("resources/unsubscribe")
        local_listen = lowlevel.get_request_handler("subscriptions/listen")
        assert local_subscribe is not None and local_unsubscribe is not None  # the face registers both

        async def subscribe(ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams) -> Any:
            if not is_upstream_uri(str(params.uri)):
                return await local_subscribe.handler(ctx, params)
            await _refusing_unavailable(self.subscribe(ctx, str(params.uri)))
            return EmptyResult()

        async def unsubscribe(ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams) -> Any:
            if not is_upstream_uri(str(params.uri)):
                return await local_unsubscribe.handler(ctx, params)
            await self.unsubscribe(ctx, str(params.uri))
            return EmptyResult()

        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
        if local_listen is not None:  # None: the server was built with `subscriptions=False`
            listen = self._listen_handler(local_listen.handler)
            lowlevel.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listen)

    # -- 2025-11-25: resources/subscribe, resources/unsubscribe --------------------------------------

    async def subscribe(self, ctx: ServerRequestContext[Any, Any], uri: str) -> None:
        """The connection of `ctx` holds `uri` (an upstream URI) until it unsubscribes or is gone.
        `MCPError` (invalid params) if the upstream serves no subscriptions, the upstream's own
        error if it refuses this one, `UpstreamUnavailableError` if it cannot be reached."""
        # Keyed by the connection: the session object is built per request, and any of the
        # connection's sessions sends its unsolicited notifications on the connection's channel.
        connection = connection_of(ctx.session)
        async with self._lock:
            await self._require_subscriptions()
            if not self.holders(uri):
                await self._upstream.subscribe(uri)
            self._connections.setdefault(uri, {})[id(connection)] = ctx.session
            if isinstance(connection, Connection) and id(connection) not in self._watched:
                # A closed connection drops what is sent to it without a word: its own teardown
                # is what says it is gone.
                self._watched.add(id(connection))
                connection.exit_stack.push_async_callback(self._closed, id(connection))

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any], uri: str) -> None:
        """The connection of `ctx` no longer holds `uri` (a no-op if it did not)."""
        async with self._lock:
            self._connections.get(uri, {}).pop(id(connection_of(ctx.session)), None)
            await self._release_unheld([uri])

    async def _require_subscriptions(self) -> None:
        client = await self._upstream.client()
        if not serves_subscriptions(client):
            raise MCPError(
                INVALID_PARAMS,
                f"mcp-durable proxy: the upstream ({self._upstream.spec.describe()}) does not serve resource "
                "subscriptions (it does not declare resources.subscribe); only the proxy's journal:// "
                "resources can be subscribed to",
            )

    # -- 2026-07-28: subscriptions/listen --------------------------------------------------------------

    def _listen_handler(self, local: Handler) -> Handler:
        """`local` (the journal's listen handler, which serves the stream), with the upstream URIs
        the stream names held for as long as it is open, or left out of its acknowledgement when
        the upstream serves no subscriptions."""

        async def listen(ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams) -> Any:
            wanted = params.notifications.resource_subscriptions or []
            upstream = [uri for uri in wanted if is_upstream_uri(uri)]
            if not upstream:
                return await local(ctx, params)
            if not await _refusing_unavailable(self._serves()):
                own = [uri for uri in wanted if not is_upstream_uri(uri)]
                honoured = params.notifications.model_copy(update={"resource_subscriptions": own or None})
                return await local(ctx, params.model_copy(update={"notifications": honoured}))
            try:
                async with self.listening(upstream):
                    return await local(ctx, params)
            except UpstreamUnavailableError as exc:  # (only `listening` raises it: before the stream)
                raise refusal_error(exc) from exc

        return listen

    async def _serves(self) -> bool:
        return serves_subscriptions(await self._upstream.client())

    @asynccontextmanager
    async def listening(self, uris: Iterable[str]) -> AsyncIterator[None]:
        """Hold the upstream subscriptions to `uris` for the block (a listen stream's life)."""
        held: list[str] = []
        try:
            async with self._lock:
                for uri in dict.fromkeys(uris):
                    if not self.holders(uri):
                        await self._upstream.subscribe(uri)
                    self._streams[uri] += 1
                    held.append(uri)
            yield
        finally:
            for uri in held:
                self._streams[uri] -= 1
                if self._streams[uri] <= 0:
                    del self._streams[uri]
            # A stream ends by its client going away, which cancels it: the release is shielded.
            with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT):
                async with self._lock:
                    await self._release_unheld(held)

    async def _release_unheld(self, uris: Iterable[str]) -> None:
        """Unsubscribe the upstream from each of `uris` nobody holds any more (under the lock)."""
        for uri in uris:
            if not self.holders(uri):
                self._connections.pop(uri, None)
                if uri in self._upstream.subscribed:
                    await self._upstream.unsubscribe(uri)

    # -- the upstream's notifications ------------------------------------------------------------------

    async def relay(self, notification: ServerNotification) -> None:
        """`Upstream.on_notification`: queue `notification` for the worker; never waits for a client."""
        self._queue.append(notification)
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._drain(), name="mcp-durable proxy: upstream notifications")

    async def _drain(self) -> None:
        while self._queue:
            notification = self._queue.popleft()
            try:
                await self._deliver(notification)
            except Exception:  # noqa: BLE001 - a relay is best effort; the next one goes on
                logger.exception("could not relay the upstream's %s", type(notification).__name__)

    async def _deliver(self, notification: ServerNotification) -> None:
        if isinstance(notification, ResourceUpdatedNotification):
            uri = str(notification.params.uri)
            if is_upstream_uri(uri):
                await self._bus.publish(ResourceUpdated(uri=uri))  # the listen streams naming it
                await self._send(uri)
            return
        event = _LIST_CHANGES.get(type(notification))
        if event is None:
            return
        if isinstance(event, ToolsListChanged):
            await self._tools_changed()  # listed again before anyone is told to list them
        await self._bus.publish(event)

    async def _send(self, uri: str) -> None:
        """`notifications/resources/updated` to each connection holding `uri`; one that cannot
        be reached in time is forgotten."""
        for connection, session in list(self._connections.get(uri, {}).items()):
            sent = False
            try:
                with anyio.move_on_after(SEND_TIMEOUT):
                    await session.send_resource_updated(uri)
                    sent = True
            except Exception:  # noqa: BLE001 - the connection is gone: forget its subscriptions
                sent = False
            if not sent:
                await self._forget(connection)

    async def _closed(self, connection: int) -> None:
        """A connection closed (its teardown): forget its subscriptions."""
        self._watched.discard(connection)
        with anyio.move_on_after(RELEASE_TIMEOUT):
            await self._forget(connection)

    async def _forget(self, connection: int) -> None:
        async with self._lock:
            dropped: list[str] = []
            for uri, holders in self._connections.items():
                if holders.pop(connection, None) is not None:
                    dropped.append(uri)
            await self._release_unheld(dropped)


async def _refusing_unavailable(work: Awaitable[Any]) -> Any:
    """`work`'s answer; an unreachable upstream answered as the proxy's other requests are
    (`upstream_unavailable`, as a JSON-RPC error)."""
    try:
        return await work
    except UpstreamUnavailableError as exc:
        raise refusal_error(exc) from exc
