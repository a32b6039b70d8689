"""The batching turn (mcp_durable/journal/turns.py): taken when another task could join a batch,
skipped when none is ready; the Postgres batcher sends a lone item without any turn of the loop
and still gathers items submitted together."""

from __future__ import annotations

import asyncio

from mcp_durable.journal.postgres.batch import Batcher
from mcp_durable.journal.postgres.journal import BATCH_SLOTS
from mcp_durable.journal.turns import let_ready_tasks_join, no_task_ready
from tests.helpers import finished_without_suspending


async def test_no_turn_is_taken_when_no_task_is_ready() -> None:
    await asyncio.sleep(0)  # start from a quiet loop
    assert no_task_ready()
    assert finished_without_suspending(let_ready_tasks_join()) == (True, None)


async def test_a_cancelled_callback_in_the_ready_queue_is_no_task_that_could_join() -> None:
    """What psycopg leaves after each statement: the socket's reader callback, queued by the
    selector and then cancelled by `remove_reader`; the loop drops it unrun."""
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_soon(lambda: None).cancel()
    assert no_task_ready()
    assert finished_without_suspending(let_ready_tasks_join()) == (True, None)
    asyncio.get_running_loop().call_soon(lambda: None)  # a live one still counts
    assert not no_task_ready()
    await asyncio.sleep(0)


async def test_a_ready_task_runs_before_the_batch_closes() -> None:
    joined: list[str] = []

    async def other() -> None:
        joined.append("other")

    task = asyncio.get_running_loop().create_task(other())
    assert not no_task_ready()
    await let_ready_tasks_join()
    assert joined == ["other"]
    await task


async def test_a_lone_item_is_sent_alone_without_a_turn_and_items_submitted_together_share_a_batch() -> None:
    batches: list[list[int]] = []

    async def run_batch(items: list[int]) -> list[int]:
        batches.append(list(items))
        return [item * 10 for item in items]

    async def run_one(item: int) -> int:
        batches.append([item])
        return item * 10

    batcher: Batcher[int, int] = Batcher(run_batch, slots=2, run_one=run_one)
    await asyncio.sleep(0)
    assert finished_without_suspending(batcher.submit(1)) == (True, 10)  # no turn of the loop
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
