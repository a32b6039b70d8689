"""Two executions of one key that meet other than by a crash: each defect of issue 31, one test.

Two engines share one journal (the memory journal object, as two instances of one process share
it; SQLite files where a lease must really be renewed) and one controlled clock, so "owner A
stalls past its lease" is: A's tool waits at a gate while the clock moves past A's lease, B
takes the record over, then A's gate opens. Every test here failed on the engine before fencing
(commit 32327fa): the failure it guarded against is named in each docstring.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.engine import Runner
from mcp_durable.errors import CallCancelledError, DurableError, InDoubtError, JournalError, TaskCancelledError
from mcp_durable.journal import CallIdentity, CallState, Journal, Reason, create_journal
from mcp_durable.steps import DurableCall, load_steps

KEY_META = "mcp-durable/idempotency-key"
T0 = 1_700_000_000.0
LEASE = 30.0
TOOL = "charge"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def shared() -> AsyncIterator[tuple[Journal, Clock, Engine, Engine]]:
    journal = create_journal("memory://")
    clock = Clock()
    a, b = Engine(journal, clock=clock, instance_id="A"), Engine(journal, clock=clock, instance_id="B")
    await a.start()
    await b.start()
    yield journal, clock, a, b
    await a.aclose()
    await b.aclose()


def outcome(payload: dict[str, Any]) -> ToolOutcome:
    data = orjson.dumps(payload)
    return ToolOutcome(data, data, is_error=False)


async def call(engine: Engine, run: Runner, policy: ToolPolicy, key: str = "k") -> Any:
    try:
        return await engine.execute(tool=TOOL, policy=policy, arguments={"amount": 5}, meta={KEY_META: key}, run=run)
    except DurableError as exc:
        return exc


async def started(event: anyio.Event) -> None:
    with anyio.fail_after(5):
        await event.wait()


async def test_a_stalled_owner_begins_no_step_after_its_successor_took_over(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: A appended its own step 1 after B's, the log read (0 reserve), (1 charge B),
    (1 charge A), and the next attempt raised DeterminismError or replayed the wrong step."""
    journal, clock, a, b = shared
    policy = ToolPolicy(lease=LEASE, in_doubt="retry")
    charges: list[str] = []
    gate, a_inside = anyio.Event(), anyio.Event()

    def tool(name: str, stall: bool) -> Runner:
        def charge_once() -> str:
            charges.append(name)
            return f"charged by {name}"

        async def run(dc: DurableCall | None) -> ToolOutcome:
            assert dc is not None
            await dc.step("reserve", lambda: f"reserved by {name}")
            if stall:
                a_inside.set()
                await gate.wait()  # A stalls here, past its lease
            charge = await dc.step("charge", charge_once)
            return outcome({"charge": charge, "by": name})

        return run

    answers: dict[str, Any] = {}
    async with anyio.create_task_group() as group:

        async def run_a() -> None:
            answers["A"] = await call(a, tool("A", stall=True), policy)

        group.start_soon(run_a)
        await started(a_inside)
        clock.now += LEASE + 1  # A's lease runs out while it stalls
        answers["B"] = await call(b, tool("B", stall=False), policy)
        gate.set()  # A runs again
    assert charges == ["B"], "a stalled owner must not begin a new step once it lost its record"
    assert answers["B"].payload == orjson.dumps({"charge": "charged by B", "by": "B"})
    assert answers["A"].superseded and answers["A"].payload == answers["B"].payload
    record = await journal.get(CallIdentity("local", TOOL, "k"))
    assert record is not None and record.state is CallState.COMPLETED and record.attempts == 2
    steps = await load_steps(journal, record.run_id)
    assert [(s.data["index"], s.data["name"]) for s in steps] == [(0, "reserve"), (1, "charge")]


