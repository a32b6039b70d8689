"""Tools that are not durable keep working untouched; durable idempotent tools advertise it."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_types import ToolAnnotations

from mcp_durable import DurableServer, ToolPolicy
from tests.helpers import connect, key_meta, wire
from tests.server.conftest import CountingSetup
from tests.server.servers.counting import Counter

MEMORY = ["memory-legacy", "memory-auto"]


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_tool_that_is_not_durable_runs_every_time_and_its_result_is_untouched(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        results = [
            await client.call_tool("plain", {"text": "a"}, meta=key_meta("same-key")),
            await client.call_tool("plain", {"text": "a"}, meta=key_meta("same-key")),
            await client.call_tool("plain", {"text": "a"}),
        ]
    assert counter.count("plain") == 3
    assert len({result.structured_content["run"] for result in results}) == 3
    for result in results:
        assert not result.is_error
        assert not any(name.startswith("mcp-durable/") for name in (result.meta or {}))


@pytest.mark.parametrize("transport", MEMORY)
async def test_durable_idempotent_tools_advertise_idempotent_hint_and_others_keep_their_annotations(
    transport: str, tmp_path: Path
) -> None:
    server = DurableServer("hints", journal=f"sqlite:///{tmp_path}/journal.db")

    @server.tool(durable=True)
    def durable_default(x: int) -> int:
        return x

    @server.tool(durable=ToolPolicy(key="required"), annotations=ToolAnnotations(destructive_hint=True, title="T"))
    def durable_annotated(x: int) -> int:
        return x

    @server.tool(durable=ToolPolicy(idempotent=False))
    def durable_not_idempotent(x: int) -> int:
        return x

    @server.tool()
    def plain(x: int) -> int:
        return x

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def plain_annotated(x: int) -> int:
        return x

    async with connect(transport, target="", journal="", server=server) as client:
        listed = {tool.name: wire(tool).get("annotations") for tool in (await client.list_tools()).tools}
    assert listed["durable_default"] == {"idempotentHint": True}
    assert listed["durable_annotated"] == {"title": "T", "destructiveHint": True, "idempotentHint": True}
    assert not (listed["durable_not_idempotent"] or {}).get("idempotentHint")
    assert listed["plain"] is None
    assert listed["plain_annotated"] == {"readOnlyHint": True}


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_durable_tool_that_is_not_idempotent_runs_every_time_without_a_key_and_once_with_one(
    transport: str, tmp_path: Path
) -> None:
    server = DurableServer("non-idempotent", journal=f"sqlite:///{tmp_path}/journal.db")
    runs: list[int] = []

    @server.tool(durable=ToolPolicy(idempotent=False))
    def send_email(to: str) -> dict[str, int]:
        runs.append(1)
        return {"sent": len(runs)}

    async with connect(transport, target="", journal="", server=server) as client:
        unkeyed = [await client.call_tool("send_email", {"to": "a@x"}) for _ in range(2)]
        keyed = [await client.call_tool("send_email", {"to": "a@x"}, meta=key_meta("mail-1")) for _ in range(2)]
    assert len(runs) == 3
    assert [r.structured_content for r in unkeyed] == [{"sent": 1}, {"sent": 2}]
    assert all("mcp-durable/key" not in (r.meta or {}) for r in unkeyed)
    assert [r.structured_content for r in keyed] == [{"sent": 3}, {"sent": 3}]
    assert keyed[1].meta is not None and keyed[1].meta["mcp-durable/replayed"] is True
