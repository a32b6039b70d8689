"""The proxy's connections to its upstream MCP server: one shared session per set of client
capabilities (`Upstream`, a small pool of `UpstreamSession`s), each reconnected when it dies.

    upstream = Upstream(UpstreamSpec(command=["npx", "-y", "@modelcontextprotocol/server-memory"]))
    async with anyio.create_task_group() as tg:
        await tg.start(upstream.supervise)
        session = upstream.session(declared_by(ctx.session))  # the calling client's capabilities
        client = await session.client()           # connects (or reconnects) on demand
        result = await session.call_tool(...)     # `UpstreamLost` if the connection died mid-call

A session declares to the upstream exactly the capabilities its key names (router.py's
`Capabilities`: sampling and its parts, elicitation), so the upstream lists and does for each
client what it would for that client directly. Sessions are opened lazily, at their first
`client()`, and closed together by `stop()`.

Contracts:
- `client()` returns a live session or raises `UpstreamUnavailableError` before anything was
  sent, so the proxy can refuse a call without writing to its journal.
- A session whose transport reached end-of-stream (a stdio child that exited) is known dead at
  once (`_WatchedReceive`), so the next call restarts the upstream instead of sending into it.
- `call_tool` raises `UpstreamLost` when the connection broke while the request was out: the
  upstream may or may not have acted on it. A call that outlives its own timeout raises
  `UpstreamTimedOut` (an `UpstreamLost`: its outcome is unknown too) and loses only that call:
  the SDK abandons the request (a courtesy `notifications/cancelled` goes upstream) and the
  shared session, with every other call on it, goes on.
- The upstream URL is shown masked (`UpstreamSpec.describe`, `UpstreamSpec.masked`:
  `journal.masked_urls.display_url`, user info included) in every message and log line,
  the HTTP client's own log lines too (`mask_http_client_logs`).
- Only one task (each session's `supervise`) enters and leaves its SDK `Client`, as anyio's
  cancel scopes require.
- What a client asked of the upstream lives past its session: the log level (sent to every
  session) and the resources subscribed to (`subscribe`, on the no-capability session only) are
  sent again on every new session.
- Each session's tools are listed on its every connect and again after the upstream's
  `notifications/tools/list_changed` on it, at its next `client()` (one listing at a time: a
  `client()` that comes while one is under way waits for it); `listings` counts them.
  Every notification of every session (but log messages, which go to its router) is handed to
  `on_notification`, in the order received.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, TaskGroup, TaskStatus
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    EmptyResult,
    InputRequiredResult,
    LoggingLevel,
    LoggingMessageNotification,
    ServerNotification,
    SubscribeRequest,
    SubscribeRequestParams,
    Tool,
    ToolListChangedNotification,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from .. import config
from ..errors import ConfigError, UpstreamUnavailableError
from ..journal.masked_urls import display_url
from ..policy import DEFAULT_TIMEOUT
from .router import NO_CAPABILITIES, Capabilities, Router

logger = logging.getLogger(__name__)

#: How long `client()` waits for the upstream to start and answer `initialize`.
DEFAULT_CONNECT_TIMEOUT = 30.0
#: Seconds without an answer from an HTTP upstream after which `ready()` pings it first.
QUIET_BEFORE_PING = 1.0
#: How long a pass-through tool call may wait for the upstream's answer by default (a durable
#: call is bounded by its policy's `timeout` instead): the default of `ToolPolicy.timeout`.
DEFAULT_CALL_TIMEOUT = DEFAULT_TIMEOUT
#: The loggers of the HTTP client under the SDK's streamable HTTP transport: they write the
#: request URL (user info and query included) into their lines.
HTTP_CLIENT_LOGGERS = ("httpx2", "httpx", "mcp.client.streamable_http")


class UpstreamLost(Exception):
    """The connection to the upstream broke while a request was out (its outcome is unknown)."""


class UpstreamTimedOut(UpstreamLost):
    """One call outlived its timeout: abandoned (its outcome unknown); the session is still up."""


@dataclass(frozen=True)
class UpstreamSpec:
    """Where the upstream is: a `command` (stdio), a `url` (streamable HTTP, optional bearer
    `token`), or an in-process `server` (an `MCPServer`, for `make_durable`). Exactly one.

    `env` is the whole environment of a stdio child (the SDK would otherwise pass only a minimal
    one); `mode` the protocol era spoken to the upstream (`legacy` by default: every server
    speaks it, and only it carries server→client requests such as sampling). `call_timeout`
    bounds how long a pass-through tool call waits for its answer (None: no bound); a durable
    call is bounded by its policy's `timeout`. The `url` may hold credentials (user info, an
    `api_key` parameter): it is only ever shown masked (`describe`, `masked`, the repr).
    """

    command: Sequence[str] | None = None
    url: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    server: Any = None
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    mode: str = "legacy"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT

    def __post_init__(self) -> None:
        given = [name for name in ("command", "url", "server") if getattr(self, name)]
        if len(given) != 1:
            raise ConfigError("an upstream is exactly one of a command, a URL or a server object")
        if self.token is not None and self.url is None:
            raise ConfigError("an upstream token needs an upstream URL")
        if self.call_timeout is not None and not self.call_timeout > 0:
            raise ConfigError("the upstream call timeout must be positive seconds, or None for no bound")

    @classmethod
    def from_command_line(cls, command: str, **kwargs: Any) -> UpstreamSpec:
        """An upstream command given as one shell-quoted string (`--upstream-command "npx -y …"`)."""
        argv = shlex.split(command)
        if not argv:
            raise ConfigError("the upstream command is empty")
        return cls(command=argv, **kwargs)

    def describe(self) -> str:
        """A name for messages and logs (never the token, nor a credential inside the URL)."""
        if self.command:  # (masked too: a command may carry a URL, or `api_key=…`)
            return "command " + self.masked(shlex.join(self.command))
        if self.url:
            return f"URL {self.masked(self.url)}"
        return f"in-process server {getattr(self.server, 'name', type(self.server).__name__)!r}"

    def masked(self, text: str) -> str:
        """`text` (an error message, a log line) with the credentials of this upstream masked:
        every URL's user info and secret parameters (`display_url`), and the token."""
        shown = display_url(text, user_info=True)
        # (A token too short to be one would mask ordinary words; no real bearer token is.)
        return shown.replace(self.token, "***") if self.token and len(self.token) >= 8 else shown

    def transport(self) -> Any:
        """What `Client(...)` connects with: a watched stdio or HTTP transport, or the server itself."""
        if self.command:
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=self.command[0],
                args=list(self.command[1:]),
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
            )
            return _Watched(stdio_client(params))
        if self.url:
            mask_http_client_logs()
            return _Watched(_http_transport(self.url, self.token))
        return self.server


