"""The batching turn (one `anyio.lowlevel.checkpoint` before a batch closes): a task ready to run
joins the batch; the Postgres batcher sends a lone item alone (`run_one`) and gathers items
submitted together into one batch. The turn is skipped only by the write of the one call in
flight (`journal/callers.py`), and not by a second such write in the same pass of the loop."""

from __future__ import annotations

import asyncio

import anyio.lowlevel

from mcp_durable.journal import callers
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


def recording_batcher() -> tuple[Batcher[int, int], list[list[int]]]:
    """A batcher whose statements do not wait (as a fast inline commit), and the batches it ran."""
    batches: list[list[int]] = []

    async def run_batch(items: list[int]) -> list[int]:
        batches.append(list(items))
        return [item * 10 for item in items]

    async def run_one(item: int) -> int:
        batches.append([item])
        return item * 10

    return Batcher(run_batch, slots=2, run_one=run_one), batches


async def probed_submit(batcher: Batcher[int, int], item: int) -> bool:
    """Submit `item` with a task ready to run beside it; whether that task ran before the answer
    (the submit gave the loop a pass)."""
    ran: list[bool] = []

    async def probe() -> None:
        ran.append(True)

    task = asyncio.get_running_loop().create_task(probe())
    assert await batcher.submit(item) == item * 10
    passed = bool(ran)
    await task
    return passed


def one_call_at_a_time() -> None:
    """A stretch of one call: overlapping calls of the tests before no longer count."""
    callers.enter()
    callers.leave()


async def test_only_the_write_of_the_one_call_in_flight_skips_the_turn() -> None:
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)
    # No call in flight: a write nobody accounts for (a test, an operator's command) takes the turn.
    assert await probed_submit(batcher, 1)
    callers.enter()
    try:
        assert not await probed_submit(batcher, 2)  # the only call: nobody to batch with
        callers.enter()
        try:
            assert await probed_submit(batcher, 3)  # another call in flight could join
        finally:
            callers.leave()
    finally:
        callers.leave()
    assert callers.in_flight() == 0
    assert batches == [[1], [2], [3]]


async def test_a_second_lone_call_in_one_pass_takes_the_turn_and_the_calls_ready_join_it() -> None:
    # Three calls ready in one pass; each would be the only one in flight when it writes, since
    # the one before finished without giving the loop a pass. The first goes alone; the second
    # takes the turn (another lone write came first in this pass), and the third joins it.
    batcher, batches = recording_batcher()
    one_call_at_a_time()

    async def call(item: int) -> None:
        callers.enter()
        try:
            await batcher.submit(item)
        finally:
            callers.leave()

    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(call(item)) for item in (1, 2, 3)]
    await asyncio.gather(*tasks)
    assert batches == [[1], [2, 3]]


async def test_after_calls_overlapped_the_next_lone_call_takes_the_turn_and_the_one_after_skips_it() -> None:
    # Callers in step leave no call in flight between their waves; the first of the next wave
    # must not take itself for a sequential caller while the others are about to write.
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)
    callers.enter()
    callers.enter()  # two calls in flight together
    callers.leave()
    callers.leave()
    for item, turn in ((1, True), (2, False), (3, False)):
        callers.enter()
        try:
            assert await probed_submit(batcher, item) is turn, item
        finally:
            callers.leave()
    assert batches == [[1], [2], [3]]
