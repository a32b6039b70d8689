"""A plain `MCPServer` (no mcp-durable in it) used as the proxy's upstream, counting its executions.

Serve it with `mcp-durable serve tests/proxy/servers/plain_upstream.py --transport http` (a plain
server: uvicorn, no journal), over stdio the same way, or made durable in process with
`serve … --policies`. `$COUNTER_FILE` is the execution counter (tests/server/servers/counting.py's
`Counter`); `$LEDGER_DB` the sqlite ledger of `charge`.

- `record(text)`: `idempotentHint: true`; counts `record`; returns the key it was sent.
- `shout(text) -> str`: `idempotentHint: true`; counts `shout`; an output schema requiring `result`.
- `plain(text)`: no hints (pass-through by default); counts `plain`.
- `gated(text)`: counts `gated`, writes its pid to `<counter>.pid`, waits for the gate file,
  counts `gated.done`.
- `charge(order_id, amount_cents)`: honours the forwarded key: the first call with a key inserts a
  ledger row (the effect) and then waits for the gate; a call with a key already in the ledger
  returns that row without a new effect.
- `progress(steps)`: reports `steps` progress notifications.
- `ask_client(prompt)`: a sampling request to the calling client; returns the answer.
- `flaky(text)`: `idempotentHint: true`; counts `flaky`; its first execution raises (a transient
  crash, which the SDK answers as an `isError` result), every later one succeeds.
- `stall(text)`: no hints (pass-through); counts `stall`, waits for the gate, counts `stall.done`.
- `chatty()`: no hints; sends one log message at each of debug, info, warning and error.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import SamplingMessage, TextContent, ToolAnnotations

from tests.server.servers.counting import ENV_COUNTER, Counter

KEY_META = "mcp-durable/idempotency-key"
IDEMPOTENT = ToolAnnotations(idempotent_hint=True, read_only_hint=False)

server = MCPServer("plain-upstream")


def _counter() -> Counter:
    return Counter(os.environ[ENV_COUNTER])


def _key(ctx: Context[Any, Any]) -> str | None:
    meta = ctx.request_context.meta or {}
    key = meta.get(KEY_META) if isinstance(meta, dict) else getattr(meta, KEY_META, None)
    return None if key is None else str(key)


@server.tool(annotations=IDEMPOTENT)
def record(text: str, ctx: Context[Any, Any]) -> dict[str, Any]:
    """Idempotent by its annotation: made durable by the proxy without a policies file."""
    n = _counter().hit("record")
    return {"text": text, "execution": n, "run": uuid.uuid4().hex, "key": _key(ctx)}


@server.tool(annotations=IDEMPOTENT)
def shout(text: str) -> str:
    """Idempotent, returning `str`: its output schema requires `{"result": …}`, so a refusal
    carried as structured content would break clients that validate it (the TypeScript SDK)."""
    _counter().hit("shout")
    return text.upper()


@server.tool()
def plain(text: str) -> dict[str, Any]:
    """No hints: passed through."""
    n = _counter().hit("plain")
    return {"text": text, "execution": n, "run": uuid.uuid4().hex}


async def _wait_for_gate(counter: Counter) -> None:
    while not counter.gate.exists():  # the test opens the gate: no timing involved
        await anyio.sleep(0.01)


@server.tool(annotations=IDEMPOTENT)
async def gated(text: str) -> dict[str, Any]:
    """Runs until the test opens the gate; its pid is in `<counter>.pid` while it waits."""
    counter = _counter()
    counter.path.with_name(counter.path.name + ".pid").write_text(str(os.getpid()))
    counter.hit("gated")
    await _wait_for_gate(counter)
    counter.hit("gated.done")
    return {"text": text, "run": uuid.uuid4().hex}


def _ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["LEDGER_DB"], isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, order_id TEXT, amount_cents INTEGER)")
    return db


@server.tool(annotations=IDEMPOTENT)
async def charge(order_id: str, amount_cents: int, ctx: Context[Any, Any]) -> dict[str, Any]:
    """A downstream system that honours the forwarded key (a unique column)."""
    key = _key(ctx) or uuid.uuid4().hex
    counter = _counter()
    db = _ledger()
    try:
        inserted = db.execute("INSERT OR IGNORE INTO charges VALUES (?, ?, ?)", (key, order_id, amount_cents)).rowcount
    finally:
        db.close()
    if inserted:
        counter.hit("charge")  # the effect, once per key
        await _wait_for_gate(counter)
    else:
        counter.hit("charge.deduplicated")
    return {"order_id": order_id, "amount_cents": amount_cents, "key": key}


@server.tool()
async def progress(steps: int, ctx: Context[Any, Any]) -> str:
    """Reports `steps` progress notifications, then answers."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
    return f"done {steps}"


@server.tool()
async def ask_client(prompt: str, ctx: Context[Any, Any]) -> str:
    """Asks the calling client's model (sampling) and returns its answer."""
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))], max_tokens=10
    )
    content = result.content
    return content.text if isinstance(content, TextContent) else str(content)


@server.tool(annotations=IDEMPOTENT)
def flaky(text: str) -> dict[str, Any]:
    """Fails its first execution with an exception (the SDK answers `isError`), then succeeds."""
    n = _counter().hit("flaky")
    if n == 1:
        raise RuntimeError("the database is restarting")
    return {"text": text, "execution": n, "run": uuid.uuid4().hex}


@server.tool()
async def stall(text: str) -> dict[str, Any]:
    """A pass-through tool that runs until the test opens the gate."""
    counter = _counter()
    counter.hit("stall")
    await _wait_for_gate(counter)
    counter.hit("stall.done")
    return {"text": text, "run": uuid.uuid4().hex}


@server.tool()
async def chatty(ctx: Context[Any, Any]) -> str:
    """One log message at each of four levels, then an answer."""
    await ctx.debug("chatty debug")
    await ctx.info("chatty info")
    await ctx.warning("chatty warning")
    await ctx.error("chatty error")
    return "said four things"


@server.resource("plain://greeting", mime_type="text/plain")
def greeting() -> str:
    return "hello from the plain upstream"


@server.prompt()
def ask(topic: str) -> str:
    """A prompt with an argument."""
    return f"Tell me about {topic}."


if __name__ == "__main__":
    server.run()
