"""A test target: durable and plain tools that count their executions in a file.

Every execution appends one line (`<tool>` when it starts, `<tool>.done` when it finishes) to the
counter file (`gated` tools finish only once the test opens the gate file beside it), so a test
in another process (stdio, HTTP, after a SIGKILL) can count how often a tool really ran. Results
carry a fresh `run` id, so a re-execution could never pass for a replay.

Serve it with `mcp-durable serve tests/server/servers/counting.py:make_server` (the counter file is
`$COUNTER_FILE`), or build it in-process with `make_server(journal=…, counter=…)`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mcp_durable import DurableServer, ToolPolicy, current_call

ENV_COUNTER = "COUNTER_FILE"


class Counter:
    """Execution counts in an append-only file (one line per event; safe across processes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def hit(self, event: str) -> int:
        """Record `event`; returns how many times it has happened, this one included."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event}\n".encode())
        finally:
            os.close(fd)
        return self.count(event)

    @property
    def gate(self) -> Path:
        """The file whose creation lets `gated` tools finish."""
        return self.path.with_name(self.path.name + ".gate")

    def open_gate(self) -> None:
        self.gate.touch()

    def count(self, event: str) -> int:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return 0
        return sum(1 for line in lines if line == event)


def make_server(journal: str | None = None, counter: str | os.PathLike[str] | None = None) -> DurableServer:
    """The counting server on `journal` (default `$MCP_DURABLE_JOURNAL`), counting into `counter`.

    Its tools, in registration order: record, slow, gated, gated_short_wait, required,
    tool_error, flaky, whoami, keyed, plain."""
    counts = Counter(counter or os.environ[ENV_COUNTER])
    server = DurableServer("counting", journal=journal)
    _add_running_tools(server, counts)
    _add_gated_tools(server, counts)
    _add_refusing_and_failing_tools(server, counts)
    _add_scope_and_plain_tools(server, counts)
    return server


def _result(tool: str, text: str, **extra: Any) -> dict[str, Any]:
    """A tool's result: its name, the text it was given and a fresh `run` id (never replayed
    by accident), plus `extra`."""
    return {"tool": tool, "text": text, "run": uuid.uuid4().hex, **extra}


def _add_running_tools(server: DurableServer, counts: Counter) -> None:
    """`record` and `slow`: durable tools that run to their end on their own."""

    @server.tool(durable=ToolPolicy(key="derived"))
    def record(text: str) -> dict[str, Any]:
        """Idempotent by default: keyed by the caller, else by its arguments."""
        counts.hit("record")
        return _result("record", text, key=current_call().key)

    @server.tool(durable=ToolPolicy(key="derived"))
    async def slow(text: str, delay: float) -> dict[str, Any]:
        """Sleeps `delay` seconds between its start and its end."""
        counts.hit("slow")
        await anyio.sleep(delay)
        counts.hit("slow.done")
        return _result("slow", text)


def _add_gated_tools(server: DurableServer, counts: Counter) -> None:
    """`gated` and `gated_short_wait`: durable tools that finish only once the test opens the gate."""

    async def wait_for_gate(tool: str) -> None:
        counts.hit(tool)
        while not counts.gate.exists():  # blocks until the test opens the gate: no timing involved
            await anyio.sleep(0.01)
        counts.hit(f"{tool}.done")

    @server.tool(durable=ToolPolicy(key="derived"))
    async def gated(text: str) -> dict[str, Any]:
        """Runs until the test opens the gate (`Counter.open_gate()`)."""
        await wait_for_gate("gated")
        return _result("gated", text)

    @server.tool(durable=ToolPolicy(wait=0.05))
    async def gated_short_wait(text: str) -> dict[str, Any]:
        """Like `gated`, but a duplicate in flight waits only 50 ms for it."""
        await wait_for_gate("gated_short_wait")
        return _result("gated_short_wait", text)


def _add_refusing_and_failing_tools(server: DurableServer, counts: Counter) -> None:
    """`required` (refuses a call without a caller key), `tool_error` and `flaky` (fail)."""

    @server.tool(durable=ToolPolicy(key="required"))
    def required(text: str) -> dict[str, Any]:
        """Refuses calls without a caller key."""
        counts.hit("required")
        return _result("required", text)

    @server.tool(durable=ToolPolicy(key="derived"))
    def tool_error(text: str) -> dict[str, Any]:
        """Always fails deliberately (a `ToolError`, which is a result to persist)."""
        n = counts.hit("tool_error")
        raise ToolError(f"declined {text!r} (execution {n})")

    @server.tool(durable=ToolPolicy(key="derived"))
    def flaky(text: str) -> dict[str, Any]:
        """Crashes (unexpected exception) on its first execution, succeeds afterwards."""
        n = counts.hit("flaky")
        if n == 1:
            raise RuntimeError("flaky crashed on its first execution")
        return _result("flaky", text, execution=n)


def _add_scope_and_plain_tools(server: DurableServer, counts: Counter) -> None:
    """`whoami` (its principal), `keyed` (its key from an argument) and `plain` (not durable)."""

    @server.tool(durable=ToolPolicy(key="derived"))
    def whoami(text: str) -> dict[str, Any]:
        """Returns the principal the call is scoped to."""
        counts.hit("whoami")
        return _result("whoami", text, principal=current_call().identity.principal)

    @server.tool(durable=ToolPolicy(key_argument="idempotency_key"))
    def keyed(text: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Takes its key as an argument too (a caller `_meta` key still wins)."""
        counts.hit("keyed")
        return _result("keyed", text, key=current_call().key)

    @server.tool()
    def plain(text: str) -> dict[str, Any]:
        """Not durable: runs every time, results untouched."""
        counts.hit("plain")
        return _result("plain", text)
