"""The proxy in front of real third-party servers from npm, driven by a real client in both eras.

`mcp-durable proxy --upstream-command "node …/server-memory"` (and server-everything) runs as a
subprocess serving streamable HTTP; the client is the SDK's `Client` in `legacy` (2025-11-25) and
`auto` (2026-07-28) mode. server-memory's own state (`read_graph`) shows how often a tool ran.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import PromptReference

from tests.helpers import first_text, key_meta, resource_text, serve_cli_http, wire
from tests.node_peers import package_bin
from tests.proxy.upstreams import EVERYTHING, MEMORY, proxy_cli

ERAS = ("legacy", "auto")
ADA = {"entities": [{"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}]}


def _upstream_args(package: str, *args: str) -> list[str]:
    return ["--upstream-command", shlex.join([*package_bin(package), *args])]


async def _names_in_graph(client: Client) -> list[str]:
    graph = await client.call_tool("read_graph", {})
    text = first_text(graph)
    return sorted(entity["name"] for entity in json.loads(text)["entities"])


@pytest.mark.parametrize("mode", ERAS)
async def test_a_durable_npm_tool_called_twice_with_one_key_runs_once_upstream(tmp_path: Path, mode: str) -> None:
    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.create_entities]\nkey = "required"\n')
    env = {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    args = proxy_cli(_upstream_args(MEMORY), f"sqlite:///{tmp_path}/proxy.db", "--policies", str(policies))
    async with serve_cli_http(args, env=env) as served, Client(served.url, mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["create_entities"].annotations is not None
        assert tools["create_entities"].annotations.idempotent_hint is True  # the hint is now a guarantee
        first = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
        assert not first.is_error, first
        assert first.meta is not None and first.meta["mcp-durable/key"] == "ada-1"
        assert "mcp-durable/replayed" not in first.meta
        assert await _names_in_graph(client) == ["Ada"]
        # Undo the effect upstream; a repeat of the key must not do it again.
        await client.call_tool("delete_entities", {"entityNames": ["Ada"]})
        assert await _names_in_graph(client) == []
        second = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
        assert second.meta is not None and second.meta["mcp-durable/replayed"] is True
        assert wire(second)["content"] == wire(first)["content"]
        assert await _names_in_graph(client) == []  # the upstream ran create_entities once
        refused = await client.call_tool("create_entities", ADA)  # key = "required"
        assert refused.is_error and refused.meta is not None
        assert refused.meta["mcp-durable/error"]["error"] == "missing_key"
        assert await _names_in_graph(client) == []


@pytest.mark.parametrize("mode", ERAS)
async def test_a_pass_through_npm_tool_runs_every_time(tmp_path: Path, mode: str) -> None:
    # No policies file: create_entities is not annotated idempotent, so it is passed through.
    env = {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    args = proxy_cli(_upstream_args(MEMORY), f"sqlite:///{tmp_path}/proxy.db")
    async with serve_cli_http(args, env=env) as served, Client(served.url, mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["create_entities"].annotations is not None
        assert tools["create_entities"].annotations.idempotent_hint is False  # untouched
        first = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
        assert first.meta is None or "mcp-durable/key" not in first.meta
        await client.call_tool("delete_entities", {"entityNames": ["Ada"]})
        second = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
        assert second.meta is None or "mcp-durable/replayed" not in second.meta
        assert await _names_in_graph(client) == ["Ada"]  # ran again
        stats = json.loads(resource_text(await client.read_resource("journal://stats")))
        assert "create_entities" not in stats["calls_by_tool"]  # nothing of it journaled


async def _everything_session(client: Client) -> dict[str, Any]:
    """What a client sees of server-everything: resources, templates, prompts, completions, progress."""
    reported: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, total, message))

    long_run = await client.call_tool(
        "trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress
    )
    resources = [r for r in (await client.list_resources()).resources if not r.uri.startswith("journal://")]
    templates = [
        t
        for t in (await client.list_resource_templates()).resource_templates
        if not t.uri_template.startswith("journal://")
    ]
    prompts = (await client.list_prompts()).prompts
    doc = await client.read_resource(resources[0].uri)
    prompt = await client.get_prompt("args-prompt", {"city": "Paris", "state": "TX"})
    completion = await client.complete(
        PromptReference(type="ref/prompt", name="completable-prompt"), {"name": "department", "value": "E"}
    )
    echo = await client.call_tool("echo", {"message": "hi"})
    return {
        "long_run": wire(long_run)["content"],
        "progress": reported,
        "resources": [r.model_dump(by_alias=True, exclude_none=True) for r in resources],
        "templates": [t.model_dump(by_alias=True, exclude_none=True) for t in templates],
        "prompts": [p.model_dump(by_alias=True, exclude_none=True) for p in prompts],
        "doc": [c.model_dump(by_alias=True, exclude_none=True) for c in doc.contents],
        "prompt": prompt.model_dump(by_alias=True, exclude_none=True, exclude={"meta"}),
        "completion": completion.completion.model_dump(by_alias=True, exclude_none=True),
        "echo": wire(echo)["content"],
    }


@pytest.mark.parametrize("mode", ERAS)
async def test_resources_prompts_completions_and_progress_work_through_the_proxy_as_directly(
    tmp_path: Path, mode: str
) -> None:
    command = package_bin(EVERYTHING)
    async with Client(StdioServerParameters(command=command[0], args=command[1:]), mode="legacy") as direct:
        expected = await _everything_session(direct)
    assert len(expected["progress"]) == 3 and expected["resources"] and expected["prompts"]
    args = proxy_cli(_upstream_args(EVERYTHING), f"sqlite:///{tmp_path}/proxy.db")
    async with serve_cli_http(args) as served, Client(served.url, mode=mode) as client:
        seen = await _everything_session(client)
        journal = [r.uri for r in (await client.list_resources()).resources if r.uri.startswith("journal://")]
    assert seen == expected
    assert "journal://stats" in journal  # the proxy adds the journal resources
