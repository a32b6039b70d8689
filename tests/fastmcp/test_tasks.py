"""Durable MCP tasks on a FastMCP 4 server, from the MCP Python SDK's client over streamable HTTP in
both protocol generations (2025-11-25 `params.task` + `tasks/get|result|list|cancel`; 2026-07-28
the tasks extension), on a file journal.

The server is `task_server.py`'s: `refund` is a task by FastMCP's own `task=True`, `job` by its
policy (`task_support="required"`). A task is a journaled call: a repeat of its key answers with
the same task and the tool runs once (its effects counted on a ledger outside the server).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client, MCPError

from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.server.tasks import RELATED_TASK, TASK_NOT_FOUND, TASKS_EXTENSION
from tests.fastmcp.servers import TOKENS, FastMCP, make_durable  # skips (or fails under CI) without FastMCP
from tests.fastmcp.task_server import task_app
from tests.helpers import client_as, meta_of, serve_app
from tests.server.servers.counting import Counter
from tests.server.task_client import (
    TaskHandle,
    TasksClient,
    call_for_task,
    create_legacy_task,
    poll_until_terminal,
    request,
)

if TYPE_CHECKING:
    from mcp_durable.fastmcp import DurableMiddleware

REFUND = {"order_id": "O-1", "amount_cents": 500}


@dataclass
class Fixture:
    app: FastMCP[Any]
    durable: DurableMiddleware
    counts: Counter
    gates: Path
    ledger: PaymentProvider

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve the app over streamable HTTP (an in-process uvicorn); yields its MCP URL."""
        async with serve_app(self.app.http_app()) as base:
            yield f"{base}/mcp"

    def open_gate(self, order_id: str) -> None:
        (self.gates / order_id).touch()

    async def until(self, event: str, times: int = 1) -> None:
        with anyio.fail_after(30):  # a bound on a hang, not a timing assertion
            while self.counts.count(event) < times:
                await anyio.sleep(0.01)


def _fixture(tmp_path: Path, **options: Any) -> Fixture:
    gates = tmp_path / "gates"
    gates.mkdir(exist_ok=True)
    app, durable = task_app(
        f"file://{tmp_path / 'journal'}", tmp_path / "counter", gates, tmp_path / "ledger.db", **options
    )
    return Fixture(app, durable, Counter(tmp_path / "counter"), gates, PaymentProvider(tmp_path / "ledger.db"))


@pytest.fixture
def fx(tmp_path: Path) -> Fixture:
    return _fixture(tmp_path)


def modern(url: str) -> Client:
    """A 2026-07-28 client that declares the tasks extension."""
    return Client(url, mode="auto", extensions=[TasksClient()])


# -- 2025-11-25 -----------------------------------------------------------------------------------


async def test_legacy_capabilities_and_each_tools_task_support_are_advertised(fx: Fixture) -> None:
    async with fx.serve() as url:
        async with Client(url, mode="legacy") as client:
            assert client.server_capabilities.tasks is not None
            listed = await request(client, "tools/list", {})
        support = {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in listed["tools"]}
        assert support == {
            "refund": "optional",
            "job": "required",
            "note": "optional",
            "echo": None,
            "approve_refund": "optional",
        }
        # FastMCP's `task=True` alone: a task of a tool that is not idempotent (in doubt: refused).
        note = fx.durable.durable_policies["note"]
        assert note.task_support == "optional" and note.idempotent is False
        assert note.in_doubt_policy == "refuse"


async def test_legacy_task_is_created_once_per_key_polled_fetched_and_listed(fx: Fixture) -> None:
    async with fx.serve() as url:
        async with Client(url, mode="legacy") as client:
            created = (await create_legacy_task(client, "refund", REFUND))["task"]
            assert created["status"] == "working" and len(created["taskId"]) >= 22
            assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= created.keys()
            again = (await create_legacy_task(client, "refund", REFUND))["task"]
            assert again["taskId"] == created["taskId"]  # the same key (order_id): the same task
            await fx.until("wait O-1")
            polled = await request(client, "tasks/get", {"taskId": created["taskId"]})
            assert polled["status"] == "working" and polled["createdAt"] == created["createdAt"]
            fx.open_gate("O-1")
            result = await request(client, "tasks/result", {"taskId": created["taskId"]})  # blocks until done
            done = await request(client, "tasks/get", {"taskId": created["taskId"]})
            listed = await request(client, "tasks/list", {})
            repeat = (await create_legacy_task(client, "refund", REFUND))["task"]
        assert result["isError"] is False and result["structuredContent"]["order_id"] == "O-1"
        assert result["_meta"][RELATED_TASK] == {"taskId": created["taskId"]}
        assert done["status"] == "completed" and repeat == {**done, "taskId": created["taskId"]}
        assert [task["taskId"] for task in listed["tasks"]] == [created["taskId"]]
        assert fx.counts.count("pay O-1") == 1 and fx.counts.count("done O-1") == 1  # the tool ran once
        assert [effect["id"] for effect in fx.ledger.effects(subject="O-1")] == [
            result["structuredContent"]["effect_id"]
        ]


