"""Shared test helpers: real servers on real transports, on free ports.

    from tests.helpers import free_port, serve_http, stdio_params, serve_app, REPO

    async with serve_http("tools/payments.py", journal=f"sqlite:///{tmp_path}/j.db",
                          env={"PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}) as served:
        async with Client(served.url) as client: ...
        served.kill()                      # SIGKILL, for crash tests

    async with Client(stdio_params("tools/payments.py", journal=url, env={...}), mode="legacy") as client: ...

    async with serve_app(server.streamable_http_app()) as url: ...   # in-process uvicorn

- `serve_http` starts `mcp-durable serve TARGET --transport http --port P` as a subprocess (the
  console script next to the test interpreter), waits until the port accepts connections, yields
  a `ServedHttp` (`.url` ending in `/mcp`, `.port`, `.proc`, `.kill()`, `.stderr()`), and on exit
  terminates the process (SIGKILL if it does not stop within 5 s). A port lost to a race with
  another test is retried on a new port.
- `stdio_params` gives the `StdioServerParameters` for `Client(...)` that run `mcp-durable serve
  TARGET` over stdio. The SDK passes the child only a minimal environment plus `env`, so put
  everything the target needs (e.g. `PAYMENTS_LEDGER`) in `env`.
- `serve_app` serves an ASGI app with uvicorn inside the test's event loop on a free port and
  yields its base URL (`http://127.0.0.1:P`), for in-process servers over HTTP.

- `connect(transport, target=, journal=, env=, server=)` yields a connected `mcp.Client` for one of
  `TRANSPORTS` (`memory-legacy`, `memory-auto`, `stdio-legacy`, `stdio-auto`, `http-legacy`,
  `http-auto`), so one test body can be parametrized over every transport and era.
- `key_meta(key)` is the `_meta` that sends an idempotency key with `client.call_tool(..., meta=)`;
  `request_meta(entries)` any other `_meta`.
- `meta_of(result)` is a tool result's `_meta` (which every durable answer carries).
- `first_text(result)` is the text of a tool result's first content block, `resource_text(result)`
  that of a resource read; `read_json(client, uri)` is the JSON document a resource holds.
- `wire(result)` is a result's wire dict; `body_bytes(result)` the JSON bytes of its `content`,
  `structuredContent` and `isError` (what a replay must keep byte-identical).

TARGET paths are relative to the repository root (`REPO`), which is the subprocesses' cwd.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, ReadResourceResult, RequestParamsMeta, TextContent, TextResourceContents

from mcp_durable import KEY_META

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, then release it).

    Under pytest-xdist each worker is handed only ports `p` with `p // 2` of its own residue
    modulo the number of workers: a port one worker was given (for a server about to start, or as
    one where nothing listens) is never another worker's, whatever happens between the release
    and its use. (`p // 2`, not `p`: Linux hands out ports of one parity to `bind`.)"""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw0", "gw1", …
    mine = int(worker.removeprefix("gw")) % workers if worker.startswith("gw") else 0
    for _ in range(10_000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port // 2 % workers == mine:
            return port
    raise RuntimeError(f"no free port for worker {worker} of {workers}")


def serve_command() -> list[str]:
    """How to run `mcp-durable`: the console script beside this interpreter, else `python -m`."""
    script = Path(sys.executable).parent / "mcp-durable"
    if script.exists():
        return [str(script)]
    found = shutil.which("mcp-durable")
    return [found] if found else [sys.executable, "-m", "mcp_durable.cli"]


def stdio_params(
    target: str,
    *,
    journal: str,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> StdioServerParameters:
    """Client parameters that start `mcp-durable serve TARGET --journal JOURNAL` over stdio."""
    command, *prefix = serve_command()
    return StdioServerParameters(
        command=command,
        args=[*prefix, "serve", target, "--journal", journal, *extra_args],
        env=dict(env or {}),
        cwd=str(REPO),
    )


@dataclass
class ServedHttp:
    """A running `mcp-durable serve … --transport http` subprocess."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    _files: list[Any] = field(default_factory=list)

    def kill(self) -> None:
        """SIGKILL the server (no shutdown of any kind) and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stderr(self) -> str:
        """What the server wrote to stderr so far (for assertion messages)."""
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""


def _start_cli(cli_args: Sequence[str], port: int, env: Mapping[str, str] | None) -> ServedHttp:
    log = tempfile.NamedTemporaryFile(prefix="mcp-durable-serve-", suffix=".log", delete=False)  # noqa: SIM115
    args = [*serve_command(), *cli_args, "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    return ServedHttp(f"http://127.0.0.1:{port}/mcp", port, proc, Path(log.name), [log])


async def wait_listening(served: ServedHttp) -> bool:
    """True once the port accepts connections; False if the process exited first."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if served.proc.poll() is not None:
            return False
        try:
            stream = await anyio.connect_tcp("127.0.0.1", served.port)
        except OSError:
            await anyio.sleep(0.05)
            continue
        await stream.aclose()
        return True
    raise TimeoutError(f"mcp-durable serve did not listen on {served.port} in {STARTUP_TIMEOUT}s:\n{served.stderr()}")


def _stop(served: ServedHttp) -> None:
    if served.proc.poll() is None:
        served.proc.terminate()
        try:
            served.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            served.proc.kill()
            served.proc.wait(timeout=10)
    for handle in served._files:
        handle.close()
    served.stderr_path.unlink(missing_ok=True)


@asynccontextmanager
async def serve_http(
    target: str,
    *,
    journal: str,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
) -> AsyncIterator[ServedHttp]:
    """Run `mcp-durable serve TARGET --transport http` on a free port until the block exits."""
    async with serve_cli_http(["serve", target, "--journal", journal, *extra_args], env=env, port=port) as served:
        yield served


@asynccontextmanager
async def serve_cli_http(
    cli_args: Sequence[str], *, env: Mapping[str, str] | None = None, port: int | None = None
) -> AsyncIterator[ServedHttp]:
    """Run `mcp-durable CLI_ARGS… --transport http` (e.g. `proxy --upstream-url …`) on a free port."""
    for _attempt in range(5):
        served = _start_cli(cli_args, port or free_port(), env)
        try:
            if await wait_listening(served):
                break
            text = served.stderr()
            if port is None and "address already in use" in text.lower():
                continue  # lost the port to a race; try another
            raise RuntimeError(f"mcp-durable serve exited with {served.proc.returncode}:\n{text}")
        except BaseException:
            _stop(served)
            raise
        finally:
            if served.proc.poll() is not None:
                _stop(served)
    else:
        raise RuntimeError("could not find a free port for mcp-durable serve")
    try:
        yield served
    finally:
        _stop(served)


@asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn in this event loop on a free port; yields `http://127.0.0.1:P`."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # bound here and handed to uvicorn: no port race
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not server.started:
            if time.monotonic() > deadline or (tg.cancel_scope.cancel_called):
                raise TimeoutError("uvicorn did not start")
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
    sock.close()


@asynccontextmanager
async def client_as(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    """An MCP client over streamable HTTP that sends `Authorization: Bearer <token>` on every request."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


#: Every way a test can reach a server: in-memory (both eras), stdio and HTTP subprocesses (both eras).
TRANSPORTS = ("memory-legacy", "memory-auto", "stdio-legacy", "stdio-auto", "http-legacy", "http-auto")


@asynccontextmanager
async def connect(
    transport: str,
    *,
    target: str,
    journal: str,
    env: Mapping[str, str] | None = None,
    server: Any = None,
) -> AsyncIterator[Client]:
    """A connected `mcp.Client` over `transport` (one of `TRANSPORTS`).

    `memory-*` connects in-process to `server` (an `MCPServer` the caller built on `journal`);
    `stdio-*` and `http-*` start `mcp-durable serve target --journal journal` with `env`. The
    suffix is the client mode: `legacy` (2025-11-25 handshake) or `auto` (2026-07-28).
    """
    kind, _, mode = transport.partition("-")
    if kind == "memory":
        if server is None:
            raise ValueError("memory transports need the server object")
        async with Client(server, mode=mode) as client:
            yield client
    elif kind == "stdio":
        async with Client(stdio_params(target, journal=journal, env=env), mode=mode) as client:
            yield client
    elif kind == "http":
        async with serve_http(target, journal=journal, env=env) as served:
            async with Client(served.url, mode=mode) as client:
                yield client
    else:
        raise ValueError(f"unknown transport {transport!r}")


def request_meta(entries: Mapping[str, Any]) -> RequestParamsMeta:
    """`entries` as the `_meta` of a request, for `client.call_tool(..., meta=)`.

    `RequestParamsMeta` is an open TypedDict (PEP 728 `extra_items=Any`: any key round-trips), but
    mypy does not implement `extra_items` yet and rejects every key the class does not declare,
    ours included; hence the one cast, here rather than at each call.
    """
    return cast(RequestParamsMeta, dict(entries))


def key_meta(key: str) -> RequestParamsMeta:
    """The `_meta` that sends `key` as the call's idempotency key."""
    return request_meta({KEY_META: key})


def meta_of(result: CallToolResult) -> dict[str, Any]:
    """`result`'s `_meta`: every answer of a durable tool carries one (key, replayed, error)."""
    assert result.meta is not None, f"a result without _meta: {result!r}"
    return result.meta


def first_text(result: CallToolResult) -> str:
    """The text of a tool result's first content block (asserted to be text)."""
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


def resource_text(result: ReadResourceResult) -> str:
    """The text of a resource's first contents (asserted to be text, not a blob)."""
    contents = result.contents[0]
    assert isinstance(contents, TextResourceContents), contents
    return contents.text


async def read_json(client: Client, uri: str) -> Any:
    """The JSON document at resource `uri` (asserted to be one JSON text content)."""
    import orjson

    result = await client.read_resource(uri)
    (content,) = result.contents
    assert isinstance(content, TextResourceContents) and content.mime_type == "application/json", content
    return orjson.loads(content.text)


def wire(result: Any) -> dict[str, Any]:
    """A result as it goes on the wire (aliases, JSON types, no nulls)."""
    return dict(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def body_bytes(result: Any) -> bytes:
    """The JSON bytes of what replay must keep identical: `content`, `structuredContent`, `isError`."""
    import orjson

    data = wire(result)
    return orjson.dumps({name: data.get(name) for name in ("content", "structuredContent", "isError")})
