"""Case 8: MCP tasks (2025-11-25, in-memory client): what creating a task and polling it cost.

Per journal, three variants in interleaved rounds (a new seeded order each round): a plain
durable call that misses (a new key: claim and result durable before the answer), a
task-creating call (a new key: the claim with its task id is durable before the
`CreateTaskResult`; the tool then runs in the background) and `tasks/get` of a finished task
(one lookup by principal and task id). Each cell is the median of every sample.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from mcp import Client
from mcp_types import Request
from pydantic import TypeAdapter

from .common import CaseResult, Settings, Table, journal_urls, median, ratio, us
from .servers import TOOL, task_server
from .timing import BenchmarkError, check_result

_ANY = TypeAdapter(dict[str, Any])


async def _tasks_get(client: Client, task_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await client.session.send_request(
        Request[Any, Any](method="tasks/get", params={"taskId": task_id}), _ANY
    )
    return result


async def _create(client: Client, n: int) -> dict[str, Any]:
    # The session validates a tools/call answer as a CallToolResult; a CreateTaskResult is sent raw.
    params = {"name": TOOL, "arguments": {"n": n}, "task": {}}
    result: dict[str, Any] = await client.session._dispatcher.send_raw_request("tools/call", params, None)
    return result


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("tasks")
    rounds = settings.pick(4, 60)
    per_round = 10
    urls = {name: url for name, url in journal_urls(settings).items() if name in ("memory", "file", "sqlite")}
    samples: dict[tuple[str, str], list[float]] = {}
    fresh = itertools.count(1)
    async with AsyncExitStack() as stack:
        variants: list[tuple[tuple[str, str], Callable[[], Awaitable[Any]]]] = []
        for name, url in urls.items():
            client = await stack.enter_async_context(Client(task_server(url), mode="legacy"))
            done = (await _create(client, -1))["task"]["taskId"]
            with_client = client

            async def plain(c: Client = with_client) -> None:
                check_result(await c.call_tool(TOOL, {"n": next(fresh)}), replayed=False)

            async def create(c: Client = with_client) -> None:
                if (await _create(c, next(fresh)))["task"]["status"] not in ("working", "completed"):
                    raise BenchmarkError("a task-creating call did not answer with a task")

            async def get(c: Client = with_client, task_id: str = done) -> None:
                if (await _tasks_get(c, task_id))["taskId"] != task_id:
                    raise BenchmarkError("tasks/get answered for another task")

            variants += [((name, "plain"), plain), ((name, "create"), create), ((name, "get"), get)]
        for _, call in variants:  # warm up every path
            for _ in range(10):
                await call()
        for round_number in range(rounds):
            order = list(variants)
            random.Random(round_number).shuffle(order)
            for key, call in order:
                for _ in range(per_round):
                    began = time.perf_counter()
                    await call()
                    samples.setdefault(key, []).append(time.perf_counter() - began)
    table = Table(
        "8. MCP tasks, in-memory client, 2025-11-25 (median per request)",
        ["journal", "plain durable call", "task creation", "creation / plain", "tasks/get", "tasks/get / plain"],
    )
    table.notes.append(
        f"{rounds} interleaved rounds × {per_round} requests per cell; plain = a durable call with a new key "
        "(the tool runs before the answer), creation = tools/call with params.task and a new key (answered once "
        "the claim and its task id are durable; the tool then runs in the background), tasks/get = a finished task."
    )
    for name in urls:
        plain_s, create_s, get_s = (median(samples[(name, kind)]) for kind in ("plain", "create", "get"))
        table.add(name, us(plain_s), us(create_s), ratio(create_s / plain_s), us(get_s), ratio(get_s / plain_s))
    result.tables.append(table)
    return result
