"""A network partition, for real: one replica cut off from Postgres mid-call, then healed.

Two `mcp-durable serve` replicas share one Postgres journal (a scratch schema). Replica A
reaches Postgres through a forwarder in this process (`blackhole.BlackHole`); replica B
directly. A client calls a tool on A, which claims the call (committed) and runs it; the
forwarder then black-holes A's traffic: A's connections stay open, but nothing passes either
way, so A's lease renewals go unanswered and its lease (1 s) runs out in the journal while A
goes on. A client retries the same key on B, which finds the lease run out and applies the
tool's in-doubt policy. Then A's tool is let go on, the partition heals, and everything A sent
meanwhile (renewals, its outcome) reaches Postgres late.

For every in-doubt policy, with a downstream that honours keys (the payment ledger) and one
that does not (the outbox), in two timings:

- A made its effect before the partition (the danger window): `retry` runs the tool again on B,
  so one effect with the ledger and two with the outbox (the documented consequence of `retry`
  over a downstream that ignores keys); `reconcile` finds A's effect (one); `refuse` answers
  `in_doubt` on B (one, A's).
- A was cut off before its effect: once its lease has run out A starts nothing more, so it
  never makes its effect: B's run makes the only one (`retry`, `reconcile`), or none is made
  (`refuse`).

In every case A's late writes are rejected: the journal keeps B's outcome (or stays in doubt
under `refuse`), A's caller gets an error or that recorded outcome marked superseded, and no
result is overwritten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
from mcp.types import CallToolResult

from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.outbox import Outbox
from mcp_durable.journal import CallIdentity, CallRecord
from tests.crash.blackhole import BlackHole
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
    refusal_code,
    until,
)
from tests.crash.replicas import serve_http_together

pytestmark = pytest.mark.postgres

POLICIES = ["retry", "reconcile", "refuse"]
DOWNSTREAMS = ["ledger", "outbox"]


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
@pytest.mark.parametrize("policy", POLICIES)
async def test_an_owner_cut_off_after_its_effect_never_overwrites_the_outcome_recorded_without_it(
    tmp_path: Path, policy: str, downstream: str, replicas_journal: str
) -> None:
    seen = await _partition(tmp_path, replicas_journal, policy, downstream, effect_first=True)
    assert seen.summary() == _expected(downstream, policy, effect_first=True), seen
    _assert_nothing_overwritten(seen)


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
@pytest.mark.parametrize("policy", POLICIES)
async def test_an_owner_cut_off_before_its_effect_makes_none_once_its_lease_has_run_out(
    tmp_path: Path, policy: str, downstream: str, replicas_journal: str
) -> None:
    seen = await _partition(tmp_path, replicas_journal, policy, downstream, effect_first=False)
    assert seen.summary() == _expected(downstream, policy, effect_first=False), seen
    _assert_nothing_overwritten(seen)


def _expected(downstream: str, policy: str, *, effect_first: bool) -> dict[str, Any]:
    """What the downstream and the journal hold at the end, and what B answered (module docstring).

    `runs` are the replicas whose runs reach the effect: A's only when it made it before the cut
    (never after its lease ran out), B's when its policy runs the tool (`retry`, or `reconcile`
    finding nothing). The ledger makes one effect for any number of requests under one key;
    the outbox one per request.
    """
    if policy == "refuse":
        runs, answer_b, state, recorded_by = ["A"] if effect_first else [], "in_doubt", "in_doubt", None
    elif policy == "reconcile" and effect_first:
        runs, answer_b, state, recorded_by = ["A"], "B (reconciled)", "completed", "B (reconciled)"
    else:
        runs, answer_b, state, recorded_by = ["A", "B"] if effect_first else ["B"], "B", "completed", "B"
    return {
        "effects": min(len(runs), 1) if downstream == "ledger" else len(runs),
        "requests": len(runs),
        "senders": runs if downstream == "outbox" else None,
        "state": state,
        "recorded_by": recorded_by,
        "answer_b": answer_b,
    }


@dataclass
class Seen:
    """What one partition run left: the answers, the journal's record, the downstream's counts.

    `effects` and `requests` are what the downstream holds under the key; `senders` the
    replicas whose runs sent a mail (outbox; None for the ledger); `left_a` how A's tool left
    its hold point; `held` the bytes A sent into the partition, `delivered` those forwarded
    after the heal."""

    effects: int
    requests: int
    senders: list[str] | None
    record: CallRecord
    answer_a: CallToolResult | None
    failure_a: BaseException | None
    answer_b: CallToolResult
    left_a: str | None
    held: int
    delivered: int
    seconds: float
    stderr_a: str

    def summary(self) -> dict[str, Any]:
        """The observations `_expected` states: downstream counts, the record, B's answer."""
        kept = recorded(self.record) if self.record.state.is_final else None
        return {
            "effects": self.effects,
            "requests": self.requests,
            "senders": self.senders,
            "state": self.record.state.value,
            "recorded_by": None if kept is None else kept.get("by"),
            "answer_b": refusal_code(self.answer_b) or (self.answer_b.structured_content or {}).get("by"),
        }

    def __repr__(self) -> str:
        shown = {**self.__dict__, "answer_a": describe(self.answer_a), "answer_b": describe(self.answer_b)}
        return f"Seen({shown})"


