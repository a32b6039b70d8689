"""One error boundary: a refusal reaches a client as a tool result (`results.refusal`) or, where
no result can carry it, as one JSON-RPC error (`results.refusal_error`), the same whichever
method met it (a resource read, `tasks/get`, `tasks/list`, a task-creating call); a
`ConfigError` raised while serving is a programmer's error, never answered as a refusal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_durable import ConfigError, DurableServer, ToolPolicy
from mcp_durable.journal import create_journal
from mcp_durable.wire_errors import WIRE
from tests.helpers import first_text, key_meta
from tests.server.task_client import create_legacy_task, request


def build(journal: str) -> DurableServer:
    server = DurableServer("shop", journal=journal)

    @server.tool(durable=ToolPolicy(key="required", task_support="optional"))
    def ship(order_id: str) -> dict[str, Any]:
        return {"shipped": order_id}

    @server.tool(durable=True)
    def misconfigured(order_id: str) -> dict[str, Any]:
        # A programmer's error met while serving: a policy built (wrongly) inside a tool.
        ToolPolicy(key="sometimes")  # type: ignore[arg-type]
        return {}

    return server


def _without_uri(data: Any) -> dict[str, Any]:
    assert isinstance(data, dict)
    return {name: value for name, value in data.items() if name != "uri"}


async def test_resources_and_tasks_answer_a_journal_that_fails_with_the_same_json_rpc_error(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/journal"
    holder = create_journal(url)
    await holder.open()  # another writer holds the journal: every access of the server's fails
    errors: dict[str, MCPError] = {}
    try:
        async with Client(build(url), mode="legacy") as client:
            refused = await client.call_tool("ship", {"order_id": "o-1"}, meta=key_meta("k-1"))
            attempts = {
                "resources/read": client.read_resource("journal://stats"),
                "tasks/get": request(client, "tasks/get", {"taskId": "t-1"}),
                "tasks/list": request(client, "tasks/list", {}),
                "tools/call (task)": create_legacy_task(client, "ship", {"order_id": "o-1"}, key="k-1"),
            }
            for method, attempt in attempts.items():
                with pytest.raises(MCPError) as caught:
                    await attempt
                errors[method] = caught.value
    finally:
        await holder.aclose()
    assert refused.is_error and refused.meta is not None
    body = refused.meta["mcp-durable/error"]
    assert body["error"] == "journal_unavailable"
    listed = errors.pop("tasks/list")  # reads the journal without starting the engine: its own message
    assert (listed.error.code, _without_uri(listed.error.data)["error"]) == (-32603, "journal_unavailable")
    answers = {
        method: (error.error.code, error.error.message, _without_uri(error.error.data))
        for method, error in errors.items()
    }
    # Word for word the refused tool call's text and refusal object, under the table's code.
    assert answers == dict.fromkeys(errors, (WIRE["journal_unavailable"].jsonrpc, first_text(refused), body))
    assert errors["resources/read"].error.data["uri"] == "journal://stats"


async def test_a_refusal_of_a_task_creating_call_is_the_tables_json_rpc_error_with_the_tools_refusal() -> None:
    async with Client(build("memory://"), mode="legacy") as client:
        refused = await client.call_tool("ship", {"order_id": "o-1"})  # no key: missing_key
        with pytest.raises(MCPError) as caught:
            await create_legacy_task(client, "ship", {"order_id": "o-1"})
    assert refused.meta is not None and refused.meta["mcp-durable/error"]["error"] == "missing_key"
    error = caught.value.error
    assert (error.code, error.message, error.data) == (
        WIRE["missing_key"].jsonrpc,
        first_text(refused),
        refused.meta["mcp-durable/error"],
    )


async def test_a_config_error_raised_while_serving_is_not_answered_as_a_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Client(build("memory://"), mode="auto") as client:
        answer = await client.call_tool("misconfigured", {"order_id": "o-1"}, meta=key_meta("k-1"))
    assert answer.is_error
    assert "mcp-durable/error" not in (answer.meta or {})  # no `config_error` refusal for the client
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], ConfigError)]
    assert logged, "the ConfigError goes to the server's log, with its traceback"
