"""`mcp-durable proxy`: serve an upstream MCP server (a command or a URL) with durable tools.

    mcp-durable proxy --upstream-command "npx -y @modelcontextprotocol/server-memory" --journal sqlite:///p.db
    mcp-durable proxy --upstream-url http://127.0.0.1:9000/mcp --upstream-token "$TOKEN" --transport http
    mcp-durable proxy --upstream-command "…" --print-config > policies.toml

Reads the environment here (the journal, the upstream token, a stdio upstream's environment),
with `trust_env` on as for every command (`cli.main`); `ProxyServer` reads the tokens, admins and
replica name the same way, as `serve`'s server does. The upstream URL is shown masked everywhere
(`UpstreamSpec.describe`): the banner, messages, log lines.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import Any

from .. import config
from ..errors import ConfigError, UpstreamUnavailableError
from ..policy import DEFAULT_TIMEOUT

#: The default of `--upstream-timeout` (`UpstreamSpec.call_timeout`; no SDK import here).
DEFAULT_CALL_TIMEOUT = DEFAULT_TIMEOUT
#: The HTTP client's loggers (`proxy.upstream.HTTP_CLIENT_LOGGERS`, without importing the SDK).
HTTP_CLIENT_LOGGERS = ("httpx2", "httpx", "mcp.client.streamable_http")

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
    proxy.add_argument(
        "--upstream-timeout",
        metavar="SECONDS",
        type=_seconds,
        default=DEFAULT_CALL_TIMEOUT,
        help="how long a pass-through tool call waits for the upstream's answer, or 'none' "
        f"(default: {DEFAULT_CALL_TIMEOUT:g}; a durable tool's policy has its own timeout)",
    )
    proxy.add_argument("--name", help="the proxy's server name (default: mcp-durable-proxy)")
    add_serving_options(proxy)
    proxy.set_defaults(handler=_proxy)


def _seconds(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected positive seconds or 'none', not {text!r}")
    return value


def _proxy(args: argparse.Namespace) -> int:
    from ..policy_file import Policies, load_policies
    from .serving import serve_server

    _set_log_levels(args)
    policies = load_policies(args.policies) if args.policies else Policies()
    spec = _spec(args)
    if args.print_config:
        import anyio

        sys.stdout.write(anyio.run(_render_config, spec, policies))
        return 0
    from ..proxy.server import ProxyServer
    from .serving import set_otel_up

    set_otel_up(args)
    journal = args.journal or config.journal_url()
    server = ProxyServer(spec, policies, name=args.name, journal=journal)
    _set_log_levels(args)  # again: the SDK's server constructor sets the root logger to INFO
    return serve_server(server, args, f"the upstream {spec.describe()}")


def _set_log_levels(args: argparse.Namespace) -> None:
    """`--log-level` for the process; the HTTP client's per-request lines (INFO, one for every
    request to an HTTP upstream) only with `--debug` or `--log-level debug`."""
    root = logging.getLogger()
    root.setLevel(args.log_level.upper())
    verbose = args.debug or root.level <= logging.DEBUG
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else max(logging.WARNING, root.level))
    if args.print_config and not verbose:
        # The supervisor's warning would say again what the one error line says.
        logging.getLogger("mcp_durable.proxy").setLevel(logging.ERROR)


def _spec(args: argparse.Namespace) -> Any:
    from ..proxy.upstream import UpstreamSpec, child_environment

    token = args.upstream_token or config.upstream_token()
    timeout = args.upstream_timeout
    if args.upstream_url:
        return UpstreamSpec(url=args.upstream_url, token=token, call_timeout=timeout)
    if args.upstream_token:
        raise ConfigError("--upstream-token goes with --upstream-url")
    env = child_environment(config.environment())
    return UpstreamSpec.from_command_line(args.upstream_command, env=env, cwd=os.getcwd(), call_timeout=timeout)


async def _render_config(spec: Any, policies: Any) -> str:
    import anyio

    from ..policy_file import render_policies
    from ..proxy.router import ALL_CAPABILITIES
    from ..proxy.upstream import Upstream

    upstream = Upstream(spec)
    # Every capability declared: the upstream lists the tools it lists only to a client that can
    # be asked (sampling, elicitation) too, so the policies can name them.
    session = upstream.session(ALL_CAPABILITIES)
    unavailable: UpstreamUnavailableError | None = None
    async with anyio.create_task_group() as tg:
        await tg.start(upstream.supervise)
        try:
            await session.client()
        except UpstreamUnavailableError as exc:
            unavailable = exc  # raised below, outside the task group: one line, not an exception group
        finally:
            upstream.stop()
    if unavailable is not None:
        raise ConfigError(f"upstream {spec.describe()} cannot be reached: {session.failure}") from unavailable
    tools = [(tool.name, _hints(tool), tool.description) for tool in session.tools.values()]
    unknown = policies.unknown(session.tools)
    if unknown:
        print(f"mcp-durable: the policies name tools the upstream does not have: {', '.join(unknown)}", file=sys.stderr)
    text: str = render_policies(tools, policies)
    return text


def _hints(tool: Any) -> dict[str, Any] | None:
    if tool.annotations is None:
        return None
    hints: dict[str, Any] = tool.annotations.model_dump(by_alias=True, exclude_none=True)
    return hints
