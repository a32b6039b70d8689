"""Journal resources when the journal cannot be read: the same clear `journal_unavailable` a tool
call gets, never the SDK's anonymous "-32603 Error reading resource"."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.helpers import first_text, free_port, key_meta, serve_http
from tests.server.servers.counting import make_server

COUNTING = "tests/server/servers/counting.py:make_server"
RESOURCES = ("journal://stats", "journal://calls", "journal://calls/record/k-1", "journal://in-doubt")


async def _refusal_and_resource_errors(client: Client) -> tuple[str, list[MCPError]]:
    refused = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
    assert refused.is_error and refused.meta is not None
    assert refused.meta["mcp-durable/error"]["error"] == "journal_unavailable"
    errors = []
    for uri in RESOURCES:
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri)
        errors.append(caught.value)
    return first_text(refused), errors


def _check(tool_text: str, errors: list[MCPError]) -> None:
    for uri, error in zip(RESOURCES, errors, strict=True):
        assert error.error.message == tool_text, (uri, error.error.message)  # word for word the tool's message
        assert "Error reading resource" not in error.error.message
        data = error.error.data
        assert isinstance(data, dict) and data["error"] == "journal_unavailable" and data["uri"] == uri, data


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_resources_of_a_journal_locked_by_another_server_answer_journal_unavailable(
    mode: str, tmp_path: Path
) -> None:
    journal = f"file://{tmp_path}/journal"
    env = {"COUNTER_FILE": str(tmp_path / "counter")}
    async with serve_http(COUNTING, journal=journal, env=env), serve_http(COUNTING, journal=journal, env=env) as locked:
        async with Client(locked.url, mode=mode) as client:
            text, errors = await _refusal_and_resource_errors(client)
    assert text.startswith("journal_unavailable: ") and "locked by another writer" in text
    _check(text, errors)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_resources_of_a_postgres_journal_that_is_down_answer_journal_unavailable(
    mode: str, tmp_path: Path
) -> None:
    # Nothing listens on this port: the database is down for the whole test.
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/test?pool_timeout=0.5"
    server = make_server(journal=down, counter=tmp_path / "counter")
    async with Client(server, mode=mode) as client:
        text, errors = await _refusal_and_resource_errors(client)
    assert text.startswith("journal_unavailable: ")
    _check(text, errors)
