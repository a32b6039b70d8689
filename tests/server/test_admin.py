"""Admin tools over MCP: registered only with admin principals, resolve a call in doubt (the next
call with its key replays the operator's verdict, or runs), purge expired records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, create_journal
from mcp_durable.keys import fingerprint
from tests.helpers import first_text, resource_text

MODES = ["legacy", "auto"]


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(journal: Journal, ran: list[str], *, admins: tuple[str, ...], clock: Clock | None = None) -> DurableServer:
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    server = DurableServer("ops", journal=journal, admin_principals=admins, **kwargs)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), idempotent=False, retention=60.0))
    def ship(order_id: str) -> dict[str, Any]:
        ran.append(order_id)
        return {"shipped": order_id}

    return server


@asynccontextmanager
async def journal_with_a_call_in_doubt() -> AsyncIterator[Journal]:
    journal = create_journal("memory://")
    await journal.open()
    ghost = CallRecord(
        identity=CallIdentity("local", "ship", "o-1"),
        fingerprint=fingerprint({"order_id": "o-1"}),
        state=CallState.PENDING,
        version=1,
        run_id="r",
        attempts=1,
        created_at=1.0,
        updated_at=1.0,
        owner="previous-boot",
        lease_until=2.0,
        arguments=b'{"order_id":"o-1"}',
    )
    await journal.claim(ghost, 1.0)
    yield journal
    await journal.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_without_admin_principals_there_are_no_admin_tools(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_DURABLE_ADMINS", raising=False)
    server = build(create_journal("memory://"), [], admins=())
    async with Client(server, mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"ship"}
        refused = await client.call_tool("journal_resolve", {"tool": "ship", "key": "o-1", "resolution": "failed"})
        assert refused.is_error


@pytest.mark.parametrize("mode", MODES)
async def test_a_non_admin_local_principal_is_refused_by_the_admin_tools(mode: str) -> None:
    async with journal_with_a_call_in_doubt() as journal:
        server = build(journal, [], admins=("ops",))
        async with Client(server, mode=mode) as client:
            refused = await client.call_tool(
                "journal_resolve", {"tool": "ship", "key": "o-1", "resolution": "completed", "result": {"x": 1}}
            )
            assert refused.is_error and "forbidden" in first_text(refused)
            # The same machine-readable refusal as a durable call's (results.refusal)
            assert refused.meta is not None and refused.meta["mcp-durable/error"]["error"] == "forbidden"
            assert refused.meta["mcp-durable/error"]["principal"] == "local"
            assert refused.structured_content == refused.meta["mcp-durable/error"]  # an open object schema
            purge = await client.call_tool("journal_purge_expired", {})
            assert purge.is_error and purge.meta is not None and purge.meta["mcp-durable/error"]["error"] == "forbidden"
        assert (await journal.get(CallIdentity("local", "ship", "o-1"))).state == CallState.IN_DOUBT  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
async def test_resolving_a_call_in_doubt_as_completed_makes_its_key_replay_the_operators_result(mode: str) -> None:
    ran: list[str] = []
    async with journal_with_a_call_in_doubt() as journal:
        server = build(journal, ran, admins=("local",))
        async with Client(server, mode=mode) as client:
            before = await client.call_tool("ship", {"order_id": "o-1"})
            assert before.is_error and before.meta is not None
            assert before.meta["mcp-durable/error"]["error"] == "in_doubt"
            resolved = await client.call_tool(
                "journal_resolve",
                {
                    "tool": "ship",
                    "key": "o-1",
                    "resolution": "completed",
                    "result": {"shipped": "o-1", "by": "hand"},
                    "note": "checked the carrier",
                },
            )
            assert not resolved.is_error, resolved
            assert resolved.structured_content["state"] == "completed"
            after = await client.call_tool("ship", {"order_id": "o-1"})
        assert ran == []  # the tool never ran: the operator's verdict is replayed
        assert not after.is_error and after.structured_content == {"shipped": "o-1", "by": "hand"}
        assert after.meta is not None and after.meta["mcp-durable/replayed"] is True


@pytest.mark.parametrize("mode", MODES)
async def test_resolving_a_call_in_doubt_as_not_applied_lets_the_next_call_run(mode: str) -> None:
    ran: list[str] = []
    async with journal_with_a_call_in_doubt() as journal:
        server = build(journal, ran, admins=("local",))
        async with Client(server, mode=mode) as client:
            resolved = await client.call_tool(
                "journal_resolve", {"tool": "ship", "key": "o-1", "resolution": "not_applied"}
            )
            assert not resolved.is_error and resolved.structured_content["state"] == "released"
            after = await client.call_tool("ship", {"order_id": "o-1"})
            again = await client.call_tool(
                "journal_resolve", {"tool": "ship", "key": "o-1", "resolution": "not_applied"}
            )
        assert again.is_error and "not in doubt" in first_text(again)
        assert again.meta is not None and again.meta["mcp-durable/error"]["error"] == "operator_error"
        assert ran == ["o-1"] and after.structured_content == {"shipped": "o-1"}


@pytest.mark.parametrize("mode", MODES)
async def test_purging_drops_exactly_the_records_whose_retention_ended(mode: str) -> None:
    clock = Clock()
    journal = create_journal("memory://")
    server = build(journal, [], admins=("local",), clock=clock)
    async with Client(server, mode=mode) as client:
        await client.call_tool("ship", {"order_id": "old"})
        clock.now += 50
        await client.call_tool("ship", {"order_id": "new"})
        clock.now += 20  # "old" is 70 s old (retention 60 s), "new" 20 s
        purged = await client.call_tool("journal_purge_expired", {})
        assert purged.structured_content == {"purged": 1}
        left = await client.read_resource("journal://calls")
    assert '"new"' in resource_text(left) and '"old"' not in resource_text(left)


async def test_over_stdio_the_local_principal_is_an_admin_only_when_configured(tmp_path: Any) -> None:
    from mcp.shared.exceptions import MCPError

    from tests.helpers import stdio_params

    target, journal = "tests/server/servers/counting.py:make_server", f"sqlite:///{tmp_path}/j.db"
    env = {"COUNTER_FILE": str(tmp_path / "counter")}
    async with Client(stdio_params(target, journal=journal, env=env)) as client:
        assert "journal_resolve" not in {t.name for t in (await client.list_tools()).tools}
        with pytest.raises(MCPError, match="Unknown resource"):
            await client.read_resource("journal://entries")
    async with Client(stdio_params(target, journal=journal, env={**env, "MCP_DURABLE_ADMINS": "local"})) as client:
        assert "journal_resolve" in {t.name for t in (await client.list_tools()).tools}
        entries = await client.read_resource("journal://entries")
        assert '"server/counting"' in resource_text(entries)


@pytest.mark.parametrize("mode", MODES)
async def test_forgetting_a_call_in_doubt_lets_its_key_run_as_a_new_call_and_journals_who_and_why(mode: str) -> None:
    from mcp_durable.engine.operators import audit_entries

    ran: list[str] = []
    async with journal_with_a_call_in_doubt() as journal:
        identity = CallIdentity("local", "ship", "o-1")
        refused = build(journal, ran, admins=("ops",))
        async with Client(refused, mode=mode) as client:
            denied = await client.call_tool("journal_forget", {"tool": "ship", "key": "o-1"})
        assert denied.is_error and "forbidden" in first_text(denied)
        assert await audit_entries(journal, identity) == []

        server = build(journal, ran, admins=("local",))
        async with Client(server, mode=mode) as client:
            forgotten = await client.call_tool(
                "journal_forget", {"tool": "ship", "key": "o-1", "note": "never shipped"}
            )
            assert not forgotten.is_error, forgotten
            assert forgotten.structured_content["state"] == "released"
            after = await client.call_tool("ship", {"order_id": "o-1"})
            again = await client.call_tool("journal_forget", {"tool": "ship", "key": "o-1"})
        assert ran == ["o-1"] and after.structured_content == {"shipped": "o-1"}
        assert again.is_error and "not in doubt" in first_text(again)
        record = await journal.get(identity)
        assert record is not None and record.run_id != "r"  # a new call: a new run, no step replayed
        (audit,) = await audit_entries(journal, identity)
        assert audit.data["action"] == "forget" and audit.data["by"] == "local"
        assert audit.data["note"] == "never shipped"
        assert (audit.data["from"], audit.data["to"]) == ("in_doubt", "released")
