"""The FastMCP 4 server the tests call, and the clients they call it with.

Importing this module skips the importing test module when FastMCP is not installed (the extra
`fastmcp`), and fails it when `CI` is set: a missing integration is never hidden by a skip in CI.
So test modules import FastMCP, and `mcp_durable.fastmcp`'s `make_durable`, from here.

    app = shop_app(tmp_path)                       # refund, send_mail, order_status; no journal yet
    durable = make_durable(app, journal=..., policies=tmp_path / "policies.toml")
    async with connected("mcp-legacy", app) as caller:
        result = await caller.call("refund", {"order_id": "O-1", "amount_cents": 500}, key="r-1")

The three tools, each counted outside the server (the stand-ins' own SQLite files):

- `refund`: annotated `idempotentHint: true` (durable by its own annotation); its downstream, the
  stand-in payment provider, honours the scoped key it is given (`PaymentProvider`);
- `send_mail`: durable by the policies file (`key = "required"`, `in_doubt = "refuse"`); its
  downstream, the stand-in outbox, does not deduplicate (`Outbox`);
- `order_status`: `readOnlyHint: true`, not journaled; reads the ledger.

`Arrivals` is a FastMCP middleware of the test server's own (added before the durable one): it
counts the `tools/call` requests that reached the server, so a test can hold a first call inside
its tool and send a second one while it runs.

The same shop as a server process of its own (`shop_server.py`, with crash points), on `Shop`'s
stand-ins: `shop_stdio(journal, shop_env(shop, …))` are the stdio client's parameters that start
it, `serve_shop_http(journal, env)` runs it on streamable HTTP and yields its URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

try:
    import fastmcp  # noqa: F401 - only whether it is installed
except ImportError:
    _WHY = "FastMCP 4 is not installed (pip install -e '.[dev,fastmcp]'; `make test` installs it)"
    if os.environ.get("CI"):
        pytest.fail(f"{_WHY}; CI must have it", pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

from fastmcp import Client as FastMCPClient
from fastmcp import FastMCP
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from mcp import Client, StdioServerParameters
from mcp_types import CallToolRequestParams, CallToolResult, ToolAnnotations

from mcp_durable import KEY_META, current_call
from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.outbox import Outbox
from mcp_durable.fastmcp import make_durable
from tests.helpers import REPO, ServedHttp, client_as, free_port, serve_app, wait_listening

__all__ = [
    "CLIENTS",
    "SHOP_SERVER",
    "TOKENS",
    "Arrivals",
    "Caller",
    "FastMCP",
    "FastMCPClient",
    "Shop",
    "arrivals",
    "connected",
    "make_durable",
    "serve_shop_http",
    "shop_app",
    "shop_env",
    "shop_stdio",
]

#: The policies file of the test server: `send_mail` by name; `refund` by its own annotation.
POLICIES = """
[tools.send_mail]
key = "required"
in_doubt = "refuse"
"""

#: The ways a test reaches the server: FastMCP's own client (in memory), and the MCP Python SDK's
#: client over streamable HTTP in each protocol era (2025-11-25 handshake, 2026-07-28).
CLIENTS = ("fastmcp", "mcp-legacy", "mcp-auto")

#: Bearer tokens of the authenticated server and the principal each maps to.
TOKENS = {"tokA": "alice", "tokB": "bob"}


class Arrivals(Middleware):
    """Counts `tools/call` requests by tool as they reach the server; `wait_for(tool, n)`."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._changed = anyio.Event()

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        name = context.message.name
        self.counts[name] = self.counts.get(name, 0) + 1
        self._changed.set()
        self._changed = anyio.Event()
        return await call_next(context)

    async def wait_for(self, tool: str, count: int) -> None:
        with anyio.fail_after(30):  # a bound on a hang, not a timing assertion
            while self.counts.get(tool, 0) < count:
                await self._changed.wait()


class Shop:
    """The stand-ins the shop's tools act on, each a SQLite file under `directory`, and the gate
    a test may hold `refund` at (`hold_refunds`)."""

    def __init__(self, directory: Path) -> None:
        self.ledger = PaymentProvider(directory / "ledger.db")
        self.outbox = Outbox(directory / "outbox.db")
        self.policies = directory / "policies.toml"
        self.policies.write_text(POLICIES)
        self.gate: anyio.Event | None = None

    def hold_refunds(self) -> anyio.Event:
        """From now on `refund` waits, before it moves money, until the returned event is set."""
        self.gate = anyio.Event()
        return self.gate


