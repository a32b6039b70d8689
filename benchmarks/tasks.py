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
from collections.abc import Awaitable, Callable, Iterator
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


#: One measured variant: its cell (journal name, kind) and one request of it.
Variant = tuple[tuple[str, str], Callable[[], Awaitable[Any]]]


async def run(settings: Settings) -> CaseResult:
    """The case: every variant on every journal measured in interleaved rounds, then its table."""
    result = CaseResult("tasks")
    rounds = settings.pick(4, 60)
    per_round = 10
    urls = {name: url for name, url in journal_urls(settings).items() if name in ("memory", "file", "sqlite")}
    fresh = itertools.count(1)
    async with AsyncExitStack() as stack:
        variants: list[Variant] = []
        for name, url in urls.items():
            client = await stack.enter_async_context(Client(task_server(url), mode="legacy"))
            variants += await _variants(name, client, fresh)
        samples = await _measure(variants, rounds, per_round)
    result.tables.append(_table(urls, samples, rounds, per_round))
    return result


async def _variants(name: str, client: Client, fresh: Iterator[int]) -> list[Variant]:
    """The three variants on one journal's client (`fresh` numbers each new key): a plain durable
    call, a task-creating call, and `tasks/get` of a task created (and finished) here."""
    done = (await _create(client, -1))["task"]["taskId"]

    async def plain() -> None:
        check_result(await client.call_tool(TOOL, {"n": next(fresh)}), replayed=False)

    async def create() -> None:
        if (await _create(client, next(fresh)))["task"]["status"] not in ("working", "completed"):
            raise BenchmarkError("a task-creating call did not answer with a task")

    async def get() -> None:
        if (await _tasks_get(client, done))["taskId"] != done:
            raise BenchmarkError("tasks/get answered for another task")

    return [((name, "plain"), plain), ((name, "create"), create), ((name, "get"), get)]


async def _measure(variants: list[Variant], rounds: int, per_round: int) -> dict[tuple[str, str], list[float]]:
    """Every variant warmed up (10 requests), then `rounds` rounds in a new seeded order each, of
    `per_round` timed requests per variant; returns each cell's samples (seconds)."""
    samples: dict[tuple[str, str], list[float]] = {}
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
    return samples


def _table(urls: dict[str, str], samples: dict[tuple[str, str], list[float]], rounds: int, per_round: int) -> Table:
    """The case's table: per journal, the median of each variant and their ratios to plain."""
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
    return table
