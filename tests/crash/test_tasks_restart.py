"""Tasks survive a SIGKILL of their server: the task id still answers, and the in-doubt policy decides.

A task (a refund that pays, then waits on a gate: tests/server/servers/tasks.py) is created over
HTTP; once it has paid and waits, its server is SIGKILLed and started again on the same journal.

- file journal, `retry`: the new server resumes the task at start, in the background: the `pay`
  step replays from the journal (no second run, one effect on the ledger), the task completes
  exactly once and `tasks/result` returns its result;
- `refuse`: the task ends `failed` with the `in_doubt` error, and its tool is not run again;
- `reconcile`: the hook finds the refund on the ledger and completes the task without a rerun;
- two replicas on Postgres: the replica that did not start the task answers `tasks/get` and
  `tasks/result` and resumes it when the owner is killed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable.demo.ledger import PaymentProvider
from tests.conftest import scratch_postgres_url
from tests.crash.replicas import serve_http_together
from tests.helpers import ServedHttp, serve_http
from tests.server.servers.counting import Counter
from tests.server.task_client import create_legacy_task, request

TASKS = "tests/server/servers/tasks.py:make_server"
ARGS = {"order_id": "O-1", "amount_cents": 900}


class Setup:
    def __init__(self, tmp_path: Path, policy: str) -> None:
        self.gates = tmp_path / "gates"
        self.gates.mkdir(exist_ok=True)
        self.counts = Counter(tmp_path / "counter")
        self.ledger = PaymentProvider(tmp_path / "ledger.db")
        self.env = {
            "COUNTER_FILE": str(self.counts.path),
            "TASK_GATE": str(self.gates),
            "PAYMENTS_LEDGER": str(self.ledger.path),
            "TASK_IN_DOUBT": policy,
            "TASK_LEASE": "1.0",
        }

    async def until(self, event: str, times: int = 1, timeout: float = 30) -> None:
        with anyio.fail_after(timeout):
            while self.counts.count(event) < times:
                await anyio.sleep(0.02)

    @asynccontextmanager
    async def serve(self, journal: str) -> AsyncIterator[ServedHttp]:
        async with serve_http(TASKS, journal=journal, env=self.env) as served:
            yield served

    @asynccontextmanager
    async def serve_replicas(self, journal: str) -> AsyncIterator[list[ServedHttp]]:
        """Two replicas on `journal`, booted at the same time."""
        async with serve_http_together((TASKS, journal, self.env), (TASKS, journal, self.env)) as replicas:
            yield replicas


async def _create_then_kill(setup: Setup, served: ServedHttp) -> str:
    """Create the task on `served`, wait until it has paid and waits on its gate, SIGKILL it."""
    async with Client(served.url, mode="legacy") as client:
        task_id: str = (await create_legacy_task(client, "refund", ARGS))["task"]["taskId"]
    await setup.until("wait O-1")
    served.kill()
    return task_id


async def _get(url: str, task_id: str) -> dict[str, Any]:
    async with Client(url, mode="legacy") as client:
        return await request(client, "tasks/get", {"taskId": task_id})


async def _result(url: str, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(60):
        async with Client(url, mode="legacy") as client:
            return await request(client, "tasks/result", {"taskId": task_id})


async def test_a_killed_servers_task_is_resumed_at_start_and_completes_exactly_once(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "retry")
    journal = f"file://{tmp_path / 'journal'}"
    async with setup.serve(journal) as first:
        task_id = await _create_then_kill(setup, first)
    async with setup.serve(journal) as second:
        await setup.until("wait O-1", 2)  # resumed at start, without any request
        polled = await _get(second.url, task_id)
        assert polled["taskId"] == task_id and polled["status"] == "working"
        (setup.gates / "O-1").touch()
        result = await _result(second.url, task_id)
        done = await _get(second.url, task_id)
    assert result["isError"] is False and result["structuredContent"]["order_id"] == "O-1"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert done["status"] == "completed"
    assert setup.counts.count("pay O-1") == 1  # the pay step replayed from the journal
    assert setup.counts.count("done O-1") == 1
    assert len(setup.ledger.effects(subject="O-1")) == 1
    assert result["structuredContent"]["effect_id"] == setup.ledger.effects(subject="O-1")[0]["id"]


async def test_under_refuse_a_killed_servers_task_ends_failed_in_doubt(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "refuse")
    journal = f"file://{tmp_path / 'journal'}"
    async with setup.serve(journal) as first:
        task_id = await _create_then_kill(setup, first)
    (setup.gates / "O-1").touch()
    async with setup.serve(journal) as second:
        polled = await _get(second.url, task_id)
        result = await _result(second.url, task_id)
    assert polled["status"] == "failed" and "in_doubt" in polled["statusMessage"]
    assert result["isError"] is True and result["_meta"]["mcp-durable/error"]["error"] == "in_doubt"
    assert setup.counts.count("wait O-1") == 1 and setup.counts.count("done O-1") == 0  # not run again


async def test_under_reconcile_the_hook_completes_a_killed_servers_task(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "reconcile")
    journal = f"file://{tmp_path / 'journal'}"
    async with setup.serve(journal) as first:
        task_id = await _create_then_kill(setup, first)
    async with setup.serve(journal) as second:
        result = await _result(second.url, task_id)
        done = await _get(second.url, task_id)
    effects = setup.ledger.effects(subject="O-1")
    assert done["status"] == "completed" and result["isError"] is False
    assert result["structuredContent"] == {"order_id": "O-1", "effect_id": effects[0]["id"]}
    assert len(effects) == 1 and setup.counts.count("done O-1") == 0  # found, not run again
    assert sum(setup.counts.count(f"reconcile {k}") for k in ("O-1",)) == 1


@pytest.fixture
def postgres_journal() -> Iterator[str]:
    yield scratch_postgres_url("tasks")


@pytest.mark.postgres
async def test_a_replica_answers_for_another_replicas_task_and_resumes_it_when_the_owner_dies(
    tmp_path: Path, postgres_journal: str
) -> None:
    setup = Setup(tmp_path, "retry")
    async with setup.serve_replicas(postgres_journal) as (a, b):
        async with Client(a.url, mode="legacy") as client:
            task_id = (await create_legacy_task(client, "refund", ARGS))["task"]["taskId"]
        await setup.until("wait O-1")
        seen_by_b = await _get(b.url, task_id)  # B did not start it, and answers from the journal
        a.kill()
        await setup.until("wait O-1", 2)  # B resumed it once A's lease ran out, with nobody asking
        (setup.gates / "O-1").touch()
        result = await _result(b.url, task_id)
        done = await _get(b.url, task_id)
    assert seen_by_b["taskId"] == task_id and seen_by_b["status"] == "working"
    assert result["isError"] is False and result["structuredContent"]["order_id"] == "O-1"
    assert done["status"] == "completed"
    assert setup.counts.count("wait O-1") == 2 and setup.counts.count("pay O-1") == 1
    assert setup.counts.count("done O-1") == 1 and len(setup.ledger.effects(subject="O-1")) == 1


@pytest.mark.postgres
async def test_a_cancel_sent_to_another_replica_stops_the_tool_on_the_owner(
    tmp_path: Path, postgres_journal: str
) -> None:
    setup = Setup(tmp_path, "retry")
    async with setup.serve_replicas(postgres_journal) as (a, b):
        async with Client(a.url, mode="legacy") as client:
            task_id = (await create_legacy_task(client, "refund", ARGS))["task"]["taskId"]
        await setup.until("wait O-1")
        async with Client(b.url, mode="legacy") as client:
            cancelled = await request(client, "tasks/cancel", {"taskId": task_id})
        await setup.until("stopped O-1")  # A learnt it from the journal when it renewed its lease
        (setup.gates / "O-1").touch()
        after_a = await _get(a.url, task_id)
        a.kill()  # a cancelled task is never resumed, not even when its owner dies
        await anyio.sleep(1.5)  # past A's lease: B would take an in-doubt task over now
        after_b = await _get(b.url, task_id)
    assert cancelled["status"] == "cancelled"
    assert after_a["status"] == "cancelled" and after_b["status"] == "cancelled"
    assert setup.counts.count("done O-1") == 0 and setup.counts.count("wait O-1") == 1
