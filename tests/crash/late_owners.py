"""What the late-owner tests share (test_partition.py, test_replicas_stall.py).

A late owner is a replica that claimed a call, then stopped being heard (cut off from the
journal, or stopped) for longer than its lease, while another replica took the call over; it
comes back later and tries to go on. These helpers drive the target `servers/late_owner.py`
and read what happened from the journal and the downstream systems, never from the replicas:

- `Hold`: the hold files of one replica (where its tool waits, and the markers it writes);
- `until(condition, what)`: poll a condition, failing with `what` after a bound;
- `reading(url)`: the journal, opened in the test process (`PostgresJournal`), to read records;
- `lease_run_out(journal, identity)`: wait until the stored lease of a PENDING record has passed;
- `Background`: a call in flight on a replica, answered whenever its replica gets round to it;
- `recorded(record)`, `refusal_code(result)`, `assert_late_answer_is_recorded(answer, record)`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup
from mcp import Client
from mcp.types import CallToolResult

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, create_journal
from tests.helpers import key_meta, meta_of

TARGET = "tests/crash/servers/late_owner.py"
PRINCIPAL = "local"  # the principal of every call over unauthenticated HTTP
SUPERSEDED = "mcp-durable/superseded"
REFUSAL = "mcp-durable/error"


@dataclass(frozen=True)
class Hold:
    """The hold point of one replica's tools: `env` to serve it with, `release()` to let it go on."""

    path: Path

    @classmethod
    def under(cls, directory: Path, replica: str) -> Hold:
        return cls(directory / f"{replica}.hold")

    @property
    def env(self) -> dict[str, str]:
        return {"HOLD_FILE": str(self.path)}

    def reached(self) -> bool:
        """Whether a tool has arrived at the hold point (and made its effect first, if it does)."""
        return self.path.with_name(self.path.name + ".reached").exists()

    def left(self) -> str | None:
        """How the tool left the hold point: `released`, `stopped: …` (its run cancelled), None yet."""
        marker = self.path.with_name(self.path.name + ".left")
        return marker.read_text() if marker.exists() else None

    def release(self) -> None:
        self.path.touch()


async def until(condition: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    try:
        with anyio.fail_after(timeout):
            while True:
                held = condition()
                if not isinstance(held, bool):
                    held = await held
                if held:
                    return
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}") from None


@asynccontextmanager
async def reading(url: str) -> AsyncIterator[Journal]:
    """The journal at `url`, opened here (not through any replica) for reading records."""
    journal = create_journal(url)
    await journal.open()
    try:
        yield journal
    finally:
        await journal.aclose()


async def record_of(journal: Journal, identity: CallIdentity) -> CallRecord:
    record = await journal.get(identity)
    assert record is not None, f"no record of {identity}"
    return record


async def lease_run_out(journal: Journal, identity: CallIdentity) -> CallRecord:
    """Wait until the record of `identity` is PENDING with its stored lease passed; return it."""
    seen: list[CallRecord] = []

    async def passed() -> bool:
        record = await record_of(journal, identity)
        seen[:] = [record]
        return record.state == CallState.PENDING and (record.lease_until or 0.0) < time.time()

    await until(passed, f"the lease of {identity} to run out")
    return seen[0]


@dataclass
class Background:
    """One call sent to a replica in the background; `answer` once it is answered (or `failure`)."""

    answer: CallToolResult | None = None
    failure: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    def start(cls, group: TaskGroup, url: str, tool: str, arguments: dict[str, Any], key: str) -> Background:
        call = cls()

        async def send() -> None:
            try:
                async with Client(url) as client:
                    call.answer = await client.call_tool(tool, arguments, meta=key_meta(key))
            except Exception as exc:  # noqa: BLE001 - kept for the assertions (a dropped connection)
                call.failure = exc
            finally:
                call.done.set()

        group.start_soon(send)
        return call

    async def wait(self, what: str, timeout: float = 15.0) -> CallToolResult | None:
        """The answer, once it has come (None if the call failed: see `failure`)."""
        await until(self.done.is_set, what, timeout)
        return self.answer


async def call(url: str, tool: str, arguments: dict[str, Any], key: str) -> CallToolResult:
    """One call, answered before this returns."""
    async with Client(url) as client:
        return await client.call_tool(tool, arguments, meta=key_meta(key))


def recorded(record: CallRecord) -> Any:
    """The structured result the journal keeps for `record` (None when it keeps no result)."""
    if record.result is None:
        return None
    return orjson.loads(record.result).get("structuredContent")


def refusal_code(result: CallToolResult | None) -> str | None:
    """The refusal's code (`in_doubt`, …) of an error result, else None."""
    if result is None or not result.is_error:
        return None
    refusal = meta_of(result).get(REFUSAL)
    return refusal.get("error") if isinstance(refusal, dict) else None


def describe(result: CallToolResult | None) -> Any:
    """A result as the assertion messages show it."""
    if result is None:
        return None
    return {
        "is_error": result.is_error,
        "structured": result.structured_content,
        "meta": result.meta,
        "text": [getattr(c, "text", None) for c in result.content],
    }


def assert_late_answer_is_recorded(answer: CallToolResult | None, record: CallRecord) -> None:
    """The late owner's caller got an error, or the recorded outcome marked superseded — never
    a result of its own that the journal does not hold (None: the call got no answer)."""
    if answer is None or answer.is_error:
        return
    assert record.state.is_final, (
        f"the late owner answered a result while the journal holds none: {describe(answer)}, record {record.state}"
    )
    assert answer.structured_content == recorded(record), (
        f"the late owner answered its own result, not the recorded one: {describe(answer)} vs {recorded(record)}"
    )
    assert meta_of(answer).get(SUPERSEDED) is True, f"a late owner's answer not marked superseded: {describe(answer)}"
