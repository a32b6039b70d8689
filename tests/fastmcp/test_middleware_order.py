"""At start-up the integration warns about FastMCP middleware that would undo a durable tool's
guarantee, saying what and the safe order: `ResponseCachingMiddleware` caching a durable tool's
calls (in either order), `RetryMiddleware` after the durable middleware. The safe set-ups start
without a warning, and the unsafe one shows why it warns: a new key answered from the cache.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.fastmcp.servers import FastMCP, Shop, connected, make_durable, shop_app
from tests.helpers import meta_of

LOGGER = "mcp_durable.fastmcp.middleware"
REFUND = {"order_id": "O-9", "amount_cents": 900}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER and record.levelname == "WARNING"]


async def _start(app: FastMCP) -> None:
    async with connected("fastmcp", app):
        pass


@pytest.mark.parametrize("before", [True, False], ids=["caching-first", "caching-last"])
async def test_response_caching_of_durable_tools_is_warned_about_in_either_order(
    before: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastmcp.server.middleware.caching import ResponseCachingMiddleware

    shop = Shop(tmp_path)
    app = shop_app(shop, name="cached")
    if before:
        app.add_middleware(ResponseCachingMiddleware())
        make_durable(app, journal="memory://", policies=shop.policies)
    else:
        make_durable(app, journal="memory://", policies=shop.policies)
        app.add_middleware(ResponseCachingMiddleware())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        async with connected("fastmcp", app) as caller:
            first = await caller.call("refund", REFUND, key="first-key")
            second = await caller.call("refund", REFUND, key="second-key")
    (warning,) = _warnings(caplog)
    assert warning.startswith("cached: ResponseCachingMiddleware caches tools/call of the durable tools")
    assert "refund, send_mail" in warning and "order_status" not in warning
    assert ("before the durable middleware" in warning) is before
    assert "call_tool_settings={'excluded_tools': ['refund', 'send_mail']}" in warning
    # What the warning is about: the second key's refund never happened.
    assert len(shop.ledger.requests()) == 1
    assert second.structured_content == first.structured_content
    if before:
        assert meta_of(second)["mcp-durable/key"] == "first-key"  # the old answer, old key and all


async def test_caching_that_leaves_the_durable_tools_out_starts_without_a_warning_and_runs_each_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastmcp.server.middleware.caching import ResponseCachingMiddleware

    shop = Shop(tmp_path)
    app = shop_app(shop, name="cached")
    app.add_middleware(ResponseCachingMiddleware(call_tool_settings={"excluded_tools": ["refund", "send_mail"]}))
    make_durable(app, journal="memory://", policies=shop.policies)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        async with connected("fastmcp", app) as caller:
            await caller.call("refund", REFUND, key="first-key")
            second = await caller.call("refund", REFUND, key="second-key")
    assert _warnings(caplog) == []
    assert len(shop.ledger.requests()) == 2 and meta_of(second)["mcp-durable/key"] == "second-key"


async def test_retry_after_the_durable_middleware_is_warned_about_and_retry_before_it_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fastmcp.server.middleware.error_handling import RetryMiddleware

    shop = Shop(tmp_path)
    unsafe = shop_app(shop, name="retried")
    make_durable(unsafe, journal="memory://", policies=shop.policies)
    unsafe.add_middleware(RetryMiddleware())
    safe = shop_app(shop, name="retried")
    safe.add_middleware(RetryMiddleware())
    make_durable(safe, journal="memory://", policies=shop.policies)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await _start(unsafe)
        (warning,) = _warnings(caplog)
        caplog.clear()
        await _start(safe)
        assert _warnings(caplog) == []
    assert warning.startswith("retried: RetryMiddleware is after the durable middleware")
    assert "refund, send_mail" in warning and "add RetryMiddleware before make_durable(...)" in warning