class _MaskedRecord(logging.Filter):
    """Rewrites a log record's message with every URL credential masked (`display_url`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = display_url(message, user_info=True)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_MASKED_RECORD = _MaskedRecord()


def mask_http_client_logs() -> None:
    """Mask URL credentials in the HTTP client's log lines (it logs every request's full URL at
    INFO, the SDK's transport its endpoint at DEBUG). Idempotent; a filter on those loggers only."""
    for name in HTTP_CLIENT_LOGGERS:
        target = logging.getLogger(name)
        if _MASKED_RECORD not in target.filters:
            target.addFilter(_MASKED_RECORD)


@asynccontextmanager
async def _http_transport(url: str, token: str | None) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    from ..server.sdk_internals import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


class _WatchedReceive(ObjectReceiveStream[Any]):
    """A transport's read stream that records end-of-stream (the upstream is gone) when it happens."""

    def __init__(self, inner: ObjectReceiveStream[Any], ended: anyio.Event) -> None:
        self._inner = inner
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Watched:
    """Wraps a transport so the end of its read stream sets `ended`."""

    def __init__(self, inner: AbstractAsyncContextManager[Any]) -> None:
        self._inner = inner
        self.ended = anyio.Event()

    async def __aenter__(self) -> Any:
        read, write = await self._inner.__aenter__()
        return _WatchedReceive(read, self.ended), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)


class _Connection:
    def __init__(self, client: Client, ended: anyio.Event, tools: list[Tool]) -> None:
        self.client = client
        self.ended = ended
        self.tools = tools


