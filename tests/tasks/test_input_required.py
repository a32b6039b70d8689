"""A durable task that asks its user (`input_required`), over streamable HTTP with real clients.

The target (tests/tasks/servers/asking.py) runs a durable step, asks for an approval, runs a second
step, asks for a receipt address and answers with both answers; a counter file outside the server
counts each step's real runs.

- 2026-07-28 (the Python client with the tasks extension): `tasks/get` shows the task
  `input_required` with its question in `inputRequests`, `tasks/update` answers it; another
  principal (another bearer token) gets exactly the unknown-id error for the task's `tasks/get` and
  `tasks/update`, so it neither sees the question nor answers it, and its own call with the same
  key is its own task.
- 2025-11-25 (the Python client's elicitation callback): the task is `input_required`, and
  `tasks/result` brings each question to the client as `elicitation/create` with the related-task
  `_meta`, then the result.
- SIGKILL while the task waits for its user, twice: after each restart the task asks again under
  the key it had (or, past an answered question, resumes with the journaled answer), and no step
  runs twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestParams, ElicitResult

from mcp_durable.server.tasks import RELATED_TASK, TASK_NOT_FOUND
from tests.helpers import ServedHttp, serve_http
from tests.server.servers.counting import Counter
from tests.server.task_client import (
    TasksClient,
    accept,
    call_for_task,
    create_legacy_task,
    poll_until_terminal,
    refused,
    request,
    wait_for_question,
)

ASKING = "tests/tasks/servers/asking.py:make_server"
TOKENS = "tokA=alice,tokB=bob"
REFUND = {"order_id": "O-1", "amount_cents": 250}


@asynccontextmanager
async def _server(tmp_path: Path) -> AsyncIterator[ServedHttp]:
    env = {"COUNTER_FILE": str(tmp_path / "counter"), "MCP_DURABLE_TOKENS": TOKENS}
    async with serve_http(ASKING, journal=f"file://{tmp_path / 'journal'}", env=env) as served:
        yield served


@asynccontextmanager
async def _client(url: str, token: str, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    extensions = [TasksClient()] if mode == "auto" else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, extensions=extensions, **kwargs) as client:
            yield client


async def test_a_task_asks_its_principal_and_no_other_2026(tmp_path: Path) -> None:
    counts = Counter(tmp_path / "counter")
    async with _server(tmp_path) as served:
        async with _client(served.url, "tokA", "auto") as alice, _client(served.url, "tokB", "auto") as bob:
            task_id = (await call_for_task(alice, "approve_refund", REFUND, key="r-1")).task_id
            asking = await wait_for_question(alice, task_id, "input-0")
            question = asking["inputRequests"]["input-0"]

            unknown = await refused(bob, "tasks/get", {"taskId": "not-a-task-id"})
            seen = await refused(bob, "tasks/get", {"taskId": task_id})
            answered = await refused(
                bob, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=False)}}
            )
            bobs = (await call_for_task(bob, "approve_refund", REFUND, key="r-1")).task_id
            await wait_for_question(bob, bobs, "input-0")  # his own task, asking him

            still = await request(alice, "tasks/get", {"taskId": task_id})  # Bob's answer did not land
            ack = await request(
                alice, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=True)}}
            )
            second = await wait_for_question(alice, task_id, "input-1")
            await request(
                alice,
                "tasks/update",
                {"taskId": task_id, "inputResponses": {"input-1": accept(email="a@example.com"), "input-9": {}}},
            )
            done = await poll_until_terminal(alice, task_id)
            again = await request(alice, "tasks/get", {"taskId": task_id})
            await request(bob, "tasks/cancel", {"taskId": bobs})

    assert question["method"] == "elicitation/create"
    assert question["params"]["message"] == "Refund 250 cents for O-1?"
    assert question["params"]["requestedSchema"]["properties"]["approve"]["type"] == "boolean"
    for error in (seen, answered):
        assert (error.error.code, error.error.message) == (unknown.error.code, TASK_NOT_FOUND)
    assert bobs != task_id
    assert still["status"] == "input_required" and list(still["inputRequests"]) == ["input-0"]
    assert ack["resultType"] == "complete" and not {"taskId", "status", "inputRequests"} & set(ack)
    assert list(second["inputRequests"]) == ["input-1"]  # the answered question is gone
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "refunded 250 cents for O-1, receipt to a@example.com"
    assert "inputRequests" not in again
    # One quote per principal's task, one payment (Alice's; Bob's task never got an approval).
    assert counts.count("quote O-1") == 2
    assert counts.count("pay O-1") == 1


async def test_a_task_asks_through_tasks_result_2025(tmp_path: Path) -> None:
    counts = Counter(tmp_path / "counter")
    asked: list[tuple[str, Any]] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        related = (params.meta or {}).get(RELATED_TASK)
        asked.append((params.message, related))
        if "Refund" in params.message:
            return ElicitResult(action="accept", content={"approve": True})
        return ElicitResult(action="accept", content={"email": "legacy@example.com"})

    async with _server(tmp_path) as served:
        async with _client(served.url, "tokA", "legacy", elicitation_callback=answer) as alice:
            created = await create_legacy_task(alice, "approve_refund", REFUND, key="r-2")
            task_id = created["task"]["taskId"]
            with anyio.fail_after(30):
                while (task := await request(alice, "tasks/get", {"taskId": task_id}))["status"] == "working":
                    await anyio.sleep(0.05)
            result = await request(alice, "tasks/result", {"taskId": task_id})
            final = await request(alice, "tasks/get", {"taskId": task_id})

    assert created["task"]["status"] == "working"
    assert task["status"] == "input_required" and "inputRequests" not in task
    assert asked == [
        ("Refund 250 cents for O-1?", {"taskId": task_id}),
        ("Where should the receipt for O-1 go?", {"taskId": task_id}),
    ]
    assert result["content"][0]["text"] == "refunded 250 cents for O-1, receipt to legacy@example.com"
    assert result["_meta"][RELATED_TASK] == {"taskId": task_id}
    assert final["status"] == "completed"
    assert (counts.count("quote O-1"), counts.count("pay O-1")) == (1, 1)


def _kill(served: ServedHttp) -> None:
    served.proc.kill()
    served.proc.wait(timeout=10)


async def test_a_task_waiting_for_its_user_survives_sigkill(tmp_path: Path) -> None:
    counts = Counter(tmp_path / "counter")
    async with _server(tmp_path) as served:
        async with _client(served.url, "tokA", "auto") as alice:
            task_id = (await call_for_task(alice, "approve_refund", REFUND, key="r-3")).task_id
            await wait_for_question(alice, task_id, "input-0")
        _kill(served)  # waiting for the approval: nothing answered yet
    async with _server(tmp_path) as served:
        async with _client(served.url, "tokA", "auto") as alice:
            asked_again = await wait_for_question(alice, task_id, "input-0")  # asked again, under its key
            await request(
                alice, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=True)}}
            )
            await wait_for_question(alice, task_id, "input-1")
        _kill(served)  # approved and paid, waiting for the receipt address
    async with _server(tmp_path) as served:
        async with _client(served.url, "tokA", "auto") as alice:
            resumed = await wait_for_question(alice, task_id, "input-1")  # the approval is the journal's
            await request(
                alice,
                "tasks/update",
                {"taskId": task_id, "inputResponses": {"input-1": accept(email="k@example.com")}},
            )
            done = await poll_until_terminal(alice, task_id)

    assert list(asked_again["inputRequests"]) == ["input-0"]
    assert list(resumed["inputRequests"]) == ["input-1"]
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "refunded 250 cents for O-1, receipt to k@example.com"
    assert (counts.count("quote O-1"), counts.count("pay O-1")) == (1, 1)  # no step ran twice
