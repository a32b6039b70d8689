"""The journal resources, read through a real in-memory client in both protocol eras, checked
against the calls the test made: stats, recovery, listings, one record, in doubt, the process
log and the recovered process state. Sensitive values are masked; keys are percent-encoded."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

from mcp_durable import DurableServer, ToolPolicy, keys
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, create_journal
from mcp_durable.server.redact import MASK
from tests.helpers import meta_of, read_json

MODES = ["legacy", "auto"]
KEY = "order A/1 ?#&,"  # needs percent-encoding in a URI
KEY_URI = "journal://calls/refund/order%20A%2F1%20%3F%23%26%2C"
TEMPLATES = {
    "journal://calls{?tool,state,limit,cursor}",
    "journal://calls/{tool}/{key}",
    "journal://entries{?after,limit}",
    "journal://processes/{process_id}",
}
STATIC = {"journal://stats", "journal://recovery", "journal://in-doubt"}


def build_server(journal: str | Journal, *, admins: tuple[str, ...] = ("local",)) -> DurableServer:
    server = DurableServer("shop", journal=journal, admin_principals=admins)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("card",)))
    def refund(order_id: str, amount_cents: int, card: str) -> dict[str, Any]:
        return {"order_id": order_id, "refunded": amount_cents, "card": card, "run": uuid.uuid4().hex}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    def decline(order_id: str) -> dict[str, Any]:
        raise ToolError(f"declined {order_id}")

    return server


@asynccontextmanager
async def orphaned_journal(url: str) -> AsyncIterator[Journal]:
    """A journal holding one PENDING call of a previous boot that died (found in doubt at start)."""
    journal = create_journal(url)
    await journal.open()
    ghost = CallRecord(
        identity=CallIdentity("local", "refund", "ghost"),
        fingerprint="0" * 64,
        state=CallState.PENDING,
        version=1,
        run_id="r",
        attempts=1,
        created_at=1.0,
        updated_at=1.0,
        owner="previous-boot",
        lease_until=2.0,
        arguments=b"{}",
    )
    await journal.claim(ghost, 1.0)
    try:
        yield journal
    finally:
        await journal.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_every_journal_resource_reads_back_the_calls_made_in_the_test(mode: str) -> None:
    async with orphaned_journal("memory://") as journal:
        server = build_server(journal)
        async with Client(server, mode=mode) as client:
            refund_args = {"order_id": KEY, "amount_cents": 250, "card": "4111-1111"}
            first = await client.call_tool("refund", refund_args)
            again = await client.call_tool("refund", refund_args)
            declined = await client.call_tool("decline", {"order_id": "o-9"})
            assert again.meta is not None and again.meta["mcp-durable/replayed"] is True
            assert declined.is_error

            templates = {t.uri_template: t for t in (await client.list_resource_templates()).resource_templates}
            assert TEMPLATES <= set(templates)
            assert all(t.mime_type == "application/json" for t in templates.values())
            resources = {str(r.uri): r for r in (await client.list_resources()).resources}
            assert STATIC <= set(resources) and all(resources[u].mime_type == "application/json" for u in STATIC)

            stats = await read_json(client, "journal://stats")
            assert stats["scope"] == "all" and stats["backend"] == "memory"
            assert stats["calls"] == 3
            assert stats["calls_by_state"] == {"completed": 1, "failed": 1, "in_doubt": 1}
            assert stats["calls_by_tool"] == {"refund": 2, "decline": 1}
            assert stats["oldest_record_at"] == "1970-01-01T00:00:01Z"  # the ghost
            assert stats["retention"]["by_tool"] == {"refund": 86400.0, "decline": 86400.0}

            recovery = await read_json(client, "journal://recovery")
            assert recovery["backend"] == "memory" and recovery["calls_found_in_doubt"] == 1
            assert recovery["previous_lifecycle_state"] is None and recovery["problems"] == []
            assert isinstance(recovery["start_duration_s"], float) and recovery["process_id"] == "server/shop"

            listing = await read_json(client, "journal://calls")
            assert [(c["tool"], c["key"]) for c in listing["calls"]] == [
                ("decline", "o-9"),
                ("refund", KEY),
                ("refund", "ghost"),
            ]  # newest first
            assert listing["next_cursor"] is None
            assert listing["calls"][1]["uri"] == KEY_URI
            only_failed = await read_json(client, "journal://calls?state=failed&tool=decline")
            assert [c["key"] for c in only_failed["calls"]] == ["o-9"]

            record = await read_json(client, KEY_URI)
            assert record["state"] == "completed" and record["attempts"] == 1 and record["principal"] == "local"
            assert record["fingerprint"] == keys.fingerprint(refund_args)
            assert record["owner"] is None and record["lease_until"] is None
            assert record["completed_at"] == meta_of(first)["mcp-durable/first-completed-at"]
            assert record["arguments"] == {**refund_args, "card": MASK}
            assert record["result"]["structuredContent"] == {**first.structured_content, "card": MASK}
            # The whole secret: "4111" alone turns up in timestamps (…:21.641117Z failed a run).
            assert "4111-1111" not in orjson.dumps(record).decode()
            failed = await read_json(client, "journal://calls/decline/o-9")
            assert failed["state"] == "failed" and failed["result"]["isError"] is True
            assert "declined o-9" in failed["result"]["content"][0]["text"]

            in_doubt = await read_json(client, "journal://in-doubt")
            assert in_doubt["count"] == 1 and [c["key"] for c in in_doubt["calls"]] == ["ghost"]

            entries = await read_json(client, "journal://entries?limit=500")
            lifecycle = [
                e["data"]["to"]
                for e in entries["entries"]
                if e["process_id"] == "server/shop" and e["entry_type"] == "state_transition"
            ]
            assert lifecycle == ["starting", "running"]
            seqs = [e["seq"] for e in entries["entries"]]
            assert seqs == sorted(seqs) and entries["next_after"] == seqs[-1]
            tail = await read_json(client, f"journal://entries?after={seqs[0]}&limit=1")
            assert [e["seq"] for e in tail["entries"]] == [seqs[1]]

            process = await read_json(client, "journal://processes/server%2Fshop")
            assert process["process_id"] == "server/shop" and process["lifecycle_state"] == "running"
            assert process["context_state"]["orphans_in_doubt"] == 1
            assert process["context_state"]["instance_id"] == server.engine.instance_id


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_records_and_bad_parameters_are_errors_not_empty_answers(mode: str) -> None:
    server = build_server("memory://")
    async with Client(server, mode=mode) as client:
        with pytest.raises(MCPError, match="Unknown resource"):
            await client.read_resource("journal://calls/refund/never-called")
        with pytest.raises(MCPError, match="Unknown resource"):
            await client.read_resource("journal://processes/no-such-process")
        for bad in (
            "journal://calls?limit=0",
            "journal://calls?limit=many",
            "journal://calls?state=lost",
            "journal://calls?cursor=not-a-cursor!",
        ):
            with pytest.raises(MCPError):
                await client.read_resource(bad)


async def _fill(journal: Journal, n: int) -> list[CallIdentity]:
    """`n` completed records of `local`, several per creation time (ties are broken by identity)."""
    identities = []
    for i in range(n):
        identity = CallIdentity("local", "refund" if i % 3 else "ship", f"k-{i:04d}")
        record = CallRecord(
            identity=identity,
            fingerprint="f" * 64,
            state=CallState.COMPLETED,
            version=2,
            run_id=f"r{i}",
            attempts=1,
            created_at=1000.0 + i // 4,
            updated_at=1000.0 + i // 4,
            completed_at=1000.0 + i // 4,
            result=b'{"content":[]}',
        )
        assert (await journal.claim(record, 0.0))[0]
        identities.append(identity)
    return identities


@pytest.mark.parametrize("mode", MODES)
async def test_pagination_walks_a_thousand_records_newest_first_without_gaps_or_repeats(
    mode: str, tmp_path: Any
) -> None:
    journal = create_journal(f"sqlite:///{tmp_path}/j.db?synchronous=OFF")
    await journal.open()
    identities = await _fill(journal, 1000)
    server = build_server(journal, admins=())
    async with Client(server, mode=mode) as client:
        seen: list[tuple[str, str]] = []
        cursor: str | None = None
        pages = 0
        while True:
            uri = "journal://calls?limit=97" + (f"&cursor={cursor}" if cursor else "")
            page = await read_json(client, uri)
            pages += 1
            seen.extend((c["tool"], c["key"]) for c in page["calls"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 11  # ceil(1000 / 97): never an empty last page
        assert len(seen) == 1000 and len(set(seen)) == 1000
        expected = sorted(identities, key=lambda i: (1000.0 + int(i.key[2:]) // 4, i), reverse=True)
        assert seen == [(i.tool, i.key) for i in expected]
        ships = await read_json(client, "journal://calls?tool=ship&limit=500")
        assert len(ships["calls"]) == 334 and {c["tool"] for c in ships["calls"]} == {"ship"}
    await journal.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_recovery_reports_what_opening_a_file_journal_found_after_a_torn_write(mode: str, tmp_path: Any) -> None:
    try:
        import mcp_durable.journal.file  # noqa: F401
    except ImportError:
        pytest.skip("the file journal is not built yet")
    url = f"file://{tmp_path}/fj?durability=relaxed"
    async with Client(build_server(url), mode=mode) as client:
        await client.call_tool("refund", {"order_id": "before", "amount_cents": 1, "card": "4111-1111"})
    (segment,) = sorted((tmp_path / "fj").glob("seg-*.log"))
    torn = b'@0000ffff 00000000000000ff 00000000 {"t":"call"'  # a frame cut off mid-write
    with segment.open("ab") as out:
        out.write(torn)
    async with Client(build_server(url), mode=mode) as client:
        recovery = await read_json(client, "journal://recovery")
        record = await read_json(client, "journal://calls/refund/before")
    assert recovery["backend"] == "file" and recovery["bytes_truncated"] == len(torn)
    assert recovery["problems"] and recovery["truncated_to"]
    assert recovery["previous_lifecycle_state"] == "stopped" and recovery["clean_previous_stop"] is True
    assert recovery["records_loaded"] >= 1 and recovery["calls_found_in_doubt"] == 0
    assert record["state"] == "completed"  # nothing before the torn frame is lost


async def test_a_principals_stats_are_the_journals_counts_read_without_any_record(tmp_path: Path) -> None:
    """`journal://stats` of a non-admin counts that principal's records (never another's) from
    the journal's kept counts: it answers even when no record could be read back from disk
    (here: every segment of a file journal cut to nothing after the writes)."""
    import os

    from mcp_durable.errors import JournalError
    from mcp_durable.server.resources import stats_body

    journal = create_journal(f"file://{tmp_path}/journal?durability=relaxed")
    await journal.open()
    try:
        for n, (principal, tool, state) in enumerate(
            [
                ("alice", "refund", CallState.COMPLETED),
                ("alice", "refund", CallState.FAILED),
                ("alice", "decline", CallState.COMPLETED),
                ("bob", "refund", CallState.COMPLETED),
            ]
        ):
            record = CallRecord(
                CallIdentity(principal, tool, f"k{n}"), "f", CallState.PENDING, 1, "r", 1, 10.0 + n, 10.0
            )
            await journal.claim(record, 0.0)
            assert await journal.swap(1, record.evolve(state=state, owner=None))
        for segment in (tmp_path / "journal").glob("seg-*.log"):
            os.truncate(segment, 0)
        with pytest.raises(JournalError):  # the records are gone from disk …
            await journal.list_calls()
        body = await stats_body(journal, "alice")  # … the counts are not
        assert body == {
            "scope": "principal",
            "principal": "alice",
            "backend": "file",
            "calls": 3,
            "calls_by_state": {"completed": 2, "failed": 1},
            "calls_by_tool": {"decline": 1, "refund": 2},
            "oldest_record_at": "1970-01-01T00:00:10Z",
        }
        everyone = await stats_body(journal, None)
        assert everyone["calls"] == 4 and everyone["calls_by_state"] == {"completed": 3, "failed": 1}
        assert (await stats_body(journal, "mallory"))["calls"] == 0
    finally:
        await journal.aclose()
