"""A durable tool's per-call work done once (server/prevalidated.py): the function called with the
face's validated values (through `Tool.run`), a `str` result converted and dumped for the journal directly, and a
repeated request not validated again. Each answers exactly as the SDK's own path does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, cast

import orjson
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallState
from mcp_durable.server import prevalidated
from mcp_durable.server.prevalidated import pure_schema
from mcp_durable.server.results import dump_result
from tests.helpers import key_meta

IDEMPOTENT = ToolPolicy(idempotent=True, key="derived")
RUNS: list[str] = []


async def echo(text: str, times: int = 1) -> str:
    RUNS.append(text)
    return text * times


def shout(text: str) -> str:  # a sync tool: the SDK runs it in a worker thread
    return text.upper()


class Shipment(BaseModel):
    order: str
    items: list[int]


async def ship(order: str, items: list[int]) -> Shipment:
    return Shipment(order=order, items=items)


async def declines(text: str) -> str:
    raise ToolError(f"declined {text!r}")


async def crashes(text: str) -> str:
    raise RuntimeError("secret detail")


async def lies(text: str) -> str:
    return 42  # type: ignore[return-value]  # against its declared output: the SDK refuses it


async def with_context(text: str, ctx: Context) -> str:
    return f"{text}:{type(ctx).__name__}:{ctx.request_id is not None}"


TOOLS: list[Callable[..., Any]] = [echo, shout, ship, declines, crashes, lies, with_context]


def _servers() -> tuple[DurableServer, MCPServer]:
    durable = DurableServer("prepared", journal="memory://")
    plain = MCPServer("plain")
    for fn in TOOLS:
        durable.add_tool(fn, durable=IDEMPOTENT)
        plain.add_tool(fn)
    return durable, plain


def _wire(result: CallToolResult) -> dict[str, Any]:
    body: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    body.pop("_meta", None)
    return body


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("echo", {"text": 'é "q"\n', "times": 2}),
        ("shout", {"text": "abc"}),
        ("ship", {"order": "O-1", "items": [1, 2]}),
        ("declines", {"text": "x"}),
        ("crashes", {"text": "x"}),
        ("lies", {"text": "x"}),
        ("with_context", {"text": "x"}),
    ],
)
async def test_a_durable_tool_answers_as_the_same_tool_on_a_plain_server(
    mode: str, tool: str, arguments: dict[str, Any]
) -> None:
    durable, plain = _servers()
    async with Client(durable, mode=mode) as ours, Client(plain, mode=mode) as theirs:
        first = await ours.call_tool(tool, arguments, meta=key_meta("k-1"))
        again = await ours.call_tool(tool, arguments, meta=key_meta("k-1"))
        expected = await theirs.call_tool(tool, arguments)
    assert _wire(first) == _wire(expected)
    record = await durable.journal.get(CallIdentity("local", tool, "k-1"))
    assert record is not None
    if tool in ("crashes", "lies"):
        # An unexpected exception (and a result the output schema refuses) releases the claim.
        assert record.state == CallState.RELEASED
        assert "mcp-durable/replayed" not in (again.meta or {})
        assert "secret detail" not in str(first.content)
        return
    assert record.state == (CallState.FAILED if tool == "declines" else CallState.COMPLETED)
    assert (again.meta or {}).get("mcp-durable/replayed") is True
    assert _wire(again) == _wire(first)
    # What is journaled is the answer's own wire form, so a replay is byte-identical.
    assert record.result is not None and orjson.loads(record.result) == _wire(first)


async def test_a_str_tools_conversion_is_the_sdks_and_its_journal_json_the_sdks_dump() -> None:
    durable, plain = _servers()
    assert "echo" in durable._prepared  # prepared at registration: the face's conversion installed
    ours = durable._tool_manager.get_tool("echo").fn_metadata  # type: ignore[union-attr]
    theirs = plain._tool_manager.get_tool("echo").fn_metadata  # type: ignore[union-attr]
    assert "convert_result" in vars(ours) and "convert_result" not in vars(theirs)
    for text in ("", "a\u2028b", 'q "x"\n\u2713'):
        made: prevalidated.TextConversions = []
        token = prevalidated.validated_as({}, {}, made)
        try:
            converted = ours.convert_result(text)
        finally:
            prevalidated.done(token)
        sdk = theirs.convert_result(text)
        assert isinstance(sdk, CallToolResult) and converted == sdk
        assert made == [(converted, dump_result(sdk))]
    # Anything but a `str` goes to the SDK's conversion, its errors included.
    with pytest.raises(ValidationError):
        ours.convert_result(7)


async def test_a_str_tool_that_runs_another_inside_journals_its_own_result() -> None:
    durable = DurableServer("nested", journal="memory://")

    @durable.tool(durable=ToolPolicy(key="derived"))
    def inner(text: str) -> str:
        return "inner " + text

    @durable.tool(durable=ToolPolicy(key="derived"))
    async def outer(text: str, ctx: Context) -> str:
        inner_tool = durable._tool_manager.get_tool("inner")
        assert inner_tool is not None
        await inner_tool.run({"text": text}, ctx, convert_result=True)  # converted inside outer's run
        # A result made by the tool itself (the SDK passes it through): no text conversion of
        # outer's, so the only one made during its run is inner's — which is not outer's result.
        made = CallToolResult(
            content=[TextContent(type="text", text="outer " + text)], structured_content={"result": "outer " + text}
        )
        return cast(str, made)

    async with Client(durable) as client:
        first = await client.call_tool("outer", {"text": "x"}, meta=key_meta("k-1"))
        again = await client.call_tool("outer", {"text": "x"}, meta=key_meta("k-1"))
    assert first.structured_content == {"result": "outer x"}
    assert again.structured_content == {"result": "outer x"}
    assert (again.meta or {}).get("mcp-durable/replayed") is True
    record = await durable.journal.get(CallIdentity("local", "outer", "k-1"))
    assert record is not None and record.result is not None
    assert orjson.loads(record.result)["structuredContent"] == {"result": "outer x"}


async def test_a_repeated_request_is_answered_from_its_remembered_validation() -> None:
    RUNS.clear()
    durable, _ = _servers()
    prepared = durable._prepared["echo"]
    async with Client(durable) as client:
        answers = [await client.call_tool("echo", {"text": "r"}) for _ in range(3)]
        other = await client.call_tool("echo", {"text": "r", "times": 1})  # another request, the same call
        await client.call_tool("echo", {"text": "s"})
    assert RUNS == ["r", "s"]
    assert prepared.recall(orjson.dumps({"text": "r"})) is not None  # remembered at its first repeat
    assert prepared.recall(orjson.dumps({"text": "r", "times": 1})) is not None  # answered as a replay
    assert prepared.recall(orjson.dumps({"text": "s"})) is None  # a first call fills no memo
    meta = [a.meta or {} for a in answers]
    assert [m.get("mcp-durable/replayed") for m in meta] == [None, True, True]
    assert _wire(answers[2]) == _wire(answers[0])
    assert (other.meta or {}).get("mcp-durable/replayed") is True
    assert len({m["mcp-durable/key"] for m in [*meta, other.meta or {}]}) == 1


async def test_a_tool_registered_again_is_never_answered_from_the_old_validation() -> None:
    durable = DurableServer("again", journal="memory://")
    durable.add_tool(echo, durable=IDEMPOTENT)
    async with Client(durable) as client:
        for _ in range(2):
            await client.call_tool("echo", {"text": "r"})
        durable.remove_tool("echo")

        async def echo_int(text: int) -> str:  # same name, another argument type
            return str(text)

        durable.add_tool(echo_int, name="echo", durable=IDEMPOTENT)
        refused = await client.call_tool("echo", {"text": "r"})
    assert refused.is_error  # validated against the new signature, not recalled


SEEN: list[int] = []


def seen(n: int) -> int:
    SEEN.append(n)
    return n


async def counted(n: Annotated[int, AfterValidator(seen)]) -> str:
    return "ok"


async def test_a_validation_that_runs_code_is_never_remembered() -> None:
    SEEN.clear()
    durable = DurableServer("impure", journal="memory://")
    durable.add_tool(counted, durable=IDEMPOTENT)
    async with Client(durable) as client:
        for _ in range(3):
            await client.call_tool("counted", {"n": 1})
    assert SEEN == [1, 1, 1]  # validated on every request (a repeat too)
    assert durable._prepared["counted"].memo_key({"n": 1}) is None


def _schema(**fields: Any) -> Any:
    return type(
        "M",
        (BaseModel,),
        {
            "__annotations__": {k: v[0] for k, v in fields.items()},
            **{k: v[1] for k, v in fields.items() if v[1] is not ...},
        },
    )


class Nested(BaseModel):
    name: str
    tags: list[str] = []


class Validated(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def upper(cls, value: str) -> str:
        return value.upper()


class PostInit(BaseModel):
    name: str

    def model_post_init(self, context: Any, /) -> None:
        pass


@pytest.mark.parametrize(
    ("model", "pure"),
    [
        (_schema(n=(int, ...), s=(str, "x"), f=(float, 1.5)), True),
        (_schema(items=(list[Nested], ...), maybe=(dict[str, int] | None, None)), True),
        (_schema(n=(Annotated[int, AfterValidator(lambda n: n)], ...)), False),
        (_schema(nonce=(str, Field(default_factory=lambda: "x"))), False),
        (_schema(inner=(Validated, ...)), False),
        (_schema(inner=(PostInit, ...)), False),
    ],
)
def test_pure_schema_tells_validation_that_runs_no_code(model: Any, pure: bool) -> None:
    assert pure_schema(model.__pydantic_core_schema__) is pure
