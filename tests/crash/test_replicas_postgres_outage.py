"""Postgres stops for a few seconds under a running server: refusals, then recovery by itself.

The test runs its own throwaway cluster (`tests/backends/pg_cluster.py`), never the shared
one. A replica serves over HTTP with its journal there while a caller sends a steady stream of
calls, each with a new key. The cluster is stopped, left down for a few seconds, and started
again; the server is never restarted.

- Calls made while the database is down fail with `journal_unavailable` and run no tool.
- After it is back, calls succeed again, and a key refused during the outage runs once.
- Every call answered either a result or `journal_unavailable`, and no key ran twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable.demo.ledger import PaymentProvider
from tests.backends.pg_cluster import PgCluster
from tests.crash.test_replicas_concurrency import TARGET
from tests.helpers import key_meta, serve_http

pytestmark = pytest.mark.postgres

DOWN_SECONDS = 4.0


@dataclass
class Sent:
    key: str
    started: float
    ended: float
    result: Any

    @property
    def error(self) -> str | None:
        return (self.result.structured_content or {}).get("error") if self.result.is_error else None


async def test_calls_fail_as_journal_unavailable_while_postgres_is_down_and_succeed_once_it_is_back(
    tmp_path: Path,
) -> None:
    ledger = PaymentProvider(tmp_path / "ledger.db")
    env = {"PAYMENTS_LEDGER": str(ledger.path)}
    sent: list[Sent] = []

    with PgCluster.create() as cluster:
        journal = cluster.url("postgres") + "?schema=outage&pool_timeout=1&connect_timeout=2"
        async with serve_http(TARGET, journal=journal, env=env) as served, Client(served.url) as client:

            async def call(key: str) -> Sent:
                started = time.monotonic()
                result = await client.call_tool(
                    "refund", {"order_id": f"O-{key}", "amount_cents": 100}, meta=key_meta(key)
                )
                done = Sent(key, started, time.monotonic(), result)
                sent.append(done)
                return done

            assert not (await call("before")).result.is_error
            stream_done = anyio.Event()

            async def stream() -> None:
                i = 0
                while not stream_done.is_set():
                    await call(f"stream-{i}")
                    i += 1
                    await anyio.sleep(0.05)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    await anyio.sleep(0.5)
                    await anyio.to_thread.run_sync(cluster.stop)
                    down_from = time.monotonic()
                    await anyio.sleep(DOWN_SECONDS)
                    down_until = time.monotonic()
                    await anyio.to_thread.run_sync(cluster.start)
                    while not any(s.started > down_until and not s.result.is_error for s in sent):
                        await anyio.sleep(0.1)  # recovered by itself: a call made after the restart succeeded
                    await anyio.sleep(0.5)
                    stream_done.set()

            during = [s for s in sent if s.started >= down_from and s.ended <= down_until]
            retried = await call(during[0].key) if during else None
            again = await call("before")

    runs: dict[str, int] = {}  # requests the provider received per key: one per tool execution
    for request in ledger.requests():
        runs[request["idempotency_key"]] = runs.get(request["idempotency_key"], 0) + 1
    assert during, "no call was made while the database was down"
    assert all(s.error == "journal_unavailable" for s in during), [s.result for s in during]
    assert not any(s.key in runs for s in during[1:])  # refused calls ran no tool
    assert {s.error for s in sent} <= {None, "journal_unavailable"}
    assert all(count == 1 for count in runs.values())  # no key ran twice
    assert sent[-3].result.is_error is False  # the stream's last call, after recovery
    assert retried is not None and not retried.result.is_error and runs[retried.key] == 1  # ran once, now
    assert again.result.meta is not None and again.result.meta.get("mcp-durable/replayed") is True
