"""The appends' pipelined connection (`journal/postgres/pipeline.py`) against the real database:
statements answered in the order sent, each its own transaction; a failing statement fails its
own caller only; a lost connection fails what is in flight and the next statement reconnects;
large parameters go out whole; closing waits for what is in flight. It drives libpq's pipeline
mode through psycopg's `pq` wrapper, so these also fail loudly if psycopg changes that API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from mcp_durable.journal.postgres.pipeline import Pipeline
from tests.conftest import postgres_or_skip

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pipeline() -> AsyncIterator[Pipeline]:
    pipeline = Pipeline(postgres_or_skip(), options="-c statement_timeout=5000")
    try:
        yield pipeline
    finally:
        await pipeline.aclose()


async def test_statements_sent_together_are_answered_in_order_each_in_a_transaction_of_its_own(
    pipeline: Pipeline,
) -> None:
    sql = "SELECT $1::int * 2, txid_current()::text, NULL::text"
    answers = await asyncio.gather(*(pipeline.rows(sql, [str(n).encode()]) for n in range(50)))
    assert [int(rows[0][0] or b"") for rows in answers] == [n * 2 for n in range(50)]
    assert all(rows[0][2] is None for rows in answers)  # NULL comes back as None
    transactions = [int(rows[0][1] or b"") for rows in answers]
    assert transactions == sorted(transactions) and len(set(transactions)) == 50  # run in the order sent
    assert pipeline.connections == 1


async def test_a_failing_statement_fails_its_own_caller_and_not_the_ones_sent_beside_it(pipeline: Pipeline) -> None:
    sql = "SELECT 10 / $1::int"
    outcomes = await asyncio.gather(*(pipeline.rows(sql, [str(n).encode()]) for n in (1, 0, 5)), return_exceptions=True)
    assert outcomes[0] == [(b"10",)] and outcomes[2] == [(b"2",)]
    assert isinstance(outcomes[1], psycopg.errors.DivisionByZero)
    # A statement the server cannot prepare raises its own error, every time it is sent.
    for _ in range(2):
        with pytest.raises(psycopg.errors.SyntaxError):
            await pipeline.rows("SELEC $1", [b"1"])
    assert await pipeline.rows(sql, [b"2"]) == [(b"5",)] and pipeline.connections == 1


async def test_a_lost_connection_fails_what_is_in_flight_and_the_next_statement_reconnects(pipeline: Pipeline) -> None:
    await pipeline.rows("SELECT 1", [])
    pid = pipeline.backend_pid
    in_flight = asyncio.ensure_future(pipeline.rows("SELECT pg_sleep(30)", []))
    await asyncio.sleep(0.2)
    async with await psycopg.AsyncConnection.connect(postgres_or_skip(), autocommit=True) as other:
        await other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        await asyncio.wait_for(in_flight, 10)
    assert await pipeline.rows("SELECT $1::text", [b"back"]) == [(b"back",)]
    assert pipeline.connections == 2 and pipeline.backend_pid != pid


async def test_parameters_larger_than_the_socket_takes_at_once_go_out_whole(pipeline: Pipeline) -> None:
    big = b"x" * (8 << 20)
    answers = await asyncio.gather(*(pipeline.rows("SELECT length($1::text)", [big]) for _ in range(3)))
    assert answers == [[(str(len(big)).encode(),)]] * 3


async def test_closing_waits_for_what_is_in_flight_then_refuses() -> None:
    pipeline = Pipeline(postgres_or_skip())
    await pipeline.rows("SELECT 1", [])
    in_flight = asyncio.ensure_future(pipeline.rows("SELECT pg_sleep(0.3), 'done'", []))
    await asyncio.sleep(0)  # sent: nothing in `rows` awaits before it sends on a connection made
    await pipeline.aclose()
    assert (await in_flight)[0][1] == b"done"
    with pytest.raises(psycopg.OperationalError):
        await pipeline.rows("SELECT 1", [])
