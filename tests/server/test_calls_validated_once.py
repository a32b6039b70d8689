"""A durable call's arguments are validated once, and the tool gets exactly the values its key
was derived from (issue 15: the SDK used to validate them a second time before the function)."""

from __future__ import annotations

import uuid
from typing import Annotated

import orjson
import pytest
from mcp import Client
from pydantic import AfterValidator, Field

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallState
from tests.helpers import first_text

VALIDATIONS: list[int] = []


def counted(n: int) -> int:
    VALIDATIONS.append(n)
    return n


async def stamp(
    n: Annotated[int, AfterValidator(counted)], nonce: str = Field(default_factory=lambda: uuid.uuid4().hex)
) -> str:
    """Returns the nonce it was given (drawn by validation when the caller gave none)."""
    return nonce


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_arguments_are_validated_once_and_the_tool_gets_the_journaled_values(mode: str) -> None:
    VALIDATIONS.clear()
    server = DurableServer("validated-once", journal="memory://")
    server.add_tool(stamp, durable=ToolPolicy(idempotent=True, key_fields=("n",)))
    async with Client(server, mode=mode) as client:
        first = await client.call_tool("stamp", {"n": 7})
        nonce = first_text(first)
        again = await client.call_tool("stamp", {"n": 7, "nonce": nonce})
        bad = await client.call_tool("stamp", {"n": "seven"})
    assert VALIDATIONS == [7, 7]  # once per call: the run, then the repeat (which replays)
    assert first_text(again) == nonce and (again.meta or {}).get("mcp-durable/replayed")
    key = (first.meta or {})["mcp-durable/key"]
    record = await server.journal.get(CallIdentity("local", "stamp", key))
    assert record is not None and record.state == CallState.COMPLETED
    # The value the tool used is the one journaled with the call (validation drew it once).
    assert record.arguments is not None and orjson.loads(record.arguments)["nonce"] == nonce
    assert bad.is_error  # still refused by the SDK's own validation, before any claim
