"""The conformance suite's server fixtures behave through the proxy as when served directly.

Upstream: tests/proxy/servers/conformance_fixtures.py, a plain `MCPServer` (every tool is a
pass-through tool: none is annotated idempotent), started by the proxy as a stdio subprocess.
Directly: the same server object, connected in process. The client of both is the SDK `Client`
in both eras, with sampling and elicitation callbacks and a log level.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from mcp import Client
from mcp_types import CreateMessageResult, ElicitResult, LoggingMessageNotificationParams, PromptReference, TextContent

from mcp_durable.proxy import ProxyServer, UpstreamSpec
from tests.helpers import REPO, wire
from tests.proxy.servers.conformance_fixtures import server as fixtures

ERAS = ("legacy", "auto")
TOOLS: list[tuple[str, dict[str, Any]]] = [
    ("test_simple_text", {}),
    ("test_image_content", {}),
    ("test_audio_content", {}),
    ("test_embedded_resource", {}),
    ("test_multiple_content_types", {}),
    ("test_tool_with_logging", {}),
    ("test_tool_with_progress", {}),
    ("test_error_handling", {}),
    ("test_structured_output", {"city": "Lisbon"}),
]
#: Server→client requests exist only in the 2025-11-25 era.
LEGACY_ONLY: list[tuple[str, dict[str, Any]]] = [
    ("test_sampling", {"prompt": "What is 2+2?"}),
    ("test_elicitation", {"message": "Your name?"}),
]


def _strip_sdk_meta(data: dict[str, Any]) -> dict[str, Any]:
    """Without the `_meta` each server stamps on its own answers (`io.modelcontextprotocol/serverInfo`)."""
    meta = {k: v for k, v in (data.get("_meta") or {}).items() if not k.startswith("io.modelcontextprotocol/")}
    data = {k: v for k, v in data.items() if k != "_meta"}
    return {**data, "_meta": meta} if meta else data


async def _session(server: Any, mode: str) -> dict[str, Any]:
    logs: list[tuple[str, Any]] = []
    asked: list[str] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append((params.level, params.data))

    async def on_sampling(context: Any, params: Any) -> CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="4"), model="test-model")

    async def on_elicitation(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"username": "ada"})

    seen: dict[str, Any] = {}
    async with Client(
        server,
        mode=mode,
        logging_callback=on_log,
        log_level="debug",
        sampling_callback=on_sampling,
        elicitation_callback=on_elicitation,
    ) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name, _ in TOOLS + LEGACY_ONLY:
            seen[f"schema:{name}"] = tools[name].model_dump(by_alias=True, exclude_none=True)
        for name, arguments in TOOLS + (LEGACY_ONLY if mode == "legacy" else []):
            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(
                progress: float,
                total: float | None,
                message: str | None,
                sink: list[tuple[float, float | None, str | None]] = progress,
            ) -> None:
                sink.append((progress, total, message))

            result = await client.call_tool(name, arguments, progress_callback=on_progress)
            seen[name] = _strip_sdk_meta(wire(result))
            seen[f"progress:{name}"] = progress
        seen["logs"] = logs
        seen["asked"] = asked
        for uri in ("test://static-text", "test://static-binary", "test://template/42/data"):
            seen[uri] = _strip_sdk_meta((await client.read_resource(uri)).model_dump(by_alias=True, exclude_none=True))
        seen["prompts"] = [
            p.model_dump(by_alias=True, exclude_none=True)
            for p in (await client.list_prompts()).prompts
            if p.name.startswith("test_")
        ]
        for name, arguments in (("test_simple_prompt", {}), ("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})):
            seen[f"prompt:{name}"] = _strip_sdk_meta(
                (await client.get_prompt(name, arguments)).model_dump(by_alias=True, exclude_none=True)
            )
        completion = await client.complete(
            PromptReference(type="ref/prompt", name="test_prompt_with_arguments"), {"name": "arg1", "value": "pa"}
        )
        seen["completion"] = completion.completion.model_dump(by_alias=True, exclude_none=True)
        templates = (await client.list_resource_templates()).resource_templates
        seen["templates"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in templates if t.uri_template.startswith("test://")
        ]
    return seen


@pytest.mark.parametrize("mode", ERAS)
async def test_the_conformance_fixtures_behave_through_the_proxy_as_served_directly(mode: str) -> None:
    direct = await _session(fixtures, mode)
    upstream = UpstreamSpec(
        command=[sys.executable, str(REPO / "tests/proxy/servers/conformance_fixtures.py")],
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )
    proxied = await _session(ProxyServer(upstream, journal="memory://"), mode)
    assert direct["test_error_handling"]["isError"] is True
    assert len(direct["progress:test_tool_with_progress"]) == 3
    assert len(direct["logs"]) == 3
    if mode == "legacy":
        assert direct["asked"] == ["What is 2+2?", "Your name?"]
        assert "LLM response: 4" in direct["test_sampling"]["content"][0]["text"]
    assert direct["completion"]["values"] == ["paris", "park"]
    assert proxied == direct
