"""`tasks/cancel` never frees a key: a terminal task stays as it is, a cancelled one is not run again.

The refund of tests/server/servers/tasks.py pays (its effect, counted `pay O`), then waits on a
gate file (counted `wait O`), under `in_doubt="refuse"`. Both protocol generations:

- a task in doubt after a restart is `failed` (refuse): cancelling it changes nothing (2025-11-25
  answers -32602, 2026-07-28 acknowledges), and a plain call with its key is still refused
  `in_doubt`, never run a second time;
- a task cancelled after its effect stays cancelled: a plain call with its key is refused
  `cancelled` and does not run the tool (engine semantics: a requestor-cancelled call answers
  `cancelled` to repeats until it expires or an operator acts);
- a task a 2026-07-28 repeat attaches to an in-doubt plain call (the server SIGKILLed under it)
  is `failed` too, and its cancel does not free the key either.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp_types import CallToolResult

from mcp_durable import CallIdentity, CallState, DurableServer
from mcp_durable.journal import CallRecord, create_journal
from tests.helpers import meta_of, serve_http
from tests.server.servers.counting import Counter
from tests.server.servers.tasks import make_server
from tests.server.task_client import TaskHandle, TasksClient, call_for_task, create_legacy_task, poll_until_terminal
from tests.server.task_client import request as task_request

TASKS = "tests/server/servers/tasks.py:make_server"
#: 2025-11-25 (the client opts in per call) and 2026-07-28 (the server decides).
ERAS = ("legacy", "2026-07-28")


@dataclass
class Setup:
    """One journal, gate directory, counter and ledger; servers on them made (and "restarted") at will."""

    tmp_path: Path

    def __post_init__(self) -> None:
        self.gates = self.tmp_path / "gates"
        self.gates.mkdir(exist_ok=True)
        self.counts = Counter(self.tmp_path / "counter")
        self.journal = f"file://{self.tmp_path / 'journal'}"
        self.ledger = self.tmp_path / "ledger.db"

    def server(self) -> DurableServer:
        """A new server on the journal: a restart of whichever server used it before."""
        return make_server(
            journal=self.journal, counter=self.counts.path, gate=self.gates, ledger=self.ledger, in_doubt="refuse"
        )

    @property
    def env(self) -> dict[str, str]:
        """The same server as a subprocess (`serve_http(TASKS, …)`)."""
        return {
            "COUNTER_FILE": str(self.counts.path),
            "TASK_GATE": str(self.gates),
            "PAYMENTS_LEDGER": str(self.ledger),
            "TASK_IN_DOUBT": "refuse",
        }

    async def until_counted(self, event: str) -> None:
        with anyio.fail_after(30):  # a bound on a hang, not a timing assertion
            while self.counts.count(event) < 1:
                await anyio.sleep(0.02)

    async def record(self, order_id: str) -> CallRecord:
        """The refund's record of `order_id`, read from the journal itself (no server running)."""
        journal = create_journal(self.journal)
        await journal.open()
        try:
            record = await journal.get(CallIdentity("local", "refund", order_id))
        finally:
            await journal.aclose()
        assert record is not None
        return record


def args(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "amount_cents": 400}


@asynccontextmanager
async def task_client(server: DurableServer, era: str) -> AsyncIterator[Client]:
    """A client that can create tasks in `era`."""
    if era == "legacy":
        async with Client(server, mode="legacy") as client:
            yield client
    else:
        async with Client(server, extensions=[TasksClient()]) as client:
            yield client


async def create_task(client: Client, era: str, order_id: str) -> str:
    """Create the refund task of `order_id` in `era` (the gate is shut: it is a task in both)."""
    if era == "legacy":
        created = await create_legacy_task(client, "refund", args(order_id))
        task_id: str = created["task"]["taskId"]
        return task_id
    handle = await call_for_task(client, "refund", args(order_id))
    assert isinstance(handle, TaskHandle), handle
    return handle.task_id


async def answer_or_error(client: Client, method: str, task_id: str) -> dict[str, Any] | MCPError:
    """`method` (`tasks/get`, `tasks/cancel`) on `task_id`: its answer, or the JSON-RPC error it got."""
    try:
        return await task_request(client, method, {"taskId": task_id})
    except MCPError as exc:
        return exc


async def plain_call(server: DurableServer, era: str, order_id: str) -> CallToolResult:
    """A plain `tools/call` of the refund (no task: 2025-11-25 without `params.task`, 2026-07-28
    from a request that does not declare the tasks extension)."""
    async with Client(server, mode="legacy" if era == "legacy" else "auto") as client:
        return await client.call_tool("refund", args(order_id))


def refusal_code(result: CallToolResult) -> str | None:
    error = meta_of(result).get("mcp-durable/error")
    return None if error is None else str(error["error"])


def assert_cancel_changed_nothing(era: str, answer: dict[str, Any] | MCPError) -> None:
    """The answer the spec gives to cancelling a terminal task: -32602 (2025-11-25), an ack (2026-07-28)."""
    if era == "legacy":
        assert isinstance(answer, MCPError), answer
        assert answer.error.code == -32602 and "terminal status 'failed'" in answer.error.message
    else:
        assert isinstance(answer, dict), answer
        assert {k: v for k, v in answer.items() if k != "_meta"} == {"resultType": "complete"}


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


