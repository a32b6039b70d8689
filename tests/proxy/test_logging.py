"""Logging through the proxy: the `logging` capability is declared (the upstream's log messages are
forwarded), `logging/setLevel` is answered and applied, and `--log-level` governs the proxy's own
log, the HTTP client's per-request lines included (shown only at debug).

Real clients; the upstream is the plain Python upstream (stdio, or HTTP for the CLI), whose
`chatty` tool logs at debug, info, warning and error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client
from mcp_types import LoggingMessageNotificationParams

from mcp_durable.proxy import ProxyServer
from tests.helpers import key_meta, serve_cli_http
from tests.proxy.upstreams import plain_http_upstream, plain_stdio_spec, proxy_cli, upstream_env

WIDE = {"COLUMNS": "2000"}  # log lines unwrapped


async def test_the_proxy_declares_logging_and_applies_set_level_to_forwarded_messages(tmp_path: Path) -> None:
    # The 2025-11-25 era: 2026-07-28 has no `logging/setLevel` (and no server-sent log messages
    # outside a request's own stream).
    proxy = ProxyServer(plain_stdio_spec(upstream_env(tmp_path)), journal=f"sqlite:///{tmp_path}/proxy.db")
    heard: list[LoggingMessageNotificationParams] = []

    async def hear(params: LoggingMessageNotificationParams) -> None:
        heard.append(params)

    async with Client(proxy, mode="legacy", logging_callback=hear) as client:
        assert client.server_capabilities.logging is not None  # before the fix: not declared
        await client.set_logging_level("warning")  # before the fix: -32601 Method not found
        done = await client.call_tool("chatty", {})
    assert not done.is_error, done
    assert [(params.level, params.data) for params in heard] == [
        ("warning", "chatty warning"),
        ("error", "chatty error"),
    ]


async def _served_stderr(tmp_path: Path, *extra: str) -> str:
    env = upstream_env(tmp_path)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], f"sqlite:///{tmp_path}/proxy.db", *extra)
        async with serve_cli_http(args, env={**env, **WIDE}) as proxy:
            async with Client(proxy.url, mode="legacy") as client:
                done = await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
                await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
            assert not done.is_error, done
            return proxy.stderr()


def _log_lines(stderr: str, level: str) -> list[str]:
    return [line for line in stderr.splitlines() if f" {level} " in f" {line} "]


async def test_the_log_level_is_the_one_given_and_upstream_requests_are_logged_only_at_debug(tmp_path: Path) -> None:
    quiet: Any = await _served_stderr(tmp_path / "default")
    # Before the fix: the SDK's server constructor reset the root logger to INFO after
    # --log-level (default warning) was applied, and every request to the upstream was logged.
    assert "HTTP Request:" not in quiet, quiet
    assert _log_lines(quiet, "INFO") == [], quiet
    info = await _served_stderr(tmp_path / "info", "--log-level", "info")
    assert "HTTP Request:" not in info, info  # the HTTP client's lines are debug detail
    debug = await _served_stderr(tmp_path / "debug", "--log-level", "debug")
    assert "HTTP Request: POST http://127.0.0.1:" in debug
    assert _log_lines(debug, "DEBUG"), debug
