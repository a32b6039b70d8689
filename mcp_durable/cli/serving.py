"""Serving an MCP server from the command line: the options every serving command takes
(`serve`, `proxy`, `console`), the start-up banner, uvicorn, the console mount.

Its own module so that `mcp-durable proxy` (proxy/cli.py) and `serve` (cli.py) share it without
importing each other. Nothing of the MCP face is imported until a server is served.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ..errors import ConfigError
from ..journal import ENV_JOURNAL, display_url

#: The MCP Inspector the serve banner names: pinned, so the command works as printed (an
#: unpinned `npx` resolves whatever is newest, whose CLI may differ). The docs pin the same one.
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def freeze_startup_heap() -> int:
    """Move every object alive now into the collector's permanent generation; returns how many.

    For `serve`, once the server is built: the SDK, pydantic's schemas and the tools are objects
    the cyclic collector tracks and would walk in every full collection, though none of them is
    ever garbage. A durable call waits for its fsync with its request state alive, so full
    collections come more often than on a plain server; frozen, they skip the start-up heap
    (what that was measured to buy: docs/dev/performance-notebook.md). Frozen objects are still
    freed by reference counting; only a cycle among them is kept.
    A process setting, so the library never does this: `serve` owns its process.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def serve_server(server: Any, args: argparse.Namespace, label: str) -> int:
    """Serve `server` over `args.transport` (stdio, or streamable HTTP on `args.host:args.port`)."""
    from ..server.assembly import face_of

    face = face_of(server)
    journal = display_url(face.journal.url) if face is not None else "none (plain MCPServer)"
    if args.transport == "stdio":
        frozen = "" if args.no_gc_freeze else f"; {freeze_startup_heap():,} start-up objects frozen"
        print(f"mcp-durable: serving {label} over stdio; journal {journal}{frozen}", file=sys.stderr)
        server.run("stdio")
        return 0
    from ..server.auth import point_auth_at

    base_url = f"http://{args.host}:{args.port}"
    server.settings.auth = point_auth_at(server.settings.auth, base_url)  # 401s name this port
    # host= lets the SDK choose DNS-rebinding protection for it: on for loopback, as it should be.
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=args.stateless, host=args.host)
    url = f"{base_url}/mcp"
    _flush_telemetry_when_stopped(app)
    console = _mount_console(app, server, base_url) if not args.no_console else "off (--no-console)"
    heap = (
        "collected as usual (--no-gc-freeze)"
        if args.no_gc_freeze
        else (f"{freeze_startup_heap():,} start-up objects frozen (gc.freeze; --no-gc-freeze to keep collecting them)")
    )
    announce(
        f"mcp-durable: serving {label} over streamable HTTP at {url}",
        f"  journal: {journal}",
        f"  heap:    {heap}",
        f"  console: {console}",
        f"  connect: any MCP client to {url}; send the key in _meta['mcp-durable/idempotency-key']",
        f"  e.g.:    npx -y {INSPECTOR} --cli {url} --transport http --method tools/list",
    )
    return run_uvicorn(app, args)


def set_otel_up(args: argparse.Namespace) -> None:
    """OpenTelemetry from the `OTEL_*` environment for a serving command (cli/otel_env.py), before
    it serves; what was done said on stderr."""
    from .. import config
    from .otel_env import configure_from_environment

    line = configure_from_environment(config.environment(), stdio=args.transport == "stdio")
    if line is not None:
        announce(line)


def _flush_telemetry_when_stopped(app: Any) -> None:
    """Flush the OpenTelemetry this command set up when the app's lifespan ends (uvicorn's
    graceful shutdown, SIGTERM's included, after which the process never reaches its exit hooks);
    the app is left as it is when the command set none up."""
    from . import otel_env

    if not otel_env.configured():
        return
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        try:
            async with inner(app) as state:
                yield state
        finally:
            otel_env.flush()

    app.router.lifespan_context = lifespan


def announce(*lines: str) -> None:
    """A serving command's start-up banner, on stderr (stdout may be the stdio transport)."""
    print("\n".join(lines), file=sys.stderr, flush=True)


#: How long the HTTP server keeps an idle connection open. Clients reuse a pooled connection idle
#: for up to a few seconds (the MCP SDK's httpx client: 5 s, as long as uvicorn's default), and a
#: request sent while the server closes that connection is lost to a reset (`ReadError`). The
#: server must outwait every client, and the load balancers' 60 s idle timeout in front of it.
KEEP_ALIVE_SECONDS = 75


def run_uvicorn(app: Any, args: argparse.Namespace) -> int:
    import anyio
    import uvicorn

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    anyio.run(uvicorn.Server(config).serve)
    return 0


def add_serving_options(parser: argparse.ArgumentParser) -> None:
    """The options every serving command takes (`serve`, `proxy`)."""
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--journal", help=f"journal URL (default: ${ENV_JOURNAL} or the embedded journal)")
    parser.add_argument("--stateless", action="store_true", help="stateless streamable HTTP (no sessions)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="keep the start-up heap in the garbage collector's generations (see docs/cli.md)",
    )
    parser.add_argument(
        "--no-console", action="store_true", help="do not mount the operator console at /console (http)"
    )


def _mount_console(app: Any, server: Any, base_url: str) -> str:
    """Mount the operator console at /console when it can be (a DurableServer, Jinja2 installed)."""
    from ..server.assembly import face_of

    if face_of(server) is None:
        return "off (a plain MCPServer has no journal)"
    try:
        from ..console import mount_console

        mount_console(app, server)
    except (ImportError, ConfigError):
        return "off (pip install 'mcp-durable[console]' for the operator console)"
    return f"{base_url}/console/ (the MCP bearer tokens sign in; --no-console to turn it off)"
