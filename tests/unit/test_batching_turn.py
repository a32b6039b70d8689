"""The batching turn (one `anyio.lowlevel.checkpoint` before a batch closes): a task ready to run
joins the batch; the Postgres batcher sends a lone item alone (`run_one`) and gathers items
submitted together into one batch."""

from __future__ import annotations

import asyncio

import anyio.lowlevel

from mcp_durable.journal.postgres.batch import Batcher
from mcp_durable.journal.postgres.journal import BATCH_SLOTS


async def test_a_ready_task_runs_before_the_batch_closes() -> None:
    joined: list[str] = []

    async def other() -> None:
        joined.append("other")

    task = asyncio.get_running_loop().create_task(other())
    await anyio.lowlevel.checkpoint()  # what a batch's leader awaits before it takes the batch
    assert joined == ["other"]
    await task


async def test_a_lone_item_is_sent_alone_and_items_submitted_together_share_a_batch() -> None:
    batches: list[list[int]] = []

    async def run_batch(items: list[int]) -> list[int]:
        batches.append(list(items))
        return [item * 10 for item in items]

    async def run_one(item: int) -> int:
        batches.append([item])
        return item * 10

    batcher: Batcher[int, int] = Batcher(run_batch, slots=2, run_one=run_one)
    await asyncio.sleep(0)
    assert await batcher.submit(1) == 10
    results = await asyncio.gather(*(batcher.submit(n) for n in (2, 3, 4)))
    assert results == [20, 30, 40]
    assert batches == [[1], [2, 3, 4]]


async def test_items_arriving_one_by_one_while_a_postgres_batch_commits_share_the_next_statement() -> None:
    """The journal's setting (`BATCH_SLOTS`): requests that arrive spread out (HTTP clients), each
    while the batch before is in flight, gather into one statement instead of going alone."""
    batches: list[list[int]] = []
    in_flight = asyncio.Event()
    release = asyncio.Event()

    async def run_batch(items: list[int]) -> list[int]:
        batches.append(list(items))
        in_flight.set()
        await release.wait()  # the statement and its commit take a round trip
        return [item * 10 for item in items]

    batcher: Batcher[int, int] = Batcher(run_batch, slots=BATCH_SLOTS)
    first = asyncio.get_running_loop().create_task(batcher.submit(1))
    await in_flight.wait()
    later = []
    for n in (2, 3, 4):  # one at a time, each given every chance to go out alone
        later.append(asyncio.get_running_loop().create_task(batcher.submit(n)))
        for _ in range(5):
            await asyncio.sleep(0)
    release.set()
    assert await first == 10
    assert [await task for task in later] == [20, 30, 40]
    assert batches == [[1], [2, 3, 4]]
