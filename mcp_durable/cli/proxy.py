"""`mcp-durable proxy`: serve an upstream MCP server (a command or a URL) with durable tools.

    mcp-durable proxy --upstream-command "npx -y @modelcontextprotocol/server-memory" --journal sqlite:///p.db
    mcp-durable proxy --upstream-url http://127.0.0.1:9000/mcp --upstream-token "$TOKEN" --transport http
    mcp-durable proxy --upstream-command "…" --print-config > policies.toml

Reads the environment here (the journal, the upstream token, a stdio upstream's environment),
with `trust_env` on as for every command (`cli.main`); `ProxyServer` reads the tokens, admins and
replica name the same way, as `serve`'s server does.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .. import config
from ..errors import ConfigError

#: The upstream's bearer token, when not given by --upstream-token (which shows in `ps`).
ENV_UPSTREAM_TOKEN = config.UPSTREAM_TOKEN


def add_proxy_command(commands: Any) -> None:
    from .serving import add_serving_options

    proxy = commands.add_parser(
        "proxy",
        help="serve another MCP server (a command or a URL) with durable tools",
        description="Durability for a server you did not write: see docs/proxy.md.",
    )
    upstream = proxy.add_mutually_exclusive_group(required=True)
    upstream.add_argument(
        "--upstream-command",
        metavar="CMD",
        help='the upstream as a command speaking stdio, one shell-quoted string ("npx -y …")',
    )
    upstream.add_argument("--upstream-url", metavar="URL", help="the upstream's streamable HTTP endpoint")
    proxy.add_argument(
        "--upstream-token", metavar="TOKEN", help=f"bearer token for --upstream-url (default: ${ENV_UPSTREAM_TOKEN})"
    )
    proxy.add_argument("--policies", metavar="FILE", help="per-tool policies (TOML; see --print-config)")
    proxy.add_argument(
        "--print-config",
        action="store_true",
        help="print the policies the proxy would use for this upstream, as TOML, and exit",
    )
    proxy.add_argument("--name", help="the proxy's server name (default: mcp-durable-proxy)")
    add_serving_options(proxy)
    proxy.set_defaults(handler=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    from ..policy_file import Policies, load_policies
    from .serving import serve_server

    logging.getLogger().setLevel(args.log_level.upper())
    policies = load_policies(args.policies) if args.policies else Policies()
    spec = _spec(args)
    if args.print_config:
        import anyio

        sys.stdout.write(anyio.run(_render_config, spec, policies))
        return 0
    from ..proxy.server import ProxyServer

    journal = args.journal or config.journal_url()
    server = ProxyServer(spec, policies, name=args.name, journal=journal)
    return serve_server(server, args, f"the upstream {spec.describe()}")


def _spec(args: argparse.Namespace) -> Any:
    from ..proxy.upstream import UpstreamSpec, child_environment

    token = args.upstream_token or config.upstream_token()
    if args.upstream_url:
        return UpstreamSpec(url=args.upstream_url, token=token)
    if args.upstream_token:
        raise ConfigError("--upstream-token goes with --upstream-url")
    env = child_environment(config.environment())
    return UpstreamSpec.from_command_line(args.upstream_command, env=env, cwd=os.getcwd())


async def _render_config(spec: Any, policies: Any) -> str:
    import anyio

    from ..policy_file import render_policies
    from ..proxy.router import Router
    from ..proxy.upstream import Upstream

    upstream = Upstream(spec, Router())
    async with anyio.create_task_group() as tg:
        await tg.start(upstream.supervise)
        try:
            await upstream.client()
        finally:
            upstream.stop()
    tools = [(tool.name, _hints(tool), tool.description) for tool in upstream.tools.values()]
    unknown = policies.unknown(upstream.tools)
    if unknown:
        print(f"mcp-durable: the policies name tools the upstream does not have: {', '.join(unknown)}", file=sys.stderr)
    text: str = render_policies(tools, policies)
    return text


def _hints(tool: Any) -> dict[str, Any] | None:
    if tool.annotations is None:
        return None
    hints: dict[str, Any] = tool.annotations.model_dump(by_alias=True, exclude_none=True)
    return hints