#: What receives the upstream's notifications (`Upstream.on_notification`).
NotificationHandler = Callable[[ServerNotification], Awaitable[None]]
#: The transport faults of a request on a session that broke.
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class UpstreamSession:
    """One session with the upstream, declaring `capabilities`, (re)connected on demand by
    `supervise`; its requests and log messages go to its own `router`. Made by `Upstream.session`."""

    def __init__(self, pool: Upstream, capabilities: Capabilities) -> None:
        self.pool = pool
        self.capabilities = capabilities
        #: Routes this session's server→client requests and log messages (router.py).
        self.router = Router(pool.log_level)
        self._live: _Connection | None = None
        self._wanted = anyio.Event()  # set: someone needs a connection
        self._changed = anyio.Event()  # replaced after every connect attempt
        self._error: BaseException | None = None
        self._lock = anyio.Lock()
        self._stop = anyio.Event()
        self.connects = 0
        self._last_ok = -math.inf  # when the upstream last answered (anyio clock)
        #: The upstream's tools as last listed to this session (refreshed on every connect).
        self.tools: dict[str, Tool] = {}
        #: The resources subscribed to (`subscribe`), subscribed again on every new session.
        self.subscribed: set[str] = set()
        #: How many times the tools were listed (each connect, each relisting after a change).
        self.listings = 0
        self._tools_stale = False
        #: Held while the tools are listed again (`_relist`): a request that finds it held waits
        #: for that listing, which cleared the stale mark before the upstream answered it.
        self._relisting = anyio.Lock()

    @property
    def spec(self) -> UpstreamSpec:
        return self.pool.spec

    @property
    def log_level(self) -> LoggingLevel | None:
        """The log level a client last set, sent again on every new session."""
        return self.pool.log_level

    def describe(self) -> str:
        """The upstream and this session's capabilities, for messages and logs (masked)."""
        return f"{self.spec.describe()} ({self.capabilities.describe()})"

    @property
    def failure(self) -> str | None:
        """Why the last connect attempt failed (credentials masked), or None."""
        return None if self._error is None else self.spec.masked(_reason(self._error))

    @property
    def connected(self) -> bool:
        """Whether a session is up and not known dead (an HTTP upstream may have died unseen)."""
        live = self._live
        return live is not None and not live.ended.is_set()

    # -- the supervisor ----------------------------------------------------------------------------

    def restart(self) -> None:
        """Before `supervise` runs again after a `stop()` (a server served again)."""
        self._stop = anyio.Event()

    async def supervise(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect whenever asked, hold the session until it dies or `stop()`; loop."""
        task_status.started()
        while not self._stop.is_set():
            await self._wanted.wait()
            if self._stop.is_set():
                break
            self._wanted = anyio.Event()
            try:
                await self._hold_one()
            except Exception as exc:  # noqa: BLE001 - reported to every waiting caller
                self._error = _leaf(exc)
                logger.warning("upstream %s: %s", self.describe(), self.failure)
            finally:
                self._live = None
                self._announce()

    async def _hold_one(self) -> None:
        transport = self.spec.transport()
        ended = transport.ended if isinstance(transport, _Watched) else anyio.Event()
        # The deadline covers the start and the handshake only. A scope around the whole session
        # (not `fail_after` around the enter): the client's task group must nest inside it.
        with anyio.CancelScope(deadline=anyio.current_time() + self.spec.connect_timeout) as connecting:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(
                    Client(
                        transport,
                        mode=self.spec.mode,
                        # What its clients declared, and nothing more: the upstream lists and does
                        # for this session what it would for them directly.
                        sampling_callback=self.router.sampling if self.capabilities.sampling else None,
                        sampling_capabilities=self.capabilities.sampling_capability(),
                        elicitation_callback=self.router.elicitation if self.capabilities.elicitation else None,
                        logging_callback=self.router.logging,
                        message_handler=self._on_message,
                        cache=None,
                    )
                )
                self._tools_stale = False  # listed now
                tools = await _all_tools(client)
                await self._apply_log_level(client)
                await self._resubscribe(client)
                connecting.deadline = math.inf
                await self._serve_session(client, ended, tools)
        if connecting.cancelled_caught:
            raise TimeoutError(f"no answer to initialize within {self.spec.connect_timeout} s")

    async def _serve_session(self, client: Client, ended: anyio.Event, tools: list[Tool]) -> None:
        """Publish a connected session and hold it until its transport ends, `lost()` or `stop()`."""
        self.tools = {tool.name: tool for tool in tools}
        self._live = _Connection(client, ended, tools)
        self._error = None
        self.connects += 1
        self.listings += 1
        self._announce()
        await ended.wait()
        if not self._stop.is_set():
            logger.warning("upstream %s: connection closed; the next call reconnects", self.describe())

    async def _apply_log_level(self, client: Client) -> None:
        """A new session starts at the upstream's own level: send the one a client asked for."""
        if self.log_level is not None and serves_logging(client):
            try:
                await client.set_logging_level(self.log_level)
            except MCPError as exc:  # a level it refuses must not cost the session
                logger.debug("upstream %s refused log level %s: %s", self.spec.describe(), self.log_level, exc)

    async def _resubscribe(self, client: Client) -> None:
        """A new session has no subscriptions: make the ones clients hold again."""
        for uri in sorted(self.subscribed):
            try:
                await _send_subscribe(client, uri)
            except MCPError as exc:  # the upstream refuses it now: its subscribers hear nothing more
                logger.warning("upstream %s refused the subscription to %s again: %s", self.spec.describe(), uri, exc)

    async def _on_message(self, message: ServerNotification | Exception) -> None:
        """The session's message handler: notifications to `on_notification` (log messages have
        gone to the router already); a transport fault is the session's own business."""
        if isinstance(message, Exception | LoggingMessageNotification):
            return
        if isinstance(message, ToolListChangedNotification):
            # Marked here, before any await, so a request after the one that changed them lists again.
            self._tools_stale = True
        if self.pool.on_notification is not None:
            await self.pool.on_notification(message)

    def _announce(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def lost(self) -> None:
        """The current session is broken (a request failed on it): drop it, reconnect on demand."""
        live = self._live
        if live is not None:
            live.ended.set()

    def stop(self) -> None:
        """End `supervise` (closing the session and a stdio child)."""
        self._stop.set()
        self._wanted.set()
        self.lost()

    # -- for callers -------------------------------------------------------------------------------

    async def client(self) -> Client:
        """A live session, connecting first if needed; `UpstreamUnavailableError` if that fails.
        Its tools are listed again first when the upstream said they changed."""
        live = self._live
        if live is not None and not live.ended.is_set():
            if self._tools_stale or self._relisting.locked():
                await self._relist(live.client)
            return live.client
        async with self._lock:
            live = self._live
            if live is not None and not live.ended.is_set():
                return live.client
            if self._stop.is_set() or self.pool.stopping:
                raise UpstreamUnavailableError(self.spec.describe(), "the proxy is stopping")
            while live is not None:  # a dead session still being torn down
                changed = self._changed
                await changed.wait()
                live = self._live
            changed = self._changed
            self._wanted.set()
            with anyio.move_on_after(self.spec.connect_timeout + 5):
                await changed.wait()
            live = self._live
            if live is None or live.ended.is_set():
                raise UpstreamUnavailableError(self.spec.describe(), self.failure or "no connection")
            self._last_ok = anyio.current_time()
            return live.client

    async def ready(self) -> Client:
        """`client()`, checked alive first when it may have died unseen; before a durable call.

        A stdio upstream's death is seen at once (its output ends). An HTTP upstream's is not:
        its session has no stream that ends, and a call sent to a dead one fails exactly like a
        call the upstream died in (in doubt). So after `QUIET_BEFORE_PING` seconds without an
        answer from it, a ping comes first: a dead upstream is then reconnected, or refused
        with `UpstreamUnavailableError` before anything is claimed. A death inside that second
        still leaves the call in doubt, the conservative answer.
        """
        client = await self.client()
        if self.spec.url is None or anyio.current_time() - self._last_ok < QUIET_BEFORE_PING:
            return client
        try:
            with anyio.fail_after(self.spec.connect_timeout):
                await client.send_ping()
        except Exception:  # noqa: BLE001 - any failure: the session is not usable
            self.lost()
            client = await self.client()
        self._last_ok = anyio.current_time()
        return client

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        progress: Any = None,
        timeout: float | None = None,
    ) -> CallToolResult | InputRequiredResult:
        """Forward one `tools/call`, waiting at most `timeout` seconds for its answer (None: no
        bound). `UpstreamLost` if the connection broke with it outstanding, `UpstreamTimedOut`
        if the timeout passed first (only this call is abandoned; the session stays up); an
        `MCPError` the upstream answered is re-raised as is (nothing happened there)."""
        client = await self.client()
        with self.breaks_as_lost():
            try:
                result = await client.session.call_tool(
                    name,
                    arguments,
                    read_timeout_seconds=timeout,
                    progress_callback=progress,
                    meta=meta,  # type: ignore[arg-type]
                    allow_input_required=True,
                )
            except MCPError as exc:
                if exc.error.code == REQUEST_TIMEOUT:
                    # This request's own read timeout: the SDK has abandoned it (and told the
                    # upstream so); the session is healthy, and dropping it would lose every other
                    # call on it.
                    raise UpstreamTimedOut(f"the upstream did not answer {name!r} within {timeout} s") from exc
                raise
        self._last_ok = anyio.current_time()
        assert isinstance(result, CallToolResult | InputRequiredResult)
        return result

    async def _relist(self, client: Client) -> None:
        """List the tools again if the upstream said they changed (`tools/list_changed`), one
        listing at a time: a request that comes while one is under way (the proxy starts one as
        soon as it hears the change) waits for it. Answered from the listing before the change, a
        client that was told of a new tool (by the reply to the call that made it) would not find
        it. A failure keeps the last listing (and the mark, to try again on the next request)."""
        async with self._relisting:
            if not self._tools_stale:
                return
            self._tools_stale = False  # a change announced during the listing marks it again
            try:
                tools = await _all_tools(client)
            except (MCPError, *_BROKEN) as exc:
                self._tools_stale = True
                logger.warning("upstream %s: could not list its changed tools: %s", self.describe(), exc)
                return
            self.tools = {tool.name: tool for tool in tools}
            self.listings += 1

    async def subscribe(self, uri: str) -> None:
        """Subscribe to the upstream resource `uri`, now and on every new session, until
        `unsubscribe`. `UpstreamUnavailableError` if it cannot be reached, the `MCPError` it
        answered if it refuses (then nothing is kept)."""
        client = await self.client()
        try:
            await _send_subscribe(client, uri)
        except MCPError as exc:
            if exc.error.code != CONNECTION_CLOSED:
                raise
            self.lost()
            raise UpstreamUnavailableError(
                self.spec.describe(), self.spec.masked(f"the connection broke ({exc.error.message})")
            ) from exc
        except _BROKEN as exc:
            self.lost()
            raise UpstreamUnavailableError(
                self.spec.describe(), f"the connection broke ({type(exc).__name__})"
            ) from exc
        self.subscribed.add(uri)

    async def unsubscribe(self, uri: str) -> None:
        """Unsubscribe from `uri`. Best effort: an upstream that cannot be told now forgets it
        with its session, and no new session subscribes to it again."""
        self.subscribed.discard(uri)
        live = self._live
        if live is None or live.ended.is_set():
            return
        try:
            request = UnsubscribeRequest(params=UnsubscribeRequestParams(uri=uri))
            await live.client.session.send_request(request, EmptyResult)
        except (MCPError, *_BROKEN) as exc:
            logger.debug("upstream %s: could not unsubscribe from %s: %s", self.spec.describe(), uri, exc)

    @contextmanager
    def breaks_as_lost(self) -> Iterator[None]:
        """A connection that breaks in the block, with a request of it out, as `UpstreamLost` (its
        outcome unknown; the session dropped, to reconnect on demand); any other `MCPError` the
        upstream answered passes as it is."""
        try:
            yield
        except MCPError as exc:
            if exc.error.code != CONNECTION_CLOSED:
                raise
            self.lost()
            raise UpstreamLost(self._broke(exc.error.message)) from exc
        except _BROKEN as exc:
            self.lost()
            raise UpstreamLost(self._broke(type(exc).__name__)) from exc

    def _broke(self, detail: str) -> str:
        return self.spec.masked(f"the upstream connection broke during the call ({detail})")

    async def apply_log_level(self, level: LoggingLevel) -> None:
        """Set the upstream's log level on this session now, if it is up and serves logging."""
        self.router.level = level
        live = self._live
        if live is not None and not live.ended.is_set() and serves_logging(live.client):
            await live.client.set_logging_level(level)


class Upstream:
    """The proxy's sessions with its upstream, one per set of client capabilities met (`session`),
    each opened when first needed and shared by every client that declared that set (at most ten
    sets: sampling absent or with any of its two parts, times elicitation or not).

    `supervise` runs them all (each in a task of its own), `stop` closes them all. A call, a
    listing or a request of a client goes through `session(declared_by(its session))`; the
    methods here without a `capabilities` argument use the no-capability session
    (`NO_CAPABILITIES`), which also holds the resource subscriptions (one subscription upstream
    for all clients) and runs background task calls (no client waits on them to be asked).
    The journal and the keys do not depend on the session: a key's effect happens once,
    whichever session runs it.
    """

    def __init__(self, spec: UpstreamSpec, on_notification: NotificationHandler | None = None) -> None:
        self.spec = spec
        #: Receives every notification of every session but its log messages, in the order received.
        self.on_notification = on_notification
        #: The log level a client last set (`set_log_level`), sent again on every new session.
        self.log_level: LoggingLevel | None = None
        self._sessions: dict[Capabilities, UpstreamSession] = {}
        self._group: TaskGroup | None = None
        self._stopped = anyio.Event()
        #: Set from `stop()` until `supervise` runs again: no session is started meanwhile.
        self.stopping = False

    def session(self, capabilities: Capabilities = NO_CAPABILITIES) -> UpstreamSession:
        """The session declaring `capabilities`, made (and supervised) when first asked for;
        it connects at its first `client()`."""
        session = self._sessions.get(capabilities)
        if session is None:
            session = self._sessions[capabilities] = UpstreamSession(self, capabilities)
            if self._group is not None and not self.stopping:
                self._group.start_soon(session.supervise)
        return session

    def sessions(self) -> list[UpstreamSession]:
        """The sessions made so far (connected or not)."""
        return list(self._sessions.values())

    async def supervise(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Supervise every session (those made before, and each made from now on) until `stop()`."""
        self._stopped = anyio.Event()
        self.stopping = False
        async with anyio.create_task_group() as group:
            for session in self._sessions.values():
                session.restart()  # a server may be served again after a stop (a new connection)
                await group.start(session.supervise)
            self._group = group
            task_status.started()
            try:
                await self._stopped.wait()
            finally:
                self._group = None
                for session in self._sessions.values():
                    session.stop()

    def stop(self) -> None:
        """End `supervise`, closing every session (and its stdio child)."""
        self.stopping = True
        self._stopped.set()
        for session in self._sessions.values():
            session.stop()

    @property
    def connects(self) -> int:
        """How many sessions were connected, over all capability sets."""
        return sum(session.connects for session in self._sessions.values())

    @property
    def failure(self) -> str | None:
        """Why the no-capability session's last connect attempt failed (masked), or None."""
        return self.session().failure

    @property
    def subscribed(self) -> set[str]:
        """The resources subscribed to upstream (on the no-capability session)."""
        return self.session().subscribed

    def tool(self, name: str) -> Tool | None:
        """Tool `name` as some session last listed it (the no-capability session's first)."""
        for session in (self.session(), *self._sessions.values()):
            if name in session.tools:
                return session.tools[name]
        return None

    async def client(self) -> Client:
        """The no-capability session's `client()`."""
        return await self.session().client()

    async def subscribe(self, uri: str) -> None:
        """`UpstreamSession.subscribe` on the no-capability session."""
        await self.session().subscribe(uri)

    async def unsubscribe(self, uri: str) -> None:
        """`UpstreamSession.unsubscribe` on the no-capability session."""
        await self.session().unsubscribe(uri)

    async def set_log_level(self, level: LoggingLevel) -> None:
        """Set the upstream's log level (when it serves logging) on every session, now and on
        every new one; it is also each session's router's filter."""
        self.log_level = level
        for session in self.sessions():
            await session.apply_log_level(level)


def serves_logging(client: Client) -> bool:
    """Whether the upstream declared the `logging` capability."""
    return client.server_capabilities.logging is not None


def serves_subscriptions(client: Client) -> bool:
    """Whether the upstream declared `resources.subscribe`."""
    resources = client.server_capabilities.resources
    return resources is not None and resources.subscribe is True


async def _send_subscribe(client: Client, uri: str) -> None:
    # The request itself, not the session's `subscribe_resource`: that is marked deprecated for the
    # 2026-07-28 era, and the proxy speaks 2025-11-25 to its upstream, where it is current.
    await client.session.send_request(SubscribeRequest(params=SubscribeRequestParams(uri=uri)), EmptyResult)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups: what the operator must read."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _all_tools(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a stdio upstream gets: ours, without mcp-durable's own secrets."""
    return config.without_secrets(environ)
