"""What users asked for, through the in-memory client in both eras: fingerprint fields, key
`_meta` names of other protocols, and interactive tools whose elicited answers never replay to
another session."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from mcp import Client
from mcp.server.mcpserver import Elicit, Resolve
from mcp_types import ElicitResult
from pydantic import BaseModel

from mcp_durable import KEY_META, ConfigError, DurableServer, ToolPolicy
from tests.helpers import key_meta, meta_of, request_meta

MODES = ["legacy", "auto"]


def error_of(result: Any) -> str:
    assert result.is_error, result
    refusal = (result.meta or {}).get("mcp-durable/error") or result.structured_content
    return str(refusal["error"])


# -- fingerprint fields -----------------------------------------------------------------------------


def _refunds(runs: list[str], policy: ToolPolicy) -> DurableServer:
    server = DurableServer("fingerprints", journal="memory://")

    @server.tool(durable=policy)
    def refund(order_id: str, amount_cents: int, reason: str = "") -> dict[str, Any]:
        runs.append(reason)
        return {"order_id": order_id, "amount_cents": amount_cents, "reason": reason}

    return server


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "policy",
    [
        ToolPolicy(key="derived", fingerprint_exclude=("reason",)),
        ToolPolicy(key="derived", fingerprint_fields=("order_id", "amount_cents")),
    ],
    ids=["exclude", "fields"],
)
async def test_a_reworded_free_text_argument_replays_and_a_changed_amount_is_still_key_reuse(
    mode: str, policy: ToolPolicy
) -> None:
    runs: list[str] = []
    server = _refunds(runs, policy)
    first_args = {"order_id": "O-1", "amount_cents": 500, "reason": "customer asked"}
    reworded = {**first_args, "reason": "the customer asked for a refund"}
    async with Client(server, mode=mode) as client:
        first = await client.call_tool("refund", first_args, meta=key_meta("r-1"))
        again = await client.call_tool("refund", reworded, meta=key_meta("r-1"))
        other = await client.call_tool("refund", {**first_args, "amount_cents": 900}, meta=key_meta("r-1"))
        # Without a caller key the derived key leaves the reason out too.
        derived = await client.call_tool("refund", {**first_args, "order_id": "O-2"})
        derived_again = await client.call_tool("refund", {**reworded, "order_id": "O-2"})
    assert meta_of(again)["mcp-durable/replayed"] is True and again.structured_content == first.structured_content
    assert error_of(other) == "key_reuse"
    assert meta_of(derived_again)["mcp-durable/replayed"] is True
    assert meta_of(derived_again)["mcp-durable/key"] == meta_of(derived)["mcp-durable/key"]
    assert runs == ["customer asked", "customer asked"]  # O-1 once, O-2 once


async def test_without_fingerprint_fields_a_reworded_argument_is_key_reuse() -> None:
    server = _refunds([], ToolPolicy())
    async with Client(server) as client:
        await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 5, "reason": "a"}, meta=key_meta("k"))
        reworded = await client.call_tool(
            "refund", {"order_id": "O-1", "amount_cents": 5, "reason": "b"}, meta=key_meta("k")
        )
    assert error_of(reworded) == "key_reuse"


@pytest.mark.parametrize("setting", ["fingerprint_fields", "fingerprint_exclude"])
def test_a_fingerprint_name_that_is_not_an_argument_is_refused_at_registration(setting: str) -> None:
    server = DurableServer("typo", journal="memory://")
    fields: dict[str, Any] = {setting: ("reson",)}  # a parametrized field name, so typed loosely
    with pytest.raises(ConfigError, match="reson"):
        server.add_tool(lambda order_id, reason="": order_id, name="refund", durable=ToolPolicy(**fields))
    assert "refund" not in server.policies and server._tool_manager.get_tool("refund") is None


# -- key locations ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_key_in_another_protocols_meta_name_is_used_after_our_own(mode: str) -> None:
    runs: list[str] = []
    server = DurableServer("commerce", journal="memory://")

    @server.tool(durable=ToolPolicy(key_meta=("idempotency_key", "idempotencyKey"), key="required"))
    def checkout(cart: str) -> dict[str, Any]:
        runs.append(cart)
        return {"cart": cart, "run": len(runs)}

    async with Client(server, mode=mode) as client:
        theirs = await client.call_tool("checkout", {"cart": "c1"}, meta=request_meta({"idempotency_key": "ck-1"}))
        again = await client.call_tool("checkout", {"cart": "c1"}, meta=request_meta({"idempotency_key": "ck-1"}))
        second_name = await client.call_tool("checkout", {"cart": "c1"}, meta=request_meta({"idempotencyKey": "ck-1"}))
        ours_first = await client.call_tool(
            "checkout", {"cart": "c1"}, meta=request_meta({KEY_META: "ours-1", "idempotency_key": "ck-1"})
        )
        none = await client.call_tool("checkout", {"cart": "c1"}, meta=request_meta({"other": "ck-1"}))
    assert meta_of(theirs)["mcp-durable/key"] == "ck-1" and meta_of(again)["mcp-durable/replayed"] is True
    assert meta_of(second_name)["mcp-durable/key"] == "ck-1" and meta_of(second_name)["mcp-durable/replayed"] is True
    assert meta_of(ours_first)["mcp-durable/key"] == "ours-1" and "mcp-durable/replayed" not in meta_of(ours_first)
    assert error_of(none) == "missing_key"
    assert runs == ["c1", "c1"]


# -- interactive tools ----------------------------------------------------------------------------------


class Confirm(BaseModel):
    answer: str


def ask() -> Elicit[Confirm]:
    return Elicit("Book it?", Confirm)


def _booking(runs: list[str], policy: ToolPolicy) -> DurableServer:
    server = DurableServer("booking", journal="memory://")

    @server.tool(durable=policy)
    async def book(destination: str, confirm: Annotated[Confirm, Resolve(ask)]) -> dict[str, Any]:
        runs.append(confirm.answer)
        return {"destination": destination, "answer": confirm.answer}

    return server


def _answering(answer: str) -> Any:
    async def elicit(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={"answer": answer})

    return elicit


@pytest.mark.parametrize("mode", MODES)
async def test_an_interactive_tool_never_replays_one_sessions_elicited_answer_to_another(mode: str) -> None:
    runs: list[str] = []
    server = _booking(runs, ToolPolicy(interactive=True))
    answers = {}
    for session in ("yes from session 1", "no from session 2"):
        async with Client(server, mode=mode, elicitation_callback=_answering(session)) as client:
            answers[session] = await client.call_tool("book", {"destination": "Oslo"})
    assert [a.structured_content["answer"] for a in answers.values()] == list(answers)
    assert all(not (a.meta or {}).get("mcp-durable/replayed") for a in answers.values())
    assert runs == list(answers)
    async with Client(server, mode=mode) as client:
        (tool,) = (await client.list_tools()).tools
    assert not (tool.annotations and tool.annotations.idempotent_hint)


@pytest.mark.parametrize("mode", MODES)
async def test_an_interactive_tool_called_with_a_caller_key_is_deduplicated_under_that_key(mode: str) -> None:
    runs: list[str] = []
    server = _booking(runs, ToolPolicy(interactive=True))
    async with Client(server, mode=mode, elicitation_callback=_answering("yes")) as client:
        first = await client.call_tool("book", {"destination": "Oslo"}, meta=key_meta("trip-1"))
    async with Client(server, mode=mode, elicitation_callback=_answering("no")) as client:
        again = await client.call_tool("book", {"destination": "Oslo"}, meta=key_meta("trip-1"))
    assert meta_of(again)["mcp-durable/replayed"] is True and again.structured_content == first.structured_content
    assert runs == ["yes"]


@pytest.mark.parametrize("mode", MODES)
async def test_without_interactive_a_derived_key_call_that_asks_its_client_is_refused_not_replayed(mode: str) -> None:
    # What `interactive=True` declares: without it, a call keyed by its arguments that asks its
    # client is refused (missing_key) and released, in every session, never answered with another's.
    runs: list[str] = []
    server = _booking(runs, ToolPolicy(key="derived"))
    for session in ("yes", "no"):
        async with Client(server, mode=mode, elicitation_callback=_answering(session)) as client:
            last = await client.call_tool("book", {"destination": "Oslo"})
        assert last.is_error and meta_of(last)["mcp-durable/error"]["error"] == "missing_key"
    assert runs == []


def test_registering_a_tool_that_resolves_input_from_the_client_without_interactive_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _booking([], ToolPolicy(key="derived"))
    assert "interactive=True" in caplog.text
    caplog.clear()
    _booking([], ToolPolicy(interactive=True))
    assert "interactive=True" not in caplog.text
