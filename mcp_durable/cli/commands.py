"""The `mcp-durable` command: `serve` a module's MCP server; `journal …` to inspect and operate.

Exit codes: 0 ok, 1 a `DurableError`, 2 a usage error. No traceback without `--debug`.

The command reads the environment (`MCP_DURABLE_JOURNAL`, `MCP_DURABLE_TOKENS`, …: see
mcp_durable/config.py): `main` turns the process default of `trust_env` on before anything is
loaded, so a served module's `DurableServer(...)` takes its settings from there (docs/cli.md),
and restores it on return (tests call `main` in their own process).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import config
from ..errors import ConfigError, DurableError
from ..journal import ENV_JOURNAL, create_journal, default_journal_url
from .serving import (
    INSPECTOR,
    add_serving_options,
    announce,
    freeze_startup_heap,
    run_uvicorn,
    serve_server,
    set_otel_up,
)

__all__ = ["INSPECTOR", "build_parser", "freeze_startup_heap", "load_target", "main", "serve_server"]


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


def _serve(args: argparse.Namespace) -> int:
    server = load_target(args.target)
    # The SDK's server constructor sets the root logger to INFO; --log-level is the process's.
    logging.getLogger().setLevel(args.log_level.upper())
    # After the module is imported, not before: a module that sets OpenTelemetry up itself keeps
    # its providers (`set_otel_up` then leaves them). The server follows the global providers
    # from whenever they are set.
    set_otel_up(args)
    from ..server.assembly import face_of

    if args.policies:
        server = _with_policies(server, args.policies, args.journal)
    face = face_of(server)
    if face is not None and args.journal and face.journal.url != args.journal:
        # Handed to the server explicitly (not through the environment): whatever journal the
        # module built its server with, every part of the engine (calls, leases, lifecycle)
        # runs on this one. Nothing is opened before the server starts, so the module's own
        # journal is never touched.
        face.engine.use_journal(create_journal(args.journal))
    return serve_server(server, args, args.target)


def _with_policies(server: Any, path: str, journal: str | None) -> Any:
    """`serve --policies`: a plain MCPServer made durable in process (`make_durable`)."""
    from ..policy_file import load_policies
    from ..server.assembly import face_of

    if face_of(server) is not None:
        raise ConfigError("--policies is for a plain MCPServer; a DurableServer declares its policies in code")
    from ..proxy import make_durable

    return make_durable(server, load_policies(path), journal=journal)


def _console(args: argparse.Namespace) -> int:
    from ..engine import LOCAL_PRINCIPAL
    from ..server.assembly import default_principal
    from ..server.auth import StaticTokenVerifier

    try:
        from ..console import JournalSource, standalone_app
    except ImportError as exc:
        raise ConfigError("the console needs Jinja2: pip install 'mcp-durable[console]'") from exc
    tokens = config.tokens()  # the environment is trusted here: `main` turned it on
    verifier = StaticTokenVerifier(tokens) if tokens else None
    source = JournalSource(
        args.journal or default_journal_url(), verifier=verifier, admins=config.admins(), principal_of=default_principal
    )
    app = standalone_app(source, args.host)
    signin = "a bearer token of $MCP_DURABLE_TOKENS" if tokens else f"none configured: everyone is {LOCAL_PRINCIPAL!r}"
    announce(
        f"mcp-durable: console at http://{args.host}:{args.port}/console/",
        f"  journal: {source.journal_url}",
        f"  sign in: {signin}; admins: {', '.join(sorted(source.admins)) or 'none ($MCP_DURABLE_ADMINS)'}",
    )
    return run_uvicorn(app, args)


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
    add_serving_options(serve)
    serve.add_argument(
        "--policies",
        metavar="FILE",
        help="make a plain MCPServer durable in process with this policies file (docs/proxy.md)",
    )
    serve.set_defaults(handler=_serve)

    from .proxy import add_proxy_command

    add_proxy_command(commands)

    console = commands.add_parser("console", help="the operator console on its own, beside a running server")
    console.add_argument("--journal", help=f"journal URL (default: ${ENV_JOURNAL} or the embedded journal)")
    console.add_argument("--host", default="127.0.0.1")
    console.add_argument("--port", type=int, default=8001)
    console.add_argument("--log-level", default="warning")
    console.set_defaults(handler=_console)

    demo = commands.add_parser("demo", help="run a demonstration").add_subparsers(dest="demo", required=True)
    crash = demo.add_parser("crash", help="kill -9 a refund server mid-batch: plain MCPServer vs mcp-durable")
    crash.add_argument("--trials", type=int, default=50)
    crash.add_argument("--seed", type=int, default=7)
    crash.add_argument("--journal", choices=("sqlite", "file"), default="sqlite")
    crash.add_argument("--workdir", help="keep ledgers and journals here (default: a temporary folder)")
    crash.set_defaults(handler=_demo_crash)

    try:
        from .journal import add_journal_commands
    except ImportError:  # pragma: no cover - the operator CLI lands with the resources issue
        pass
    else:
        add_journal_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # Every command reads its settings from the environment, as documented (docs/cli.md):
        # turned on before the target module is loaded, so its DurableServer(...) does too.
        with config.environment_used():
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
