"""The peers: the same tools made idempotent the way a user would without mcp-durable.

Each builder returns a plain `MCPServer` with two tools, both keyed by their arguments as
mcp-durable derives a key: `noop(n)` (returns "ok") and `refund(order, amount_cents)` (one
money movement in the demo payment provider's ledger, a downstream that does NOT honour keys,
so a second run is a visible duplicate).

- **DBOS Transact** (`dbos`): the tool runs a `@DBOS.workflow` under `SetWorkflowID(key)`; a
  repeat of the key returns the workflow's recorded output. DBOS is one instance per process, so
  `dbos_session(url)` launches it (SQLite file or a Postgres schema) and destroys it after.
- **Powertools idempotency** (`aws-lambda-powertools`) with its Redis persistence layer: the
  tool body is an `@idempotent_function` whose data carries the key (`event_key_jmespath`).
  Powertools is synchronous, so these tools are plain functions (the SDK runs them in a worker
  thread).

Needs the optional extra `peers` (`pip install -e '.[peers]'`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.demo.ledger import PaymentProvider

from .servers import TOOL, noop

REFUND = "refund"
# Outside Lambda there is no remaining time to read; Powertools warns about it on every call.
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
#: Set in a child of the crash harness: SIGKILL the process right after the refund's effect,
#: before the idempotency layer records the result (inside the danger window).
CRASH_ENV = "PEERS_CRASH_AFTER_EFFECT"
LEDGER_ENV = "PAYMENTS_LEDGER"


def _refund_effect(order: str, amount_cents: int) -> str:
    """Move the money (no idempotency key: the downstream cannot deduplicate), then maybe die."""
    effect = PaymentProvider(Path(os.environ[LEDGER_ENV])).refund(order, amount_cents, idempotency_key=None)
    if os.environ.get(CRASH_ENV) == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return f"refunded {amount_cents} for {order}: {effect.id}"


def key_of(tool: str, **arguments: Any) -> str:
    return f"{tool}:" + ",".join(f"{k}={arguments[k]}" for k in sorted(arguments))


# -- mcp-durable ----------------------------------------------------------------------------------


def durable_peer(journal: str, *, lease: float = 30.0) -> DurableServer:
    """mcp-durable itself, with both tools (keys derived from the arguments). The refund's
    downstream does not honour keys, so it is configured as the docs say for such a tool: a
    call that may have run is refused as in doubt (`in_doubt="refuse"`), never run again."""

    async def refund(order: str, amount_cents: int) -> str:
        return _refund_effect(order, amount_cents)

    server = DurableServer("bench-durable", journal=journal, log_level="WARNING")
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived"))
    server.add_tool(
        refund, name=REFUND, durable=ToolPolicy(idempotent=True, key="derived", lease=lease, in_doubt="refuse")
    )
    return server


# -- DBOS -----------------------------------------------------------------------------------------

_dbos_workflows: dict[str, Any] = {}


def _dbos_registered() -> dict[str, Any]:
    """The workflows, registered once per process (DBOS keeps them in a global registry)."""
    if not _dbos_workflows:
        from dbos import DBOS

        @DBOS.workflow(name="bench_noop")
        async def noop_workflow(n: int) -> str:
            return "ok"

        @DBOS.step(name="bench_refund_effect")
        def refund_step(order: str, amount_cents: int) -> str:
            return _refund_effect(order, amount_cents)

        @DBOS.workflow(name="bench_refund")
        def refund_workflow(order: str, amount_cents: int) -> str:
            return refund_step(order, amount_cents)

        _dbos_workflows.update(noop=noop_workflow, refund=refund_workflow)
    return _dbos_workflows


@contextmanager
def dbos_session(system_database_url: str, schema: str | None = None) -> Iterator[None]:
    """DBOS launched on `system_database_url` (a Postgres `schema` when given), destroyed after."""
    from dbos import DBOS

    _dbos_registered()
    config: dict[str, Any] = {
        "name": "mcp-durable-bench-peers",
        "system_database_url": system_database_url,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    if schema is not None:
        config["dbos_system_schema"] = schema
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy(destroy_registry=False)


def dbos_peer() -> MCPServer:
    """A plain MCPServer whose tools run DBOS workflows with the key as workflow id (DBOS launched)."""
    from dbos import SetWorkflowID

    workflows = _dbos_registered()

    async def noop_tool(n: int) -> str:
        with SetWorkflowID(key_of(TOOL, n=n)):
            result: str = await workflows["noop"](n)
        return result

    def refund(order: str, amount_cents: int) -> str:
        with SetWorkflowID(key_of(REFUND, order=order, amount_cents=amount_cents)):
            result: str = workflows["refund"](order, amount_cents)
        return result

    server = MCPServer("bench-dbos", log_level="WARNING")
    server.add_tool(noop_tool, name=TOOL)
    server.add_tool(refund, name=REFUND)
    return server


# -- Powertools + Redis ---------------------------------------------------------------------------


def powertools_peer(port: int) -> MCPServer:
    """A plain MCPServer whose tools are Powertools idempotent functions on the Redis at `port`."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer

    store = RedisCachePersistenceLayer(host="127.0.0.1", port=port, ssl=False)
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="request", persistence_store=store, config=config)
    def noop_body(request: dict[str, Any]) -> str:
        return "ok"

    @idempotent_function(data_keyword_argument="request", persistence_store=store, config=config)
    def refund_body(request: dict[str, Any]) -> str:
        return _refund_effect(request["order"], request["amount_cents"])

    def noop_tool(n: int) -> str:
        result: str = noop_body(request={"key": key_of(TOOL, n=n), "n": n})
        return result

    def refund(order: str, amount_cents: int) -> str:
        key = key_of(REFUND, order=order, amount_cents=amount_cents)
        result: str = refund_body(request={"key": key, "order": order, "amount_cents": amount_cents})
        return result

    server = MCPServer("bench-powertools", log_level="WARNING")
    server.add_tool(noop_tool, name=TOOL)
    server.add_tool(refund, name=REFUND)
    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def redis_fsync_always() -> Iterator[int]:
    """A redis-server of our own (never the shared one reconfigured): AOF with `appendfsync
    always`, so every write is fsynced before Redis answers; in a temp dir, on a free port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix="bench-redis-")
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            directory,
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def redis_config(port: int) -> str:
    """How the Redis at `port` persists, e.g. "AOF appendfsync always" or "no AOF"."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        aof = client.config_get("appendonly").get("appendonly")
        fsync = client.config_get("appendfsync").get("appendfsync")
        save = client.config_get("save").get("save")
    finally:
        client.close()
    if aof == "yes":
        return f"AOF, appendfsync {fsync}"
    return "no AOF" + (f", snapshots '{save}'" if save else ", no snapshots")
