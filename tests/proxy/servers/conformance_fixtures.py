"""A plain `MCPServer` with the MCP conformance suite's server fixtures (its tool, resource and
prompt names), as the upstream whose answers the proxy must pass through unchanged.

It serves every fixture of the 0.1.16 suite's server scenarios, pending ones included
(tests/conformance/): a description on each tool and prompt, `logging/setLevel`,
`resources/subscribe` and `resources/unsubscribe` (of `test://watched-resource`), the SEP-1034 and
SEP-1330 elicitation tools, `json_schema_2020_12_tool` and `test_reconnection` (SEP-1699). None of
the tools is annotated idempotent, so behind the proxy every one is a pass-through tool.
"""

from __future__ import annotations

import base64
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp_types import (
    AudioContent,
    Completion,
    ElicitRequestedSchema,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    PromptReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel

from mcp_durable.server.sdk_internals import lowlevel_server, registered_tool

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
    """Returns an image content block."""
    return [ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png")]


@server.tool()
def test_audio_content() -> list[Any]:
    """Returns an audio content block."""
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
    """Returns an embedded resource."""
    return [_embedded()]


@server.tool()
def test_multiple_content_types() -> list[Any]:
    """Returns text, an image and an embedded resource."""
    return [
        TextContent(type="text", text="Multiple content types test:"),
        ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png"),
        _embedded(),
    ]


@server.tool()
async def test_tool_with_logging(ctx: Context[Any, Any]) -> str:
    """Sends three log messages before it answers."""
    for step in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(step)
    return "Tool with logging executed successfully"


@server.tool()
async def test_tool_with_progress(ctx: Context[Any, Any]) -> str:
    """Reports progress three times before it answers."""
    for value in (0, 50, 100):
        await ctx.report_progress(value, 100, f"at {value}")
    return "Tool with progress executed successfully"


@server.tool()
def test_error_handling() -> str:
    """Answers with an error result."""
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
    """Asks the client for a sampling completion of `prompt`."""
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))], max_tokens=100
    )
    content = result.content
    return f"LLM response: {content.text if isinstance(content, TextContent) else content}"


class Answer(BaseModel):
    username: str


@server.tool()
async def test_elicitation(message: str, ctx: Context[Any, Any]) -> str:
    """Asks the client for a username."""
    result = await ctx.elicit(message=message, schema=Answer)
    return f"User response: action={result.action}, content={getattr(result, 'data', None)}"


#: SEP-1034: a default for each primitive type.
DEFAULTS_SCHEMA: ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
}
#: SEP-1330: the five enum forms.
ENUMS_SCHEMA: ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


async def _elicit_raw(ctx: Context[Any, Any], message: str, schema: ElicitRequestedSchema) -> str:
    # The session's form request with the schema as written: `ctx.elicit` renders a pydantic model,
    # which cannot say `enumNames` or a titled multi-select.
    result = await ctx.session.elicit_form(message=message, requested_schema=schema, related_request_id=ctx.request_id)
    return f"Elicitation completed: action={result.action}, content={result.content}"


@server.tool()
async def test_elicitation_sep1034_defaults(ctx: Context[Any, Any]) -> str:
    """Asks the client for a form whose fields all have defaults (SEP-1034)."""
    return await _elicit_raw(ctx, "Please provide user information", DEFAULTS_SCHEMA)


@server.tool()
async def test_elicitation_sep1330_enums(ctx: Context[Any, Any]) -> str:
    """Asks the client for a form with every enum form (SEP-1330)."""
    return await _elicit_raw(ctx, "Please select values using different enum schema types", ENUMS_SCHEMA)


@server.tool()
async def test_reconnection(ctx: Context[Any, Any]) -> str:
    """Closes its SSE stream mid-call, for the client to resume (SEP-1699), then answers. Served here
    without an event store, the stream is not closed and the call just goes on."""
    await ctx.info("Before disconnect")
    await ctx.close_sse_stream()
    await ctx.info("After reconnect")
    return "Reconnection test completed"


@server.tool()
def json_schema_2020_12_tool(name: str | None = None, address: dict[str, str] | None = None) -> str:
    """Tool with JSON Schema 2020-12 features."""
    return f"name={name} address={address}"


# The suite checks that `$schema`, `$defs` and `additionalProperties` reach the client as written.
_json_schema_tool = registered_tool(server, "json_schema_2020_12_tool")
assert _json_schema_tool is not None
_json_schema_tool.parameters = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


@server.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(RED_PIXEL_PNG)


@server.resource("test://watched-resource", mime_type="text/plain")
def watched() -> str:
    return "Watched resource content"


@server.resource("test://template/{id}/data", mime_type="application/json")
def template_data(id: str) -> str:
    return f'{{"id": "{id}", "templateTest": true, "data": "Data for ID: {id}"}}'


@server.prompt()
def test_simple_prompt() -> str:
    """A prompt without arguments."""
    return "This is a simple prompt for testing."


@server.prompt()
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with two required arguments."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.prompt()
def test_prompt_with_embedded_resource(resourceUri: str) -> list[Any]:
    """A prompt with an embedded resource (`resourceUri`: the suite's argument name)."""
    return [
        UserMessage(
            content=EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                ),
            )
        ),
        UserMessage(content="Please process the embedded resource above."),
    ]


@server.prompt()
def test_prompt_with_image() -> list[Any]:
    """A prompt with an image."""
    return [
        UserMessage(content=ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png")),
        UserMessage(content="Please analyze the image above."),
    ]


@server.completion()  # type: ignore[untyped-decorator,no-untyped-call]  # mcp leaves this decorator untyped
async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
    if isinstance(ref, PromptReference) and ref.name == "test_prompt_with_arguments":
        values = [v for v in ("paris", "park", "lisbon") if v.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)
    return None


#: The URIs subscribed to (the suite subscribes and unsubscribes; nothing here changes them).
SUBSCRIBED: set[str] = set()


async def _subscribe(ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
    SUBSCRIBED.add(str(params.uri))
    return EmptyResult()


async def _unsubscribe(ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams) -> EmptyResult:
    SUBSCRIBED.discard(str(params.uri))
    return EmptyResult()


async def _set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
    return EmptyResult()  # accepted: the tools log at info, which every level the suite sets lets through


# MCPServer has no decorator for these three; the handlers declare `logging` and `resources.subscribe`.
lowlevel_server(server).add_request_handler("resources/subscribe", SubscribeRequestParams, _subscribe)
lowlevel_server(server).add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, _unsubscribe)
lowlevel_server(server).add_request_handler("logging/setLevel", SetLevelRequestParams, _set_level)


if __name__ == "__main__":
    server.run()
