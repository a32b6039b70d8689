"""A stateful property test of several `Engine`s sharing one journal, through random interleavings.

Three engine slots run on one journal (memory and file: one `MemoryJournal` or `FileJournal`
object shared by all of them, a single-writer journal whose live owners are the engines started
on that object, as in one process; SQLite: one journal object per engine on the same file, as
separate processes would; Postgres: one journal object per engine on a fresh schema per example,
as replicas would, each with its own pool and its own statement batches, so claims, swaps and
step appends of different engines meet in the server's row locks and the entries' lock as
replicas' do; the engine of slot 1 sends even a lone claim, swap or read as a batch statement,
so the single-row and the batch statements both run). One controlled clock drives every record
time and lease. Hypothesis draws rules (below) and the invariants are
checked after every step. It follows `test_engine_model.py`: a blocking portal runs one event
loop, the clock is injected, and each tool run counts what it does.

How runs are driven. Every `execute` is an asyncio task of the portal's loop, and a `submit`'s
background run is the tasks that `submit` spawned. A runner may *park* at a gate (an
`anyio.Event`): before its effect, or between its two durable steps. After every rule the test
*settles*: it waits (real time, bounded) until every run has either ended or is parked at a gate
that nothing is about to open (no gate set, no cancel on its way), then checks the answers that
came and reads the journal for the invariants. So the only interleaving is the one the rules
choose, and no rule sleeps beyond a few milliseconds. Calls do not wait for a live owner
(`wait=0`: `in_progress` at once), except concurrent duplicates with nobody ahead of them,
which latch on to the first of them.

Stalls. `call` with a gate parks its run there and leaves it; `time_passes` moves the clock past
the lease while it waits (leases are renewed on real time, every `LEASE / 3` real seconds, which
no example lasts, so no renewal ever lands); another engine's repeat then finds the owner gone
and takes the record over (in_doubt="retry") or marks it in doubt (in_doubt="refuse");
`resume` opens the gate and the stale run goes on. `the_lease_runs_out_and_another_engine_repeats`
is the middle of that as one rule, so the search meets it often. On the single-writer journals
(memory, file) an owner started on the shared object is alive whatever its lease says, so its
stalled run is never taken over; there a stale run's late writes meet only what operators did
meanwhile. (A stale write landing on a later record of its key at the same version is checked
on every journal by `tests/engine/test_fencing.py`; on the file journal with the run check
removed, 1,500 examples here did not meet it.)

Crashes. A crashed engine must write nothing more, and its records must look like a dead
process's. Its parked runs stay parked for good (their gates are only opened at teardown,
after the last check, when nothing they write is looked at); it is never called again. On
SQLite and Postgres its journal object is closed first, so nothing it still holds (a lease
renewal, a run) can reach the database; its PENDING records keep their lease, which runs out
with the clock, as a dead process's do. On a shared single-writer journal the journal object
cannot be closed (the other engines use it), so the crashed engine leaves the journal's live
owners (`engine.owners.leave()`, what its `aclose` would do): the other engines then see its
PENDING records as a previous boot's orphans, as the single-writer rules say. `restart` starts
a new engine (a new instance id) in a crashed slot; its `start()` sweeps.

The rules. Four tools, one key each (so every rule on a tool meets the others): `pay`
(non-idempotent, in_doubt="refuse", its effect in its body), `ship` (the same, its effects two
durable steps), `sync` and `book` (idempotent, in_doubt="retry"; without and with steps).
`call` (an `execute` or a `submit`; the tool answers, returns an error result, raises before its
effect, or raises under `exceptions="persist"`; with or without a gate), `resume`,
`the_lease_runs_out_and_another_engine_repeats`, `concurrent_duplicates` (two or three engines
at once), `cancel_task` (the requestor's, whatever the task's state), `operator_acts` (resolve
completed / failed / not_applied, forget, cancel, rerun from no step or step 0, 1, 2; one that
does not apply is a no-op), `time_passes`, `retention_runs` (`retention.retention_pass`),
`crash`, `restart`, and, on an engine whose `ToolPolicy` has `timeout`,
`a_hung_tool_times_out`.

The invariants, checked after every step (numbered as the lead cites them):

1. A non-idempotent tool's effect happens at most once per key, except for what operators
   allowed (each resolve `not_applied`, `forget`, `rerun`, and each expiry of the record permits
   one more) and except runs released by an exception raised before the effect (they make no
   effect). For tools whose effects are durable steps, each (run, step index) effect happens at
   most once, and a run that no longer holds its record (a stalled owner whose record was taken
   over, resolved or cancelled) begins no new step after it resumes.
2. A final result (a COMPLETED or FAILED record) is never overwritten while it lives: once a key
   has a final record with payload P, every later read shows P until it expires or an operator
   re-runs it.
3. A replay is byte-identical to the first answer (the final record the journal holds), and an
   answer marked `superseded` carries the recorded payload, never the stale run's own.
   Concurrent duplicates with no live owner ahead of them run the tool at most once and are all
   answered the same bytes.
4. A run's step log has one entry per index (`journal.entries(process_id="steps/" + run_id)`).
5. Nothing acknowledged disappears before its retention: a completed or failed record (one
   answered to a caller, or resolved by an operator, or read) is readable until its `expires_at`.
6. A record's `attempts` never decreases while the record lives.
7. A requestor-cancelled or operator-cancelled call is never run again under that record:
   repeats answer `cancelled` (`CallCancelledError` / `TaskCancelledError`) until it expires or
   an operator acts; cancelling a task whose status is terminal (completed, failed, cancelled,
   or in doubt under in_doubt="refuse" or parked) changes nothing.
8. Between steps no record is left PENDING by a run that ended: every PENDING record is held by
   a run parked at a gate (stalled, or of a crashed engine). In particular an exception under
   `exceptions="persist"` never leaves its record PENDING.
9. What the journal keeps beside its records agrees with them (`tests/journal_kept.py`):
   `count_calls` (kept counts, with the oldest record; and counted in buckets over a time
   range) is `CountQuery.count` of the records `list_calls` returns, and a listing of an open
   state (PENDING, IN_DOUBT) or of tasks alone (each read from its own index) holds exactly the
   records of that state, or the tasks.

"E" marks an answer no rule can explain (an unexpected exception type, `key_reuse` for a key
called with one set of arguments, a journal error on a live engine).

Knobs: `MCP_DURABLE_PROPERTY_EXAMPLES` (default per backend, about half a minute each in `make
test`) and `MCP_DURABLE_PROPERTY_STEPS` (30), as in `test_engine_model.py`; raise them for a
long run (e.g. `MCP_DURABLE_PROPERTY_EXAMPLES=5000`). `MCP_DURABLE_INVARIANTS` (e.g. "6,7")
checks only those invariants, to find the smallest example of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from mcp_durable import ToolPolicy
from mcp_durable.engine import CallOutcome, Engine, Runner, ToolOutcome
from mcp_durable.errors import (
    CallCancelledError,
    DurableError,
    JournalError,
    KeyReuseError,
    OperatorError,
    TaskCancelledError,
)
from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, Journal, create_journal
from mcp_durable.journal.postgres import PostgresJournal
from mcp_durable.keys import KEY_META
from mcp_durable.operations.retention import RetentionSchedule, retention_pass
from mcp_durable.steps import DurableCall
from tests.conftest import drop_scratch_schemas, scratch_postgres_url
from tests.hardening.interleaving_model import (
    ARGUMENTS,
    HAS_TIMEOUT,
    IDENTS,
    KEY,
    LEASE,
    PRINCIPAL,
    RETENTION,
    TOOLS,
    Behaviour,
    Boom,
    CancelMark,
    Fence,
    GateAt,
    Ident,
    Ledger,
    Op,
    Run,
    describe,
    fence_of,
    held,
    task_terminal,
)
from tests.journal_kept import kept_disagreements

# A quarter to half a minute each on a quiet machine. Memory and file run the same single-writer
# rules (one shared object), so they split what memory alone ran before the file journal joined.
DEFAULT_EXAMPLES = {"memory": 350, "file": 150, "sqlite": 200, "postgres": 100}
STEPS = int(os.environ.get("MCP_DURABLE_PROPERTY_STEPS", "30"))
CHECKED = {part.strip() for part in os.environ.get("MCP_DURABLE_INVARIANTS", "").split(",") if part.strip()}

T0 = 1_700_000_000.0
SLOTS = 3
LINGER = 0.003  # real seconds a duplicates' run lasts, so its copies latch on to it
PATIENCE = 5.0  # real seconds a duplicate may wait for the run ahead of it (a few ms in practice)
SETTLE_S = 10.0  # real seconds for every run to end or park; beyond, an engine hangs
HANG_TIMEOUT = 0.01  # the hung tool's `ToolPolicy.timeout` (real seconds)
RETENTION_SCHEDULE = RetentionSchedule(compact_garbage_ratio=None, lifecycle=False)
ACTIONS = ("completed", "failed", "not_applied", "forget", "cancel", "rerun", "rerun 0", "rerun 1", "rerun 2")

slot_numbers = st.integers(0, SLOTS - 1)
picks = st.integers(0, 7)
tools = st.sampled_from(sorted(TOOLS))


def examples(backend: str) -> int:
    return int(os.environ.get("MCP_DURABLE_PROPERTY_EXAMPLES", DEFAULT_EXAMPLES[backend]))


@dataclass(eq=False)
class Slot:
    """One engine on the journal (its own journal object on SQLite and Postgres, the shared one on memory)."""

    engine: Engine
    journal: Journal
    crashed: bool = False


class Interleavings(RuleBasedStateMachine):
    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.dir = Path(tempfile.mkdtemp(prefix="mcp-durable-interleavings-"))
        self.url = (
            scratch_postgres_url("interleavings")
            if self.backend == "postgres"
            else f"sqlite:///{self.dir}/journal.db?synchronous=NORMAL"
        )
        self.now = T0
        self.serial = 0
        self.generations = [0] * SLOTS
        self.ledgers = {ident: Ledger() for ident in IDENTS}
        self.step_effects: Counter[tuple[str, int]] = Counter()
        self.ops: list[Op] = []
        self.records: dict[Ident, CallRecord] = {}  # the last read of the journal
        self.violations: list[str] = []
        self.tearing_down = False
        # Single-writer journals (memory, file): one object all engines share, as one process's do.
        shared_url = {"memory": "memory://", "file": f"file://{self.dir}/journal?durability=relaxed"}.get(self.backend)
        self.shared = None if shared_url is None else create_journal(shared_url)
        self.observer = self.shared if self.shared is not None else create_journal(self.url)
        self.portal.call(self.observer.open)
        self.slots = [self.portal.call(self.boot, i) for i in range(SLOTS)]
        self.snapshot = self.portal.call(self.read_all)  # what the invariants check: the journal now

    async def boot(self, i: int) -> Slot:
        """A new engine (a new instance id) in slot `i`, started."""
        self.generations[i] += 1
        journal = self.shared if self.shared is not None else create_journal(self.url)
        if isinstance(journal, PostgresJournal) and i == 1:
            # Calls one at a time go out as single-row statements; this engine sends every claim,
            # swap and read as a batch statement instead (what calls made together share), so
            # both kinds of statement meet in every example.
            for batcher in (journal._claims, journal._swaps, journal._gets):
                batcher._run_one = None
        engine = Engine(journal, clock=lambda: self.now, instance_id=f"e{i}.{self.generations[i]}")
        await engine.start()
        return Slot(engine, journal)

    def teardown(self) -> None:
        self.tearing_down = True  # what the runs do from here is not checked
        try:
            self.portal.call(self.wind_down)
        finally:
            self.stack.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.backend == "postgres":
                drop_scratch_schemas()  # one per example: a few hundred would pile up till the test ends

    async def wind_down(self) -> None:
        for op in self.ops:
            op.run.gate.set()  # crashed engines' runs too: nothing is checked any more
        with contextlib.suppress(AssertionError):
            await self.settle()
        for slot in self.slots:
            if not slot.crashed:
                await slot.engine.aclose()
        await self.observer.aclose()  # the shared journal too: the file journal's handles and lock

    # -- helpers ----------------------------------------------------------------------------------

    def drive(self, work: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Do `work` on the event loop, then read the journal for the invariants (one trip)."""

        async def then_read() -> tuple[dict[Ident, CallRecord], dict[str, list[int]], list[str]]:
            await work(*args)
            return await self.read_all()

        self.snapshot = self.portal.call(then_read)

    def violate(self, invariant_id: str, text: str) -> None:
        if not self.tearing_down and (not CHECKED or invariant_id in CHECKED):
            self.violations.append(f"invariant {invariant_id}: {text}")

    def alive(self) -> list[int]:
        return [i for i, slot in enumerate(self.slots) if not slot.crashed]

    def live_slot(self, n: int) -> int:
        alive = self.alive()
        return n if n in alive else alive[n % len(alive)]

    def known(self) -> list[Ident]:
        """Keys with a live record, or a run parked on them."""
        live = {i for i, r in self.records.items() if not r.is_expired(self.now)}
        return sorted(live | {op.run.ident for op in self.ops})

    def resumable(self) -> list[Op]:
        return [op for op in self.ops if op.run.waiting and not op.crashed and op.run.gate_at != "hang"]

    def tasks_known(self) -> list[Ident]:
        return sorted(i for i, r in self.records.items() if r.task_id is not None and not r.is_expired(self.now))

    def new_run(
        self, slot: int, ident: Ident, behaviour: Behaviour, gate_at: GateAt | None, linger: bool = False
    ) -> Run:
        self.serial += 1
        if gate_at == "between" and not TOOLS[ident[0]].steps:
            gate_at = "before"
        engine = self.slots[slot].engine
        return Run(self.serial, ident, slot, engine.instance_id, self.slots[slot].journal, behaviour, gate_at, linger)

    def policy(self, run: Run, *, wait: float = 0.0) -> ToolPolicy:
        tool = TOOLS[run.ident[0]]
        exceptions = "persist" if run.behaviour == "raise_persisted" else "release"
        return tool.policy(wait=wait, exceptions=exceptions, timeout=HANG_TIMEOUT if run.gate_at == "hang" else None)

    async def read_records(self) -> dict[Ident, CallRecord]:
        listed = await self.observer.list_calls(CallQuery(limit=500))
        return {(r.identity.tool, r.identity.key): r for r in listed}

    # -- the tool ---------------------------------------------------------------------------------

    def runner(self, run: Run) -> Runner:
        steps = TOOLS[run.ident[0]].steps

        async def go(call: DurableCall | None) -> ToolOutcome:
            assert call is not None
            run.started, run.fence = True, (run.owner, call.run_id, call.attempt)
            cancel = self.ledgers[run.ident].live_cancel(self.now)
            if cancel is not None:
                self.violate("7", f"run {run.serial} of {run.ident} began while the call is cancelled by {cancel.by}")
            if run.linger:
                await anyio.sleep(LINGER)
            if run.gate_at in ("before", "hang"):
                await run.park()
            if run.behaviour in ("raise", "raise_persisted"):
                raise Boom(f"run {run.serial} raised before its effect")
            if steps:
                await call.step("effect-0", self.step_effect, run, call, 0)
                if run.gate_at == "between":
                    await run.park()
                await call.step("effect-1", self.step_effect, run, call, 1)
            else:
                self.ledgers[run.ident].effects += 1
            return ToolOutcome(run.payload, run.payload, is_error=run.behaviour == "error")

        return go

    async def step_effect(self, run: Run, call: DurableCall, index: int) -> dict[str, int]:
        """A durable step's effect: counted per (run, index), checked against the run's fence."""
        record = await run.journal.get(call.identity)
        if not held(record, run.fence):
            self.violate(
                "1",
                f"run {run.serial} began step {index} of run {call.run_id[:8]} without holding "
                f"its record (fence {run.fence}): {describe(record)}",
            )
        self.step_effects[(call.run_id, index)] += 1
        if self.step_effects[(call.run_id, index)] > 1:
            self.violate(
                "1",
                f"step {index} of run {call.run_id[:8]} made its effect "
                f"{self.step_effects[(call.run_id, index)]} times (last by run {run.serial})",
            )
        return {"by": run.serial}

    # -- driving ----------------------------------------------------------------------------------

    def start_call(self, run: Run, policy: ToolPolicy) -> Op:
        engine = self.slots[run.slot].engine

        async def answer() -> Any:
            try:
                return await engine.execute(
                    tool=run.ident[0],
                    policy=policy,
                    arguments=ARGUMENTS,
                    meta={KEY_META: run.ident[1]},
                    run=self.runner(run),
                    principal=PRINCIPAL,
                )
            except Exception as exc:  # noqa: BLE001 - every answer is checked, an exception included
                return exc

        task = asyncio.get_running_loop().create_task(answer())
        op = Op("call", run, {task}, self.ledgers[run.ident].live_cancel(self.now))
        self.ops.append(op)
        return op

    async def start_task(self, run: Run, policy: ToolPolicy) -> None:
        engine = self.slots[run.slot].engine
        cancel = self.ledgers[run.ident].live_cancel(self.now)
        before = asyncio.all_tasks()
        answer: Any
        try:
            answer = await engine.submit(
                tool=run.ident[0],
                policy=policy,
                arguments=ARGUMENTS,
                meta={KEY_META: run.ident[1]},
                run=self.runner(run),
                principal=PRINCIPAL,
            )
        except Exception as exc:  # noqa: BLE001 - checked below
            answer = exc
        spawned = {task for task in asyncio.all_tasks() - before if not task.done()}
        self.ops.append(Op("task", run, spawned, cancel))
        if isinstance(answer, Exception):
            self.check_exception(run, answer)
        if cancel is not None and not (
            isinstance(answer, TaskCancelledError | CallCancelledError)
            or (isinstance(answer, CallRecord) and answer.state == CallState.RELEASED)
        ):
            self.violate("7", f"a task submitted for cancelled {run.ident} was answered {answer!r}")

    async def begin(
        self, slot: int, ident: Ident, behaviour: Behaviour, gate_at: GateAt | None, as_task: bool = False
    ) -> None:
        run = self.new_run(slot, ident, behaviour, gate_at)
        if as_task:
            await self.start_task(run, self.policy(run))
        else:
            self.start_call(run, self.policy(run))
        await self.settle()

    async def settle(self) -> None:
        """Wait until every run has ended or is parked at a gate, then check the answers that came."""
        deadline = anyio.current_time() + SETTLE_S
        turns = 0
        while not all(op.quiet() for op in self.ops):
            if anyio.current_time() > deadline:
                busy = [f"{op.kind} of run {op.run.serial} on {op.run.ident}" for op in self.ops if not op.quiet()]
                raise AssertionError(f"the engines did not settle in {SETTLE_S} s: {busy}")
            turns += 1
            await anyio.sleep(0 if turns < 200 else 0.001)
        finished = [op for op in self.ops if op.done()]
        self.ops = [op for op in self.ops if not op.done()]
        if any(op.kind == "call" for op in finished):
            records = await self.read_records()
            for op in finished:
                if op.kind == "call":
                    self.check_answer(op, records.get(op.run.ident))

    # -- checking answers -------------------------------------------------------------------------

    def check_exception(self, run: Run, exc: BaseException) -> None:
        expected = isinstance(exc, Boom) or (
            isinstance(exc, DurableError) and not isinstance(exc, KeyReuseError | JournalError)
        )
        if not expected:
            self.violate("E", f"run {run.serial} on {run.ident} was answered {type(exc).__name__}: {exc}")

    def check_answer(self, op: Op, record: CallRecord | None) -> None:
        run, answer = op.run, op.answer()
        ledger = self.ledgers[run.ident]
        if (
            op.cancel is not None
            and ledger.cancel is op.cancel
            and op.cancel.live(self.now)
            and not isinstance(answer, CallCancelledError | TaskCancelledError)
        ):
            self.violate("7", f"a repeat of {run.ident}, cancelled by {op.cancel.by}, was answered {answer!r}")
        if not isinstance(answer, CallOutcome):
            self.check_exception(run, answer)
            return
        recorded = ledger.live_final(self.now)
        if recorded is None and record is not None and record.state.is_final and not record.is_expired(self.now):
            recorded = record.result
        if answer.replayed:
            self.check_replay(run, answer, recorded, record)
        elif answer.superseded:
            self.check_superseded(run, answer, recorded, record)
        else:
            self.check_acknowledged(run, answer, ledger, record)

    def check_replay(self, run: Run, answer: CallOutcome, recorded: bytes | None, record: CallRecord | None) -> None:
        if answer.payload != recorded:
            self.violate(
                "3",
                f"a repeat of {run.ident} on {run.owner} replayed {answer.payload!r}; the "
                f"recorded result is {recorded!r} ({describe(record)})",
            )

    def check_superseded(
        self, run: Run, answer: CallOutcome, recorded: bytes | None, record: CallRecord | None
    ) -> None:
        if answer.payload == run.payload:
            self.violate("3", f"run {run.serial} on {run.ident} was answered superseded with its own result")
        elif answer.payload != recorded:
            self.violate(
                "3",
                f"run {run.serial} on {run.ident} was answered superseded {answer.payload!r}; the "
                f"recorded result is {recorded!r} ({describe(record)})",
            )

    def check_acknowledged(self, run: Run, answer: CallOutcome, ledger: Ledger, record: CallRecord | None) -> None:
        before = ledger.live_final(self.now)
        if answer.payload != run.payload:
            self.violate("3", f"run {run.serial} on {run.ident} was answered {answer.payload!r} as its own result")
        elif before is not None and before != answer.payload:
            self.violate(
                "2", f"run {run.serial} on {run.ident} was acknowledged {answer.payload!r} while {before!r} was final"
            )
        elif record is None or not record.state.is_final or record.result != answer.payload:
            self.violate(
                "5",
                f"run {run.serial} on {run.ident} was acknowledged {answer.payload!r}; the journal "
                f"holds {describe(record)}",
            )
        else:
            ledger.final, ledger.final_expires = record.result, record.expires_at

    # -- the invariants ---------------------------------------------------------------------------

    @invariant()
    def the_invariants_hold(self) -> None:
        records, steps, kept_off = self.snapshot
        self.records = records
        for problem in kept_off:
            self.violate("9", problem)
        parked = {op.run.fence for op in self.ops if op.run.parked}
        for ident in IDENTS:
            self.observe(ident, records.get(ident), parked)
        for process, indexes in steps.items():
            twice = sorted(index for index, n in Counter(indexes).items() if n > 1)
            if twice:
                self.violate("4", f"the step log of {process[:14]} has index(es) {twice} more than once: {indexes}")
        assert not self.violations, "\n".join(self.violations)

    async def read_all(self) -> tuple[dict[Ident, CallRecord], dict[str, list[int]], list[str]]:
        steps: dict[str, list[int]] = defaultdict(list)
        for entry in await self.observer.entries():
            if entry.process_id.startswith("steps/") and entry.entry_type == "step":
                steps[entry.process_id].append(int(entry.data["index"]))
        return await self.read_records(), steps, await kept_disagreements(self.observer)

    def observe(self, ident: Ident, record: CallRecord | None, parked: set[Fence | None]) -> None:
        live = record if record is not None and not record.is_expired(self.now) else None
        ledger = self.ledgers[ident]
        self.observe_final(ident, live, ledger)
        self.observe_attempts(ident, live, ledger)
        self.observe_cancel(ident, live, ledger)
        tool = TOOLS[ident[0]]
        if not tool.idempotent and not tool.steps and ledger.effects > ledger.permits:
            self.violate("1", f"{ident}'s effect happened {ledger.effects} times; {ledger.permits} allowed")
        if live is not None and live.state == CallState.PENDING and fence_of(live) not in parked:
            self.violate("8", f"{ident} is left PENDING by a run that is not running: {describe(live)}")

    def observe_final(self, ident: Ident, live: CallRecord | None, ledger: Ledger) -> None:
        final = ledger.live_final(self.now)
        if final is None:
            ledger.final = None
            if live is not None and live.state.is_final:
                ledger.final, ledger.final_expires = live.result, live.expires_at
            return
        if live is None or not live.state.is_final:
            self.violate(
                "5", f"{ident}'s final result {final!r} (until {ledger.final_expires}) is gone: {describe(live)}"
            )
        elif live.result != final:
            self.violate("2", f"{ident}'s final result {final!r} was overwritten: {describe(live)}")
        elif ledger.final_expires is not None and (live.expires_at is None or live.expires_at >= ledger.final_expires):
            ledger.final_expires = live.expires_at
        elif ledger.final_expires is not None:
            self.violate("5", f"{ident}'s final result now expires at {live.expires_at}, before {ledger.final_expires}")

    def observe_attempts(self, ident: Ident, live: CallRecord | None, ledger: Ledger) -> None:
        if live is None:
            ledger.attempts = ledger.attempts_since = None
            return
        if ledger.attempts_since != live.created_at:
            # Another record of the key: the one seen expired and a new call claimed the key
            # (within one rule, with no look in between). Its attempts count afresh.
            ledger.attempts, ledger.attempts_since = None, live.created_at
        if ledger.attempts is not None and live.attempts < ledger.attempts:
            self.violate(
                "6", f"{ident}'s attempts went from {ledger.attempts} down to {live.attempts}: {describe(live)}"
            )
        ledger.attempts = live.attempts

    def observe_cancel(self, ident: Ident, live: CallRecord | None, ledger: Ledger) -> None:
        cancel = ledger.live_cancel(self.now)
        ledger.cancel = cancel
        if cancel is not None and (live is None or live.state != CallState.RELEASED):
            self.violate("7", f"{ident}, cancelled by {cancel.by}, is no longer cancelled: {describe(live)}")

    # -- rules: calls -----------------------------------------------------------------------------

    @rule(
        slot=slot_numbers,
        tool=tools,
        behaviour=st.sampled_from(["ok", "ok", "error", "raise", "raise_persisted"]),
        gate=st.sampled_from([None, None, "before", "between"]),
        as_task=st.booleans(),
    )
    def call(self, slot: int, tool: str, behaviour: Behaviour, gate: GateAt | None, as_task: bool) -> None:
        """A call (`execute`) or a task (`submit`) on engine `slot`. With a gate its run, if the
        engine starts one, parks there: a stall, before its effect or between its two steps
        (before, for a tool without steps). Every rule on a tool meets the others on its one key."""
        self.drive(self.begin, self.live_slot(slot), (tool, KEY), behaviour, gate, as_task)

    @precondition(lambda self: bool(self.resumable()))
    @rule(pick=picks)
    def resume(self, pick: int) -> None:
        """A stalled run of a live engine goes on, whatever happened to its record meanwhile."""
        ops = self.resumable()
        self.drive(self.open_gate, ops[pick % len(ops)])

    async def open_gate(self, op: Op) -> None:
        op.run.gate.set()
        await self.settle()

    @precondition(lambda self: bool(self.resumable()))
    @rule(
        pick=picks,
        other=slot_numbers,
        behaviour=st.sampled_from(["ok", "ok", "error", "raise"]),
        gate=st.sampled_from([None, "before", "between"]),
        as_task=st.booleans(),
    )
    def the_lease_runs_out_and_another_engine_repeats(
        self, pick: int, other: int, behaviour: Behaviour, gate: GateAt | None, as_task: bool
    ) -> None:
        """The heart of the stale-owner interleavings, as one rule: a stalled run's lease runs out
        (the clock passes it) and another engine calls its key, which takes the record over
        (retry) or marks it in doubt (refuse); its own run may stall in turn. `resume` later
        lets the stale run go on."""
        stalled = self.resumable()[pick % len(self.resumable())]
        self.advance(LEASE + 1)
        others = [i for i in self.alive() if i != stalled.run.slot] or self.alive()
        self.drive(self.begin, others[other % len(others)], stalled.run.ident, behaviour, gate, as_task)

    @rule(slot=slot_numbers, tool=tools, behaviour=st.sampled_from(["ok", "error"]), copies=st.integers(2, 3))
    def concurrent_duplicates(self, slot: int, tool: str, behaviour: Behaviour, copies: int) -> None:
        self.drive(self.duplicates, self.live_slot(slot), (tool, KEY), behaviour, copies)

    async def duplicates(self, slot: int, ident: Ident, behaviour: Behaviour, copies: int) -> None:
        """Copies on different engines at once. Patient when no live owner is ahead of them (they
        latch on to the first); impatient otherwise (a parked owner would keep them waiting)."""
        record = self.records.get(ident)
        patient = record is None or record.state != CallState.PENDING or record.is_expired(self.now)
        alive = self.alive()
        ops = []
        for copy in range(copies):
            run = self.new_run(alive[(alive.index(slot) + copy) % len(alive)], ident, behaviour, None, linger=True)
            ops.append(self.start_call(run, self.policy(run, wait=PATIENCE if patient else 0.0)))
        await self.settle()
        if not patient:
            return
        ran = [op.run.serial for op in ops if op.run.started]
        payloads = {op.answer().payload for op in ops if isinstance(op.answer(), CallOutcome)}
        if len(ran) > 1 or len(payloads) > 1:
            self.violate("3", f"concurrent duplicates of {ident}: runs {ran} ran, answers {sorted(payloads)}")

    if HAS_TIMEOUT:

        @rule(slot=slot_numbers, tool=tools)
        def a_hung_tool_times_out(self, slot: int, tool: str) -> None:
            """A run that never returns: its policy's (real, short) timeout ends it."""
            self.drive(self.begin, self.live_slot(slot), (tool, KEY), "ok", "hang")

    # -- rules: cancels and operators -------------------------------------------------------------

    @precondition(lambda self: bool(self.tasks_known()))
    @rule(slot=slot_numbers, pick=picks)
    def cancel_task(self, slot: int, pick: int) -> None:
        """The task's requestor cancels it: while it runs, after it ended, while in doubt."""
        tasks = self.tasks_known()
        self.drive(self.cancel_a_task, self.live_slot(slot), tasks[pick % len(tasks)])

    async def cancel_a_task(self, slot: int, ident: Ident) -> None:
        before = self.records[ident]
        assert before.task_id is not None
        terminal = task_terminal(before)
        _, changed = await self.slots[slot].engine.cancel_task(PRINCIPAL, before.task_id, RETENTION)
        await self.settle()
        after = (await self.read_records()).get(ident)
        if terminal and (changed or after is None or after.version != before.version):
            self.violate(
                "7",
                f"cancelling terminal task {ident} ({describe(before)}) changed it "
                f"(changed={changed}): {describe(after)}",
            )
        elif changed:
            self.ledgers[ident].cancel = CancelMark("requestor", after.expires_at if after is not None else None)

    @precondition(lambda self: bool(self.known()))
    @rule(slot=slot_numbers, pick=picks, action=st.sampled_from(ACTIONS))
    def operator_acts(self, slot: int, pick: int, action: str) -> None:
        """resolve completed | failed | not_applied, forget, cancel, rerun (from step 0, 1, 2).
        A verdict that does not apply (`OperatorError`) is a no-op."""
        known = self.known()
        self.drive(self.operate, self.live_slot(slot), known[pick % len(known)], action)

    async def operate(self, slot: int, ident: Ident, action: str) -> None:
        engine = self.slots[slot].engine
        identity = CallIdentity(PRINCIPAL, *ident)
        self.serial += 1
        try:
            if action in ("completed", "failed"):
                payload = orjson.dumps({"operator": self.serial, "resolved": action})
                record = await engine.resolve(identity, action, payload=payload, retention=RETENTION)
            elif action == "not_applied":
                record = await engine.resolve(identity, action, retention=RETENTION)
            elif action == "forget":
                record = await engine.forget(identity)
            elif action == "cancel":
                record = await engine.cancel(identity, retention=RETENTION)
            else:
                from_step = None if action == "rerun" else int(action.split()[1])
                record = await engine.rerun(identity, from_step=from_step, retention=RETENTION)
        except OperatorError:
            record = None
        if record is not None:
            self.after_verdict(ident, action, record)
        await self.settle()

    def after_verdict(self, ident: Ident, action: str, record: CallRecord) -> None:
        ledger = self.ledgers[ident]
        if action in ("completed", "failed"):
            final = ledger.live_final(self.now)
            if final is not None and final != record.result:
                self.violate("2", f"an operator's resolve replaced {ident}'s final result {final!r}")
            ledger.final, ledger.final_expires, ledger.cancel = record.result, record.expires_at, None
        elif action == "cancel":
            ledger.cancel = CancelMark("operator", record.expires_at)
        else:  # not_applied, forget, rerun: the key may run (and make its effect) once more
            ledger.permits += 1
            ledger.cancel = None
            if action.startswith("rerun"):
                ledger.final = None

    # -- rules: time, retention, crashes ----------------------------------------------------------

    @rule(seconds=st.sampled_from([1.0, LEASE + 1, LEASE + 1, RETENTION / 2, RETENTION + 1]))
    def time_passes(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move the clock (the journal is as the last read found it: nothing runs meanwhile)."""
        later = self.now + seconds
        for ident, record in self.records.items():
            if record.expires_at is not None and self.now < record.expires_at <= later:
                self.ledgers[ident].permits += 1  # an expiry: the key may run once more
        self.now = later

    @rule(slot=slot_numbers)
    def retention_runs(self, slot: int) -> None:
        """A retention pass: expired records and their runs' step entries are purged."""
        self.drive(retention_pass, self.slots[self.live_slot(slot)].engine, RETENTION_SCHEDULE)

    @precondition(lambda self: len(self.alive()) >= 2)
    @rule(slot=slot_numbers)
    def crash(self, slot: int) -> None:
        """An engine dies: its parked runs never go on, and it writes nothing more (module docstring)."""
        self.drive(self.crash_slot, self.live_slot(slot))

    async def crash_slot(self, i: int) -> None:
        slot = self.slots[i]
        slot.crashed = True
        for op in self.ops:
            if op.run.owner == slot.engine.instance_id:
                op.crashed = True
        if self.shared is not None:
            slot.engine.owners.leave()  # its PENDING records are a dead boot's now
        else:
            await slot.journal.aclose()  # nothing of it reaches the file any more

    @precondition(lambda self: any(slot.crashed for slot in self.slots))
    @rule(slot=slot_numbers)
    def restart(self, slot: int) -> None:
        crashed = [i for i, s in enumerate(self.slots) if s.crashed]
        i = crashed[slot % len(crashed)]
        self.drive(self.reboot, i)

    async def reboot(self, i: int) -> None:
        self.slots[i] = await self.boot(i)


BACKENDS = ["memory", "file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_engines_sharing_a_journal_keep_every_invariant_through_stalls_crashes_cancels_and_operators(
    backend: str,
) -> None:
    machine = type(f"Interleavings_{backend}", (Interleavings,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples(backend),
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