async def test_a_stale_owner_that_finishes_first_does_not_overwrite_its_successor(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: A's late result was written over B's running attempt ("record it, as its owner"),
    the record ended with `attempts: 1` although two runs made effects, and B's answer was lost."""
    journal, clock, a, b = shared
    policy = ToolPolicy(lease=LEASE, in_doubt="retry")
    gate_a, gate_b, a_inside, b_inside = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()
    effects: list[str] = []

    def tool(name: str, gate: anyio.Event, inside: anyio.Event) -> Runner:
        async def run(_dc: DurableCall | None) -> ToolOutcome:
            inside.set()
            await gate.wait()
            effects.append(name)
            return outcome({"by": name})

        return run

    answers: dict[str, Any] = {}
    async with anyio.create_task_group() as group:

        async def run_on(name: str, engine: Engine, gate: anyio.Event, inside: anyio.Event) -> None:
            answers[name] = await call(engine, tool(name, gate, inside), policy)

        group.start_soon(run_on, "A", a, gate_a, a_inside)
        await started(a_inside)
        clock.now += LEASE + 1
        group.start_soon(run_on, "B", b, gate_b, b_inside)
        await started(b_inside)
        gate_a.set()  # the stale owner finishes first …
        await anyio.sleep(0.05)
        record = await journal.get(CallIdentity("local", TOOL, "k"))
        assert record is not None and record.state is CallState.PENDING and record.owner == "B"
        assert record.attempts == 2, "attempts must never go backwards"
        gate_b.set()  # … and its successor's outcome is the one recorded
    record = await journal.get(CallIdentity("local", TOOL, "k"))
    assert record is not None and record.state is CallState.COMPLETED and record.attempts == 2
    assert record.result == orjson.dumps({"by": "B"})
    assert answers["A"].superseded and answers["A"].payload == record.result
    assert not answers["B"].superseded and answers["B"].payload == record.result


async def test_a_requestor_cancelled_task_is_never_run_again_by_a_plain_call(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: the RELEASED "cancelled by the task's requestor" record was taken over by the next
    plain call with the key, which ran the tool a second time."""
    journal, _clock, a, b = shared
    policy = ToolPolicy(lease=LEASE, task_support="optional")
    runs: list[str] = []
    effect_made, finish = anyio.Event(), anyio.Event()

    async def run(_dc: DurableCall | None) -> ToolOutcome:
        runs.append("run")
        effect_made.set()
        await finish.wait()
        return outcome({"done": True})

    record = await a.submit(tool=TOOL, policy=policy, arguments={"amount": 5}, meta={KEY_META: "k"}, run=run)
    assert record.task_id is not None
    await started(effect_made)
    cancelled, changed = await b.cancel_task("local", record.task_id, retention=600)
    assert changed and cancelled is not None and cancelled.reason is Reason.REQUESTOR_CANCELLED
    finish.set()
    answer = await call(b, run, policy)
    assert isinstance(answer, TaskCancelledError), answer
    answer = await call(a, run, policy)
    assert isinstance(answer, TaskCancelledError), answer
    assert runs == ["run"]
    again = await a.submit(tool=TOOL, policy=policy, arguments={"amount": 5}, meta={KEY_META: "k"}, run=run)
    assert again.task_id == record.task_id and again.cancelled
    assert runs == ["run"]


async def test_cancelling_a_task_in_doubt_under_refuse_changes_nothing(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: the requestor's cancel flipped the in-doubt record (task status `failed`) to
    RELEASED, and the next plain call with the key took it over and charged a second time."""
    journal, clock, a, b = shared
    policy = ToolPolicy(lease=LEASE, idempotent=False, in_doubt="refuse", task_support="optional")
    b.task_policy = lambda tool: policy
    inside, never = anyio.Event(), anyio.Event()
    runs: list[str] = []

    async def hangs(_dc: DurableCall | None) -> ToolOutcome:
        runs.append("run")
        inside.set()
        await never.wait()
        return outcome({})

    record = await a.submit(tool=TOOL, policy=policy, arguments={"amount": 5}, meta={KEY_META: "k"}, run=hangs)
    assert record.task_id is not None
    await started(inside)
    # A dies inside the call: it leaves the journal, and its lease runs out.
    a.owners.leave()
    clock.now += LEASE + 1
    answer = await call(b, hangs, policy)
    assert isinstance(answer, InDoubtError)
    after, changed = await b.cancel_task("local", record.task_id, retention=600)
    assert not changed and after is not None and after.state is CallState.IN_DOUBT
    answer = await call(b, hangs, policy)
    assert isinstance(answer, InDoubtError), answer
    assert runs == ["run"]
    assert await b.task("local", record.task_id) is not None  # still found, still failed
    never.set()


async def test_an_exception_under_exceptions_persist_never_leaves_its_record_pending(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: an exception the face did not turn into a result (an `MCPError`) reached the
    engine under `exceptions="persist"` and the record stayed PENDING with no run behind it."""
    journal, _clock, a, _b = shared

    class Protocolish(Exception):
        pass

    async def raises(_dc: DurableCall | None) -> ToolOutcome:
        raise Protocolish("the upstream answered with a JSON-RPC error")

    with pytest.raises(Protocolish):
        await a.execute(
            tool=TOOL,
            policy=ToolPolicy(exceptions="persist"),
            arguments={"amount": 5},
            meta={KEY_META: "k"},
            run=raises,
        )
    record = await journal.get(CallIdentity("local", TOOL, "k"))
    assert record is not None and record.state is CallState.RELEASED and record.reason is Reason.EXCEPTION


async def test_a_hung_tool_is_stopped_at_its_timeout_and_its_call_left_in_doubt(
    shared: tuple[Journal, Clock, Engine, Engine],
) -> None:
    """Before: a live owner renewed the lease of a hung tool for as long as it hung; duplicates
    got `in_progress` forever and shutdown waited."""
    journal, _clock, a, b = shared
    policy = ToolPolicy(lease=LEASE, timeout=0.2, idempotent=False, in_doubt="refuse", wait=5.0)
    never = anyio.Event()

    async def hangs(_dc: DurableCall | None) -> ToolOutcome:
        await never.wait()
        return outcome({})

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            answers: list[Any] = []

            async def duplicate() -> None:
                await anyio.sleep(0.05)
                answers.append(await call(b, hangs, policy))

            group.start_soon(duplicate)
            first = await call(a, hangs, policy)
    assert isinstance(first, InDoubtError) and "timeout" in str(first)
    assert len(answers) == 1 and isinstance(answers[0], InDoubtError)  # the duplicate waited, then was answered
    record = await journal.get(CallIdentity("local", TOOL, "k"))
    assert record is not None and record.state is CallState.IN_DOUBT and record.reason is Reason.TIMED_OUT


async def test_an_operator_cancel_on_another_engine_stops_a_plain_call_at_its_next_renewal(tmp_path: Path) -> None:
    """Before: a failed renewal stopped only tasks; a plain call's tool ran on to its effect."""
    url = f"sqlite:///{tmp_path}/journal.db"
    a, b = Engine(create_journal(url), instance_id="A"), Engine(create_journal(url), instance_id="B")
    await a.start()
    await b.start()
    effects: list[str] = []
    inside = anyio.Event()

    async def slow(_dc: DurableCall | None) -> ToolOutcome:
        inside.set()
        await anyio.sleep(1.5)
        effects.append("effect")
        return outcome({})

    policy = ToolPolicy(lease=0.3)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                answers: list[Any] = []

                async def run_a() -> None:
                    answers.append(await call(a, slow, policy))

                group.start_soon(run_a)
                await started(inside)
                await b.cancel(CallIdentity("local", TOOL, "k"), by="test")
        assert len(answers) == 1 and isinstance(answers[0], CallCancelledError), answers
        assert effects == []
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_failed_start_leaves_no_background_loop_behind(tmp_path: Path) -> None:
    """Before: each failed start left one more task-watch loop running (four after three)."""
    url = f"sqlite:///{tmp_path}/journal.db"
    writer = create_journal(url)
    await writer.open()
    await writer.append("server-x", "state_transition", {"to": "running"}, T0)
    await writer.aclose()
    # The lifecycle's entry no longer decodes (a damaged row): reading it at start raises
    # `JournalError`, after the task watch of a shared journal would have been started.
    with sqlite3.connect(tmp_path / "journal.db") as db:
        db.execute("UPDATE entries SET data = '{not json' WHERE process_id = 'server-x'")

    async def resumer(_record: Any) -> None:
        return None

    engine = Engine(create_journal(url), process_id="server-x")
    engine.task_resumer = resumer
    for _ in range(3):
        with pytest.raises(JournalError):
            await engine.start()
        assert engine.background == set()
        assert not engine.opened
    await engine.aclose()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "file", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_stalled_owner_never_writes_over_a_later_record_of_its_key_at_the_same_version(
    kind: str, tmp_path: Path
) -> None:
    """Versions start again at 1 when a claim replaces an expired record. Before (found by the
    interleaving test on Postgres): A's run stalled past its lease holding version 1, B took it
    over and completed it, the record expired, B's next call of the key claimed it anew (version
    1 again) and stalled in its tool; A's run then raised, and its release, a swap expecting
    version 1, landed on B's new record. B's run was fenced out of its own record and its
    effect's result lost, and the next call ran the tool again. A swap expects the run id too."""
    from tests.conftest import make_journal_factory

    journal = make_journal_factory(kind, tmp_path)()
    clock = Clock()
    a, b = Engine(journal, clock=clock, instance_id="A"), Engine(journal, clock=clock, instance_id="B")
    await a.start()
    await b.start()
    policy = ToolPolicy(lease=LEASE, in_doubt="retry", retention=60.0)
    identity = CallIdentity("local", TOOL, "k")
    effects: list[str] = []

    def tool(name: str, gate: anyio.Event | None = None, inside: anyio.Event | None = None) -> Runner:
        async def run(_dc: DurableCall | None) -> ToolOutcome:
            if inside is not None:
                inside.set()
            if gate is not None:
                await gate.wait()
            if name == "A":
                raise RuntimeError("A's run raised before its effect")
            effects.append(name)
            return outcome({"by": name})

        return run

    try:
        answers: dict[str, Any] = {}
        gate_a, a_inside, gate_c, c_inside = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()

        async def run_on(name: str, engine: Engine, runner: Runner) -> None:
            try:
                answers[name] = await call(engine, runner, policy)
            except RuntimeError as exc:
                answers[name] = exc

        async with anyio.create_task_group() as group:
            group.start_soon(run_on, "A", a, tool("A", gate_a, a_inside))
            await started(a_inside)
            clock.now += LEASE + 1  # A stalls past its lease
            await run_on("B", b, tool("B"))  # B takes A's record over and completes it
            first = await journal.get(identity)
            assert first is not None and first.state is CallState.COMPLETED and first.attempts == 2
            clock.now += 61  # the completed record expires
            group.start_soon(run_on, "C", b, tool("C", gate_c, c_inside))
            await started(c_inside)
            fresh = await journal.get(identity)
            assert fresh is not None and fresh.state is CallState.PENDING and fresh.owner == "B"
            assert fresh.version == 1, "the premise: a new record's versions start again"
            fresh_run = fresh.run_id
            gate_a.set()  # A's stale run raises: its release must not land on C's record
            with anyio.fail_after(5):
                while "A" not in answers:
                    await anyio.sleep(0.01)
            after_a = await journal.get(identity)
            gate_c.set()  # (before any assertion: the task group waits for C's run)
        assert after_a == fresh, f"A's stale release landed on C's record: {after_a}"
        record = await journal.get(identity)
        assert record is not None and record.state is CallState.COMPLETED and record.run_id == fresh_run
        assert record.result == orjson.dumps({"by": "C"})
        assert not answers["C"].superseded and answers["C"].payload == record.result
        assert effects == ["B", "C"]
    finally:
        await a.aclose()
        await b.aclose()