# -- a task in doubt after a restart ----------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_cancelling_a_task_in_doubt_after_a_restart_changes_nothing_and_its_key_stays_refused(
    setup: Setup, era: str
) -> None:
    first = setup.server()
    async with task_client(first, era) as client:
        task_id = await create_task(client, era, "O-1")
        await setup.until_counted("wait O-1")
    # The server stopped with the task running: its record stays pending, and the next start
    # finds it in doubt; under `refuse` the task is `failed` until an operator resolves it.
    restarted = setup.server()
    setup.gates.joinpath("O-1").touch()  # a run the cancel let through would now finish
    async with task_client(restarted, era) as client:
        before = await task_request(client, "tasks/get", {"taskId": task_id})
        answer = await answer_or_error(client, "tasks/cancel", task_id)
        after = await task_request(client, "tasks/get", {"taskId": task_id})
    again = await plain_call(restarted, era, "O-1")
    assert before["status"] == "failed"
    assert_cancel_changed_nothing(era, answer)
    assert after["status"] == "failed" and after["lastUpdatedAt"] == before["lastUpdatedAt"]
    if era != "legacy":
        assert after["error"]["data"]["error"] == "in_doubt"
    assert again.is_error and refusal_code(again) == "in_doubt"
    assert setup.counts.count("pay O-1") == 1 and setup.counts.count("wait O-1") == 1
    assert setup.counts.count("done O-1") == 0  # never run a second time
    record = await setup.record("O-1")
    assert record.state == CallState.IN_DOUBT and record.task_id == task_id


# -- a task cancelled after its effect ------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_a_plain_call_with_the_key_of_a_cancelled_task_is_refused_cancelled_and_runs_nothing(
    setup: Setup, era: str
) -> None:
    # Fails until the engine answers a requestor-cancelled call `cancelled` (it used to run it again).
    server = setup.server()
    async with task_client(server, era) as client:
        task_id = await create_task(client, era, "O-2")
        await setup.until_counted("wait O-2")  # after its effect: it has paid, and waits
        answer = await answer_or_error(client, "tasks/cancel", task_id)
        ended = await poll_until_terminal(client, task_id)
        setup.gates.joinpath("O-2").touch()  # a run of the key would now finish
        again = await plain_call(server, era, "O-2")
        still = await answer_or_error(client, "tasks/get", task_id)
    assert not isinstance(answer, MCPError), answer
    assert again.is_error and refusal_code(again) == "cancelled", again
    assert ended["status"] == "cancelled"
    assert isinstance(still, dict) and still["status"] == "cancelled", still  # the task id still answers
    assert setup.counts.count("pay O-2") == 1 and setup.counts.count("wait O-2") == 1
    assert setup.counts.count("done O-2") == 0


# -- a task attached to an in-doubt plain call ------------------------------------------------------


async def _in_doubt_plain_call(setup: Setup, order_id: str) -> None:
    """A plain call of the refund on a server SIGKILLed after its effect, while it waits: in doubt."""
    outcome: list[Any] = []

    async def call(url: str) -> None:
        try:
            async with Client(url, mode="legacy") as client:
                outcome.append(await client.call_tool("refund", args(order_id)))
        except Exception as exc:  # noqa: BLE001 - the server is killed under it
            outcome.append(exc)

    async with serve_http(TASKS, journal=setup.journal, env=setup.env) as served:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(call, served.url))
            await setup.until_counted(f"wait {order_id}")
            served.kill()
    assert outcome and not isinstance(outcome[0], CallToolResult), outcome  # it never answered


async def test_a_task_attached_to_an_in_doubt_plain_call_cannot_be_cancelled_to_free_its_key(setup: Setup) -> None:
    await _in_doubt_plain_call(setup, "O-3")
    restarted = setup.server()
    setup.gates.joinpath("O-3").touch()  # a run the cancel let through would now finish
    async with Client(restarted, extensions=[TasksClient()]) as client:
        attached = await call_for_task(client, "refund", args("O-3"))  # the same key: a task attached to it
        assert isinstance(attached, TaskHandle), attached
        answer = await answer_or_error(client, "tasks/cancel", attached.task_id)
        after = await task_request(client, "tasks/get", {"taskId": attached.task_id})
    modern = await plain_call(restarted, "2026-07-28", "O-3")
    async with Client(restarted, mode="legacy") as client:  # the same task in the other generation
        legacy_task = (await create_legacy_task(client, "refund", args("O-3")))["task"]
        legacy_answer = await answer_or_error(client, "tasks/cancel", legacy_task["taskId"])
    legacy = await plain_call(restarted, "legacy", "O-3")
    assert attached.status == "failed"
    assert_cancel_changed_nothing("2026-07-28", answer)
    assert after["status"] == "failed" and after["error"]["data"]["error"] == "in_doubt"
    assert legacy_task["taskId"] == attached.task_id and legacy_task["status"] == "failed"
    assert_cancel_changed_nothing("legacy", legacy_answer)
    assert modern.is_error and refusal_code(modern) == "in_doubt"
    assert legacy.is_error and refusal_code(legacy) == "in_doubt"
    assert setup.counts.count("pay O-3") == 1 and setup.counts.count("done O-3") == 0
    record = await setup.record("O-3")
    assert record.state == CallState.IN_DOUBT and record.task_id == attached.task_id