async def test_legacy_cancel_stops_the_tool_and_the_task_stays_cancelled(fx: Fixture) -> None:
    async with fx.serve() as url:
        args = {"order_id": "O-2", "amount_cents": 700}
        async with Client(url, mode="legacy") as client:
            task_id = (await create_legacy_task(client, "refund", args))["task"]["taskId"]
            await fx.until("wait O-2")
            cancelled = await request(client, "tasks/cancel", {"taskId": task_id})
            assert cancelled["status"] == "cancelled"
            await fx.until("stopped O-2")  # the tool was stopped where it waited
            fx.open_gate("O-2")
            with pytest.raises(MCPError) as again:
                await request(client, "tasks/cancel", {"taskId": task_id})
            assert again.value.error.code == -32602
            repeat = (await create_legacy_task(client, "refund", args))["task"]
            polled = await request(client, "tasks/get", {"taskId": task_id})
        assert repeat["taskId"] == task_id and repeat["status"] == "cancelled" and polled["status"] == "cancelled"
        assert fx.counts.count("done O-2") == 0 and fx.counts.count("wait O-2") == 1  # never resumed


async def test_a_task_required_tool_is_refused_without_a_task_in_each_generation(fx: Fixture) -> None:
    async with fx.serve() as url:
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError) as legacy:
                await client.call_tool("job", {"name": "a"})
            created = (await create_legacy_task(client, "job", {"name": "b"}))["task"]
            result = await request(client, "tasks/result", {"taskId": created["taskId"]})
            with pytest.raises(MCPError) as forbidden:
                await create_legacy_task(client, "echo", {"text": "x"})
        async with Client(url, mode="auto") as undeclared:
            with pytest.raises(MCPError) as modern_refusal:
                await undeclared.call_tool("job", {"name": "c"})
        assert legacy.value.error.code == -32601 and forbidden.value.error.code == -32601
        assert modern_refusal.value.error.code == -32021
        assert (modern_refusal.value.error.data or {})["requiredCapabilities"]["extensions"] == {TASKS_EXTENSION: {}}
        assert result["structuredContent"] == {"job": "b"}
        assert fx.counts.count("job a") == 0 and fx.counts.count("job c") == 0 and fx.counts.count("job b") == 1


async def test_a_plain_call_of_a_task_tool_is_durable_and_a_task_call_with_its_key_attaches_to_it(
    fx: Fixture,
) -> None:
    async with fx.serve() as url:
        args = {"order_id": "O-3", "amount_cents": 300}
        fx.open_gate("O-3")
        async with Client(url, mode="legacy") as client:
            first = await client.call_tool("refund", args)  # no params.task: the durable middleware's call
            again = await client.call_tool("refund", args)
            attached = (await create_legacy_task(client, "refund", args))["task"]
            result = await request(client, "tasks/result", {"taskId": attached["taskId"]})
        assert meta_of(again)["mcp-durable/replayed"] is True and again.structured_content == first.structured_content
        assert attached["status"] == "completed" and result["structuredContent"] == first.structured_content
        assert fx.counts.count("pay O-3") == 1 and len(fx.ledger.effects(subject="O-3")) == 1


async def test_bad_arguments_of_a_task_creating_call_are_refused_before_any_claim(fx: Fixture) -> None:
    async with fx.serve() as url:
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError) as bad:
                await create_legacy_task(client, "refund", {"order_id": "O-9", "amount_cents": "lots"})
            listed = await request(client, "tasks/list", {})
        assert bad.value.error.code == -32602 and "amount_cents" in bad.value.error.message
        assert listed["tasks"] == []


# -- 2026-07-28 -----------------------------------------------------------------------------------


async def test_modern_call_answers_a_task_once_per_key_and_tasks_get_inlines_its_result(fx: Fixture) -> None:
    async with fx.serve() as url:
        async with modern(url) as client:
            handle = await call_for_task(client, "refund", REFUND)
            assert isinstance(handle, TaskHandle) and handle.status == "working"  # outlasted task_after
            again = await call_for_task(client, "refund", REFUND)
            assert isinstance(again, TaskHandle) and again.task_id == handle.task_id
            polled = await request(client, "tasks/get", {"taskId": handle.task_id})
            assert polled["status"] == "working" and polled["resultType"] == "complete"
            fx.open_gate("O-1")
            done = await poll_until_terminal(client, handle.task_id)
            repeat = await call_for_task(client, "refund", REFUND)
        assert done["status"] == "completed" and done["result"]["structuredContent"]["order_id"] == "O-1"
        assert isinstance(repeat, TaskHandle) and repeat.task_id == handle.task_id  # it ran longer: a task
        assert fx.counts.count("pay O-1") == 1 and fx.counts.count("done O-1") == 1
        assert len(fx.ledger.effects(subject="O-1")) == 1


