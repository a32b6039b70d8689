"""A FastMCP server's durable task survives a SIGKILL of the server: the task id still answers after
a restart on the same file journal, and the tool's in-doubt policy decides what happens to it.

The server is `task_server.py` as a process of its own over streamable HTTP. Its `refund` task pays
(a durable step, on a ledger outside the server that honours the scoped key), then waits on a
gate; once it has paid and waits, the process is SIGKILLed and started again on the same journal.

- `retry` (the refund is `idempotentHint: true`): the new process resumes the task at start, with
  no request for it; the `pay` step replays from the journal, the task completes exactly once and
  its result is read from the new process, in the generation it was created in;
- `refuse`: the task ends `failed` (`in_doubt`) and its tool is not run again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable.demo.ledger import PaymentProvider
from tests.fastmcp.servers import FastMCP  # noqa: F401 - skips (or fails under CI) without FastMCP
from tests.helpers import REPO, ServedHttp, free_port, wait_listening
from tests.server.servers.counting import Counter
from tests.server.task_client import TaskHandle, TasksClient, call_for_task, create_legacy_task, request

TASK_SERVER = Path(__file__).with_name("task_server.py")
ARGS = {"order_id": "O-1", "amount_cents": 900}


class Setup:
    """The stand-ins one test's server processes act on, and how to start one."""

    def __init__(self, tmp_path: Path, policy: str) -> None:
        self.gates = tmp_path / "gates"
        self.gates.mkdir(exist_ok=True)
        self.counts = Counter(tmp_path / "counter")
        self.ledger = PaymentProvider(tmp_path / "ledger.db")
        self.journal = f"file://{tmp_path / 'journal'}"
        self.env = {
            "COUNTER_FILE": str(self.counts.path),
            "TASK_GATE": str(self.gates),
            "PAYMENTS_LEDGER": str(self.ledger.path),
            "TASK_IN_DOUBT": policy,
            "TASK_LEASE": "1.0",
        }

    async def until(self, event: str, times: int = 1) -> None:
        with anyio.fail_after(30):  # a bound on a hang, not a timing assertion
            while self.counts.count(event) < times:
                await anyio.sleep(0.02)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[ServedHttp]:
        """`task_server.py` on the journal over HTTP on a free port until the block exits (then
        terminated, or killed); a port lost to a race is retried."""
        with tempfile.TemporaryDirectory(prefix="task-server-") as logs:
            for attempt in range(5):
                port = free_port()
                log_path = Path(logs) / f"stderr-{attempt}.log"
                with log_path.open("wb") as log:  # the child keeps its own descriptor
                    proc = subprocess.Popen(
                        [sys.executable, str(TASK_SERVER), "--journal", self.journal, "--port", str(port)],
                        cwd=REPO,
                        env={**os.environ, **self.env},
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                served = ServedHttp(f"http://127.0.0.1:{port}/mcp", port, proc, log_path)
                try:
                    if await wait_listening(served):
                        break
                    if "address already in use" not in served.stderr().lower():
                        raise RuntimeError(f"task_server.py exited with {proc.returncode}:\n{served.stderr()}")
                except BaseException:
                    served.kill()
                    raise
            else:
                raise RuntimeError("could not find a free port for task_server.py")
            try:
                yield served
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        served.kill()


def _client(url: str, era: str) -> Client:
    if era == "legacy":
        return Client(url, mode="legacy")
    return Client(url, mode="auto", extensions=[TasksClient()])


async def _create(url: str, era: str) -> str:
    async with _client(url, era) as client:
        if era == "legacy":
            task_id: str = (await create_legacy_task(client, "refund", ARGS))["task"]["taskId"]
            return task_id
        handle = await call_for_task(client, "refund", ARGS)
        assert isinstance(handle, TaskHandle), handle
        return handle.task_id


async def _get(url: str, era: str, task_id: str) -> dict[str, Any]:
    async with _client(url, era) as client:
        return await request(client, "tasks/get", {"taskId": task_id})


async def _terminal(url: str, era: str, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(60):
        while (task := await _get(url, era, task_id))["status"] == "working":
            await anyio.sleep(0.05)
    return task


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_killed_servers_task_is_resumed_at_start_and_completes_exactly_once(era: str, tmp_path: Path) -> None:
    setup = Setup(tmp_path, "retry")
    async with setup.serve() as first:
        task_id = await _create(first.url, era)
        await setup.until("wait O-1")
        first.kill()
    async with setup.serve() as second:
        await setup.until("wait O-1", 2)  # resumed at start, without any request
        polled = await _get(second.url, era, task_id)
        assert polled["taskId"] == task_id and polled["status"] == "working"
        (setup.gates / "O-1").touch()
        done = await _terminal(second.url, era, task_id)
        if era == "legacy":
            async with _client(second.url, era) as client:
                result = await request(client, "tasks/result", {"taskId": task_id})
        else:
            result = done["result"]
    assert done["status"] == "completed" and result["isError"] is False
    assert result["structuredContent"]["order_id"] == "O-1"
    assert setup.counts.count("pay O-1") == 1  # the pay step replayed from the journal
    assert setup.counts.count("done O-1") == 1
    effects = setup.ledger.effects(subject="O-1")
    assert [effect["id"] for effect in effects] == [result["structuredContent"]["effect_id"]]


async def test_under_refuse_a_killed_servers_task_ends_failed_in_doubt(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "refuse")
    async with setup.serve() as first:
        task_id = await _create(first.url, "legacy")
        await setup.until("wait O-1")
        first.kill()
    (setup.gates / "O-1").touch()
    async with setup.serve() as second:
        legacy = await _terminal(second.url, "legacy", task_id)
        modern = await _get(second.url, "modern", task_id)
    assert legacy["status"] == "failed" and "in_doubt" in legacy["statusMessage"]
    assert modern["status"] == "failed" and modern["error"]["data"]["error"] == "in_doubt"
    assert setup.counts.count("wait O-1") == 1 and setup.counts.count("done O-1") == 0  # never run again
    assert len(setup.ledger.effects(subject="O-1")) == 1
