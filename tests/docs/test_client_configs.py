"""The client configurations in the docs start exactly the servers they name, over stdio.

A client configuration is a ```json block of the docs (README.md, docs/*.md, examples/*.md) whose
object has `mcpServers` (Claude Desktop, Cursor) or `servers` (VS Code's `mcp.json`). For each
server entry of each, in a directory laid out like a clone (tests/docs/test_examples.py's
`workdir`):
- the two placeholders docs/clients.md names, `/ABSOLUTE/PATH/TO/mcp-durable` and
  `${workspaceFolder}`, become the clone's path; nothing else of the entry changes, and no
  placeholder may be left;
- `command` is looked up as a shell would, on a `PATH` with the clone's `.venv/bin` first;
- the MCP Python SDK's stdio client starts `command` with `args`, and `env` over the SDK's
  default environment (as a desktop client passes its own), then initializes, lists the tools
  and calls them: the entry's name picks the scenario (`SCENARIOS`), and a name without one fails.

npx: the proxy is started in tests/node with npm's registry set to a closed port and npm's cache
to an empty directory (the test machine's npm settings, beside the entry's `env`), so
`npx -y PACKAGE@VERSION` can only run the package installed there; the test also fails if npm
installed or fetched anything. Where node or npx is missing it skips, and fails when `CI` is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from tests.docs.snippets import REPO, Block, all_blocks, blocks
from tests.docs.test_examples import refunds, workdir
from tests.helpers import first_text, free_port, key_meta, meta_of, wire
from tests.node_peers import NODE_DIR, require_node_peers

CLIENTS_DOC = REPO / "docs" / "clients.md"
EXAMPLE = REPO / "examples" / "claude_desktop_config.json"
PLACEHOLDERS = ("/ABSOLUTE/PATH/TO/mcp-durable", "${workspaceFolder}")
LEFTOVER = re.compile(r"/ABSOLUTE/PATH|\$\{[^}]*\}")
SERVER_TABLES = ("mcpServers", "servers")  # Claude Desktop and Cursor; VS Code
ADA = {"entities": [{"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}]}


def is_client_config(block: Block) -> bool:
    """A json block that names servers for a client (parsed or not: a broken one must fail)."""
    return block.lang == "json" and any(f'"{table}"' in block.text for table in SERVER_TABLES)


def config_blocks() -> list[Block]:
    return [block for block in all_blocks() if is_client_config(block)]


def entries_of(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tables = [config[table] for table in SERVER_TABLES if table in config]
    assert len(tables) == 1, f"one of {SERVER_TABLES} expected, got {list(config)}"
    entries: dict[str, dict[str, Any]] = tables[0]
    return entries


def entry_ids() -> list[tuple[Block, str]]:
    """(block, server name) for every entry of every client configuration, in doc order."""
    found: list[tuple[Block, str]] = []
    for block in config_blocks():
        try:
            names = list(entries_of(json.loads(block.text)))
        except (ValueError, AssertionError):
            names = ["(does not parse)"]  # the test of this entry fails with the parser's message
        found.extend((block, name) for name in names)
    return found


def substituted(block: Block, clone: Path) -> dict[str, Any]:
    """The block's configuration with the placeholders replaced by the clone's path, and only them."""
    text = block.text
    for placeholder in PLACEHOLDERS:
        text = text.replace(placeholder, str(clone))
    left = LEFTOVER.search(text)
    assert left is None, f"{block.where}: a placeholder the test does not know: {left[0]!r}"
    config: dict[str, Any] = json.loads(text)
    return config


def policies_block() -> str:
    """The policies file docs/clients.md tells the reader to save: its one ```toml block."""
    found = [block.text for block in blocks(CLIENTS_DOC) if block.lang == "toml"]
    assert len(found) == 1, f"docs/clients.md should show one toml block, shows {len(found)}"
    return found[0]


def require_npx() -> None:
    if shutil.which("npx") is None:
        if os.environ.get("CI"):
            pytest.fail("npx is not installed; CI must have it (.ci/run installs tests/node with npm)")
        pytest.skip("npx is not installed")


# -- the scenarios, one per server name ---------------------------------------------------------


async def payments(client: Client, env: dict[str, str]) -> None:
    """tools/payments.py: refund once per key, keyed by order without one; charge needs a key."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert {"refund", "charge"} <= tools.keys(), sorted(tools)
    assert tools["refund"].annotations is not None and tools["refund"].annotations.idempotent_hint is True
    arguments = {"order_id": "O-1", "amount_cents": 500}
    first = await client.call_tool("refund", arguments, meta=key_meta("desk-1"))
    second = await client.call_tool("refund", arguments, meta=key_meta("desk-1"))
    assert not first.is_error, first
    assert meta_of(first)["mcp-durable/key"] == "desk-1" and "mcp-durable/replayed" not in meta_of(first)
    assert meta_of(second)["mcp-durable/replayed"] is True
    assert wire(second)["content"] == wire(first)["content"]
    assert second.structured_content == first.structured_content
    # What a chat client sends: no key. refund is keyed by its order_id; charge refuses.
    keyless = {"order_id": "O-2", "amount_cents": 700}
    chat_first = await client.call_tool("refund", keyless)
    chat_second = await client.call_tool("refund", keyless)
    assert not chat_first.is_error and "mcp-durable/replayed" not in meta_of(chat_first)
    assert meta_of(chat_second)["mcp-durable/replayed"] is True
    charge = await client.call_tool("charge", {"customer_id": "C-1", "amount_cents": 100})
    assert charge.is_error and meta_of(charge)["mcp-durable/error"]["error"] == "missing_key"
    ledger = Path(env["PAYMENTS_LEDGER"])  # the entry's own absolute path
    assert len(refunds(ledger, "O-1")) == 1 and len(refunds(ledger, "O-2")) == 1


async def names_in_graph(client: Client) -> list[str]:
    graph = json.loads(first_text(await client.call_tool("read_graph", {})))
    return sorted(entity["name"] for entity in graph["entities"])


async def memory(client: Client, env: dict[str, str]) -> None:
    """server-memory behind the proxy: create_entities once per key (policies file), else passed on."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ("create_entities", "create_relations", "add_observations"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.idempotent_hint is True, name  # made durable
    first = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
    assert not first.is_error, first
    assert meta_of(first)["mcp-durable/key"] == "ada-1"
    await client.call_tool("delete_entities", {"entityNames": ["Ada"]})
    second = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
    assert meta_of(second)["mcp-durable/replayed"] is True
    assert wire(second)["content"] == wire(first)["content"]
    assert await names_in_graph(client) == []  # the upstream ran the keyed call once
    keyless = await client.call_tool("create_entities", ADA)
    assert keyless.meta is None or "mcp-durable/key" not in keyless.meta  # forwarded unjournaled
    assert await names_in_graph(client) == ["Ada"]
    assert Path(env["MEMORY_FILE_PATH"]).is_file()  # the entry's memory file, not the package's


@dataclass(frozen=True, slots=True)
class Scenario:
    check: Callable[[Client, dict[str, str]], Awaitable[None]]
    npx: bool  # the entry starts an npm package with npx: started in tests/node, offline


SCENARIOS = {"payments": Scenario(payments, npx=False), "memory": Scenario(memory, npx=True)}


def npm_offline(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """npm settings under which npx can run only what tests/node has installed, and npm's cache."""
    cache = tmp_path / "npm-cache"
    cache.mkdir()
    closed = f"http://127.0.0.1:{free_port()}/"  # nothing listens there: a fetch fails
    settings = {
        "npm_config_registry": closed,
        "npm_config_cache": str(cache),
        "npm_config_fetch_retries": "0",  # a fetch fails at once instead of retrying past the proxy's start-up
        "npm_config_update_notifier": "false",
    }
    return settings, cache


def assert_npm_fetched_nothing(cache: Path) -> None:
    assert not (cache / "_npx").exists(), "npx installed the package instead of running tests/node's"
    fetched = [
        line for log in cache.glob("_logs/*.log") for line in log.read_text().splitlines() if "http fetch" in line
    ]
    assert not fetched, fetched


@pytest.mark.parametrize(("block", "name"), entry_ids(), ids=[f"{block.where}:{name}" for block, name in entry_ids()])
async def test_each_client_config_entry_starts_its_command_over_stdio_and_replays(
    block: Block, name: str, tmp_path: Path
) -> None:
    clone = workdir(tmp_path)
    config = substituted(block, clone)
    entry = entries_of(config)[name]
    scenario = SCENARIOS.get(name)
    assert scenario is not None, f"{block.where}: no scenario for a server named {name!r}: add one to SCENARIOS"
    if "servers" in config:
        assert entry["type"] == "stdio", "VS Code needs the type of each server"
    env: dict[str, str] = dict(entry.get("env", {}))
    path = f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    command = shutil.which(entry["command"], path=path)
    assert command is not None, f"{block.where}: {entry['command']!r} is not on {path}"
    (clone / "memory-policies.toml").write_text(policies_block())
    npm, cache = npm_offline(tmp_path)
    if scenario.npx:
        require_node_peers()
        require_npx()
        cwd = NODE_DIR  # where `npx -y` finds the pinned package installed
    else:
        cwd = tmp_path / "desktop-cwd"  # desktop clients start servers in a directory of their own
        cwd.mkdir()
    params = StdioServerParameters(
        command=command, args=list(entry.get("args", [])), env={"PATH": path, **npm, **env}, cwd=str(cwd)
    )
    async with Client(params, mode="legacy") as client:
        await scenario.check(client, env)
    assert_npm_fetched_nothing(cache)
    assert not (cwd / ".mcp-durable").exists(), "the entry's absolute paths should be used"


def test_the_docs_show_each_client_format_with_both_servers() -> None:
    shown: dict[str, list[str]] = {}
    for block in config_blocks():
        config = json.loads(block.text)
        for table in SERVER_TABLES:
            if table in config:
                shown.setdefault(table, []).append(block.where)
                assert set(config[table]) == set(SCENARIOS), f"{block.where}: {sorted(config[table])}"
    assert sorted(shown) == sorted(SERVER_TABLES), shown


def test_the_example_file_is_the_payments_entry_of_the_docs() -> None:
    desktop = next(block for block in config_blocks() if "mcpServers" in json.loads(block.text))
    example = json.loads(EXAMPLE.read_text())["mcpServers"]
    assert example == {"payments": json.loads(desktop.text)["mcpServers"]["payments"]}