async def test_modern_call_that_finishes_within_task_after_gets_the_plain_result(fx: Fixture) -> None:
    async with fx.serve() as url:
        fx.open_gate("O-4")
        args = {"order_id": "O-4", "amount_cents": 400}
        async with modern(url) as client:
            first = await call_for_task(client, "refund", args, key="k-4")
            again = await call_for_task(client, "refund", args, key="k-4")
        assert not isinstance(first, TaskHandle) and first.structured_content["order_id"] == "O-4"
        assert not isinstance(again, TaskHandle) and meta_of(again)["mcp-durable/replayed"] is True
        assert fx.counts.count("pay O-4") == 1


async def test_modern_cancel_stops_the_tool_and_a_legacy_task_is_read_in_the_modern_generation(
    fx: Fixture,
) -> None:
    async with fx.serve() as url:
        async with Client(url, mode="legacy") as legacy:
            legacy_task = (await create_legacy_task(legacy, "job", {"name": "old"}))["task"]
        async with modern(url) as client:
            handle = await call_for_task(client, "refund", {"order_id": "O-5", "amount_cents": 500})
            assert isinstance(handle, TaskHandle)
            await fx.until("wait O-5")
            ack = await request(client, "tasks/cancel", {"taskId": handle.task_id})
            await fx.until("stopped O-5")
            cancelled = await request(client, "tasks/get", {"taskId": handle.task_id})
            again = await request(client, "tasks/cancel", {"taskId": handle.task_id})  # terminal: the same ack
            old = await poll_until_terminal(client, legacy_task["taskId"])
        assert ack == again and "status" not in ack
        assert cancelled["status"] == "cancelled" and fx.counts.count("done O-5") == 0
        assert old["status"] == "completed" and old["result"]["structuredContent"] == {"job": "old"}


# -- principals, registration ---------------------------------------------------------------------


async def test_another_principals_task_is_answered_like_an_unknown_one(tmp_path: Path) -> None:
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

    verifier = StaticTokenVerifier({token: {"client_id": who, "scopes": []} for token, who in TOKENS.items()})
    fixture = _fixture(tmp_path, auth=verifier)
    fixture.open_gate("O-6")
    async with serve_app(fixture.app.http_app()) as base:
        url = f"{base}/mcp"
        async with client_as(url, "tokA", "legacy") as alice:
            task_id = (await create_legacy_task(alice, "refund", {"order_id": "O-6", "amount_cents": 1}))["task"][
                "taskId"
            ]
            own = await request(alice, "tasks/result", {"taskId": task_id})
        async with client_as(url, "tokB", "legacy") as bob:
            with pytest.raises(MCPError) as peeked:
                await request(bob, "tasks/get", {"taskId": task_id})
            with pytest.raises(MCPError) as cancelled:
                await request(bob, "tasks/cancel", {"taskId": task_id})
            listed = await request(bob, "tasks/list", {})
    assert own["structuredContent"]["order_id"] == "O-6"
    for refused in (peeked, cancelled):
        assert (refused.value.error.code, refused.value.error.message) == (-32602, TASK_NOT_FOUND)
    assert listed["tasks"] == []


def test_a_tasks_extension_registered_already_keeps_serving_and_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fastmcp.server.extensions import ServerExtension

    from mcp_durable.fastmcp.internals import low_level_server

    class _OtherTasks(ServerExtension):
        """Another tasks extension (what `fastmcp-tasks` registers), serving nothing."""

        identifier = TASKS_EXTENSION

    app: FastMCP[Any] = FastMCP("other")
    app.add_extension(_OtherTasks())
    with caplog.at_level(logging.WARNING, logger="mcp_durable.fastmcp.tasks"):
        durable = make_durable(app, journal="memory://")
    assert durable.tasks is None
    assert "a tasks extension is registered already" in caplog.text
    strict: FastMCP[Any] = FastMCP("strict")
    strict.add_extension(_OtherTasks())
    with pytest.raises(ValueError, match="already registered"):
        make_durable(strict, journal="memory://", tasks=True)
    off: FastMCP[Any] = FastMCP("off")
    assert make_durable(off, journal="memory://", tasks=False).tasks is None
    assert all(m.__self__.__class__.__name__ != "DurableTasks" for m in _bound(low_level_server(off).middleware))


def _bound(middleware: list[Any]) -> list[Any]:
    return [m for m in middleware if hasattr(m, "__self__")]


def test_the_low_level_server_fastmcp_keeps_is_where_the_tasks_middleware_goes(tmp_path: Path) -> None:
    from mcp_durable.fastmcp.internals import INTERNALS, low_level_server

    fixture = _fixture(tmp_path)
    assert "FastMCP._mcp_server" in INTERNALS
    assert hasattr(fixture.app, "_mcp_server"), "FastMCP._mcp_server is gone: see mcp_durable/fastmcp/internals.py"
    server = low_level_server(fixture.app)
    assert fixture.durable.tasks is not None and fixture.durable.tasks.middleware in server.middleware
    assert server.get_request_handler("tasks/get") is not None
