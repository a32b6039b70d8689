"""Credentials inside `--upstream-url` (`user:password@`, `?api_key=`, `?token=`) are never shown:
not in a client's `upstream_unavailable` answer, not in the banner or the log lines on stderr,
the HTTP client's per-request lines included (`--log-level debug`).

The proxy is the real console script serving streamable HTTP (its stderr is searched whole); the
upstream is the plain Python upstream over HTTP, or nothing (a free port).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from mcp_durable.journal.masked_urls import display_url
from tests.helpers import first_text, free_port, key_meta, meta_of, serve_cli_http
from tests.proxy.upstreams import plain_http_upstream, proxy_cli, upstream_env

PASSWORD = "PW-s3cret-in-userinfo"
API_KEY = "KEY-s3cret-in-query"
TOKEN = "TOK-s3cret-in-query"
SECRETS = (PASSWORD, API_KEY, TOKEN)
#: Wide enough that the log handler does not wrap a line (and split a secret across two).
WIDE = {"COLUMNS": "2000"}


def _with_credentials(url: str) -> str:
    """`http://127.0.0.1:P/mcp` with a password in its user info and two secret parameters."""
    return url.replace("http://", f"http://alice:{PASSWORD}@", 1) + f"?api_key={API_KEY}&token={TOKEN}&v=1"


def _assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} shown in {where}:\n{text}"


def test_the_masking_function_masks_an_upstream_urls_whole_user_info_and_secret_parameters() -> None:
    url = _with_credentials("http://127.0.0.1:9/mcp")
    assert display_url(url, user_info=True) == "http://***@127.0.0.1:9/mcp?api_key=***&token=***&v=1"
    assert display_url("https://ghp_abc@github.example/mcp", user_info=True) == "https://***@github.example/mcp"
    assert (
        display_url("https://h/mcp?key=k&x-api-key=a&sig=s&sslkey=/p")
        == "https://h/mcp?key=***&x-api-key=***&sig=***&sslkey=/p"
    )


async def test_an_unreachable_upstream_url_is_named_masked_to_clients_and_on_stderr(tmp_path: Path) -> None:
    upstream = _with_credentials(f"http://127.0.0.1:{free_port()}/mcp")  # nothing listens there
    args = proxy_cli(["--upstream-url", upstream], f"sqlite:///{tmp_path}/proxy.db")
    async with serve_cli_http(args, env=WIDE) as proxy:
        async with Client(proxy.url, mode="legacy") as client:
            refused = await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
            with pytest.raises(Exception) as listing:  # noqa: B017 - the SDK's MCPError, whatever its class
                await client.list_tools()
        stderr = proxy.stderr()
    error = meta_of(refused)["mcp-durable/error"]
    assert error["error"] == "upstream_unavailable"
    shown = f"{first_text(refused)}\n{error['message']}\n{listing.value}"
    _assert_no_secret(shown, "the answers")
    assert "http://***@127.0.0.1:" in error["message"] and "api_key=***" in error["message"]
    _assert_no_secret(stderr, "stderr")
    assert "mcp-durable: serving the upstream URL http://***@127.0.0.1:" in stderr  # the banner, masked


async def test_the_http_clients_request_lines_show_the_upstream_url_masked(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", _with_credentials(upstream.url)], f"sqlite:///{tmp_path}/p.db")
        async with serve_cli_http([*args, "--log-level", "debug"], env={**env, **WIDE}) as proxy:
            async with Client(proxy.url, mode="legacy") as client:
                done = await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
            stderr = proxy.stderr()
    assert not done.is_error, done
    assert "HTTP Request: POST http://***@127.0.0.1:" in stderr  # logged at debug, masked
    _assert_no_secret(stderr, "stderr")
