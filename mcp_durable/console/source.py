"""Where the console reads and acts: a journal, who may see what, and how changes are announced.

Two sources, one contract (`ConsoleSource`):
- `ServerSource`: the console mounted in `mcp-durable serve --transport http`. It reads the
  server's own journal, acts through the server's engine (the path `journal_resolve` takes),
  uses the server's token verifier, principal function and admins, and watches the change
  notifications the journal resources announce (`JournalNotifier.watch`).
- `JournalSource`: `mcp-durable console --journal URL`, beside a running server. A file journal
  is opened read-only (`?mode=ro`, never the writer's lock) and reopened for each read, so it
  sees the writer's appends; it offers no actions (the writer owns the file). SQLite and
  Postgres are shared: actions go through an `Engine` on the same journal. Changes are found
  by polling, and only while a page with live updates is open.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken, TokenVerifier

from ..engine import Engine
from ..journal import CallQuery, Journal, create_journal, display_url
from ..journal.model import CallRecord
from ..policy import DEFAULT_RETENTION
from ..server.redact import SensitiveNames
from ..server.resources import recovery_body, stats_body
from ..uris import STATS_URI

if TYPE_CHECKING:
    from ..server.assembly import DurableFace

#: Seconds between two looks at a shared journal for a page with live updates (standalone only).
POLL_INTERVAL = 2.0


class ConsoleSource(Protocol):
    """What the console needs from where it runs.

    `reading()` yields an open journal for one request's reads. `engine` acts (None: read-only).
    `principal(token)` is the identity a verified token (None: no auth configured) acts as,
    exactly as over MCP. `changes(principal)` yields change hints (record URIs or
    `journal://stats`) that principal may see, for as long as the caller iterates.
    """

    verifier: TokenVerifier | None
    journal_url: str

    @property
    def admins(self) -> frozenset[str]: ...

    def reading(self) -> Any: ...

    @property
    def engine(self) -> Engine | None: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def principal(self, token: AccessToken | None) -> str: ...

    async def sensitive(self, journal: Journal, tool: str) -> tuple[str, ...]: ...

    def retention(self, tool: str) -> float | None: ...

    async def recovery(self, journal: Journal, scope: str | None) -> dict[str, Any]: ...

    def changes(self, principal: str) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


def principal_with_token(principal_of: Callable[[Any], str], token: AccessToken | None) -> str:
    """Run a server's principal function as it runs for an MCP request carrying `token`: the SDK's
    auth context holds the token while it runs (the default reads it from there)."""
    marker = auth_context_var.set(AuthenticatedUser(token) if token is not None else None)
    try:
        return principal_of(None)
    finally:
        auth_context_var.reset(marker)


class ServerSource:
    """The console of a running `DurableServer` or `ProxyServer` (mounted at `/console`), read
    through the durable parts it composes (`face`)."""

    def __init__(self, face: DurableFace) -> None:
        self.face = face
        self.verifier: TokenVerifier | None = face.token_verifier
        self.journal_url = display_url(face.journal.url)

    @property
    def admins(self) -> frozenset[str]:
        return self.face.admin_principals

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Journal]:
        await self.face.engine.start()
        yield self.face.journal

    @property
    def engine(self) -> Engine | None:
        return self.face.engine

    @property
    def clock(self) -> Callable[[], float]:
        return self.face.engine.clock

    def principal(self, token: AccessToken | None) -> str:
        return principal_with_token(self.face.principal_of, token)

    async def sensitive(self, journal: Journal, tool: str) -> tuple[str, ...]:
        return await self.face.resources.sensitive(tool)

    def retention(self, tool: str) -> float | None:
        policy = self.face.policies.get(tool)
        return policy.retention if policy is not None else DEFAULT_RETENTION

    async def recovery(self, journal: Journal, scope: str | None) -> dict[str, Any]:
        return recovery_body(journal.recovery, self.face.engine, scope)

    async def changes(self, principal: str) -> AsyncIterator[str]:
        notifier = self.face.notifier
        send, receive = anyio.create_memory_object_stream[str](64)

        def listener(event: Any) -> None:
            try:
                send.send_nowait(str(getattr(event, "uri", STATS_URI)))
            except anyio.WouldBlock:  # a burst: the page reloads once for all of it anyway
                pass

        unsubscribe = notifier.watch(principal, listener)
        try:
            async with receive:
                async for uri in receive:
                    yield uri
        finally:
            unsubscribe()
            send.close()

    async def aclose(self) -> None:
        return None


class JournalSource:
    """A console on its own, on a journal URL (`mcp-durable console --journal URL`)."""

    def __init__(
        self,
        url: str,
        *,
        verifier: TokenVerifier | None,
        admins: Collection[str],
        principal_of: Callable[[Any], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        from ..cli.journal import read_only_url

        self._url = read_only_url(url)
        self.verifier = verifier
        self.admins = frozenset(admins)
        self.journal_url = display_url(url)
        self._principal_of = principal_of
        self._clock = clock
        self._journal: Journal | None = None
        self._engine: Engine | None = None
        self._opened = anyio.Lock()

    async def _shared(self) -> Journal:
        async with self._opened:
            if self._journal is None:
                journal = create_journal(self._url)
                await journal.open()
                self._journal = journal
                if not journal.single_writer:
                    # No process id: a console journals no lifecycle. Operator actions go through
                    # this engine (`Engine.resolve` …), which starts it on the first one: its
                    # sweep marks only records whose lease ran out, as any replica's start does.
                    self._engine = Engine(journal, clock=self._clock)
            return self._journal

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Journal]:
        journal = await self._shared()
        if not journal.single_writer:
            yield journal
            return
        # A read-only file journal is a picture of the moment it was opened: reopen it per read.
        fresh = create_journal(self._url)
        await fresh.open()
        try:
            yield fresh
        finally:
            await fresh.aclose()

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def principal(self, token: AccessToken | None) -> str:
        return principal_with_token(self._principal_of, token)

    async def sensitive(self, journal: Journal, tool: str) -> tuple[str, ...]:
        return (await SensitiveNames.load(journal)).get(tool, ())

    def retention(self, tool: str) -> float | None:
        return DEFAULT_RETENTION

    async def recovery(self, journal: Journal, scope: str | None) -> dict[str, Any]:
        return recovery_body(journal.recovery, None, scope)

    async def changes(self, principal: str) -> AsyncIterator[str]:
        scope = None if principal in self.admins else principal
        last: Any = None
        while True:
            async with self.reading() as journal:
                seen = await _signature(journal, scope)
            if last is not None and seen != last:
                yield STATS_URI
            last = seen
            await anyio.sleep(POLL_INTERVAL)

    async def aclose(self) -> None:
        if self._journal is not None:
            await self._journal.aclose()
            self._journal = None


async def _signature(journal: Journal, principal: str | None) -> Any:
    """Something that differs when what `principal` sees changed: the counts, and the versions
    of the newest records (a state change of an old record moves the counts by state)."""
    counts = await stats_body(journal, principal)
    newest: list[CallRecord] = await journal.list_calls(CallQuery(principal=principal, limit=50))
    return (counts["calls_by_state"], [(r.identity, r.version) for r in newest])


def tokens_and_admins(tokens: Mapping[str, str] | None, admins: Collection[str]) -> tuple[Any, frozenset[str]]:
    """The verifier of a `{token: principal}` map (None without one) and the admin set."""
    from ..server.auth import StaticTokenVerifier

    return (StaticTokenVerifier(tokens) if tokens else None), frozenset(admins)
