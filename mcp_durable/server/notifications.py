"""Change notifications for the journal resources, in both protocol eras, scoped by principal.

When the engine changes a call record (claim, completion, in doubt, resolution…) it calls its
listeners; `JournalNotifier.on_change` then announces `journal://calls/{tool}/{key}` and
`journal://stats` as updated:

- 2026-07-28: on `subscriptions/listen` streams. We serve that method with the SDK's own
  `ListenHandler` over a `PrincipalBus`, which remembers the principal of each stream and
  delivers a record's events only to its principal and to admins. Events published on the
  server's own bus (`ctx.notify_resource_updated`, `MCPServer(subscriptions=…)`) still reach every
  stream, unfiltered, as before.
- 2025-11-25: `resources/subscribe` / `resources/unsubscribe` (which `MCPServer` does not serve)
  are registered on the low-level server; subscribed sessions get
  `notifications/resources/updated`, with the same principal rule.

Across replicas: when the server's bus can forward scoped events to other processes (a
`ScopedSubscriptionBus` of server/ports.py, such as the `PgSubscriptionBus` of server/pgbus.py),
each change is also forwarded with its principal, and events
arriving from other replicas are delivered here under the same principal rule. Delivery is best
effort and bounded in time: a slow or vanished client never delays or fails the call that
changed the record.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.lowlevel
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, ServerEvent, SubscriptionBus
from mcp_types import EmptyResult, SubscribeRequestParams, SubscriptionsListenRequestParams, UnsubscribeRequestParams

from ..journal.model import CallRecord
from ..uris import STATS_URI, record_uri
from .ports import DurableHost, ScopedSubscriptionBus
from .redact import SensitiveNames
from .sdk_internals import connection_of

logger = logging.getLogger(__name__)
SEND_TIMEOUT = 2.0

#: The principal of the `subscriptions/listen` request being served (read by `PrincipalBus.subscribe`).
_LISTENER: ContextVar[str | None] = ContextVar("journal_listener", default=None)


class PrincipalBus:
    """A `SubscriptionBus` that knows whose each listen stream is.

    `subscribe` runs synchronously inside the listen request (the SDK's `ListenHandler` calls it
    before its first await), so it reads the stream's principal from a context variable.
    `publish_for(principal, event)` reaches that principal's streams and admins' streams only.
    """

    def __init__(self, inner: SubscriptionBus, is_admin: Callable[[str], bool]) -> None:
        self._listeners: dict[object, tuple[Callable[[ServerEvent], None], str | None]] = {}
        self._is_admin = is_admin
        inner.subscribe(self._deliver_all)  # the server's own events keep reaching every stream

    @property
    def listened_to(self) -> bool:
        """Whether any stream listens now."""
        return bool(self._listeners)

    def _deliver_all(self, event: ServerEvent) -> None:
        for listener, _ in list(self._listeners.values()):
            _safe(listener, event)

    async def publish(self, event: ServerEvent) -> None:
        self._deliver_all(event)
        await anyio.lowlevel.checkpoint()

    def publish_for(self, principal: str, event: ServerEvent) -> None:
        """Deliver to `principal`'s streams and admins' streams. Synchronous on purpose: it runs
        inside the engine's change listener, which must not yield the event loop needlessly."""
        for listener, owner in list(self._listeners.values()):
            if owner is not None and (owner == principal or self._is_admin(owner)):
                _safe(listener, event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = (listener, _LISTENER.get())

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe


def _safe(listener: Callable[[ServerEvent], None], event: ServerEvent) -> None:
    try:
        listener(event)
    except Exception:  # fan-out boundary: one broken stream must not starve the others
        logger.exception("journal subscription listener raised; continuing")


def _connection_id(ctx: ServerRequestContext[Any, Any]) -> int:
    """The identity of the client connection a request came on. `ctx.session` is built per
    request around the connection; its unsolicited notifications go out on the connection's own
    channel, so any of its sessions can send a subscription's updates after the request ended."""
    return id(connection_of(ctx.session))


class JournalNotifier:
    """Announces record changes to subscribers of both eras; journals the redaction config.

    `bus` is the server's own subscription bus (`MCPServer(subscriptions=…)`). `DurableServer`
    wires the rest: `on_change` as an engine listener, `subscribe` / `unsubscribe` as the
    2025-11-25 request handlers, `listen_handler()` for 2026-07-28 `subscriptions/listen`, and
    `forward_across(bus)` when its bus is a `ScopedSubscriptionBus`.
    """

    def __init__(self, host: DurableHost, bus: SubscriptionBus) -> None:
        self.host = host
        self._inner = bus
        # uri -> {connection id: (session, principal)}: legacy subscriptions of live connections.
        self._legacy: dict[str, dict[int, tuple[Any, str]]] = {}
        self._bus: PrincipalBus | None = None
        self._journaled: dict[str, tuple[str, ...]] | None = None
        self._publishing: dict[str, tuple[str, ...]] | None = None  # queued to be journaled
        self._queue: deque[Coroutine[Any, Any, None]] = deque()
        self._names: dict[str, tuple[str, ...]] | None = None
        self._names_for = -1
        self._worker: asyncio.Task[None] | None = None
        #: The bus that carries changes to and from other replicas (`forward_across`), if any.
        self._replicas: ScopedSubscriptionBus | None = None

    def listen_handler(
        self,
    ) -> Callable[[ServerRequestContext[Any, Any], SubscriptionsListenRequestParams], Coroutine[Any, Any, Any]]:
        """The `subscriptions/listen` handler: the SDK's own `ListenHandler` over a bus that
        remembers each stream's principal, so record changes reach only whom they may."""
        handler = ListenHandler(self._principal_bus())

        async def listen(ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams) -> Any:
            token = _LISTENER.set(self.host.request_principal(ctx))
            try:
                return await handler(ctx, params)
            finally:
                _LISTENER.reset(token)

        return listen

    def forward_across(self, bus: ScopedSubscriptionBus) -> None:
        """Forward every change to the other replicas on `bus`, scoped to its record's principal,
        and announce theirs here under the same principal rule."""
        self._replicas = bus
        bus.subscribe_scoped(self._from_other_replica)

    def _principal_bus(self) -> PrincipalBus:
        if self._bus is None:
            self._bus = PrincipalBus(self._inner, self._is_admin)
        return self._bus

    def watch(self, principal: str, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        """Deliver the change events `principal` may see to `listener` (its own records' changes;
        every change for an admin) until the returned callable is called.

        The same events, on the same bus, as the `subscriptions/listen` streams (the console's
        live updates use it). `listener` is called synchronously inside the engine's change
        listener: it must not block or raise. While nobody watches or listens, a change costs
        nothing here (see `on_change`).
        """
        bus = self._principal_bus()
        token = _LISTENER.set(principal)
        try:
            return bus.subscribe(listener)
        finally:
            _LISTENER.reset(token)

    def _from_other_replica(self, event: ServerEvent, principal: str | None) -> None:
        """A change made on another replica: announce it here under the same principal rule."""
        if principal is None or not isinstance(event, ResourceUpdated):
            return
        if self._bus is not None:
            self._bus.publish_for(principal, event)
        uri = str(event.uri)
        if uri in self._legacy:
            self._defer(self._after_change(self._journaled or {}, [uri], principal))

    def _is_admin(self, principal: str) -> bool:
        return self.host.is_admin(principal)

    # -- 2025-11-25 -------------------------------------------------------------------------------

    async def subscribe(self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams) -> EmptyResult:
        """The `resources/subscribe` handler: the connection hears of `params.uri`'s changes."""
        principal = self.host.request_principal(ctx)
        self._legacy.setdefault(str(params.uri), {})[_connection_id(ctx)] = (ctx.session, principal)
        return EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams) -> EmptyResult:
        """The `resources/unsubscribe` handler."""
        sessions = self._legacy.get(str(params.uri), {})
        sessions.pop(_connection_id(ctx), None)
        if not sessions:
            self._legacy.pop(str(params.uri), None)
        return EmptyResult()

    async def _send_legacy(self, uri: str, principal: str) -> None:
        for session_id, (session, owner) in list(self._legacy.get(uri, {}).items()):
            if owner != principal and not self._is_admin(owner):
                continue
            sent = False
            try:
                with anyio.move_on_after(SEND_TIMEOUT):
                    await session.send_resource_updated(uri)
                    sent = True
            except Exception:  # noqa: BLE001 - the session is gone: forget its subscriptions
                sent = False
            if not sent:
                self._forget(session_id)

    def _forget(self, session_id: int) -> None:
        for uri in list(self._legacy):
            self._legacy[uri].pop(session_id, None)
            if not self._legacy[uri]:
                del self._legacy[uri]

    # -- the engine listener ------------------------------------------------------------------------

    def on_change(self, record: CallRecord) -> None:
        """Called by the engine after every record change; never raises into the call, never yields.

        The engine calls its listeners between a claim and the run of the tool; a listener that
        yields there lets a duplicate of the call look at a claimed record that is not running
        yet. So only synchronous work happens here (the listen streams' buffers); what must
        await (legacy sends, journaling the redaction config) goes, in order, to one background
        worker per event loop.
        """
        names = self._sensitive_names()
        nobody_listens = (
            (self._bus is None or not self._bus.listened_to) and not self._legacy and self._replicas is None
        )
        if nobody_listens and names is self._journaled:
            return  # the usual case: nothing to announce, the sensitive names journaled already
        principal = record.identity.principal
        if nobody_listens:
            uris: tuple[str, ...] = ()  # skip expanding the record's URI template
        else:
            uris = (record_uri(record.identity.tool, record.identity.key), STATS_URI)
        if self._replicas is not None:
            for uri in uris:
                try:
                    self._replicas.forward(ResourceUpdated(uri=uri), principal=principal)
                except Exception:  # noqa: BLE001 - notification is best effort
                    logger.exception("could not forward a change of %s to other replicas", uri)
        if self._bus is not None:
            for uri in uris:
                try:
                    self._bus.publish_for(principal, ResourceUpdated(uri=uri))
                except Exception:  # noqa: BLE001 - notification is best effort
                    logger.exception("could not announce a change of %s", uri)
        if not names and self._journaled is None:
            self._journaled = names  # nothing to journal: no tool has sensitive fields
        legacy = [uri for uri in uris if uri in self._legacy]
        publish = names != self._journaled and names is not self._publishing
        if publish or legacy:
            if publish:
                self._publishing = names  # once: later changes do not queue it again meanwhile
            self._defer(self._after_change(names, legacy, principal))

    def _defer(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): nothing to hand it to
            work.close()
            return
        self._queue.append(work)
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            work = self._queue.popleft()
            try:
                await work
            except Exception:  # noqa: BLE001 - best effort; the next change goes on
                logger.exception("journal change follow-up failed")

    async def _after_change(self, names: dict[str, tuple[str, ...]], legacy: list[str], principal: str) -> None:
        if names != self._journaled:
            await self._journal_sensitive_names(names)
        for uri in legacy:
            await self._send_legacy(uri, principal)

    def _sensitive_names(self) -> dict[str, tuple[str, ...]]:
        # Recomputed when a tool is registered or removed, not on every change of every call.
        policies = self.host.policies
        if self._names_for != len(policies) or self._names is None:
            self._names = {tool: policy.sensitive for tool, policy in policies.items() if policy.sensitive}
            self._names_for = len(policies)
        return self._names

    async def _journal_sensitive_names(self, names: dict[str, tuple[str, ...]]) -> None:
        # Journal the tools' sensitive names so the CLI masks what the resources mask; written
        # after the first change of a boot and again only when the policies change.
        if names:
            await SensitiveNames.publish(self.host.engine.journal, names, self.host.engine.clock())
        self._journaled = names
