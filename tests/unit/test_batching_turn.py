"""The batching turn (one `anyio.lowlevel.checkpoint` before a batch closes): a task ready to run
joins the batch; the Postgres batcher sends a lone item alone (`run_one`) and gathers items
submitted together into one batch. The turn is skipped only by the write of the one call in
flight (`journal/callers.py`), and not by a second such write in the same pass of the loop;
a direct write (outside any call) counts as a call of its own, and its task's first two take
the turn."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio.lowlevel

from mcp_durable.journal import callers
from mcp_durable.journal.postgres.batch import Batcher
from mcp_durable.journal.postgres.journal import BATCH_SLOTS

T = TypeVar("T")


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


async def direct_submit(batcher: Batcher[int, int], item: int) -> bool:
    """`probed_submit` bracketed as a journal's `append` brackets its write (a direct write)."""
    counted = callers.direct_write()
    try:
        return await probed_submit(batcher, item)
    finally:
        callers.direct_done(counted)


async def in_new_task(work: Coroutine[Any, Any, T]) -> T:
    """`work` in a task of its own: a writer that has made no direct write yet."""
    return await asyncio.get_running_loop().create_task(work)


async def test_a_direct_writer_takes_the_turn_on_its_first_two_writes_and_skips_it_after() -> None:
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)

    async def writer() -> list[bool]:
        return [await direct_submit(batcher, item) for item in (1, 2, 3, 4)]

    # The first write is taken for one of writers started together; the second, coming after a
    # stretch that may have been crowded, takes the turn too; from the third on it is alone.
    assert await in_new_task(writer()) == [True, True, False, False]
    assert callers.in_flight() == 0
    assert batches == [[1], [2], [3], [4]]


async def test_a_write_inside_a_call_is_the_calls_and_counts_as_nothing_more() -> None:
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)

    async def call() -> list[bool]:
        callers.enter()
        try:
            turns = []
            for item in (1, 2):
                turns.append(await direct_submit(batcher, item))
                assert callers.in_flight() == 1  # the call's own write: no second call in flight
            return turns
        finally:
            callers.leave()

    assert await in_new_task(call()) == [False, False]  # the one call in flight: nobody to batch with
    assert batches == [[1], [2]]
    assert callers.in_flight() == 0


async def test_direct_writers_started_together_share_a_batch_and_keep_sharing() -> None:
    # Four new writers, each appending three times: each round of writes goes as one batch. (Had
    # the first writes not counted as overlapping, the second round would have gone as a lone
    # write, then another of the same task in the same pass, then a batch of the rest.)
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)

    async def writer(first: int) -> None:
        for item in (first, first + 10, first + 20):
            counted = callers.direct_write()
            try:
                await batcher.submit(item)
            finally:
                callers.direct_done(counted)

    await asyncio.gather(*(asyncio.get_running_loop().create_task(writer(n)) for n in (1, 2, 3, 4)))
    assert [sorted(batch) for batch in batches] == [[1, 2, 3, 4], [11, 12, 13, 14], [21, 22, 23, 24]]
    assert callers.in_flight() == 0


async def test_a_task_that_hands_its_call_to_another_is_no_longer_inside_it() -> None:
    # A task run (engine/tasks.py): the request's task enters the call, starts the run's task,
    # which inherits being inside it and leaves it; the request's task is a direct writer again.
    batcher, _ = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)

    async def request() -> list[bool]:
        await direct_submit(batcher, 1)  # this task's first two direct writes
        await direct_submit(batcher, 1)
        callers.enter()
        run_inside: list[bool] = []

        async def run() -> None:
            run_inside.append(not callers.direct_write())  # inside the call: not counted
            callers.leave()

        started = asyncio.get_running_loop().create_task(run())
        callers.handed_off()
        await started
        assert run_inside == [True]
        return [await direct_submit(batcher, 2)]

    assert await in_new_task(request()) == [False]  # a direct writer again: it skips the turn
    assert callers.in_flight() == 0


async def test_a_writer_in_a_loop_gives_the_loop_a_pass_every_skips_per_pass_writes() -> None:
    # Writes that skip the turn and commit inline give the loop no pass; without a bound, a task
    # ready beside a writer appending in a loop would wait for its last append.
    batcher, batches = recording_batcher()
    one_call_at_a_time()
    await asyncio.sleep(0)
    ran_after: list[int] = []
    probes: list[asyncio.Task[None]] = []
    WRITES = 48  # noqa: N806 - a few passes' worth

    async def writer() -> None:
        for item in range(WRITES):
            if item == 2:  # after the first two writes (which take the turn): a task is ready
                probes.append(asyncio.get_running_loop().create_task(probe()))
            counted = callers.direct_write()
            try:
                await batcher.submit(item)
            finally:
                callers.direct_done(counted)

    async def probe() -> None:
        ran_after.append(len(batches))

    await in_new_task(writer())
    await asyncio.gather(*probes)
    assert len(batches) == WRITES
    # The ready task ran long before the writer's last append: within its first passes' worth.
    assert ran_after and ran_after[0] <= 2 + callers.SKIPS_PER_PASS < WRITES, ran_after
