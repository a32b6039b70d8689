"""A result survives its server: call, SIGKILL the `mcp-durable serve` process, start a new one on
the same SQLite journal, repeat the call — it is replayed and the tool does not run again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable.demo.ledger import PaymentProvider
from tests.helpers import body_bytes, key_meta, meta_of, serve_http, stdio_params
from tests.server.servers.counting import Counter


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_refund_survives_a_sigkill_of_the_http_server_and_is_replayed_after_restart(
    mode: str, tmp_path: Path
) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    ledger = tmp_path / "ledger.db"
    env = {"PAYMENTS_LEDGER": str(ledger)}
    call: dict[str, Any] = {
        "name": "refund",
        "arguments": {"order_id": "O-9", "amount_cents": 4200},
        "meta": key_meta("r-9"),
    }

    async with serve_http("tools/payments.py", journal=journal, env=env) as first_server:
        async with Client(first_server.url, mode=mode) as client:
            before = await client.call_tool(**call)
        first_server.kill()
        assert first_server.proc.returncode == -9

    async with serve_http("tools/payments.py", journal=journal, env=env) as second_server:
        async with Client(second_server.url, mode=mode) as client:
            after = await client.call_tool(**call)
            by_derived_key = await client.call_tool("refund", {"order_id": "O-9", "amount_cents": 4200})

    provider = PaymentProvider(ledger)
    keys_asked = [request["idempotency_key"] for request in provider.requests()]
    assert keys_asked == ["r-9", "O-9"]  # r-9 once (before the kill), then the new key once
    assert not before.is_error
    assert body_bytes(after) == body_bytes(before)
    assert after.meta is not None and after.meta["mcp-durable/replayed"] is True
    assert meta_of(after)["mcp-durable/first-completed-at"] == meta_of(before)["mcp-durable/first-completed-at"]
    # Without a caller key the refund is keyed by order_id: a new key, so the restarted server runs it.
    assert by_derived_key.meta is not None and by_derived_key.meta["mcp-durable/key"] == "O-9"
    assert "mcp-durable/replayed" not in by_derived_key.meta


async def test_a_result_journaled_over_http_is_replayed_over_stdio_after_a_sigkill(tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path)}
    target = "tests/server/servers/counting.py:make_server"

    async with serve_http(target, journal=journal, env=env) as served:
        async with Client(served.url) as client:
            before = await client.call_tool("record", {"text": "t"}, meta=key_meta("x-1"))
        served.kill()

    async with Client(stdio_params(target, journal=journal, env=env), mode="legacy") as client:
        after = await client.call_tool("record", {"text": "t"}, meta=key_meta("x-1"))
    assert counter.count("record") == 1
    assert body_bytes(after) == body_bytes(before)
    assert after.meta is not None and after.meta["mcp-durable/replayed"] is True
