"""A durable call without a caller key that asks its client is refused, never replayed to another session.

A tool that elicits (or samples) while it runs has input beyond its arguments: the answers. Under
a key its caller did not give (derived from the arguments, `key_fields`, `key_fn`), a journaled
answer of session A would be replayed to session B's call with the same arguments, without
asking B. Unless the tool is registered `interactive=True` (such calls are never journaled), the
request to the client is refused before it is sent: the call answers `missing_key`, naming the
way out (a caller key, or `interactive=True`), and nothing is kept. With a caller key the call
asks and is journaled under that key, as the caller asserts it is one operation.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from mcp import Client
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_types import CallToolResult, CreateMessageRequestParams, CreateMessageResult, ElicitResult, TextContent
from pydantic import BaseModel

from mcp_durable import DurableServer, ToolPolicy
from tests.helpers import first_text, key_meta, meta_of


class Confirm(BaseModel):
    answer: str


class Sessions:
    """The answers each client session gave when asked, in order."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def elicitation(self, answer: str) -> Any:
        async def elicit(context: Any, params: Any) -> ElicitResult:
            self.asked.append(answer)
            return ElicitResult(action="accept", content={"answer": answer})

        return elicit

    def sampling(self, answer: str) -> Any:
        async def sample(context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
            self.asked.append(answer)
            return CreateMessageResult(role="assistant", content=TextContent(type="text", text=answer), model="m")

        return sample


def booking_server(runs: list[str]) -> DurableServer:
    server = DurableServer("booking", journal="memory://")

    @server.tool(durable=ToolPolicy(key="derived"))
    async def book(destination: str, ctx: Context) -> str:
        """Asks its user in its body: nothing at registration can see it."""
        confirmed = await ctx.elicit(f"Book {destination}?", Confirm)
        assert isinstance(confirmed, AcceptedElicitation)
        runs.append(confirmed.data.answer)
        return confirmed.data.answer

    @server.tool(durable=ToolPolicy(key_fields=("topic",)))
    async def summarise(topic: str, ctx: Context) -> str:
        """Asks a model (sampling) under a key made of its fields."""
        sampled = await ctx.session.create_message([], max_tokens=10)
        assert isinstance(sampled.content, TextContent)
        runs.append(sampled.content.text)
        return sampled.content.text

    return server


def refused(result: CallToolResult) -> bool:
    error = meta_of(result).get("mcp-durable/error") or {}
    return bool(result.is_error) and error.get("error") == "missing_key" and "interactive=True" in error["message"]


async def test_an_elicitation_without_a_caller_key_is_refused_in_each_session_and_nothing_is_kept() -> None:
    runs: list[str] = []
    sessions = Sessions()
    server = booking_server(runs)
    answers = {}
    for session in ("A", "B"):
        async with Client(server, mode="legacy", elicitation_callback=sessions.elicitation(session)) as client:
            answers[session] = await client.call_tool("book", {"destination": "Oslo"})
    assert refused(answers["A"]) and refused(answers["B"]), [first_text(a) for a in answers.values()]
    assert "mcp-durable/replayed" not in meta_of(answers["B"])  # B is not answered with A's record
    assert "'book'" in first_text(answers["A"]) and "idempotency key" in first_text(answers["A"])
    assert sessions.asked == [] and runs == []  # refused before anything was asked


async def test_with_a_caller_key_the_call_asks_and_only_that_key_replays_it() -> None:
    runs: list[str] = []
    sessions = Sessions()
    server = booking_server(runs)
    args = {"destination": "Oslo"}
    async with Client(server, mode="legacy", elicitation_callback=sessions.elicitation("A")) as client:
        first = await client.call_tool("book", args, meta=key_meta("trip-A"))
    async with Client(server, mode="legacy", elicitation_callback=sessions.elicitation("B")) as client:
        own = await client.call_tool("book", args, meta=key_meta("trip-B"))
        again = await client.call_tool("book", args, meta=key_meta("trip-A"))  # the caller says: A's trip
    assert (first_text(first), first_text(own), first_text(again)) == ("A", "B", "A")
    assert meta_of(again)["mcp-durable/replayed"] is True and "mcp-durable/replayed" not in meta_of(own)
    assert sessions.asked == ["A", "B"] and runs == ["A", "B"]


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # sampling, as 2025-11-25 has it
async def test_sampling_under_a_key_of_the_tools_fields_is_refused_too() -> None:
    runs: list[str] = []
    sessions = Sessions()
    server = booking_server(runs)
    async with Client(server, mode="legacy", sampling_callback=sessions.sampling("A")) as client:
        plain = await client.call_tool("summarise", {"topic": "tides"})
        keyed = await client.call_tool("summarise", {"topic": "tides"}, meta=key_meta("t-1"))
    assert refused(plain) and first_text(keyed) == "A"
    assert sessions.asked == ["A"] and runs == ["A"]


class Trip(BaseModel):
    answer: str


def ask() -> Elicit[Trip]:
    return Elicit("Book it?", Trip)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_parameter_resolved_from_the_client_without_a_caller_key_is_refused_in_both_generations(
    mode: str,
) -> None:
    # 2025-11-25 asks with an elicitation request; 2026-07-28 with an `input_required` answer.
    runs: list[str] = []
    sessions = Sessions()
    server = DurableServer("booking", journal="memory://")

    @server.tool(durable=ToolPolicy(key="derived"))
    async def book(destination: str, confirm: Annotated[Trip, Resolve(ask)]) -> str:
        runs.append(confirm.answer)
        return confirm.answer

    answers = []
    for session in ("A", "B"):
        async with Client(server, mode=mode, elicitation_callback=sessions.elicitation(session)) as client:
            answers.append(await client.call_tool("book", {"destination": "Oslo"}))
    assert all(refused(a) for a in answers), [first_text(a) for a in answers]
    assert runs == [] and sessions.asked == []
