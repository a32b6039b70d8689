"""The worked examples of docs/proxy.md (and README.md's proxy commands) run as written.

Every `mcp-durable proxy` command of their ```sh blocks is run through bash, in a fresh
directory, as a reader would paste it, and then used as the doc says: the stdio ones by an MCP
client that starts them (as a desktop client does), the HTTP ones by a client over streamable HTTP.
Each command has a scenario (`SCENARIOS`, by a pattern of its text); a command without one fails, so
a new example in the doc needs a scenario here. The doc's policies file (its ```toml block) runs
through the proxy too, and the fault it shows is the proxy's own message, word for word.

What the test changes, and nothing else of a command:
- `npx -y PACKAGE` runs offline: the directory has tests/node's package.json and node_modules (so
  npx finds the pinned package installed), npm's registry is a closed port and its cache empty, and
  the test fails if npm fetched or installed anything;
- an HTTP command listens on a free port (`--port 8000` replaced, or `--port` added): the doc's
  port may be taken on a shared machine;
- the doc's placeholders for a remote upstream, `https://mcp.example.com/mcp` and the token `…`,
  become a local upstream that refuses requests without that token;
- the environment sets `MEMORY_FILE_PATH` into the directory, so server-memory does not write
  into tests/node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from mcp_durable.policy import ToolPolicy
from mcp_durable.policy_file import load_policies
from tests.docs.snippets import REPO, Command, blocks, commands
from tests.docs.test_client_configs import assert_npm_fetched_nothing, npm_offline, policies_block, require_npx
from tests.helpers import STARTUP_TIMEOUT, first_text, free_port, key_meta, meta_of, serve_cli_http, wire
from tests.node_peers import NODE_DIR, require_node_peers
from tests.proxy.upstreams import PLAIN_UPSTREAM, upstream_env

PROXY_DOC = REPO / "docs" / "proxy.md"
DOCS = (REPO / "README.md", PROXY_DOC)
REMOTE_URL = "https://mcp.example.com/mcp"
TOKEN_PLACEHOLDER = "…"
UPSTREAM_TOKEN = "up-secret"
ADA = {"entities": [{"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}]}
KEY = "mcp-durable/key"
REPLAYED = "mcp-durable/replayed"


def proxy_commands() -> list[Command]:
    """The `mcp-durable proxy` commands of the docs that show them (README.md's two, then
    docs/proxy.md's), in doc order."""
    shown = [command for path in DOCS for block in blocks(path) for command in commands(block)]
    return [command for command in shown if "mcp-durable proxy" in command.text]


def shown_block(lang: str, contains: str) -> str:
    """The one ```lang block of the doc that contains `contains`."""
    found = [block.text for block in blocks(PROXY_DOC) if block.lang == lang and contains in block.text]
    assert len(found) == 1, f"docs/proxy.md should show one {lang} block with {contains!r}, shows {len(found)}"
    return found[0]


@dataclass
class Place:
    """Where the examples run: the directory, the environment, and a local upstream if needed."""

    root: Path
    env: dict[str, str]
    npm_cache: Path
    upstream_url: str | None = None


def make_place(tmp_path: Path) -> Place:
    root = tmp_path / "work"
    root.mkdir()
    # npx finds a package of the directory's own project installed: tests/node's, pinned.
    shutil.copy(NODE_DIR / "package.json", root / "package.json")
    shutil.copy(NODE_DIR / "package-lock.json", root / "package-lock.json")
    (root / "node_modules").symlink_to(NODE_DIR / "node_modules", target_is_directory=True)
    npm, cache = npm_offline(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MEMORY_FILE_PATH"] = str(root / "memory.jsonl")
    env.update(npm)
    return Place(root, env, cache)


def as_run(command: Command, place: Place, port: int | None = None) -> str:
    """The command's text with the test's substitutions (the module docstring), nothing else."""
    text = command.text
    if REMOTE_URL in text:
        assert place.upstream_url is not None
        text = text.replace(REMOTE_URL, place.upstream_url).replace(TOKEN_PLACEHOLDER, UPSTREAM_TOKEN)
    if port is not None:
        text, replaced = re.subn(r"--port \d+", f"--port {port}", text)
        if not replaced:
            text += f" --port {port}"
    assert TOKEN_PLACEHOLDER not in text, f"{command.block.where}: a placeholder the test does not know"
    return text


def run_once(command: Command, place: Place) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", as_run(command, place)],
        cwd=place.root,
        env=place.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@asynccontextmanager
async def over_stdio(command: Command, place: Place) -> AsyncIterator[Client]:
    """A client that starts the command over stdio, as a desktop client does."""
    params = StdioServerParameters(
        command="bash", args=["-c", as_run(command, place)], env=place.env, cwd=str(place.root)
    )
    async with Client(params, mode="legacy") as client:
        yield client


@asynccontextmanager
async def over_http(command: Command, place: Place) -> AsyncIterator[tuple[Client, Path]]:
    """The command serving HTTP on a free port (its own process group, stopped after), a client of
    it, and the file its stderr goes to."""
    port = free_port()
    log = place.root / f"proxy-{port}.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            ["bash", "-c", as_run(command, place, port)],
            cwd=place.root,
            env=place.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        with anyio.fail_after(STARTUP_TIMEOUT):
            while True:
                assert proc.poll() is None, f"{command.text!r} exited with {proc.returncode}:\n{log.read_text()}"
                try:
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                except OSError:
                    await anyio.sleep(0.05)
                    continue
                await stream.aclose()
                break
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            yield client, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group this test started: bash, the proxy, its upstream
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


async def names_in_graph(client: Client) -> list[str]:
    graph = json.loads(first_text(await client.call_tool("read_graph", {})))
    return sorted(entity["name"] for entity in graph["entities"])


async def what_a_client_sees(client: Client) -> None:
    """The doc's "What a client sees" lines, with server-memory upstream."""
    shown = shown_block("text", "create_entities {Ada}")
    assert 'mcp-durable/idempotency-key = "ada-1"' in shown and "replayed = true" in shown
    first = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
    assert not first.is_error, first
    assert meta_of(first)[KEY] == "ada-1" and REPLAYED not in meta_of(first)  # runs upstream
    deleted = await client.call_tool("delete_entities", {"entityNames": ["Ada"]})
    assert not deleted.is_error and await names_in_graph(client) == []  # the graph is empty again
    again = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
    assert meta_of(again)[REPLAYED] is True and wire(again)["content"] == wire(first)["content"]
    assert await names_in_graph(client) == []  # create_entities ran once


# -- the scenarios, one per command -------------------------------------------------------------


async def memory_on_sqlite(command: Command, place: Place) -> None:
    """The knowledge-graph server over stdio, on the SQLite journal the command names, with the
    policies file the doc tells the reader to save (docs/clients.md's)."""
    (place.root / "memory-policies.toml").write_text(policies_block())
    async with over_stdio(command, place) as client:
        await what_a_client_sees(client)
    assert (place.root / ".mcp-durable" / "memory-proxy.db").is_file()  # the command's own journal


async def memory_by_its_annotations(command: Command, place: Place) -> None:
    """The knowledge-graph server without a policies file (README.md): the tools it marks idempotent
    (the deletes) durable with the caller's key, the others passed through."""
    async with over_stdio(command, place) as client:
        await the_deletes_are_durable(client, "plain")
    assert (place.root / ".mcp-durable" / "memory-proxy.db").is_file()


async def the_deletes_are_durable(client: Client, key: str) -> None:
    created = await client.call_tool("create_entities", ADA, meta=key_meta(f"{key}-create"))
    first = await client.call_tool("delete_entities", {"entityNames": ["Ada"]}, meta=key_meta(f"{key}-delete"))
    again = await client.call_tool("delete_entities", {"entityNames": ["Ada"]}, meta=key_meta(f"{key}-delete"))
    assert created.meta is None or KEY not in created.meta  # passed through, unjournaled
    assert meta_of(first)[KEY] == f"{key}-delete" and REPLAYED not in meta_of(first)
    assert meta_of(again)[REPLAYED] is True


async def everything_over_http(command: Command, place: Place) -> None:
    """server-everything served over streamable HTTP: its tools, a call and a resource through the proxy."""
    async with over_http(command, place) as (client, _):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"echo", "get-sum"} <= tools, sorted(tools)
        echoed = await client.call_tool("echo", {"message": "hello"})
        assert not echoed.is_error and "hello" in first_text(echoed)
        assert (await client.list_resources()).resources


async def remote_upstream_with_a_token(command: Command, place: Place) -> None:
    """An HTTP upstream behind a bearer token: reached with the token from the environment."""
    async with over_http(command, place) as (client, log):
        first = await client.call_tool("record", {"text": "x"}, meta=key_meta("r-1"))
        second = await client.call_tool("record", {"text": "x"}, meta=key_meta("r-1"))
    assert not first.is_error, first
    # The upstream (itself durable, in process) authenticated the token as its principal `proxy`.
    assert first.structured_content is not None and first.structured_content["key"] == "proxy:r-1"
    assert meta_of(second)[REPLAYED] is True
    assert UPSTREAM_TOKEN not in log.read_text()


async def print_config(command: Command, place: Place) -> None:
    """`--print-config > policies.toml`: the policies for the upstream it sees, ready for `--policies`."""
    run = run_once(command, place)
    assert run.returncode == 0, run.stderr
    written = place.root / "policies.toml"
    policies = load_policies(written)
    # Every tool of the upstream, by its annotations: the creates passed through, the deletes durable.
    assert policies.tools["create_entities"] == "pass-through", written.read_text()
    assert isinstance(policies.tools["delete_entities"], ToolPolicy), written.read_text()
    assert "Traceback" not in run.stderr


async def memory_with_printed_policies(command: Command, place: Place) -> None:
    """`--policies policies.toml`, the file the previous command printed, passed back unedited: the
    tools the upstream marks idempotent (the deletes) durable, the others passed through."""
    assert (place.root / "policies.toml").is_file(), "the --print-config example runs first"
    async with over_stdio(command, place) as client:
        await the_deletes_are_durable(client, "printed")


Scenario = Callable[[Command, Place], Awaitable[None]]
#: A pattern of a command's text (re.search) → its scenario. Each command matches exactly one.
SCENARIOS: dict[str, Scenario] = {
    r'"npx -y @modelcontextprotocol/server-memory" --policies memory-policies\.toml --journal sqlite:': (
        memory_on_sqlite
    ),
    r'"npx -y @modelcontextprotocol/server-memory" --journal sqlite:': memory_by_its_annotations,
    r'"npx -y @modelcontextprotocol/server-everything" --transport http': everything_over_http,
    r"^MCP_DURABLE_UPSTREAM_TOKEN=\S+ mcp-durable proxy --upstream-url https://mcp\.example\.com/mcp": (
        remote_upstream_with_a_token
    ),
    r"--print-config > policies\.toml$": print_config,
    r"--policies policies\.toml$": memory_with_printed_policies,
}


def scenario_of(command: Command) -> Scenario:
    text = " ".join(command.text.split())  # a continued line keeps its indentation
    found = [scenario for pattern, scenario in SCENARIOS.items() if re.search(pattern, text)]
    assert len(found) == 1, f"{command.block.where}: {len(found)} scenarios for {command.text!r}: add one to SCENARIOS"
    return found[0]


@asynccontextmanager
async def token_upstream(place: Place) -> AsyncIterator[None]:
    """The plain Python upstream over HTTP, refusing any request without `UPSTREAM_TOKEN`."""
    env = {**upstream_env(place.root), "MCP_DURABLE_TOKENS": f"{UPSTREAM_TOKEN}=proxy"}
    policies = place.root / "upstream-policies.toml"
    policies.write_text("[tools.plain]\ndurable = false\n")
    args = ["serve", PLAIN_UPSTREAM, "--policies", str(policies), "--journal", f"sqlite:///{place.root}/up.db"]
    async with serve_cli_http(args, env=env) as upstream:
        place.upstream_url = upstream.url
        yield


async def test_every_proxy_command_of_the_doc_runs_as_written(tmp_path: Path) -> None:
    require_node_peers()
    require_npx()
    place = make_place(tmp_path)
    shown = proxy_commands()
    assert len(shown) >= len(SCENARIOS), [command.text for command in shown]
    used = {scenario_of(command) for command in shown}
    assert used == set(SCENARIOS.values()), "a scenario no command of the doc uses: remove it"
    async with token_upstream(place):
        for command in shown:
            await scenario_of(command)(command, place)
    assert_npm_fetched_nothing(place.npm_cache)


async def test_the_policies_file_of_the_doc_runs_and_its_fault_is_the_proxys_message(tmp_path: Path) -> None:
    require_node_peers()
    require_npx()
    place = make_place(tmp_path)
    (place.root / "policies.toml").write_text(shown_block("toml", "[tools.refund]"))
    served = next(c for c in proxy_commands() if re.search(r"--policies policies\.toml$", c.text))
    async with over_stdio(served, place) as client:
        refused = await client.call_tool("create_entities", ADA)  # key = "required"
        keyed = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
        again = await client.call_tool("create_entities", ADA, meta=key_meta("ada-1"))
    assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "missing_key"
    assert not keyed.is_error and meta_of(again)[REPLAYED] is True
    # The fault shown: a file whose line 5 gives tools.refund.wait a string.
    fault = shown_block("text", "Input should be")
    (place.root / "policies.toml").write_text('[defaults]\nretention = 86400\n\n[tools.refund]\nwait = "30s"\n')
    run = run_once(served, place)
    assert run.returncode != 0 and run.stderr.strip() == fault.strip()
    assert_npm_fetched_nothing(place.npm_cache)
