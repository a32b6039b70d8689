"""SIGKILL a replica inside a call: another replica takes the call over by the in-doubt policy.

Two `mcp-durable serve` replicas share one Postgres journal. Replica A runs a slow tool that
makes its effect (a refund at a provider that honours keys) and then lingers; the test kills A
with SIGKILL inside that window, and sends the same key to replica B. B sees a PENDING record
whose lease (1 s) is no longer renewed, waits for it to expire, and applies the tool's policy:

- `retry`: B runs the tool again with the same key; the provider deduplicates it, so there is
  one effect, two requests (the second `deduplicated`), and the caller gets the first effect.
- `refuse`: B answers `in_doubt` and does not run the tool (one request only).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_durable.demo.ledger import PaymentProvider
from tests.crash.replicas import serve_http_together
from tests.crash.test_replicas_concurrency import TARGET
from tests.helpers import key_meta, meta_of
from tests.journal_kept import kept_disagreements_at

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("policy", ["retry", "refuse"])
async def test_a_call_on_a_killed_replica_is_taken_over_by_another_by_its_in_doubt_policy(
    tmp_path: Path, policy: str, replicas_journal: str
) -> None:
    journal = replicas_journal
    tool = "slow_refund" if policy == "retry" else "slow_refund_refused"
    ledger = PaymentProvider(tmp_path / "ledger.db")
    env = {"PAYMENTS_LEDGER": str(ledger.path)}
    key = "order-7-refund"
    arguments = {"order_id": "O-7", "amount_cents": 1250}

    # A lingers in the window long enough to be killed there; B's run (under `retry`) need not linger.
    async with serve_http_together(
        (TARGET, journal, {**env, "SLOW_TOOL_SECONDS": "3"}), (TARGET, journal, {**env, "SLOW_TOOL_SECONDS": "0"})
    ) as (a, b):

        async def call_a() -> None:
            async with Client(a.url) as client:
                await client.call_tool(tool, arguments, meta=key_meta(key))

        async with anyio.create_task_group() as tg:

            async def doomed() -> None:
                try:
                    await call_a()
                except Exception:  # noqa: BLE001 - replica A dies under this call
                    pass

            tg.start_soon(doomed)
            with anyio.fail_after(30):
                while ledger.find(key) is None:  # A made the effect and is now in the window
                    await anyio.sleep(0.02)
            a.kill()
            tg.cancel_scope.cancel()
        first = ledger.find(key)
        assert first is not None

        with anyio.fail_after(60):
            async with Client(b.url) as client:
                result = await client.call_tool(tool, arguments, meta=key_meta(key))

    requests = [r for r in ledger.requests() if r["idempotency_key"] == key]
    assert [e["id"] for e in ledger.effects()] == [first.id]  # never a second refund
    if policy == "retry":
        assert not result.is_error, result
        assert result.structured_content is not None and result.structured_content["id"] == first.id
        assert [r["outcome"] for r in requests] == ["applied", "deduplicated"]  # B really ran it again
    else:
        assert result.is_error and result.structured_content is not None
        assert meta_of(result)["mcp-durable/error"]["error"] == "in_doubt"
        assert [r["outcome"] for r in requests] == ["applied"]  # B did not run it
    # A died inside its transaction's window: what the replicas keep beside the records (counts
    # by session, the open index) holds no trace of a half-written change.
    assert await kept_disagreements_at(journal) == []
