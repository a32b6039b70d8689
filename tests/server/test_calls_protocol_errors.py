"""A tool raising `MCPError` (a JSON-RPC error: the SDK passes it through instead of making it an
`isError` result) never leaves its record PENDING, in either protocol era, as a call or a task.

- `exceptions="persist"`: the error becomes an `isError` result (its message as text, its code in
  `_meta["mcp-durable/jsonrpc-error"]`), journaled and replayed to every repeat of the key;
- `exceptions="release"`: the caller gets the JSON-RPC error, the record is released and a retry
  runs the tool again;
- an error asking the client to act and call again (URL elicitation required) is released under
  either policy: a replay of it would stop the very retry it asks for.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import URL_ELICITATION_REQUIRED, ElicitRequestURLParams

from mcp_durable import CallIdentity, CallState, DurableServer, ToolPolicy
from tests.helpers import body_bytes, first_text, key_meta, meta_of
from tests.server.task_client import TasksClient, call_for_task, create_legacy_task, poll_until_terminal, request

ERAS = ("legacy", "auto")
DECLINED = 4001  # an application-defined JSON-RPC error code (outside -32768…-32000, which JSON-RPC reserves)


def make(journal: str) -> tuple[DurableServer, Counter[str]]:
    """A server whose tools raise `MCPError`, counting their runs."""
    server = DurableServer("jsonrpc-errors", journal=journal)
    runs: Counter[str] = Counter()

    def decline(tool: str, order_id: str) -> None:
        runs[tool] += 1
        raise MCPError(code=DECLINED, message=f"provider declined {order_id}", data={"order_id": order_id})

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), exceptions="persist"))
    def persisted(order_id: str) -> dict[str, Any]:
        decline("persisted", order_id)
        return {}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), exceptions="release"))
    def released(order_id: str) -> dict[str, Any]:
        decline("released", order_id)
        return {}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), exceptions="persist"))
    def needs_consent(order_id: str) -> dict[str, Any]:
        runs["needs_consent"] += 1
        raise UrlElicitationRequiredError(
            [
                ElicitRequestURLParams(
                    mode="url", message="approve the refund", url="https://example.com/approve", elicitation_id=order_id
                )
            ]
        )

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), exceptions="persist", task_support="required"))
    def task_persisted(order_id: str) -> dict[str, Any]:
        decline("task_persisted", order_id)
        return {}

    return server, runs


async def state_of(server: DurableServer, tool: str, key: str) -> CallState:
    record = await server.journal.get(CallIdentity("local", tool, key))
    assert record is not None
    return CallState(record.state)


@pytest.mark.parametrize("mode", ERAS)
async def test_under_persist_a_jsonrpc_error_is_kept_as_an_error_result_and_replayed(tmp_path: Path, mode: str) -> None:
    server, runs = make(f"sqlite:///{tmp_path}/journal.db")
    async with Client(server, mode=mode) as client:
        first = await client.call_tool("persisted", {"order_id": "O-1"})
        again = await client.call_tool("persisted", {"order_id": "O-1"}, meta=key_meta("O-1"))
        state = await state_of(server, "persisted", "O-1")
    assert runs["persisted"] == 1
    assert first.is_error and first_text(first) == "provider declined O-1"
    error = meta_of(first)["mcp-durable/jsonrpc-error"]
    assert error == {"code": DECLINED, "message": "provider declined O-1", "data": {"order_id": "O-1"}}
    assert state == CallState.FAILED  # before the fix: PENDING, with no run behind it
    assert meta_of(again)["mcp-durable/replayed"] is True and body_bytes(again) == body_bytes(first)
    assert meta_of(again)["mcp-durable/jsonrpc-error"] == error


@pytest.mark.parametrize("mode", ERAS)
async def test_under_release_a_jsonrpc_error_reaches_the_caller_and_the_retry_runs_again(
    tmp_path: Path, mode: str
) -> None:
    server, runs = make(f"sqlite:///{tmp_path}/journal.db")
    async with Client(server, mode=mode) as client:
        with pytest.raises(MCPError) as first:
            await client.call_tool("released", {"order_id": "O-2"})
        state = await state_of(server, "released", "O-2")
        with pytest.raises(MCPError) as again:
            await client.call_tool("released", {"order_id": "O-2"})
    assert first.value.error.code == DECLINED and first.value.error.message == "provider declined O-2"
    assert state == CallState.RELEASED
    assert again.value.error.code == DECLINED and runs["released"] == 2


@pytest.mark.parametrize("mode", ERAS)
async def test_url_elicitation_required_is_never_kept_even_under_persist(tmp_path: Path, mode: str) -> None:
    server, runs = make(f"sqlite:///{tmp_path}/journal.db")
    async with Client(server, mode=mode) as client:
        for _ in range(2):
            with pytest.raises(MCPError) as asked:
                await client.call_tool("needs_consent", {"order_id": "O-3"})
            assert asked.value.error.code == URL_ELICITATION_REQUIRED
        state = await state_of(server, "needs_consent", "O-3")
    assert runs["needs_consent"] == 2  # each call asked again: nothing was replayed
    assert state == CallState.RELEASED


async def test_a_legacy_task_whose_tool_raises_a_jsonrpc_error_under_persist_ends_failed_with_it(
    tmp_path: Path,
) -> None:
    server, runs = make(f"sqlite:///{tmp_path}/journal.db")
    async with Client(server, mode="legacy") as client:
        task = (await create_legacy_task(client, "task_persisted", {"order_id": "O-4"}))["task"]
        ended = await poll_until_terminal(client, task["taskId"])
        result = await request(client, "tasks/result", {"taskId": task["taskId"]})
        again = (await create_legacy_task(client, "task_persisted", {"order_id": "O-4"}))["task"]
    assert ended["status"] == "failed"
    assert result["isError"] is True and result["content"][0]["text"] == "provider declined O-4"
    assert result["_meta"]["mcp-durable/jsonrpc-error"]["code"] == DECLINED
    # Before the fix the record was left PENDING with no run behind it: the task was taken for
    # an orphan, run again until parked, and ended in doubt.
    assert again["taskId"] == task["taskId"] and runs["task_persisted"] == 1


async def test_a_modern_task_whose_tool_raises_a_jsonrpc_error_under_persist_completes_with_an_error_result(
    tmp_path: Path,
) -> None:
    server, runs = make(f"sqlite:///{tmp_path}/journal.db")
    async with Client(server, extensions=[TasksClient()]) as client:
        handle = await call_for_task(client, "task_persisted", {"order_id": "O-5"})
        ended = await poll_until_terminal(client, handle.task_id)
    assert ended["status"] == "completed"  # 2026-07-28: an isError result is a completed task
    assert ended["result"]["isError"] is True and ended["result"]["content"][0]["text"] == "provider declined O-5"
    assert ended["result"]["_meta"]["mcp-durable/jsonrpc-error"]["code"] == DECLINED
    assert runs["task_persisted"] == 1
