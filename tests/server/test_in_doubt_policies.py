"""In-doubt calls through a real MCP client: retry, reconcile, refuse, parking and operator resolution.

A crashed server leaves a PENDING record owned by an instance that no longer exists; these
tests plant exactly that record in a real SQLite journal (the crash tests in tests/crash/ make
it with a real SIGKILL) and then call the tool with the same key through `Client(server)`.
The downstream systems (ledger, outbox) are real files read by the test.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client

from mcp_durable import CallIdentity, CallRecord, CallState, Journal, ToolPolicy, create_journal, keys
from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.outbox import Outbox
from mcp_durable.errors import OperatorError
from mcp_durable.journal import CallQuery
from mcp_durable.server import DurableServer
from tests.crash.crash_servers.danger import make_server
from tests.crash.crash_servers.hooks import Counter
from tests.helpers import key_meta, meta_of

MODES = ["legacy", "auto"]
MAIL = {"to": "a@example.com", "subject": "Refund", "body": "done"}
PAY = {"order_id": "O-1", "amount_cents": 250}


def _setup(tmp_path: Path, *, mail_policy: str = "reconcile", url: str | None = None) -> tuple[DurableServer, Counter]:
    counter = Counter(tmp_path / "events.log")
    server = make_server(
        url or f"sqlite:///{tmp_path}/journal.db",
        mail_policy=mail_policy,
        lease=0.5,
        wait=0.0,
        counter=str(counter.path),
        ledger=str(tmp_path / "ledger.db"),
        outbox=str(tmp_path / "outbox.db"),
    )
    return server, counter


async def _plant(
    journal: Journal,
    tool: str,
    key: str,
    args: dict[str, Any],
    *,
    lease_in: float = -1.0,
    attempts: int = 1,
    owner: str = "dead-instance",
) -> CallRecord:
    """What a server killed inside the call leaves behind: a PENDING record of a gone owner."""
    now = time.time()
    record = CallRecord(
        identity=CallIdentity("local", tool, key),
        fingerprint=keys.fingerprint(args),
        state=CallState.PENDING,
        version=1,
        run_id=uuid.uuid4().hex,
        attempts=attempts,
        created_at=now,
        updated_at=now,
        owner=owner,
        lease_until=now + lease_in,
        arguments=keys.canonical_json(args),
    )
    won, _ = await journal.claim(record, now)
    assert won
    return record


async def _state(server: DurableServer, tool: str, key: str) -> CallRecord:
    record = await server.journal.get(CallIdentity("local", tool, key))
    assert record is not None
    return record


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_whose_owner_died_is_run_again_with_the_same_key_under_retry(mode: str, tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    await server.engine.start()
    await _plant(server.journal, "pay", "k1", PAY)
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("pay", PAY, meta=key_meta("k1"))
        record = await _state(server, "pay", "k1")
    assert not result.is_error, result
    assert counter.count("invoke pay k1") == 1
    assert len(PaymentProvider(tmp_path / "ledger.db").effects(subject="O-1")) == 1
    assert record.state == CallState.COMPLETED and record.attempts == 2


@pytest.mark.parametrize("mode", MODES)
async def test_a_live_owners_call_is_not_taken_over_until_its_lease_expires(mode: str, tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    await server.engine.start()
    await _plant(server.journal, "pay", "k2", PAY, lease_in=1.0, owner="live-instance")
    async with Client(server, mode=mode) as client:
        early = await client.call_tool("pay", PAY, meta=key_meta("k2"))
        assert early.is_error and meta_of(early)["mcp-durable/error"]["error"] == "in_progress"
        assert counter.count("invoke pay k2") == 0
        while True:  # the owner never renews: once its lease is over, the call is taken over
            result = await client.call_tool("pay", PAY, meta=key_meta("k2"))
            if not result.is_error:
                break
            assert meta_of(result)["mcp-durable/error"]["error"] == "in_progress"
            await anyio.sleep(0.05)
        assert (await _state(server, "pay", "k2")).attempts == 2
    assert counter.count("invoke pay k2") == 1


@pytest.mark.parametrize("mode", MODES)
async def test_reconcile_completes_the_call_with_the_mail_the_outbox_already_sent(mode: str, tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    outbox = Outbox(tmp_path / "outbox.db")
    await server.engine.start()
    await _plant(server.journal, "send_email", "m1", MAIL)
    sent = outbox.send(MAIL["to"], MAIL["subject"], MAIL["body"], key="m1")  # the crashed run's effect
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("send_email", MAIL, meta=key_meta("m1"))
        replay = await client.call_tool("send_email", MAIL, meta=key_meta("m1"))
    assert not result.is_error, result
    assert result.structured_content == sent.as_dict()
    assert result.meta is not None and result.meta["mcp-durable/reconciled"] is True
    assert replay.structured_content == sent.as_dict() and meta_of(replay)["mcp-durable/replayed"] is True
    assert counter.count("invoke send_email m1") == 0 and len(outbox.mails(key="m1")) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_reconcile_runs_the_call_when_the_outbox_shows_no_mail(mode: str, tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    await server.engine.start()
    await _plant(server.journal, "send_email", "m2", MAIL)
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("send_email", MAIL, meta=key_meta("m2"))
        attempts = (await _state(server, "send_email", "m2")).attempts
    assert attempts == 2
    assert not result.is_error and "mcp-durable/reconciled" not in (result.meta or {})
    assert counter.count("invoke send_email m2") == 1
    assert [m["id"] for m in Outbox(tmp_path / "outbox.db").mails(key="m2")] == [result.structured_content["id"]]


@pytest.mark.parametrize("mode", MODES)
async def test_reconcile_falls_back_to_in_doubt_while_the_outbox_cannot_answer(mode: str, tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    await server.engine.start()
    await _plant(server.journal, "send_email", "m3", MAIL)
    broken = tmp_path / "outbox.db"
    broken.write_bytes(b"this is not a database" * 100)
    async with Client(server, mode=mode) as client:
        refused = await client.call_tool("send_email", MAIL, meta=key_meta("m3"))
        record = await _state(server, "send_email", "m3")
        assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "in_doubt"
        assert record.state == CallState.IN_DOUBT and "reconcile failed" in (record.error or "")
        assert counter.count("invoke send_email m3") == 0
        broken.unlink()  # the outbox answers again (and it holds no mail)
        result = await client.call_tool("send_email", MAIL, meta=key_meta("m3"))
    assert not result.is_error, result
    assert counter.count("invoke send_email m3") == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("resolution", ["completed", "not_applied", "failed"])
async def test_refuse_answers_in_doubt_until_an_operator_resolves_the_call(
    mode: str, resolution: str, tmp_path: Path
) -> None:
    server, counter = _setup(tmp_path, mail_policy="refuse")
    await server.engine.start()
    await _plant(server.journal, "send_email", "m4", MAIL)
    identity = CallIdentity("local", "send_email", "m4")
    stored = {
        "content": [{"type": "text", "text": "resolved by hand"}],
        "structuredContent": {"id": "msg_manual"},
        "isError": resolution == "failed",
    }
    async with Client(server, mode=mode) as client:
        for _ in range(2):
            refused = await client.call_tool("send_email", MAIL, meta=key_meta("m4"))
            assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "in_doubt"
        listed = await server.journal.list_calls(CallQuery(state=CallState.IN_DOUBT))
        assert [r.identity for r in listed] == [identity]
        payload = None if resolution == "not_applied" else orjson.dumps(stored)
        await server.engine.resolve(identity, resolution, payload=payload, note="checked the outbox")
        assert await server.journal.list_calls(CallQuery(state=CallState.IN_DOUBT)) == []
        result = await client.call_tool("send_email", MAIL, meta=key_meta("m4"))
    if resolution == "not_applied":
        assert not result.is_error and counter.count("invoke send_email m4") == 1
    else:
        assert counter.count("invoke send_email m4") == 0
        assert result.structured_content == {"id": "msg_manual"} and bool(result.is_error) == (resolution == "failed")
        assert result.meta is not None and result.meta["mcp-durable/replayed"] is True


async def test_a_call_retried_max_attempts_times_is_parked_until_an_operator_resolves_it(tmp_path: Path) -> None:
    server, counter = _setup(tmp_path)
    await server.engine.start()
    await _plant(server.journal, "pay", "k5", PAY, attempts=server.policies["pay"].max_attempts)
    identity = CallIdentity("local", "pay", "k5")
    async with Client(server) as client:
        parked = await client.call_tool("pay", PAY, meta=key_meta("k5"))
        assert parked.is_error and meta_of(parked)["mcp-durable/error"]["error"] == "in_doubt"
        assert "parked" in parked.structured_content["message"]
        record = await server.journal.get(identity)
        assert record is not None and record.state == CallState.IN_DOUBT and "parked" in (record.error or "")
        assert counter.count("invoke pay k5") == 0
        await server.engine.resolve(identity, "not_applied")
        result = await client.call_tool("pay", PAY, meta=key_meta("k5"))
    assert not result.is_error and counter.count("invoke pay k5") == 1


async def test_an_operator_cannot_resolve_a_completed_call_a_missing_one_or_with_a_result_that_is_not_json(
    tmp_path: Path,
) -> None:
    server, _ = _setup(tmp_path, mail_policy="refuse")
    async with Client(server) as client:
        await client.call_tool("pay", PAY, meta=key_meta("k6"))
        await _plant(server.journal, "send_email", "m6", MAIL)
        with pytest.raises(OperatorError, match="not in doubt"):
            await server.engine.resolve(CallIdentity("local", "pay", "k6"), "not_applied")
        with pytest.raises(OperatorError, match="no call"):
            await server.engine.resolve(CallIdentity("local", "pay", "nope"), "not_applied")
        with pytest.raises(OperatorError, match="JSON"):
            await server.engine.resolve(CallIdentity("local", "send_email", "m6"), "completed", payload=b"{oops")
        with pytest.raises(OperatorError, match="needs the result"):
            await server.engine.resolve(CallIdentity("local", "send_email", "m6"), "completed")
        with pytest.raises(OperatorError, match="resolution must be"):
            await server.engine.resolve(CallIdentity("local", "send_email", "m6"), "maybe")


async def test_a_single_writer_journal_marks_a_previous_boots_pending_calls_in_doubt_at_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/journal.db?single_writer=1"
    previous = create_journal(url)
    await previous.open()
    await _plant(previous, "pay", "k7", PAY, lease_in=3600.0)  # a lease that would last an hour
    await previous.aclose()
    server, counter = _setup(tmp_path, url=url)
    async with Client(server) as client:
        listed = await server.journal.list_calls(CallQuery(state=CallState.IN_DOUBT))
        assert [r.identity.key for r in listed] == ["k7"] and server.engine.orphans_found == 1
        result = await client.call_tool("pay", PAY, meta=key_meta("k7"))
    assert not result.is_error and counter.count("invoke pay k7") == 1


async def test_a_shared_journal_marks_only_expired_leases_in_doubt_at_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/journal.db"
    other = create_journal(url)
    await other.open()
    await _plant(other, "pay", "dead", PAY, lease_in=-1.0)
    await _plant(other, "pay", "alive", PAY, lease_in=3600.0, owner="another-live-server")
    server, _ = _setup(tmp_path, url=url)
    await server.engine.start()
    try:
        assert server.engine.orphans_found == 1
        assert (await _state(server, "pay", "dead")).state == CallState.IN_DOUBT
        assert (await _state(server, "pay", "alive")).state == CallState.PENDING
    finally:
        await server.aclose()
        await other.aclose()


async def test_two_servers_sharing_one_single_writer_journal_in_a_process_never_take_each_others_calls() -> None:
    shared = create_journal("memory://")  # single writer: only this process writes it
    release = anyio.Event()
    runs: list[str] = []
    servers = [DurableServer(name, journal=shared) for name in ("a", "b")]
    for server in servers:

        @server.tool(durable=ToolPolicy(key_fields=("job",), wait=0.0, lease=0.05))
        async def slow(job: str) -> dict[str, Any]:
            runs.append(job)
            await release.wait()
            return {"job": job}

    result: dict[str, Any] = {}
    async with Client(servers[0]) as a, Client(servers[1]) as b:
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                result["a"] = await a.call_tool("slow", {"job": "J"})

            tg.start_soon(first)
            while not runs:
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # several lease periods: the lease is renewed, and b knows a is alive
            duplicate = await b.call_tool("slow", {"job": "J"})
            release.set()
        replay = await b.call_tool("slow", {"job": "J"})
    assert duplicate.is_error and meta_of(duplicate)["mcp-durable/error"]["error"] == "in_progress"
    assert runs == ["J"] and replay.structured_content == result["a"].structured_content
