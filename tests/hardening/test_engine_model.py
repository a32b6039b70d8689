"""A property-based test of the engine and every embedded journal against a simple model.

Hypothesis drives `Engine.execute` directly (no MCP) with an injected clock through random
interleavings of: calls with repeated and conflicting keys and arguments, under two principals;
concurrent duplicates; deliberate error results; unexpected exceptions; callers cancelled while
their tool runs; crashes of another instance inside the danger window (a PENDING record whose
owner is gone, left as a dead instance leaves it); restarts (journal closed and reopened, a new
Engine); purges; and clock advances past leases and retention.

The model predicts, for every call, whether the tool runs, and what the caller gets. The
invariant checked after every step: each identity's tool ran exactly as often as the documented
rules allow (once per retention period; again only after an unexpected exception released it, or
an in-doubt retry, or expiry), and every acknowledged result is replayed byte-identical.

Default: `MCP_DURABLE_PROPERTY_EXAMPLES` (200) examples per backend, 25 steps each; raise it for
a nightly run (e.g. `MCP_DURABLE_PROPERTY_EXAMPLES=5000`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
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
from mcp_durable.engine import Engine, ToolOutcome
from mcp_durable.errors import DurableError, InDoubtError, InProgressError, KeyReuseError
from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, Journal, create_journal
from mcp_durable.keys import KEY_META, fingerprint
from tests.conftest import JournalFactory, make_journal_factory
from tests.hardening.conftest import EMBEDDED

EXAMPLES = int(os.environ.get("MCP_DURABLE_PROPERTY_EXAMPLES", "200"))
STEPS = int(os.environ.get("MCP_DURABLE_PROPERTY_STEPS", "25"))

T0 = 1_700_000_000.0
LEASE = 30.0
RETENTION = 600.0
MAX_ATTEMPTS = 4
TOOL = "transfer"
PRINCIPALS = ("alice", "bob")
KEYS = ("k1", "k2", "k3")
# Patient: a duplicate in flight waits for the first call. Impatient: used only where the model
# predicts `in_progress` (a live foreign lease on a shared journal), so the test does not sleep.
PATIENT = ToolPolicy(lease=LEASE, retention=RETENTION, max_attempts=MAX_ATTEMPTS, wait=20.0)
IMPATIENT = replace(PATIENT, wait=0.02)

identities = st.tuples(st.sampled_from(PRINCIPALS), st.sampled_from(KEYS))
argument_values = st.sampled_from([0, 0, 0, 1])  # mostly the same arguments, sometimes a conflict
behaviours = st.sampled_from(["ok", "ok", "error", "raise"])


class Boom(Exception):
    """The tool's unexpected exception."""


@dataclass
class Model:
    """What the model believes the journal holds for one identity."""

    value: int  # the arguments' value (fingerprint)
    state: str  # completed | failed | released | pending (a dead instance's) | in_doubt
    attempts: int
    payload: bytes | None = None
    expires_at: float | None = None
    lease_until: float | None = None


