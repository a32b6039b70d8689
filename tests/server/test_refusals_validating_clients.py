"""Refusals are valid answers for clients that validate structured content against the tool's schema.

A refused call carries the refusal `{error, message, …}` in `_meta["mcp-durable/error"]` always,
and as `structuredContent` only where the tool's output schema accepts it (docs/guarantees.md). Real
clients check this: the TypeScript SDK's `callTool` throws on structured content that does not
match the schema, and the Inspector CLI exits 1. Both are run here against a real server over
streamable HTTP, on tools returning `str`, `int`, a pydantic model and a `dict`, for every
refusal code a durable call can get.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable import KEY_META
from tests.docs.test_examples import inspector_or_skip
from tests.helpers import first_text, serve_http
from tests.node_peers import node_script, require_node_peers
from tests.server.servers.typed import DOUBT_KEY, DOUBT_TEXT, TOOLS, make_server, seed_in_doubt

TYPED = "tests/server/servers/typed.py:make_server"
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
BIG_TEXT = "x" * 2000  # over the server's 1 KiB argument limit
CODES = ("missing_key", "invalid_key", "key_reuse", "too_large", "in_doubt", "in_progress", "journal_unavailable")


@dataclass
class Servers:
    url: str  # the typed server, with a call in doubt seeded for every tool
    locked_url: str  # a second server on the same file journal: the journal is locked by the first
    gate: Path


@asynccontextmanager
async def typed_servers(tmp_path: Path) -> AsyncIterator[Servers]:
    journal = f"file://{tmp_path}/journal"
    await seed_in_doubt(journal)
    gate = tmp_path / "gate"
    env = {"GATE_FILE": str(gate), "MAX_ARGUMENT_BYTES": "1024"}
    async with serve_http(TYPED, journal=journal, env=env) as served:
        async with serve_http(TYPED, journal=journal, env=env) as locked:
            yield Servers(served.url, locked.url, gate)


TS_CLIENT = r"""
import fs from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, lockedUrl, gate, tools, bigText, doubtKey, doubtText] = process.argv.slice(2);
const KEY = "mcp-durable/idempotency-key";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function connect(target) {
  const client = new Client({ name: "refusal-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(target)));
  await client.listTools(); // as real clients do: the SDK validates results against these schemas
  return client;
}

const rows = [];
async function call(client, tool, expected, args, key) {
  const params = { name: tool, arguments: args };
  if (key !== undefined) params._meta = { [KEY]: key };
  try {
    const r = await client.callTool(params);
    rows.push({ tool, expected, isError: r.isError ?? false, error: r._meta?.["mcp-durable/error"] ?? null,
                structured: r.structuredContent ?? null, text: r.content?.[0]?.text ?? "" });
  } catch (e) {
    rows.push({ tool, expected, threw: String(e) });
  }
}

const client = await connect(url);
const locked = await connect(lockedUrl);
for (const tool of tools.split(",")) {
  await call(client, tool, "missing_key", { text: "a" });
  await call(client, tool, "invalid_key", { text: "a" }, "bad\nkey");
  await call(client, tool, null, { text: "a" }, "k-1");
  await call(client, tool, "key_reuse", { text: "b" }, "k-1");
  await call(client, tool, "too_large", { text: bigText }, "k-big");
  await call(client, tool, "in_doubt", { text: doubtText }, doubtKey);
  const held = client.callTool({ name: tool, arguments: { text: "held", hold: true }, _meta: { [KEY]: "k-held" } });
  while (!fs.existsSync(`${gate}.${tool}.started`)) await sleep(10);
  await call(client, tool, "in_progress", { text: "held", hold: true }, "k-held");
  fs.writeFileSync(`${gate}.${tool}`, "");
  const done = await held;
  rows.push({ tool, expected: null, isError: done.isError ?? false, error: null, structured: done.structuredContent });
  await call(locked, tool, "journal_unavailable", { text: "a" }, "k-2");
}
console.log(JSON.stringify(rows));
await client.close();
await locked.close();
"""


def check_row(row: dict[str, Any]) -> None:
    assert "threw" not in row, f"the client rejected the answer: {row}"
    if row["expected"] is None:
        assert row["isError"] is False, row
        return
    assert row["isError"] is True, row
    assert row["error"]["error"] == row["expected"], row
    assert row["error"]["message"] and row["expected"] in row["text"], row
    if row["tool"] == "as_dict":  # an open object schema: the refusal is the structured content too
        assert row["structured"] == row["error"], row
    else:  # `{"result": …}` or the model's required fields: no structured content that breaks them
        assert row["structured"] is None, row


async def test_the_typescript_sdk_parses_every_refusal_on_tools_with_an_output_schema(tmp_path: Path) -> None:
    require_node_peers()
    async with typed_servers(tmp_path) as servers:
        proc = node_script(
            tmp_path / "client.mjs",
            TS_CLIENT,
            args=[servers.url, servers.locked_url, str(servers.gate), ",".join(TOOLS), BIG_TEXT, DOUBT_KEY, DOUBT_TEXT],
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {(r["tool"], r["expected"]) for r in rows if r["expected"]} == {(t, c) for t in TOOLS for c in CODES}
    for row in rows:
        check_row(row)


def inspector_call(url: str, tool: str, args: dict[str, str], key: str | None, cwd: Path) -> subprocess.Popen[str]:
    argv = ["npx", "-y", INSPECTOR, "--cli", url, "--transport", "http", "--method", "tools/call", "--tool-name", tool]
    for name, value in args.items():
        argv += ["--tool-arg", f"{name}={value}"]
    if key is not None:
        argv += ["--tool-metadata", f"{KEY_META}={key}"]
    env = {
        **os.environ,
        "MCP_CATALOG_PATH": str(cwd / "catalog.json"),
        "MCP_CLIENT_CONFIG_PATH": str(cwd / "client.json"),
    }
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def inspector_refusal(proc: subprocess.Popen[str], tool: str, expected: str) -> None:
    out, err = proc.communicate(timeout=180)
    # The Inspector exits 5 for a result with isError: true, and 1 when it rejects the answer.
    assert proc.returncode == 5, f"{tool} {expected}: exit {proc.returncode}\n{out}\n{err}"
    result = json.loads(out)
    assert result["isError"] is True and result["_meta"]["mcp-durable/error"]["error"] == expected, result
    assert expected in result["content"][0]["text"]


async def test_the_inspector_cli_parses_every_refusal_on_tools_with_an_output_schema(tmp_path: Path) -> None:
    inspector_or_skip(INSPECTOR)
    work = tmp_path / "inspector"
    work.mkdir()
    async with typed_servers(tmp_path) as servers:
        # Each tool's keys are its own, so the Inspector processes of every tool run at once; only
        # a key's reuse waits for its first call to have completed.
        # Each process has a folder of its own for the files the Inspector keeps.
        def folder(tool: str, what: str) -> Path:
            made = work / f"{tool}-{what}"
            made.mkdir()
            return made

        firsts: dict[str, subprocess.Popen[str]] = {}
        refusals: list[tuple[subprocess.Popen[str], str, str]] = []
        for tool in TOOLS:
            firsts[tool] = inspector_call(servers.url, tool, {"text": "a"}, "k-1", folder(tool, "first"))
            for expected, args, key, url in (
                ("missing_key", {"text": "a"}, None, servers.url),
                ("invalid_key", {"text": "a"}, " " * 256, servers.url),
                ("too_large", {"text": BIG_TEXT}, "k-big", servers.url),
                ("in_doubt", {"text": DOUBT_TEXT}, DOUBT_KEY, servers.url),
                ("journal_unavailable", {"text": "a"}, "k-2", servers.locked_url),
            ):
                refusals.append((inspector_call(url, tool, args, key, folder(tool, expected)), tool, expected))
        for tool, first in firsts.items():
            out, err = first.communicate(timeout=180)
            assert first.returncode == 0, out + err
            reuse = inspector_call(servers.url, tool, {"text": "b"}, "k-1", folder(tool, "key_reuse"))
            refusals.append((reuse, tool, "key_reuse"))
        for proc, tool, expected in refusals:
            inspector_refusal(proc, tool, expected)
        # in_progress, on the tool whose schema is the strictest: a call held open, then its duplicate.
        held = inspector_call(servers.url, "as_model", {"text": "held", "hold": "true"}, "k-held", work)
        started = Path(f"{servers.gate}.as_model.started")
        for _ in range(18000):
            if started.exists() or held.poll() is not None:
                break
            await anyio.sleep(0.01)
        assert started.exists(), held.communicate()
        inspector_refusal(
            inspector_call(servers.url, "as_model", {"text": "held", "hold": "true"}, "k-held", work),
            "as_model",
            "in_progress",
        )
        Path(f"{servers.gate}.as_model").touch()
        out, err = held.communicate(timeout=180)
        assert held.returncode == 0, out + err


# -- the same contract in process, in both eras ------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_refusal_is_structured_content_only_where_the_output_schema_accepts_it(
    mode: str, tmp_path: Path
) -> None:
    server = make_server(journal="memory://")
    async with Client(server, mode=mode) as client:
        for tool in TOOLS:
            refused = await client.call_tool(tool, {"text": "a"})
            assert refused.is_error and refused.meta is not None
            body = refused.meta["mcp-durable/error"]
            assert body["error"] == "missing_key" and body["tool"] == tool and body["message"]
            assert refused.structured_content == (body if tool == "as_dict" else None)
            assert first_text(refused) == f"missing_key: {body['message']}"
