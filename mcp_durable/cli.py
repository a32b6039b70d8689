"""The `mcp-durable` command: `serve` a module's MCP server; `journal …` to inspect and operate.

Exit codes: 0 ok, 1 a `DurableError`, 2 a usage error. No traceback without `--debug`.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import ConfigError, DurableError
from .journal import ENV_JOURNAL, create_journal, display_url

#: The MCP Inspector the serve banner names: pinned, so the command works as printed (an
#: unpinned `npx` resolves whatever is newest, whose CLI may differ). The docs pin the same one.
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def load_target(target: str) -> Any:
    """Import TARGET (`module`, `module:attr`, `path/to/file.py[:attr]`) and return its MCP server."""
    spec, _, attr = target.partition(":")
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec).resolve()
        if not path.exists():
            raise ConfigError(f"no such file: {spec}")
        module_name = f"_mcp_durable_target_{path.stem}"
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if file_spec is None or file_spec.loader is None:
            raise ConfigError(f"cannot import {spec}")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.parent))
        file_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(spec)
    return _find_server(module, attr, target)


def _find_server(module: ModuleType, attr: str, target: str) -> Any:
    from mcp.server.mcpserver import MCPServer

    if attr:
        try:
            server = getattr(module, attr)
        except AttributeError:
            raise ConfigError(f"{target}: module has no attribute {attr!r}") from None
        if callable(server) and not isinstance(server, MCPServer):
            server = server()
        return server
    for name in ("server", "mcp", "app"):
        candidate = getattr(module, name, None)
        if isinstance(candidate, MCPServer):
            return candidate
    found = [value for value in vars(module).values() if isinstance(value, MCPServer)]
    if len(found) == 1:
        return found[0]
    raise ConfigError(f"{target}: found {len(found)} MCP servers; name one as {target}:ATTR")


def freeze_startup_heap() -> int:
    """Move every object alive now into the collector's permanent generation; returns how many.

    For `serve`, once the server is built: the SDK, pydantic's schemas and the tools are about
    90,000 objects the cyclic collector tracks and would walk in every full collection, though
    none of them is ever garbage. A durable call waits for its fsync with its request state
    alive, so full collections come more often than on a plain server (docs/performance.md);
    frozen, they skip the start-up heap. Measured (docs/performance.md): the collector's share
    of a 64-caller in-process run fell from 22% to 9-11% (durable misses +10-20%); over HTTP at
    16 clients the gain is a few percent. Frozen objects are still freed by reference counting;
    only a cycle among them is kept.
    A process setting, so the library never does this: `serve` owns its process.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _serve(args: argparse.Namespace) -> int:
    server = load_target(args.target)
    # The SDK's server constructor sets the root logger to INFO; --log-level is the process's.
    logging.getLogger().setLevel(args.log_level.upper())
    from .server import DurableServer

    if isinstance(server, DurableServer) and args.journal:
        # Handed to the server explicitly (not through the environment): whatever journal the
        # module built its server with, every part of the engine (calls, leases, lifecycle)
        # runs on this one. Nothing is opened before the server starts, so the module's own
        # journal is never touched.
        server.use_journal(create_journal(args.journal))
    journal = display_url(server.journal.url) if isinstance(server, DurableServer) else "none (plain MCPServer)"
    if args.transport == "stdio":
        frozen = "" if args.no_gc_freeze else f"; {freeze_startup_heap():,} start-up objects frozen"
        print(f"mcp-durable: serving {args.target} over stdio; journal {journal}{frozen}", file=sys.stderr)
        server.run("stdio")
        return 0
    import anyio
    import uvicorn

    from .server.auth import point_auth_at

    base_url = f"http://{args.host}:{args.port}"
    server.settings.auth = point_auth_at(server.settings.auth, base_url)  # 401s name this port
    # host= lets the SDK choose DNS-rebinding protection for it: on for loopback, as it should be.
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=args.stateless, host=args.host)
    url = f"{base_url}/mcp"
    heap = "collected as usual (--no-gc-freeze)" if args.no_gc_freeze else (
        f"{freeze_startup_heap():,} start-up objects frozen (gc.freeze; --no-gc-freeze to keep collecting them)")
    print(
        f"mcp-durable: serving {args.target} over streamable HTTP at {url}\n"
        f"  journal: {journal}\n"
        f"  heap:    {heap}\n"
        f"  connect: any MCP client to {url}; send the key in _meta['mcp-durable/idempotency-key']\n"
        f"  e.g.:    npx -y {INSPECTOR} --cli {url} --transport http --method tools/list",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    anyio.run(uvicorn.Server(config).serve)
    return 0


def _demo_crash(args: argparse.Namespace) -> int:
    # The demo lives in the repository's examples/ (it serves tools/payments.py by path).
    script = Path(__file__).resolve().parents[1] / "examples" / "crash_demo.py"
    if not script.exists():
        raise ConfigError(f"the crash demo needs a source checkout: {script} not found")
    argv = ["--trials", str(args.trials), "--seed", str(args.seed), "--journal", args.journal]
    if args.workdir:
        argv += ["--workdir", args.workdir]
    return int(load_module(script).main(argv))


def load_module(path: Path) -> ModuleType:
    """Import a Python file as a module (for the demo)."""
    spec = importlib.util.spec_from_file_location(f"_mcp_durable_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-durable", description="An MCP server whose tools run once per key.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve a module's MCP server")
    serve.add_argument("target", help="module, module:attr, or path/to/file.py[:attr]")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--journal", help=f"journal URL (default: ${ENV_JOURNAL} or the embedded journal)")
    serve.add_argument("--stateless", action="store_true", help="stateless streamable HTTP (no sessions)")
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--no-gc-freeze", action="store_true",
                       help="keep the start-up heap in the garbage collector's generations (see docs/cli.md)")
    serve.set_defaults(handler=_serve)

    demo = commands.add_parser("demo", help="run a demonstration").add_subparsers(dest="demo", required=True)
    crash = demo.add_parser("crash", help="kill -9 a refund server mid-batch: plain MCPServer vs mcp-durable")
    crash.add_argument("--trials", type=int, default=50)
    crash.add_argument("--seed", type=int, default=7)
    crash.add_argument("--journal", choices=("sqlite", "file"), default="sqlite")
    crash.add_argument("--workdir", help="keep ledgers and journals here (default: a temporary folder)")
    crash.set_defaults(handler=_demo_crash)

    try:
        from .journal_cli import add_journal_commands
    except ImportError:  # pragma: no cover - the operator CLI lands with the resources issue
        pass
    else:
        add_journal_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except DurableError as exc:
        if args.debug:
            raise
        print(f"mcp-durable: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
