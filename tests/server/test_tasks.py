"""MCP tasks through the Python client, in both generations (in memory, on a file journal).

2025-11-25: the client opts in with `params.task`; 2026-07-28: the server answers `resultType:
"task"` to a request that declares the `io.modelcontextprotocol/tasks` extension. Either way a task
is a journaled call: a repeat of its key answers with the same task and the tool runs once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp_types import CallToolRequestParams, CallToolResult

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.server.tasks import RELATED_TASK, TASK_NOT_FOUND
from tests.helpers import resource_text
from tests.server.servers.counting import Counter
from tests.server.servers.tasks import make_server
from tests.server.task_client import (
    TaskHandle,
    TasksClient,
    call_for_task,
    create_legacy_task,
    poll_until_terminal,
    request,
)


@dataclass
class Fixture:
    server: DurableServer
    counts: Counter
    gates: Path
    ledger: PaymentProvider

    def open_gate(self, order_id: str) -> None:
        (self.gates / order_id).touch()

    async def until_counted(self, event: str, times: int = 1) -> None:
        with anyio.fail_after(10):
            while self.counts.count(event) < times:
                await anyio.sleep(0.01)


@pytest.fixture
async def fx(tmp_path: Path) -> AsyncIterator[Fixture]:
    gates = tmp_path / "gates"
    gates.mkdir()
    server = make_server(
        journal=f"file://{tmp_path / 'journal'}",
        counter=tmp_path / "counter",
        gate=gates,
        ledger=tmp_path / "ledger.db",
    )
    yield Fixture(server, Counter(tmp_path / "counter"), gates, PaymentProvider(tmp_path / "ledger.db"))


# -- 2025-11-25 -----------------------------------------------------------------------------------


async def test_legacy_servers_advertise_tasks_and_each_tools_task_support(fx: Fixture) -> None:
    async with Client(fx.server, mode="legacy") as client:
        assert client.server_capabilities.tasks is not None
        listed = await request(client, "tools/list", {})
    support = {t["name"]: t.get("execution", {}).get("taskSupport") for t in listed["tools"]}
    assert support["refund"] == "optional" and support["job"] == "required"
    assert support["echo"] is None  # no task support: listed exactly as before tasks


async def test_legacy_task_is_created_polled_and_fetched_and_a_repeat_gets_the_same_task(fx: Fixture) -> None:
    args = {"order_id": "O-1", "amount_cents": 500}
    async with Client(fx.server, mode="legacy") as client:
        created = await create_legacy_task(client, "refund", args, ttl=60_000)
        task = created["task"]
        assert task["status"] == "working" and len(task["taskId"]) >= 22
        assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= task.keys()
        again = await create_legacy_task(client, "refund", args)
        assert again["task"]["taskId"] == task["taskId"]  # the same key: the same task
        await fx.until_counted("wait O-1")
        polled = await request(client, "tasks/get", {"taskId": task["taskId"]})
        assert polled["status"] == "working" and polled["createdAt"] == task["createdAt"]
        fx.open_gate("O-1")
        result = await request(client, "tasks/result", {"taskId": task["taskId"]})  # blocks until done
        assert result["isError"] is False
        assert result["structuredContent"]["order_id"] == "O-1"
        assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
        done = await request(client, "tasks/get", {"taskId": task["taskId"]})
        listed = await request(client, "tasks/list", {})
    assert done["status"] == "completed"
    assert [t["taskId"] for t in listed["tasks"]] == [task["taskId"]]
    assert fx.counts.count("pay O-1") == 1 and fx.counts.count("done O-1") == 1  # the tool ran once
    assert len(fx.ledger.effects(subject="O-1")) == 1


async def test_legacy_cancel_stops_the_tool_and_the_task_stays_cancelled(fx: Fixture) -> None:
    args = {"order_id": "O-2", "amount_cents": 700}
    async with Client(fx.server, mode="legacy") as client:
        task_id = (await create_legacy_task(client, "refund", args))["task"]["taskId"]
        await fx.until_counted("wait O-2")
        cancelled = await request(client, "tasks/cancel", {"taskId": task_id})
        assert cancelled["status"] == "cancelled"
        fx.open_gate("O-2")
        await anyio.sleep(0.2)  # room for a tool that was not stopped to finish (it must not)
        assert (await request(client, "tasks/get", {"taskId": task_id}))["status"] == "cancelled"
        with pytest.raises(MCPError) as again:
            await request(client, "tasks/cancel", {"taskId": task_id})
        assert again.value.error.code == -32602
        repeat = await create_legacy_task(client, "refund", args)
        assert repeat["task"]["taskId"] == task_id and repeat["task"]["status"] == "cancelled"
        await anyio.sleep(0.2)
    assert fx.counts.count("done O-2") == 0  # stopped, and never resumed
    assert fx.counts.count("pay O-2") == 1


async def test_legacy_task_required_and_task_forbidden_tools_get_method_not_found(fx: Fixture) -> None:
    async with Client(fx.server, mode="legacy") as client:
        with pytest.raises(MCPError) as required:
            await client.call_tool("job", {"name": "j"})
        with pytest.raises(MCPError) as forbidden:
            await create_legacy_task(client, "echo", {"text": "t"})
        plain = await client.call_tool("echo", {"text": "t"})  # a tool without task support: as before
        task = (await create_legacy_task(client, "job", {"name": "j"}))["task"]
        done = await poll_until_terminal(client, task["taskId"])
    assert required.value.error.code == -32601 and "requires task augmentation" in required.value.error.message
    assert forbidden.value.error.code == -32601
    assert plain.is_error is False and plain.structured_content == {"result": "t"}
    assert done["status"] == "completed" and fx.counts.count("job j") == 1


@pytest.mark.parametrize("method", ["tasks/get", "tasks/result", "tasks/cancel"])
async def test_an_unknown_task_id_gets_invalid_params(fx: Fixture, method: str) -> None:
    async with Client(fx.server, mode="legacy") as client:
        with pytest.raises(MCPError) as unknown:
            await request(client, method, {"taskId": "no-such-task"})
    assert unknown.value.error.code == -32602 and unknown.value.error.message == TASK_NOT_FOUND


# -- 2026-07-28 -----------------------------------------------------------------------------------


async def test_modern_call_answers_with_a_task_and_a_repeat_with_the_same_key_gets_it(fx: Fixture) -> None:
    args = {"order_id": "O-3", "amount_cents": 300}
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        handle = await call_for_task(client, "refund", args)
        assert isinstance(handle, TaskHandle) and handle.status == "working"
        assert handle.ttl_ms == 24 * 3600 * 1000 and handle.poll_interval_ms
        again = await call_for_task(client, "refund", args)
        assert isinstance(again, TaskHandle) and again.task_id == handle.task_id
        polled = await request(client, "tasks/get", {"taskId": handle.task_id})
        assert polled["status"] == "working" and "result" not in polled
        fx.open_gate("O-3")
        done = await poll_until_terminal(client, handle.task_id)
        with pytest.raises(MCPError) as result_method:
            await request(client, "tasks/result", {"taskId": handle.task_id})
        with pytest.raises(MCPError) as list_method:
            await request(client, "tasks/list", {})
    assert done["status"] == "completed" and done["result"]["resultType"] == "complete"
    assert done["result"]["structuredContent"]["order_id"] == "O-3"
    assert RELATED_TASK not in done["result"].get("_meta", {})
    assert result_method.value.error.code == -32601 and list_method.value.error.code == -32601
    assert fx.counts.count("pay O-3") == 1 and len(fx.ledger.effects(subject="O-3")) == 1


async def test_modern_client_call_tool_resolves_a_task_to_the_tools_result(fx: Fixture) -> None:
    async def open_later() -> None:
        await fx.until_counted("wait O-4")
        await anyio.sleep(0.4)  # past task_after: the call is answered with a task first
        fx.open_gate("O-4")

    async with Client(fx.server, extensions=[TasksClient()]) as client, anyio.create_task_group() as tg:
        tg.start_soon(open_later)
        result = await client.call_tool("refund", {"order_id": "O-4", "amount_cents": 100})
    assert isinstance(result, CallToolResult) and result.structured_content is not None
    assert result.structured_content["order_id"] == "O-4" and fx.counts.count("done O-4") == 1


async def test_modern_cancel_is_acknowledged_and_the_task_ends_cancelled(fx: Fixture) -> None:
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        handle = await call_for_task(client, "refund", {"order_id": "O-5", "amount_cents": 100})
        await fx.until_counted("wait O-5")
        ack = await request(client, "tasks/cancel", {"taskId": handle.task_id})
        done = await poll_until_terminal(client, handle.task_id)
        again = await request(client, "tasks/cancel", {"taskId": handle.task_id})  # idempotent
    assert {k: v for k, v in ack.items() if k != "_meta"} == {"resultType": "complete"}
    assert done["status"] == "cancelled" and "result" not in done
    assert {k: v for k, v in again.items() if k != "_meta"} == {"resultType": "complete"}


async def test_modern_requests_without_the_extension_get_minus_32021_or_a_plain_call(fx: Fixture) -> None:
    fx.open_gate("O-6")
    async with Client(fx.server) as client:
        with pytest.raises(MCPError) as required:
            await client.call_tool("job", {"name": "k"})
        plain = await client.call_tool("refund", {"order_id": "O-6", "amount_cents": 100})
        with pytest.raises(MCPError) as get:
            await request(client, "tasks/get", {"taskId": "whatever"})
        with pytest.raises(MCPError) as listen:
            await request(client, "subscriptions/listen", {"notifications": {"taskIds": ["whatever"]}})
    assert required.value.error.code == -32021 and listen.value.error.code == -32021
    data: Any = required.value.error.data
    assert data["requiredCapabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert plain.is_error is False and plain.structured_content is not None
    assert get.value.error.code == -32021
    assert fx.counts.count("job k") == 0


# -- the journal shows tasks ------------------------------------------------------------------------


async def test_journal_resources_and_the_cli_show_which_calls_are_tasks_and_their_status(
    fx: Fixture, tmp_path: Path
) -> None:
    import json
    import subprocess

    from tests.helpers import REPO, serve_command

    fx.open_gate("O-7")
    async with Client(fx.server, mode="legacy") as client:
        task_id = (await create_legacy_task(client, "refund", {"order_id": "O-7", "amount_cents": 1}))["task"]["taskId"]
        await poll_until_terminal(client, task_id)
        await client.call_tool("echo", {"text": "plain"})
        listing = json.loads(resource_text(await client.read_resource("journal://calls")))
        record = json.loads(resource_text(await client.read_resource("journal://calls/refund/O-7")))
    await fx.server.aclose()
    by_tool = {c["tool"]: c for c in listing["calls"]}
    assert by_tool["refund"]["task"] is True and by_tool["refund"]["task_status"] == "completed"
    assert by_tool["echo"]["task"] is False and by_tool["echo"]["task_status"] is None
    assert record["task_id"] == task_id and record["task_status"] == "completed"
    cli = subprocess.run(
        [*serve_command(), "journal", "list", "--tasks", "--json", "--journal", f"file://{tmp_path / 'journal'}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    rows = [json.loads(line) for line in cli.stdout.splitlines() if line.strip()]
    assert [(r["tool"], r["task_status"]) for r in rows] == [("refund", "completed")]


async def test_legacy_status_notifications_reach_the_session_that_created_the_task(fx: Fixture) -> None:
    from mcp.client.extension import ClientExtension, NotificationBinding
    from mcp_types import TaskStatusNotificationParams

    seen: list[tuple[str, str]] = []

    class Watch(ClientExtension):
        identifier = "test/task-status"

        def notifications(self) -> list[NotificationBinding[Any]]:
            async def handler(params: TaskStatusNotificationParams) -> None:
                seen.append((params.task_id, params.status))

            return [
                NotificationBinding(
                    method="notifications/tasks/status", params_type=TaskStatusNotificationParams, handler=handler
                )
            ]

    async with Client(fx.server, mode="legacy", extensions=[Watch()]) as client:
        task_id = (await create_legacy_task(client, "refund", {"order_id": "O-8", "amount_cents": 1}))["task"]["taskId"]
        await fx.until_counted("wait O-8")
        fx.open_gate("O-8")
        await poll_until_terminal(client, task_id)
        with anyio.fail_after(5):
            while (task_id, "completed") not in seen:
                await anyio.sleep(0.01)
    assert seen[-1] == (task_id, "completed")


async def test_modern_quick_calls_get_the_plain_result_and_a_repeat_is_marked_replayed(fx: Fixture) -> None:
    fx.open_gate("O-9")
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        first = await call_for_task(client, "refund", {"order_id": "O-9", "amount_cents": 5})
        again = await call_for_task(client, "refund", {"order_id": "O-9", "amount_cents": 5})
    assert isinstance(first, CallToolResult) and isinstance(again, CallToolResult)  # within task_after
    assert first.meta is not None and "mcp-durable/replayed" not in first.meta
    assert again.meta is not None and again.meta["mcp-durable/replayed"] is True
    assert again.structured_content == first.structured_content and fx.counts.count("pay O-9") == 1


async def test_a_repeat_of_a_finished_task_gets_the_same_task_in_both_generations(fx: Fixture) -> None:
    args = {"order_id": "O-11", "amount_cents": 11}
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        handle = await call_for_task(client, "refund", args)
        assert isinstance(handle, TaskHandle)  # the gate is shut: past task_after, a task
        fx.open_gate("O-11")
        await poll_until_terminal(client, handle.task_id)
    # A retrying client, in a new session, repeats the call once the task has finished.
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        again = await call_for_task(client, "refund", args)
        assert isinstance(again, TaskHandle), again  # not the plain result: the same task
        polled = await request(client, "tasks/get", {"taskId": again.task_id})
        resolved = await client.call_tool("refund", args)  # the claim's resolver reads the task's result
    async with Client(fx.server, mode="legacy") as legacy:
        created = await create_legacy_task(legacy, "refund", args)
        fetched = await request(legacy, "tasks/result", {"taskId": created["task"]["taskId"]})
    assert again.task_id == handle.task_id and again.status == "completed"
    assert polled["status"] == "completed" and polled["result"]["structuredContent"]["order_id"] == "O-11"
    assert resolved.structured_content == polled["result"]["structuredContent"]
    assert created["task"]["taskId"] == handle.task_id and created["task"]["status"] == "completed"
    assert fetched["structuredContent"] == polled["result"]["structuredContent"]
    assert fx.counts.count("pay O-11") == 1 and fx.counts.count("done O-11") == 1


async def test_tasks_update_exists_only_in_2026_and_changes_nothing(fx: Fixture) -> None:
    fx.open_gate("O-10")
    async with Client(fx.server, extensions=[TasksClient()]) as client:
        task = await call_for_task(client, "job", {"name": "u"})
        ack = await request(client, "tasks/update", {"taskId": task.task_id, "inputResponses": {}})
        with pytest.raises(MCPError) as unknown:
            await request(client, "tasks/update", {"taskId": "nope", "inputResponses": {}})
        done = await poll_until_terminal(client, task.task_id)
    async with Client(fx.server, mode="legacy") as legacy:
        with pytest.raises(MCPError) as absent:
            await request(legacy, "tasks/update", {"taskId": task.task_id})
    assert {k: v for k, v in ack.items() if k != "_meta"} == {"resultType": "complete"}
    assert unknown.value.error.code == -32602 and done["status"] == "completed"
    assert absent.value.error.code == -32601


async def test_modern_listen_streams_the_callers_own_tasks_until_they_end(fx: Fixture) -> None:
    from mcp.client.extension import NotificationBinding
    from mcp_types import NotificationParams
    from pydantic import ConfigDict

    class AnyParams(NotificationParams):
        model_config = ConfigDict(extra="allow")

    seen: list[dict[str, Any]] = []

    class Listening(TasksClient):
        def notifications(self) -> list[NotificationBinding[Any]]:
            async def handler(params: AnyParams) -> None:
                seen.append(dict(params.model_extra or {}))

            return [NotificationBinding(method="notifications/tasks", params_type=AnyParams, handler=handler)]

    async with Client(fx.server, extensions=[Listening()]) as client:
        handle = await call_for_task(client, "refund", {"order_id": "O-11", "amount_cents": 1})

        async def finish() -> None:
            await fx.until_counted("wait O-11")
            with anyio.fail_after(10):
                while not seen:  # the first notification (working) has been delivered
                    await anyio.sleep(0.01)
            fx.open_gate("O-11")

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish)
            ended = await request(
                client, "subscriptions/listen", {"notifications": {"taskIds": [handle.task_id, "not-mine"]}}
            )
        with anyio.fail_after(5):
            while not seen or seen[-1]["status"] != "completed":
                await anyio.sleep(0.01)
    assert ended["resultType"] == "complete"  # the stream ended once the task was terminal
    assert [n["taskId"] for n in seen] == [handle.task_id] * len(seen)
    assert seen[0]["status"] == "working" and seen[-1]["status"] == "completed"
    assert seen[-1]["result"]["structuredContent"]["order_id"] == "O-11"


class Stamping(Extension):
    """A server extension of a user's that intercepts every tool call (e.g. to audit it)."""

    identifier = "com.example/stamping"

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        self.seen.append(params.name)
        return await call_next(ctx)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_another_extension_still_intercepts_every_call(tmp_path: Path, mode: str) -> None:
    # Calls that cannot become tasks skip the interceptor chain only while ours is the one in it.
    stamping = Stamping()
    server = DurableServer("stamped", journal=f"file://{tmp_path / 'journal'}", extensions=[stamping])

    @server.tool(durable=ToolPolicy(idempotent=True))
    def durable_echo(text: str) -> str:
        return text

    @server.tool()
    def plain_echo(text: str) -> str:
        return text

    async with Client(server, mode=mode) as client:
        for name in ("durable_echo", "plain_echo", "durable_echo"):
            result = await client.call_tool(name, {"text": "hi"})
            assert not result.is_error
    assert stamping.seen == ["durable_echo", "plain_echo", "durable_echo"]