def _assert_nothing_overwritten(seen: Seen) -> None:
    """B's result is the one the journal keeps, A's caller saw no other, A really spoke through the partition."""
    if not seen.answer_b.is_error:
        assert recorded(seen.record) == seen.answer_b.structured_content, f"B's result was overwritten: {seen}"
    assert seen.failure_a is None, seen
    assert_late_answer_is_recorded(seen.answer_a, seen.record)
    assert seen.held > 0 and seen.delivered > 0, f"A sent nothing through the partition: {seen}"


async def _partition(tmp_path: Path, journal: str, policy: str, downstream: str, *, effect_first: bool) -> Seen:
    """Run the scenario of the module docstring; return what it left (`Seen`)."""
    tool = f"{downstream}_{policy}"
    key = f"partition-{downstream}-{policy}"
    arguments = {"order_id": "O-7", "effect_first": effect_first}
    identity = CallIdentity(PRINCIPAL, tool, key)
    ledger, outbox = PaymentProvider(tmp_path / "ledger.db"), Outbox(tmp_path / "outbox.db")
    stores = {"PAYMENTS_LEDGER": str(ledger.path), "MAILER_OUTBOX": str(outbox.path)}
    hold = Hold.under(tmp_path, "a")
    parts = urlsplit(journal)
    started = time.monotonic()

    with anyio.fail_after(60), BlackHole(parts.hostname or "127.0.0.1", parts.port or 5432) as hole:
        async with (
            serve_http_together(
                (TARGET, _through(journal, hole.port), {**stores, **hold.env, "REPLICA_NAME": "A"}),
                (TARGET, journal, {**stores, "REPLICA_NAME": "B"}),
            ) as (a, b),
            reading(journal) as store,
            anyio.create_task_group() as group,
        ):
            try:
                on_a = Background.start(group, a.url, tool, arguments, key)
                await until(hold.reached, "A's tool to reach its hold point")
                hole.cut()
                await lease_run_out(store, identity)  # A's claim stands, unrenewed
                with anyio.fail_after(15):
                    answer_b = await call(b.url, tool, arguments, key)
                hold.release()
                await until(lambda: hold.left() is not None, "A's tool to leave its hold point")
                hole.heal()
                answer_a = await on_a.wait("A to answer its caller once healed")
                await until(hole.settled, "what A sent through the partition to be applied by Postgres")
                record = await record_of(store, identity)
                held, delivered = hole.held, hole.delivered_after_heal
                stderr_a = a.stderr()
            finally:
                hole.heal()  # however this ends, A can reach its journal to shut down

    if downstream == "ledger":
        requests = [r for r in ledger.requests() if r["idempotency_key"] == key]
        effects = [e for e in ledger.effects() if e["idempotency_key"] == key]
        senders = None
    else:
        requests = effects = outbox.mails(key)
        senders = [mail["body"].removeprefix("sent by ") for mail in effects]
    return Seen(
        effects=len(effects),
        requests=len(requests),
        senders=senders,
        record=record,
        answer_a=answer_a,
        failure_a=on_a.failure,
        answer_b=answer_b,
        left_a=hold.left(),
        held=held,
        delivered=delivered,
        seconds=round(time.monotonic() - started, 1),
        stderr_a=stderr_a[-2000:],
    )


def _through(url: str, port: int) -> str:
    """`url` with its host and port replaced by the forwarder's (user, database and query kept)."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
