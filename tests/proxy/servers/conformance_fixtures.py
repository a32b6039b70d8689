"""A plain `MCPServer` with the MCP conformance suite's server fixtures (its tool, resource and
prompt names), as the upstream whose answers the proxy must pass through unchanged.

None of the tools is annotated idempotent, so behind the proxy every one is a pass-through tool.
"""

from __future__ import annotations

import base64
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    AudioContent,
    Completion,
    EmbeddedResource,
    ImageContent,
    PromptReference,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)
from pydantic import BaseModel

RED_PIXEL_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108020000009077"
        "53de0000000c4944415408d763f8cfc000000301010018dd8db00000000049454e44ae426082"
    )
).decode()
SILENT_WAV = base64.b64encode(
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00@\x1f\x00\x00"
    b"\x80>\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00"
).decode()

server = MCPServer("conformance-fixtures")


@server.tool()
def test_simple_text() -> str:
    """Returns a simple text response."""
    return "This is a simple text response for testing."


@server.tool()
def test_image_content() -> list[Any]:
    return [ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png")]


@server.tool()
def test_audio_content() -> list[Any]:
    return [AudioContent(type="audio", data=SILENT_WAV, mime_type="audio/wav")]


def _embedded() -> EmbeddedResource:
    return EmbeddedResource(
        type="resource",
        resource=TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        ),
    )


@server.tool()
def test_embedded_resource() -> list[Any]:
    return [_embedded()]


@server.tool()
def test_multiple_content_types() -> list[Any]:
    return [
        TextContent(type="text", text="Multiple content types test:"),
        ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png"),
        _embedded(),
    ]


@server.tool()
async def test_tool_with_logging(ctx: Context[Any, Any]) -> str:
    for step in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(step)
    return "Tool with logging executed successfully"


@server.tool()
async def test_tool_with_progress(ctx: Context[Any, Any]) -> str:
    for value in (0, 50, 100):
        await ctx.report_progress(value, 100, f"at {value}")
    return "Tool with progress executed successfully"


@server.tool()
def test_error_handling() -> str:
    raise ToolError("This tool intentionally returns an error for testing")


class Weather(BaseModel):
    temperature: float
    conditions: str


@server.tool()
def test_structured_output(city: str) -> Weather:
    """Structured content with an output schema."""
    return Weather(temperature=21.5, conditions=f"sunny in {city}")


@server.tool()
async def test_sampling(prompt: str, ctx: Context[Any, Any]) -> str:
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))], max_tokens=100
    )
    content = result.content
    return f"LLM response: {content.text if isinstance(content, TextContent) else content}"


class Answer(BaseModel):
    username: str


@server.tool()
async def test_elicitation(message: str, ctx: Context[Any, Any]) -> str:
    result = await ctx.elicit(message=message, schema=Answer)
    return f"User response: action={result.action}, content={getattr(result, 'data', None)}"


@server.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(RED_PIXEL_PNG)


@server.resource("test://template/{id}/data", mime_type="application/json")
def template_data(id: str) -> str:
    return f'{{"id": "{id}", "templateTest": true, "data": "Data for ID: {id}"}}'


@server.prompt()
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt()
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.completion()  # type: ignore[untyped-decorator,no-untyped-call]  # mcp leaves this decorator untyped
async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
    if isinstance(ref, PromptReference) and ref.name == "test_prompt_with_arguments":
        values = [v for v in ("paris", "park", "lisbon") if v.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)
    return None


if __name__ == "__main__":
    server.run()