def shop_app(shop: Shop, *, name: str = "shop", tokens: Mapping[str, str] | None = None) -> FastMCP[Any]:
    """The FastMCP server with the three tools on `shop` (bearer auth when `tokens` are given),
    and an `Arrivals` middleware as its first (outermost) one: `app.middleware[0]`."""
    auth = None
    if tokens:
        auth = StaticTokenVerifier(
            {token: {"client_id": principal, "scopes": []} for token, principal in tokens.items()}
        )
    app: FastMCP[Any] = FastMCP(name, auth=auth, middleware=[Arrivals()])

    @app.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
    async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order; the provider deduplicates by the key it is given."""
        if shop.gate is not None:
            await shop.gate.wait()
        effect = shop.ledger.refund(order_id, amount_cents, idempotency_key=current_call().scoped_key)
        return effect.as_dict()

    @app.tool(annotations=ToolAnnotations(destructive_hint=True))
    def send_mail(to: str, subject: str, body: str) -> dict[str, Any]:
        """Send a mail; the outbox sends every request it gets (it does not deduplicate)."""
        return shop.outbox.send(to, subject, body, key=current_call().scoped_key).as_dict()

    @app.tool(annotations=ToolAnnotations(read_only_hint=True))
    def order_status(order_id: str) -> dict[str, Any]:
        """The refunds of an order, read from the ledger."""
        return {"order_id": order_id, "refunds": len(shop.ledger.effects(op="refund", subject=order_id))}

    return app


def arrivals(app: FastMCP[Any]) -> Arrivals:
    first = app.middleware[0]
    assert isinstance(first, Arrivals)
    return first


class Caller:
    """One connected client, FastMCP's or the MCP SDK's, behind one `call`."""

    def __init__(self, client: FastMCPClient[Any] | Client) -> None:
        self.client = client

    async def call(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> CallToolResult:
        """`tools/call` of `tool`, with `key` in `_meta["mcp-durable/idempotency-key"]` when given."""
        meta = None if key is None else {KEY_META: key}
        if isinstance(self.client, FastMCPClient):
            return await self.client.call_tool_mcp(tool, arguments, meta=meta)
        if meta is None:
            return await self.client.call_tool(tool, arguments)
        from tests.helpers import request_meta

        return await self.client.call_tool(tool, arguments, meta=request_meta(meta))


@asynccontextmanager
async def connected(kind: str, app: FastMCP[Any], token: str | None = None) -> AsyncIterator[Caller]:
    """A `Caller` connected to `app` as `kind` (one of `CLIENTS`): FastMCP's `Client` in memory,
    or the MCP SDK's `Client` over streamable HTTP (an in-process uvicorn on a free port) in the
    era the suffix names; `token` is sent as a bearer token (HTTP)."""
    if kind == "fastmcp" and token is None:
        async with FastMCPClient(app) as fastmcp_client:
            yield Caller(fastmcp_client)
        return
    async with serve_app(app.http_app()) as base:
        url = f"{base}/mcp"
        if kind == "fastmcp":
            async with FastMCPClient(url, auth=token) as fastmcp_client:
                yield Caller(fastmcp_client)
            return
        mode = kind.removeprefix("mcp-")
        if token is not None:
            async with client_as(url, token, mode) as authenticated:
                yield Caller(authenticated)
            return
        async with Client(url, mode=mode) as client:
            yield Caller(client)


#: The shop as a server process of its own (see its docstring).
SHOP_SERVER = Path(__file__).with_name("shop_server.py")


def shop_env(shop: Shop, **settings: str) -> dict[str, str]:
    """The environment of a `shop_server.py` process acting on `shop`'s stand-ins, plus `settings`
    (`SHOP_MAIL_POLICY`, `SHOP_LEASE`, `CRASH_PLAN`, `CRASH_COUNTER`)."""
    return {"SHOP_LEDGER": str(shop.ledger.path), "SHOP_OUTBOX": str(shop.outbox.path), **settings}


def _shop_argv(journal: str, *transport: str) -> list[str]:
    return [sys.executable, str(SHOP_SERVER), "--journal", journal, *transport]


def shop_stdio(journal: str, env: Mapping[str, str]) -> StdioServerParameters:
    """The stdio client's parameters that start `shop_server.py` on `journal` with `env` (the SDK
    passes the child only a minimal environment plus `env`)."""
    command, *args = _shop_argv(journal)
    return StdioServerParameters(command=command, args=args, env=dict(env), cwd=str(REPO))


@asynccontextmanager
async def serve_shop_http(journal: str, env: Mapping[str, str]) -> AsyncIterator[str]:
    """Run `shop_server.py` on `journal` over streamable HTTP on a free port until the block
    exits (terminated, then killed); yields its MCP URL. A port lost to a race is retried."""
    with tempfile.TemporaryDirectory(prefix="shop-server-") as logs:
        for attempt in range(5):
            port = free_port()
            log_path = Path(logs) / f"stderr-{attempt}.log"
            with log_path.open("wb") as log:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    _shop_argv(journal, "--transport", "http", "--port", str(port)),
                    cwd=REPO,
                    env={**os.environ, **env},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            served = ServedHttp(f"http://127.0.0.1:{port}/mcp", port, proc, log_path)
            try:
                if await wait_listening(served):
                    break
                if "address already in use" not in served.stderr().lower():
                    raise RuntimeError(f"shop_server.py exited with {proc.returncode}:\n{served.stderr()}")
            except BaseException:
                _stop(proc)
                raise
        else:
            raise RuntimeError("could not find a free port for shop_server.py")
        try:
            yield served.url
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
