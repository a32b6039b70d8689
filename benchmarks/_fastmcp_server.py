"""The server side of case 14: one FastMCP server with the no-op tool, in a process of its own.

    python benchmarks/_fastmcp_server.py KIND [STORE] [--http]

Run by path, not as `-m benchmarks…`: the `fastmcp-tasks` kind runs under the Python of a
separate virtual environment (fastmcp-tasks 4.1.4 pins fastmcp-slim 4.1.4, which cannot be
installed beside the FastMCP this project pins), where neither mcp-durable nor the benchmark
package is installed. So this file imports only FastMCP, and mcp-durable only for its own kinds.

KIND:
- `plain`: FastMCP with `noop(n)` (returns "ok").
- `durable`: the same, made durable in process by `mcp_durable.fastmcp.make_durable` on the
  journal STORE, `noop` keyed by its arguments (`key="derived"`): a new `n` is a miss, the same
  `n` a replay.
- `fastmcp-tasks`: FastMCP with fastmcp-tasks' `TasksExtension` on the Redis URL STORE (Docket),
  `noop` a task-required tool (`TaskConfig(mode="required")`): every call from a client that
  declares the tasks extension creates a task.
- `durable-tasks`: the `durable` server with `noop` declared `task=TaskConfig(mode="required")`:
  the FastMCP integration's durable MCP tasks (mcp_durable/fastmcp/tasks.py), the same 2026-07-28
  extension (`io.modelcontextprotocol/tasks`), one task per key.
- `server-tasks`: `DurableServer` on the journal STORE, `noop` a task-required durable tool
  (`task_support="required"`, keyed by its arguments): mcp-durable's tasks without FastMCP.

Over stdio by default; with `--http`, streamable HTTP on 127.0.0.1 on a port the kernel picks,
`PORT <n>` printed on stdout once listening.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Any

# Run by path, Python puts this folder first on sys.path, where `http.py` (case 5) would shadow
# the standard library's `http` module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

TOOL = "noop"


async def noop(n: int) -> str:
    """Does nothing: returns "ok"."""
    return "ok"


def build(kind: str, store: str | None) -> Any:
    """The server of `kind` (a FastMCP server, or a DurableServer for `durable-tasks`)."""
    if kind == "server-tasks":
        from mcp_durable import DurableServer, ToolPolicy

        server = DurableServer("bench-server-tasks", journal=store, log_level="WARNING")
        server.add_tool(noop, name=TOOL, durable=ToolPolicy(key="derived", task_support="required"))
        return server
    from fastmcp import FastMCP

    if kind == "fastmcp-tasks":
        import importlib

        from fastmcp.utilities.tasks import TaskConfig

        # Imported by name: fastmcp-tasks is installed only in its own environment.
        tasks_extension = importlib.import_module("fastmcp_tasks").TasksExtension
        app: Any = FastMCP("bench-fastmcp-tasks")
        app.add_extension(tasks_extension(url=store))
        app.tool(noop, name=TOOL, task=TaskConfig(mode="required"))
        return app
    if kind not in ("plain", "durable", "durable-tasks"):
        raise SystemExit(f"unknown kind {kind!r}")
    app = FastMCP(f"bench-fastmcp-{kind}")
    if kind == "durable-tasks":
        from fastmcp.utilities.tasks import TaskConfig

        app.tool(noop, name=TOOL, task=TaskConfig(mode="required"))
    else:
        app.tool(noop, name=TOOL)
    if kind != "plain":
        from mcp_durable import ToolPolicy
        from mcp_durable.fastmcp import make_durable

        make_durable(app, journal=store, policies={TOOL: ToolPolicy(key="derived")})
    return app


def serve_http(server: Any) -> None:
    import anyio
    import uvicorn

    http_app = server.http_app() if hasattr(server, "http_app") else server.streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(http_app, log_level="warning", lifespan="on", access_log=False)
    anyio.run(uvicorn.Server(config).serve, [sock])


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--http"]
    kind, store = args[0], (args[1] if len(args) > 1 else None)
    logging.basicConfig(level=logging.WARNING)
    server = build(kind, store)
    if "--http" in sys.argv:
        serve_http(server)
    elif hasattr(server, "http_app"):
        server.run(transport="stdio", show_banner=False, log_level="WARNING")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
