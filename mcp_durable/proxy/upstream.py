"""The proxy's connection to its upstream MCP server: one shared session, reconnected when it dies.

    upstream = Upstream(UpstreamSpec(command=["npx", "-y", "@modelcontextprotocol/server-memory"]), router)
    async with anyio.create_task_group() as tg:
        await tg.start(upstream.supervise)
        client = await upstream.client()          # connects (or reconnects) on demand
        result = await upstream.call_tool(...)    # `UpstreamLost` if the connection died mid-call

Contracts:
- `client()` returns a live session or raises `UpstreamUnavailableError` before anything was
  sent, so the proxy can refuse a call without writing to its journal.
- A session whose transport reached end-of-stream (a stdio child that exited) is known dead at
  once (`_WatchedReceive`), so the next call restarts the upstream instead of sending into it.
- `call_tool` raises `UpstreamLost` when the connection broke while the request was out: the
  upstream may or may not have acted on it.
- Only one task (`supervise`) enters and leaves the SDK `Client`, as anyio's cancel scopes require.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, TaskStatus
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, InputRequiredResult, Tool

from .. import config
from ..errors import ConfigError, UpstreamUnavailableError
from .router import Router

logger = logging.getLogger(__name__)

#: How long `client()` waits for the upstream to start and answer `initialize`.
DEFAULT_CONNECT_TIMEOUT = 30.0
#: Seconds without an answer from an HTTP upstream after which `ready()` pings it first.
QUIET_BEFORE_PING = 1.0


class UpstreamLost(Exception):
    """The connection to the upstream broke while a request was out (its outcome is unknown)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """Where the upstream is: a `command` (stdio), a `url` (streamable HTTP, optional bearer
    `token`), or an in-process `server` (an `MCPServer`, for `make_durable`). Exactly one.

    `env` is the whole environment of a stdio child (the SDK would otherwise pass only a minimal
    one); `mode` the protocol era spoken to the upstream (`legacy` by default: every server
    speaks it, and only it carries server→client requests such as sampling).
    """

    command: Sequence[str] | None = None
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    server: Any = None
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    mode: str = "legacy"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT

    def __post_init__(self) -> None:
        given = [name for name in ("command", "url", "server") if getattr(self, name)]
        if len(given) != 1:
            raise ConfigError("an upstream is exactly one of a command, a URL or a server object")
        if self.token is not None and self.url is None:
            raise ConfigError("an upstream token needs an upstream URL")

    @classmethod
    def from_command_line(cls, command: str, **kwargs: Any) -> UpstreamSpec:
        """An upstream command given as one shell-quoted string (`--upstream-command "npx -y …"`)."""
        argv = shlex.split(command)
        if not argv:
            raise ConfigError("the upstream command is empty")
        return cls(command=argv, **kwargs)

    def describe(self) -> str:
        """A name for messages and logs (never the token)."""
        if self.command:
            return "command " + shlex.join(self.command)
        if self.url:
            return f"URL {self.url}"
        return f"in-process server {getattr(self.server, 'name', type(self.server).__name__)!r}"

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
            return _Watched(_http_transport(self.url, self.token))
        return self.server


@asynccontextmanager
async def _http_transport(url: str, token: str | None) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

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


class Upstream:
    """One shared session with the upstream, (re)connected on demand by `supervise`."""

    def __init__(self, spec: UpstreamSpec, router: Router) -> None:
        self.spec = spec
        self.router = router
        self._live: _Connection | None = None
        self._wanted = anyio.Event()  # set: someone needs a connection
        self._changed = anyio.Event()  # replaced after every connect attempt
        self._error: BaseException | None = None
        self._lock = anyio.Lock()
        self._stop = anyio.Event()
        self.connects = 0
        self._last_ok = -math.inf  # when the upstream last answered (anyio clock)
        #: The upstream's tools as last listed (refreshed on every connect).
        self.tools: dict[str, Tool] = {}

    # -- the supervisor ----------------------------------------------------------------------------

    async def supervise(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect whenever asked, hold the session until it dies or `stop()`; loop."""
        self._stop = anyio.Event()  # a server may be served again after a stop (a new connection)
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
                logger.warning("upstream %s: %s", self.spec.describe(), _reason(self._error))
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
                        sampling_callback=self.router.sampling,
                        elicitation_callback=self.router.elicitation,
                        logging_callback=self.router.logging,
                        cache=None,
                    )
                )
                tools = await _all_tools(client)
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
        self._announce()
        await ended.wait()
        if not self._stop.is_set():
            logger.warning("upstream %s: connection closed; the next call reconnects", self.spec.describe())

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
        """A live session, connecting first if needed; `UpstreamUnavailableError` if that fails."""
        live = self._live
        if live is not None and not live.ended.is_set():
            return live.client
        async with self._lock:
            live = self._live
            if live is not None and not live.ended.is_set():
                return live.client
            if self._stop.is_set():
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
                reason = _reason(self._error) if self._error else "no connection"
                raise UpstreamUnavailableError(self.spec.describe(), reason)
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
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None, progress: Any = None
    ) -> CallToolResult | InputRequiredResult:
        """Forward one `tools/call`. `UpstreamLost` if the connection broke with it outstanding;
        an `MCPError` the upstream answered is re-raised as is (nothing happened there)."""
        client = await self.client()
        try:
            result = await client.session.call_tool(
                name,
                arguments,
                progress_callback=progress,
                meta=meta,  # type: ignore[arg-type]
                allow_input_required=True,
            )
        except MCPError as exc:
            if exc.error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                self.lost()
                raise UpstreamLost(f"the upstream connection broke during the call ({exc.error.message})") from exc
            raise
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.lost()
            raise UpstreamLost(f"the upstream connection broke during the call ({type(exc).__name__})") from exc
        self._last_ok = anyio.current_time()
        assert isinstance(result, CallToolResult | InputRequiredResult)
        return result


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
