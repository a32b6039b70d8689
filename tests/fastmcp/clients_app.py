"""The plain upstream's task tools (tests/proxy/servers/plain_upstream.py) written for FastMCP 4 and
made durable in process, for the task clients of other SDKs (tests/proxy/test_tasks_ext_tasks.py,
tests/proxy/test_tasks_typescript.py, target `fastmcp`): the tasks `DurableTasks` serves meet the
same clients as the proxy's.

- `charge(order_id, amount_cents)`: `idempotentHint: true`, its policy `key="required"`, task
  support optional; a downstream that honours the call's key (`current_call().key`, a unique
  column of the ledger): the first call with a key inserts a row (the effect, counted `charge`)
  and then waits for the counter's gate; a call with a key already there counts
  `charge.deduplicated` and returns the row.
- `flaky(text)`: `idempotentHint: true`, task support optional; counts `flaky`; its first
  execution raises (released by the default `exceptions="release"`: a repeat runs again).
- `record(text)`: `idempotentHint: true`, no task support; counts `record`.

`COUNTER_FILE` and `LEDGER_DB` (as `upstreams.upstream_env` sets them) say where the counter and
the ledger are.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from mcp_types import ToolAnnotations

from mcp_durable import ToolPolicy, current_call
from tests.fastmcp.servers import FastMCP, make_durable  # skips (or fails under CI) without FastMCP
from tests.server.servers.counting import Counter

IDEMPOTENT = ToolAnnotations(idempotent_hint=True)


def clients_app(journal: str, env: Mapping[str, str], *, task_after: float = 0.0) -> FastMCP[Any]:
    """The tools on `journal`, durable; `charge`'s and `flaky`'s tasks answered as tasks unless
    they end within `task_after` seconds."""
    counter = Counter(env["COUNTER_FILE"])
    ledger = env["LEDGER_DB"]
    app: FastMCP[Any] = FastMCP("fastmcp-task-clients")
    flaky_runs = [0]

    @app.tool(annotations=IDEMPOTENT)
    async def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        """A downstream system that honours the call's key (a unique column)."""
        key = current_call().key
        db = sqlite3.connect(ledger, isolation_level=None)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, order_id TEXT, amount_cents INTEGER)")
            inserted = db.execute("INSERT OR IGNORE INTO charges VALUES (?, ?, ?)", (key, order_id, amount_cents))
            effect = inserted.rowcount
        finally:
            db.close()
        if effect:
            counter.hit("charge")  # the effect, once per key
            while not counter.gate.exists():  # the test opens the gate: no timing involved
                await anyio.sleep(0.01)
        else:
            counter.hit("charge.deduplicated")
        return {"order_id": order_id, "amount_cents": amount_cents, "key": key}

    @app.tool(annotations=IDEMPOTENT)
    async def flaky(text: str) -> dict[str, Any]:
        """Its first execution crashes; every later one succeeds."""
        counter.hit("flaky")
        flaky_runs[0] += 1
        if flaky_runs[0] == 1:
            raise RuntimeError("flaky crashed on its first execution")
        return {"text": text, "run": uuid.uuid4().hex}

    @app.tool(annotations=IDEMPOTENT)
    async def record(text: str) -> dict[str, Any]:
        """Idempotent by its annotation, no task."""
        n = counter.hit("record")
        return {"text": text, "execution": n}

    policies = {
        "charge": ToolPolicy(key="required", task_support="optional", task_after=task_after),
        "flaky": ToolPolicy(task_support="optional", task_after=task_after),
    }
    make_durable(app, journal=journal, policies=policies)
    return app
