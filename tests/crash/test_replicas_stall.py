"""A stalled owner: a replica stopped (SIGSTOP) inside a call, taken over, then resumed (SIGCONT).

Two `mcp-durable serve` replicas share one Postgres journal (a scratch schema). r1 runs a
`retry` tool and is stopped with SIGSTOP at the tool's hold point, *before* the effect: a
process paused by the scheduler, a stop-the-world pause, a VM migration. Its lease (1 s) runs
out; the same key is sent to r2, which takes the call over and runs the tool. Then r1 is let go
on (SIGCONT): its run must stop as soon as it runs again, so it never makes the effect, and
whatever it answers its caller must not overwrite r2's result. The downstream is the outbox,
which does not honour keys, so an effect made twice would show as a second mail.

With durable steps: r1 is stopped between two steps; r2 takes over (the same run: it replays
the first step and runs the second); once resumed, r1 must not begin the second step, and the
run's step log has exactly one entry per index.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult

from mcp_durable.demo.outbox import Outbox
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal
from mcp_durable.keys import step_key
from tests.crash.late_owners import (
    PRINCIPAL,
    TARGET,
    Background,
    Hold,
    assert_late_answer_is_recorded,
    call,
    describe,
    lease_run_out,
    reading,
    record_of,
    recorded,
    until,
)
from tests.crash.replicas import serve_http_together
from tests.helpers import ServedHttp

pytestmark = pytest.mark.postgres


async def test_a_stalled_owner_resumed_after_a_take_over_makes_no_effect_and_overwrites_nothing(
    tmp_path: Path, replicas_journal: str
) -> None:
    key = "stall-plain"
    arguments: dict[str, Any] = {"order_id": "O-8", "effect_first": False}
    async with _replicas(tmp_path, replicas_journal) as (r1, r2, hold, store, outbox):
        seen = await _stall_and_take_over(r1, r2, hold, store, "outbox_retry", arguments, key)

    senders = [mail["body"].removeprefix("sent by ") for mail in outbox.mails(key)]
    assert senders == ["r2"], f"mails sent under the key, by replica: {senders}; {seen}"
    _assert_r2_result_stands(seen)


async def test_a_stalled_owner_resumed_between_durable_steps_does_not_begin_the_next_step(
    tmp_path: Path, replicas_journal: str
) -> None:
    key = "stall-steps"
    arguments: dict[str, Any] = {"order_id": "O-9"}
    async with _replicas(tmp_path, replicas_journal) as (r1, r2, hold, store, outbox):
        seen = await _stall_and_take_over(r1, r2, hold, store, "outbox_steps", arguments, key)
        steps = await store.entries(process_id=f"steps/{seen.record.run_id}")

    def senders(step: str) -> list[str]:
        mails = outbox.mails(step_key(PRINCIPAL, key, step))
        return [mail["body"].removeprefix("sent by ") for mail in mails]

    observed = {
        "first": senders("first"),
        "second": senders("second"),
        "step log": [entry.data["index"] for entry in steps],
    }
    # The first step's mail is r1's, made before the stop and replayed by r2; the second is r2's.
    assert observed == {"first": ["r1"], "second": ["r2"], "step log": [0, 1]}, seen
    _assert_r2_result_stands(seen)


@dataclass
class Seen:
    """What a stall left: r2's answer, r1's late answer (or failure), the journal's record."""

    answer_r2: CallToolResult
    answer_r1: CallToolResult | None
    failure_r1: BaseException | None
    left_r1: str | None
    record: CallRecord

    def __repr__(self) -> str:
        return (
            f"Seen(r2={describe(self.answer_r2)}, r1={describe(self.answer_r1)}, failure_r1={self.failure_r1!r}, "
            f"left_r1={self.left_r1!r}, record={self.record})"
        )


def _assert_r2_result_stands(seen: Seen) -> None:
    """r2 answered its own run's result, the journal keeps it, and r1's caller saw no other."""
    assert seen.answer_r2 is not None and not seen.answer_r2.is_error, seen
    assert seen.record.state == CallState.COMPLETED, seen
    assert recorded(seen.record) == seen.answer_r2.structured_content, f"r2's result was overwritten: {seen}"
    assert recorded(seen.record)["by"] == "r2", seen
    assert seen.failure_r1 is None, seen
    assert_late_answer_is_recorded(seen.answer_r1, seen.record)


@asynccontextmanager
async def _replicas(
    tmp_path: Path, journal: str
) -> AsyncIterator[tuple[ServedHttp, ServedHttp, Hold, Journal, Outbox]]:
    """r1 (held at its tools' hold point) and r2 on `journal`, the journal read here, the outbox."""
    outbox = Outbox(tmp_path / "outbox.db")
    stores = {"MAILER_OUTBOX": str(outbox.path), "PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}
    hold = Hold.under(tmp_path, "r1")
    with anyio.fail_after(60):
        async with (
            serve_http_together(
                (TARGET, journal, {**stores, **hold.env, "REPLICA_NAME": "r1"}),
                (TARGET, journal, {**stores, "REPLICA_NAME": "r2"}),
            ) as (r1, r2),
            reading(journal) as store,
        ):
            with _resumed_at_exit(r1):  # a stopped process ignores SIGTERM: resume it before it is stopped
                yield r1, r2, hold, store, outbox


async def _stall_and_take_over(
    r1: ServedHttp, r2: ServedHttp, hold: Hold, store: Journal, tool: str, arguments: dict[str, Any], key: str
) -> Seen:
    """Stop r1 at its hold point, let r2 take the call over, resume r1; return what that left."""
    identity = CallIdentity(PRINCIPAL, tool, key)
    async with anyio.create_task_group() as group:
        on_r1 = Background.start(group, r1.url, tool, dict(arguments), key)
        await until(hold.reached, "r1's tool to reach its hold point")
        os.kill(r1.proc.pid, signal.SIGSTOP)
        await lease_run_out(store, identity)
        with anyio.fail_after(15):
            answer_r2 = await call(r2.url, tool, dict(arguments), key)
        hold.release()  # r1's tool would go on at once if it were let
        os.kill(r1.proc.pid, signal.SIGCONT)
        answer_r1 = await on_r1.wait("r1 to answer its caller once resumed")
    return Seen(answer_r2, answer_r1, on_r1.failure, hold.left(), await record_of(store, identity))


@contextmanager
def _resumed_at_exit(served: ServedHttp) -> Iterator[None]:
    try:
        yield
    finally:
        if served.proc.poll() is None:
            os.kill(served.proc.pid, signal.SIGCONT)
