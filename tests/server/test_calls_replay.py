"""A durable tool runs once per key and every repeat replays its first result, on every transport.

Through a real client in both protocol eras: in-memory, stdio (`mcp-durable serve` subprocess) and
streamable HTTP (`mcp-durable serve --transport http` subprocess). Executions are counted outside
the server (a counter file, the payment provider's ledger), never by the server itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_durable.demo.ledger import PaymentProvider
from tests.helpers import TRANSPORTS, body_bytes, connect, key_meta, meta_of
from tests.server.conftest import CountingSetup
from tests.server.servers.counting import Counter

REPLAYED = "mcp-durable/replayed"
KEY = "mcp-durable/key"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tool_called_five_times_with_one_key_runs_once_and_repeats_replay_the_first_result(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        results = [await client.call_tool("record", {"text": "hello"}, meta=key_meta("order-7")) for _ in range(5)]
    assert counter.count("record") == 1
    first, repeats = results[0], results[1:]
    assert not first.is_error, first
    assert first.structured_content is not None and first.structured_content["key"] == "order-7"
    for repeat in repeats:
        assert body_bytes(repeat) == body_bytes(first)
        assert repeat.meta is not None and repeat.meta[REPLAYED] is True
        assert meta_of(repeat)["mcp-durable/first-completed-at"] == meta_of(first)["mcp-durable/first-completed-at"]
    assert first.meta is not None and REPLAYED not in first.meta
    assert all(result.meta is not None and result.meta[KEY] == "order-7" for result in results)


@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto", "http-auto"])
async def test_a_derived_key_is_returned_to_the_client_and_replays_identical_arguments(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        first = await client.call_tool("record", {"text": "same"})
        second = await client.call_tool("record", {"text": "same"})
        other = await client.call_tool("record", {"text": "different"})
    assert counter.count("record") == 2  # "same" once, "different" once
    assert first.meta is not None and first.meta[KEY].startswith("sha256:")
    assert second.meta is not None and second.meta[KEY] == first.meta[KEY] and second.meta[REPLAYED] is True
    assert body_bytes(second) == body_bytes(first)
    assert other.meta is not None and other.meta[KEY] != first.meta[KEY] and REPLAYED not in other.meta


@pytest.mark.parametrize("transport", ["stdio-legacy", "http-auto"])
async def test_the_payments_refund_moves_money_once_for_five_calls_with_one_key(transport: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    setup: dict[str, Any] = {
        "target": "tools/payments.py",
        "journal": f"sqlite:///{tmp_path}/journal.db",
        "env": {"PAYMENTS_LEDGER": str(ledger)},
    }
    async with connect(transport, **setup) as client:
        results = [
            await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 1250}, meta=key_meta("refund-O-1"))
            for _ in range(5)
        ]
    provider = PaymentProvider(ledger)
    assert len(provider.requests()) == 1  # the provider was asked once: the tool ran once
    assert [e["amount_cents"] for e in provider.effects(op="refund")] == [1250]
    assert all(body_bytes(result) == body_bytes(results[0]) for result in results)
    assert [bool(result.meta and result.meta.get(REPLAYED)) for result in results] == [False, True, True, True, True]
    assert results[0].structured_content is not None
    assert results[0].structured_content["id"] == provider.effects()[0]["id"]


async def test_repeats_answered_from_the_replay_cache_share_one_answer_and_a_rerun_is_answered_anew(
    tmp_path: Path,
) -> None:
    """The one replay cache (the engine's) keeps the face's answer with the record: repeats get the
    very same answer, made once; an operator's re-run drops it, and the next repeat gets the new
    result, not the cached one."""
    from mcp_types import CallToolResult

    from mcp_durable import DurableServer, ToolPolicy
    from mcp_durable.engine import LOCAL_PRINCIPAL
    from mcp_durable.journal import CallIdentity

    server = DurableServer("replays", journal=f"file://{tmp_path / 'journal'}")
    runs: list[int] = []

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    def charge(order_id: str) -> str:
        runs.append(1)
        return f"charge {len(runs)} of {order_id}"

    try:
        first = await server.call_tool("charge", {"order_id": "o-1"})
        second = await server.call_tool("charge", {"order_id": "o-1"})
        third = await server.call_tool("charge", {"order_id": "o-1"})
        assert len(runs) == 1 and isinstance(first, CallToolResult) and isinstance(second, CallToolResult)
        assert second is third, "a repeat's answer was made again instead of kept with the record"
        identity = CallIdentity(LOCAL_PRINCIPAL, "charge", meta_of(second)[KEY])
        await server.engine.rerun(identity)
        rerun = await server.call_tool("charge", {"order_id": "o-1"})
        repeat = await server.call_tool("charge", {"order_id": "o-1"})
        assert isinstance(rerun, CallToolResult) and isinstance(repeat, CallToolResult)
    finally:
        await server.aclose()
    assert len(runs) == 2
    assert "charge 2 of o-1" in body_bytes(repeat).decode()
    assert repeat is not third and meta_of(repeat)[REPLAYED] is True
    assert body_bytes(rerun) == body_bytes(repeat)
