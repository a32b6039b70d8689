"""A FastMCP tool run as a durable task asks its requestor (`ctx.elicit`: `input_required`), in both
generations, over streamable HTTP with the MCP Python SDK's client (tests/tasks/test_input_required.py
for FastMCP).

The tool is task_server.py's `approve_refund`: a durable step, a question (approve?), a second
step, a second question (where does the receipt go?); a counter file outside the server counts each
step's real runs.

- 2026-07-28: `tasks/get` shows the task `input_required` with its question in `inputRequests`,
  `tasks/update` answers it; another principal (another bearer token) gets exactly the unknown-id
  error for the task's `tasks/get` and `tasks/update`.
- 2025-11-25: `tasks/result` brings each question to the client as `elicitation/create` with the
  related-task `_meta`, then the result.
- SIGKILL of the server process while the task waits for its user, twice: after each restart the
  task asks again under the key it had (or, past an answered question, resumes with the journaled
  answer), and no step runs twice.
- FastMCP's guard pattern in a task (the conformance fixtures' `test_tool_with_task`, 2025-11-25):
  its `InputRequiredResult` is asked through the task, and the run again gets the answer.
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
from tests.fastmcp.servers import TOKENS  # skips (or fails under CI) without FastMCP
from tests.fastmcp.test_tasks import _fixture
from tests.fastmcp.test_tasks_restart import Setup
from tests.helpers import serve_app
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

REFUND = {"order_id": "O-1", "amount_cents": 250}


@asynccontextmanager
async def _client(url: str, token: str | None, mode: str, **kwargs: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    extensions = [TasksClient()] if mode == "auto" else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, extensions=extensions, **kwargs) as client:
            yield client


async def test_a_fastmcp_task_asks_its_principal_and_no_other_2026(tmp_path: Path) -> None:
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    verifier = StaticTokenVerifier({token: {"client_id": who, "scopes": []} for token, who in TOKENS.items()})
    fx = _fixture(tmp_path, auth=verifier)
    async with fx.serve() as url:
        async with _client(url, "tokA", "auto") as alice, _client(url, "tokB", "auto") as bob:
            task_id = (await call_for_task(alice, "approve_refund", REFUND, key="r-1")).task_id
            asking = await wait_for_question(alice, task_id, "input-0")
            question = asking["inputRequests"]["input-0"]

            unknown = await refused(bob, "tasks/get", {"taskId": "not-a-task-id"})
            seen = await refused(bob, "tasks/get", {"taskId": task_id})
            answered = await refused(
                bob, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=False)}}
            )
            still = await request(alice, "tasks/get", {"taskId": task_id})  # Bob's answer did not land
            await request(
                alice, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=True)}}
            )
            second = await wait_for_question(alice, task_id, "input-1")
            await request(
                alice,
                "tasks/update",
                {"taskId": task_id, "inputResponses": {"input-1": accept(email="a@example.com")}},
            )
            done = await poll_until_terminal(alice, task_id)
            again = (await call_for_task(alice, "approve_refund", REFUND, key="r-1")).task_id

    assert question["method"] == "elicitation/create"
    assert question["params"]["message"] == "Refund 250 cents for O-1?"
    assert question["params"]["requestedSchema"]["properties"]["approve"]["type"] == "boolean"
    for error in (seen, answered):
        assert (error.error.code, error.error.message) == (unknown.error.code, TASK_NOT_FOUND)
    assert still["status"] == "input_required" and list(still["inputRequests"]) == ["input-0"]
    assert list(second["inputRequests"]) == ["input-1"]  # the answered question is gone
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "refunded 250 cents for O-1, receipt to a@example.com"
    assert again == task_id  # a resent task-creating call: the same task
    assert (fx.counts.count("quote O-1"), fx.counts.count("pay O-1")) == (1, 1)


async def test_a_fastmcp_task_asks_through_tasks_result_2025(tmp_path: Path) -> None:
    fx = _fixture(tmp_path)
    asked: list[tuple[str, Any]] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        related = (params.meta or {}).get(RELATED_TASK)
        asked.append((params.message, related))
        if "Refund" in params.message:
            return ElicitResult(action="accept", content={"approve": True})
        return ElicitResult(action="accept", content={"email": "legacy@example.com"})

    async with fx.serve() as url:
        async with _client(url, None, "legacy", elicitation_callback=answer) as alice:
            created = await create_legacy_task(alice, "approve_refund", REFUND, key="r-2")
            task_id = created["task"]["taskId"]
            with anyio.fail_after(30):
                while (task := await request(alice, "tasks/get", {"taskId": task_id}))["status"] == "working":
                    await anyio.sleep(0.05)
            result = await request(alice, "tasks/result", {"taskId": task_id})
            final = await request(alice, "tasks/get", {"taskId": task_id})

    assert task["status"] == "input_required" and "inputRequests" not in task
    assert asked == [
        ("Refund 250 cents for O-1?", {"taskId": task_id}),
        ("Where should the receipt for O-1 go?", {"taskId": task_id}),
    ]
    assert result["content"][0]["text"] == "refunded 250 cents for O-1, receipt to legacy@example.com"
    assert result["_meta"][RELATED_TASK] == {"taskId": task_id}
    assert final["status"] == "completed"
    assert (fx.counts.count("quote O-1"), fx.counts.count("pay O-1")) == (1, 1)


async def test_a_fastmcp_task_waiting_for_its_user_survives_sigkill(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "retry")
    counts = Counter(tmp_path / "counter")
    async with setup.serve() as served:
        async with _client(served.url, None, "auto") as client:
            task_id = (await call_for_task(client, "approve_refund", REFUND, key="r-3")).task_id
            await wait_for_question(client, task_id, "input-0")
        served.kill()  # waiting for the approval: nothing answered yet
    async with setup.serve() as served:
        async with _client(served.url, None, "auto") as client:
            asked_again = await wait_for_question(client, task_id, "input-0")  # asked again, under its key
            await request(
                client, "tasks/update", {"taskId": task_id, "inputResponses": {"input-0": accept(approve=True)}}
            )
            await wait_for_question(client, task_id, "input-1")
        served.kill()  # approved and paid, waiting for the receipt address
    async with setup.serve() as served:
        async with _client(served.url, None, "auto") as client:
            resumed = await wait_for_question(client, task_id, "input-1")  # the approval is the journal's
            await request(
                client,
                "tasks/update",
                {"taskId": task_id, "inputResponses": {"input-1": accept(email="k@example.com")}},
            )
            done = await poll_until_terminal(client, task_id)

    assert list(asked_again["inputRequests"]) == ["input-0"]
    assert list(resumed["inputRequests"]) == ["input-1"]
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "refunded 250 cents for O-1, receipt to k@example.com"
    assert (counts.count("quote O-1"), counts.count("pay O-1")) == (1, 1)  # no step ran twice


async def test_a_fastmcp_guard_run_as_a_task_asks_through_it_2025(tmp_path: Path) -> None:
    """FastMCP's guard pattern inside a task: `test_tool_with_task` (the conformance fixtures')
    answers `InputRequiredResult` on its first run (a 2025-11-25 task has no round before it); its
    question is the task's, brought by `tasks/result`, and the run again gets the answer as
    `ctx.input_responses`."""
    from tests.conformance.servers.fastmcp_tasks_fixtures import make_app  # after FastMCP's check above

    asked: list[tuple[str, Any]] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append((params.message, (params.meta or {}).get(RELATED_TASK)))
        return ElicitResult(action="accept", content={"name": "Ada"})

    async with serve_app(make_app(f"file://{tmp_path / 'journal'}").http_app()) as base:
        async with _client(f"{base}/mcp", None, "legacy", elicitation_callback=answer) as client:
            created = await create_legacy_task(client, "test_tool_with_task", {}, key="g-1")
            task_id = created["task"]["taskId"]
            result = await request(client, "tasks/result", {"taskId": task_id})
            again = await create_legacy_task(client, "test_tool_with_task", {}, key="g-1")
            replayed = await request(client, "tasks/result", {"taskId": task_id})

    assert asked == [("What is your name?", {"taskId": task_id})]
    assert result["content"][0]["text"] == "Hello, Ada!" and result["isError"] is False
    assert again["task"]["taskId"] == task_id and again["task"]["status"] == "completed"
    assert replayed["content"] == result["content"]  # asked once: the journaled task's result