class EngineModel(RuleBasedStateMachine):
    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.dir = Path(tempfile.mkdtemp(prefix="mcp-durable-model-"))
        if self.backend == "sqlite":
            # Relaxed fsync for speed: this test checks the rules, not durability (the contract
            # and fault tests do that).
            url = f"sqlite:///{self.dir}/journal.db?synchronous=NORMAL"
            self.factory: JournalFactory = lambda: create_journal(url)
        else:
            self.factory = make_journal_factory(self.backend, self.dir)
        self.now = T0
        self.journal: Journal = self.factory()
        self.engine = self._engine()
        self.portal.call(self.engine.start)
        self.model: dict[tuple[str, str], Model] = {}
        self.expected_runs: dict[tuple[str, str], int] = {}
        self.actual_runs: dict[tuple[str, str], int] = {}
        self.serial = 0
        self.ghosts = 0

    def _engine(self) -> Engine:
        return Engine(self.journal, clock=lambda: self.now)

    def teardown(self) -> None:
        try:
            self.portal.call(self.engine.aclose)
        finally:
            self.stack.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ------------------------------------------------------------------------------

    @property
    def shared(self) -> bool:
        return not self.journal.single_writer

    def live(self, ident: tuple[str, str]) -> Model | None:
        record = self.model.get(ident)
        if record is None or (record.expires_at is not None and record.expires_at <= self.now):
            return None
        return record

    def predict(self, ident: tuple[str, str], value: int) -> str:
        """`run_fresh`, `run_again`, `replay`, `key_reuse`, `in_progress` or `parked`."""
        record = self.live(ident)
        if record is None:
            return "run_fresh"
        if record.value != value:
            return "key_reuse"
        if record.state in ("completed", "failed"):
            return "replay"
        if record.state == "pending":
            if self.shared and record.lease_until is not None and record.lease_until > self.now:
                return "in_progress"
            record.state = "in_doubt"  # the engine marks a dead owner's call in doubt first
        if record.state == "in_doubt" and record.attempts >= MAX_ATTEMPTS:
            return "parked"
        return "run_again"  # released, or in doubt under the retry policy

    def after_run(self, ident: tuple[str, str], value: int, prediction: str, behaviour: str, payload: bytes) -> None:
        previous = self.live(ident)
        attempts = 1 if prediction == "run_fresh" or previous is None else previous.attempts + 1
        state = {"ok": "completed", "error": "failed", "raise": "released"}[behaviour]
        self.model[ident] = Model(
            value, state, attempts, None if behaviour == "raise" else payload, expires_at=self.now + RETENTION
        )
        self.expected_runs[ident] = self.expected_runs.get(ident, 0) + 1

    # -- driving the engine ---------------------------------------------------------------------

    def tool(
        self,
        ident: tuple[str, str],
        behaviour: str,
        gate: anyio.Event | None = None,
        started: Any = None,
        linger: bool = False,
    ) -> tuple[Any, bytes]:
        """A tool run that counts itself and returns a payload unique to this run."""
        self.serial += 1
        payload = orjson.dumps({"run": self.serial, "principal": ident[0], "key": ident[1], "behaviour": behaviour})

        async def run(call: Any) -> ToolOutcome:
            self.actual_runs[ident] = self.actual_runs.get(ident, 0) + 1
            if started is not None:
                started.set()
            if gate is not None:
                await gate.wait()
            elif linger:
                await anyio.sleep(0.005)  # long enough for concurrent duplicates to latch on
            if behaviour == "raise":
                raise Boom(f"unexpected failure of run {payload!r}")
            return ToolOutcome(payload, payload, is_error=behaviour == "error")

        return run, payload

    async def execute(self, ident: tuple[str, str], value: int, run: Any, policy: ToolPolicy = PATIENT) -> Any:
        try:
            return await self.engine.execute(
                tool=TOOL,
                policy=policy,
                arguments={"value": value},
                meta={KEY_META: ident[1]},
                run=run,
                principal=ident[0],
            )
        except (DurableError, Boom) as exc:
            return exc

    def check(
        self,
        ident: tuple[str, str],
        prediction: str,
        answer: Any,
        payload: bytes,
        behaviour: str,
        record_before: Model | None,
    ) -> None:
        if prediction in ("run_fresh", "run_again"):
            if behaviour == "raise":
                assert isinstance(answer, Boom), answer
            else:
                assert not isinstance(answer, BaseException), answer
                assert answer.payload == payload and not answer.replayed
        elif prediction == "replay":
            assert record_before is not None
            assert not isinstance(answer, BaseException), answer
            assert answer.replayed and answer.payload == record_before.payload, "a replay is not byte-identical"
        elif prediction == "key_reuse":
            assert isinstance(answer, KeyReuseError), answer
        elif prediction == "in_progress":
            assert isinstance(answer, InProgressError), answer
        elif prediction == "parked":
            assert isinstance(answer, InDoubtError), answer

    # -- rules ------------------------------------------------------------------------------------

    @rule(ident=identities, value=argument_values, behaviour=behaviours)
    def call(self, ident: tuple[str, str], value: int, behaviour: str) -> None:
        before = self.live(ident)
        snapshot = replace(before) if before is not None else None
        prediction = self.predict(ident, value)
        run, payload = self.tool(ident, behaviour)
        policy = IMPATIENT if prediction == "in_progress" else PATIENT
        answer = self.portal.call(self.execute, ident, value, run, policy)
        self.check(ident, prediction, answer, payload, behaviour, snapshot)
        if prediction in ("run_fresh", "run_again"):
            self.after_run(ident, value, prediction, behaviour, payload)

    @rule(ident=identities, value=argument_values, behaviour=st.sampled_from(["ok", "error"]), copies=st.integers(2, 4))
    def concurrent_duplicates(self, ident: tuple[str, str], value: int, behaviour: str, copies: int) -> None:
        before = self.live(ident)
        snapshot = replace(before) if before is not None else None
        prediction = self.predict(ident, value)
        if prediction == "in_progress":
            return  # covered by `call`; waiting the full patience here would only slow the test
        run, payload = self.tool(ident, behaviour, linger=True)

        async def all_at_once() -> list[Any]:
            answers: list[Any] = [None] * copies

            async def one(i: int) -> None:
                answers[i] = await self.execute(ident, value, run)

            async with anyio.create_task_group() as group:
                for i in range(copies):
                    group.start_soon(one, i)
            return answers

        answers = self.portal.call(all_at_once)
        if prediction in ("run_fresh", "run_again"):
            # One of them ran the tool; every other latched on and got the same bytes.
            assert all(not isinstance(a, BaseException) for a in answers), answers
            assert {a.payload for a in answers} == {payload}
            assert sum(1 for a in answers if not a.replayed) == 1
            self.after_run(ident, value, prediction, behaviour, payload)
        else:
            for answer in answers:
                self.check(ident, prediction, answer, payload, behaviour, snapshot)

    @rule(ident=identities, value=argument_values, behaviour=st.sampled_from(["ok", "error"]))
    def caller_cancelled_while_the_tool_runs(self, ident: tuple[str, str], value: int, behaviour: str) -> None:
        record = self.live(ident)
        if record is not None and (record.value != value or record.state in ("completed", "failed", "pending")):
            return  # the tool would not run: nothing to cancel it in
        if record is not None and record.state == "in_doubt" and record.attempts >= MAX_ATTEMPTS:
            return
        prediction = self.predict(ident, value)

        async def cancel_mid_run() -> list[Any]:
            gate, started = anyio.Event(), anyio.Event()
            run, payload = self.tool(ident, behaviour, gate=gate, started=started)
            got: list[Any] = []
            scope = anyio.CancelScope()

            async def caller() -> None:
                with scope:
                    got.append(await self.execute(ident, value, run))

            async with anyio.create_task_group() as group:
                group.start_soon(caller)
                with anyio.fail_after(10):
                    await started.wait()
                scope.cancel()  # the caller gives up while its tool runs
                await anyio.sleep(0)
                gate.set()
            return [payload, got]

        payload, got = self.portal.call(cancel_mid_run)
        # The shielded run completed and persisted; the caller may or may not have seen it.
        for answer in got:
            assert not isinstance(answer, BaseException) and answer.payload == payload
        self.after_run(ident, value, prediction, behaviour, payload)

    @rule(ident=identities, value=argument_values)
    def another_instance_dies_inside_its_call(self, ident: tuple[str, str], value: int) -> None:
        """A dead instance's PENDING record: claimed (or taken over) and never finished."""
        record = self.live(ident)
        self.ghosts += 1
        owner = f"dead-instance-{self.ghosts}"
        identity = CallIdentity(ident[0], TOOL, ident[1])

        async def die() -> bool:
            if record is None:
                fresh = CallRecord(
                    identity=identity,
                    fingerprint=fingerprint({"value": value}),
                    state=CallState.PENDING,
                    version=1,
                    run_id=f"ghost-{self.ghosts}",
                    attempts=1,
                    created_at=self.now,
                    updated_at=self.now,
                    owner=owner,
                    lease_until=self.now + LEASE,
                    arguments=orjson.dumps({"value": value}),
                )
                won, _ = await self.journal.claim(fresh, self.now)
                return won
            stored = await self.journal.get(identity)
            assert stored is not None
            taken = stored.evolve(
                state=CallState.PENDING,
                owner=owner,
                lease_until=self.now + LEASE,
                attempts=stored.attempts + 1,
                updated_at=self.now,
            )
            return await self.journal.swap(stored.version, taken)

        if record is not None:
            if record.state == "pending" and not (self.shared and (record.lease_until or 0) > self.now):
                record.state = "in_doubt"
            if record.state not in ("released", "in_doubt") or record.attempts >= MAX_ATTEMPTS:
                return  # an instance takes over only a released call or an in-doubt one under retry
        assert self.portal.call(die)
        if record is None:
            self.model[ident] = Model(value, "pending", 1, lease_until=self.now + LEASE)
        else:
            record.state, record.attempts, record.lease_until = "pending", record.attempts + 1, self.now + LEASE

    @rule()
    def restart(self) -> None:
        self.portal.call(self.engine.aclose)
        self.journal = self.factory()
        self.engine = self._engine()
        self.portal.call(self.engine.start)

    @rule(seconds=st.sampled_from([1.0, LEASE + 1, RETENTION / 2, RETENTION + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def purge(self) -> None:
        self.portal.call(self.engine.purge_expired)
        for ident in [i for i in self.model if self.live(i) is None]:
            del self.model[ident]

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def every_acknowledged_result_is_replayed_byte_identical(self, data: st.DataObject) -> None:
        finals = [i for i in self.model if (r := self.live(i)) is not None and r.state in ("completed", "failed")]
        if not finals:
            return
        ident = data.draw(st.sampled_from(sorted(finals)))
        record = self.model[ident]
        run, payload = self.tool(ident, "ok")
        answer = self.portal.call(self.execute, ident, record.value, run)
        assert not isinstance(answer, BaseException), answer
        assert answer.replayed and answer.payload == record.payload

    # -- the invariant ------------------------------------------------------------------------------

    @invariant()
    def each_identity_ran_exactly_as_the_rules_allow(self) -> None:
        assert self.actual_runs == self.expected_runs

    @invariant()
    def the_journal_holds_what_the_model_says(self) -> None:
        """Between steps nothing of ours is PENDING (a failed run was released, a finished one
        persisted), and every live record has the model's state, attempts, arguments and bytes."""

        async def read_all() -> dict[tuple[str, str], CallRecord]:
            records = await self.journal.list_calls(CallQuery(tool=TOOL, limit=100))
            return {(r.identity.principal, r.identity.key): r for r in records}

        journal = self.portal.call(read_all)
        for ident in [(p, k) for p in PRINCIPALS for k in KEYS]:
            stored = journal.get(ident)
            expected = self.live(ident)
            if expected is None:
                assert stored is None or stored.is_expired(self.now), (ident, stored)
                continue
            assert stored is not None and not stored.is_expired(self.now), (ident, expected)
            assert stored.fingerprint == fingerprint({"value": expected.value})
            assert stored.attempts == expected.attempts, (ident, stored, expected)
            if expected.state in ("pending", "in_doubt"):
                assert stored.state in (CallState.PENDING, CallState.IN_DOUBT), (ident, stored)
                if stored.state == CallState.PENDING:
                    assert (stored.owner or "").startswith("dead-instance-"), f"left pending: {stored}"
            else:
                assert stored.state.value == expected.state, (ident, stored, expected)
                assert stored.result == expected.payload, "the journal does not hold the acknowledged bytes"
                assert stored.expires_at == expected.expires_at


@pytest.mark.parametrize("backend", EMBEDDED)
def test_the_engine_runs_each_identity_once_per_retention_and_replays_byte_identical(backend: str) -> None:
    machine = type(f"EngineModel_{backend}", (EngineModel,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
