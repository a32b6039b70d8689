"""Malformed requests on the legacy (2025-11-25) wire: raw JSON-RPC lines to a real stdio server.

The SDK client cannot send a `_meta` that is not an object, so this test speaks the wire itself
to `mcp-durable serve tests/hardening/target.py` over stdio, with a SQLite journal the test reads
from outside the server process before and after every hostile request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import Process

from mcp_durable.journal.sqlite import SQLiteJournal
from tests.hardening.conftest import KEY_META, snapshot
from tests.helpers import REPO, serve_command


class RawStdio:
    """One JSON-RPC line out, the response with the same id back."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send(orjson.dumps(message) + b"\n")

    async def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        assert self.proc.stdout is not None
        with anyio.fail_after(20):
            while True:
                while b"\n" not in self.buffer:
                    self.buffer += await self.proc.stdout.receive()
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = orjson.loads(line)
                if message.get("id") == self.next_id:
                    return dict(message)


HOSTILE_METAS: list[Any] = [
    "a string",
    ["a", "list"],
    42,
    True,
    {KEY_META: {"nested": 1}},
    {KEY_META: 12},
    {KEY_META: ""},
    {KEY_META: None},
    {KEY_META: "bad\nkey"},
    {KEY_META: "k" * 256},
]


async def test_a_malformed_meta_on_the_legacy_wire_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "HARDENING_RUNS": str(runs)}
    command = [*serve_command(), "serve", "tests/hardening/target.py", "--journal", f"sqlite:///{db}"]
    async with await anyio.open_process(command, cwd=REPO, env=env, stderr=None) as proc:
        wire = RawStdio(proc)
        init = await wire.request(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        assert init["result"]["protocolVersion"] == "2025-11-25"
        await wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        ok = await wire.request("tools/call", {"name": "echo", "arguments": {"text": "first"}})
        assert ok["result"].get("isError") is not True

        reader = SQLiteJournal(db)
        await reader.open()
        try:
            for meta in HOSTILE_METAS:
                before = await snapshot(reader)
                params = {"name": "echo", "arguments": {"text": "hostile"}, "_meta": meta}
                answer = await wire.request("tools/call", params)
                assert await snapshot(reader) == before, f"_meta={meta!r} changed the journal"
                assert runs.read_text().splitlines() == ["first"], f"_meta={meta!r} ran the tool"
                if "error" in answer:  # a JSON-RPC error: the request itself was refused
                    assert answer["error"]["code"] == -32602, (meta, answer)
                else:
                    result = answer["result"]
                    assert result["isError"] is True, (meta, result)
                    assert result["_meta"]["mcp-durable/error"]["error"] == "invalid_key", (meta, result)
        finally:
            await reader.aclose()
        # The server is still serving, and the good call is replayed.
        again = await wire.request("tools/call", {"name": "echo", "arguments": {"text": "first"}})
        assert again["result"]["_meta"]["mcp-durable/replayed"] is True
        proc.terminate()
