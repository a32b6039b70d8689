"""Each example runs as its docs say: a real client against a real server process.

- `examples/client.py` over stdio (it starts the server) and over HTTP (`mcp-durable serve`);
- `examples/claude_desktop_config.json`, launched the way a desktop client launches it;
- `make run`, the README's first command;
- every MCP Inspector command line in the docs, run as written (only the port differs).

The Inspector: these tests run `npx -y @modelcontextprotocol/inspector@VERSION` exactly as the docs
show it, so npm fetches that pinned version once into its own cache (~/.npm) and reuses it. When
npm is absent, or the package cannot be fetched, the Inspector test skips on a laptop and fails
when `CI` is set.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest
from mcp import Client, StdioServerParameters

from mcp_durable.demo.ledger import PaymentProvider
from tests.docs.snippets import REPO, all_commands
from tests.helpers import free_port, key_meta, serve_http

KEY_META = "mcp-durable/idempotency-key"
PLACEHOLDER_URL = "http://127.0.0.1:8000/mcp"
INSPECTOR = re.compile(r"^npx -y (?P<package>@modelcontextprotocol/inspector@[\w.]+) --cli ")
LEDGER_COMMAND = ".venv/bin/python -c "
INSPECTOR_ORDER = "O-9"  # the order the docs' Inspector lines refund (not O-1, which the client examples use)
TIMEOUT = 120


def workdir(tmp_path: Path) -> Path:
    """A directory laid out like a clone (tools/, examples/, .venv), with no journal in it yet."""
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("tools", "examples", "mcp_durable"):
        (work / name).symlink_to(REPO / name)
    (work / ".venv").symlink_to(Path(sys.prefix))
    return work


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without journal or ledger settings, so the documented defaults apply."""
    env = {k: v for k, v in os.environ.items() if k not in ("MCP_DURABLE_JOURNAL", "PAYMENTS_LEDGER")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


async def wait_listening(port: int, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


def refunds(ledger: Path, order: str = "O-1") -> list[dict[str, Any]]:
    return PaymentProvider(ledger).effects(op="refund", subject=order)


def client_lines(output: str) -> dict[str, Any]:
    """The first and second results `examples/client.py` printed."""
    found: dict[str, Any] = {}
    for line in output.splitlines():
        for label in ("first call:", "second call:"):
            if line.startswith(label):
                found[label] = json.loads(line[len(label) :])
    return found


def check_client_output(proc: subprocess.CompletedProcess[str], key: str) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = client_lines(proc.stdout)
    first, second = shown["first call:"], shown["second call:"]
    assert first["_meta"]["mcp-durable/key"] == key and "mcp-durable/replayed" not in first["_meta"]
    assert second["_meta"]["mcp-durable/replayed"] is True
    assert second["structuredContent"] == first["structuredContent"]
    assert "second call replayed from the journal: yes; same refund: yes" in proc.stdout


def test_the_python_client_over_stdio_refunds_once_and_shows_the_replay(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    command = [sys.executable, "examples/client.py", "stdio", "--key", "refund-O-1"]
    proc = subprocess.run(command, cwd=work, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
    check_client_output(proc, "refund-O-1")
    # The documented defaults: journal and ledger under ./.mcp-durable/.
    ledger = work / ".mcp-durable" / "payments-ledger.db"
    assert len(refunds(ledger)) == 1
    # A second run with the same key: both calls are replays now; still one refund.
    again = subprocess.run(command, cwd=work, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert client_lines(again.stdout)["first call:"]["_meta"]["mcp-durable/replayed"] is True
    assert len(refunds(ledger)) == 1


async def test_the_python_client_over_http_refunds_once_and_shows_the_replay(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    async with serve_http(
        "tools/payments.py", journal=f"sqlite:///{tmp_path}/journal.db", env={"PAYMENTS_LEDGER": str(ledger)}
    ) as served:
        command = [sys.executable, "examples/client.py", "http", served.url, "--key", "k-http", "--order", "O-7"]
        proc = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
        check_client_output(proc, "k-http")
    assert len(refunds(ledger, "O-7")) == 1


async def test_the_desktop_client_config_starts_a_server_that_replays(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    text = (REPO / "examples" / "claude_desktop_config.json").read_text()
    config = json.loads(text.replace("/ABSOLUTE/PATH/TO/mcp-durable", str(work)))
    entry = config["mcpServers"]["payments"]
    elsewhere = tmp_path / "desktop-cwd"  # desktop clients start servers in a directory of their own
    elsewhere.mkdir()
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"], cwd=str(elsewhere))
    async with Client(params, mode="legacy") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["refund"].annotations is not None and tools["refund"].annotations.idempotent_hint is True
        arguments = {"order_id": "O-1", "amount_cents": 500}
        first = await client.call_tool("refund", arguments, meta=key_meta("desk-1"))
        second = await client.call_tool("refund", arguments, meta=key_meta("desk-1"))
    assert not first.is_error and (second.meta or {}).get("mcp-durable/replayed") is True
    assert second.structured_content == first.structured_content
    assert len(refunds(Path(entry["env"]["PAYMENTS_LEDGER"]))) == 1
    assert not (elsewhere / ".mcp-durable").exists(), "the config's absolute paths should be used"


async def test_make_run_serves_the_payments_tools_and_prints_how_to_connect(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    port = free_port()
    ledger = tmp_path / "ledger.db"
    env = clean_env(MCP_DURABLE_JOURNAL=f"sqlite:///{tmp_path}/journal.db", PAYMENTS_LEDGER=str(ledger))
    # The venv of this test run stands in for the one `make` builds; -o: do not rebuild it.
    stamp = f"{sys.prefix}/.installed-stamp"
    command = ["make", "-C", str(REPO), "-o", stamp, "run", f"VENV={sys.prefix}", f"PORT={port}"]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stderr is not None
        printed: list[str] = []
        with anyio.fail_after(60):  # a server that never prints its banner fails, never hangs the run
            while not printed or "connect:" not in printed[-1]:
                line = await anyio.to_thread.run_sync(proc.stderr.readline, abandon_on_cancel=True)
                if not line:
                    break  # make exited
                printed.append(line)
        url = f"http://127.0.0.1:{port}/mcp"
        assert any(f"streamable HTTP at {url}" in line for line in printed), "".join(printed)
        # serve freezes the start-up heap (docs/cli.md) and says how many objects it froze
        assert any(re.search(r"heap: +[\d,]{5,} start-up objects frozen", line) for line in printed), printed
        await wait_listening(port)  # the message is printed just before uvicorn binds
        async with Client(url, mode="legacy") as client:
            first = await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 500}, meta=key_meta("mr"))
            second = await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 500}, meta=key_meta("mr"))
        assert not first.is_error and (second.meta or {}).get("mcp-durable/replayed") is True
        assert len(refunds(ledger)) == 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the server it started (its own session)
        proc.wait(timeout=20)


# -- the MCP Inspector CLI -------------------------------------------------------------------------


def inspector_commands() -> list[str]:
    """Every distinct Inspector command line in the docs, in doc order."""
    seen: list[str] = []
    for command in all_commands():
        if INSPECTOR.match(command.text) and command.text not in seen:
            seen.append(command.text)
    return seen


def inspector_or_skip(package: str) -> None:
    """Make sure `npx` can run the pinned Inspector (fetching it once); skip, or fail under CI."""
    why = ""
    if shutil.which("npx") is None:
        why = "npx (npm) is not installed"
    else:
        proc = subprocess.run(["npx", "-y", package, "--version"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            why = f"npx could not run {package}: {proc.stderr[-500:]}"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the Inspector CLI is required in CI: {why}")
        pytest.skip(why)


def option(argv: list[str], name: str) -> list[str]:
    """The values after `name` up to the next option."""
    if name not in argv:
        return []
    values = []
    for item in argv[argv.index(name) + 1 :]:
        if item.startswith("--"):
            break
        values.append(item)
    return values


def check_tool_call(argv: list[str], runs: list[dict[str, Any]], seen: dict[tuple[str, str], list[str]]) -> str:
    """Check the runs of one `tools/call` command against what the docs promise; return the tool."""
    tool = option(argv, "--tool-name")[0]
    args = option(argv, "--tool-arg")
    meta = dict(pair.split("=", 1) for pair in option(argv, "--tool-metadata"))
    key = meta.get(KEY_META)
    if key is None:
        # Only `charge` (key="required") is shown without a key: refused before it runs.
        assert tool == "charge"
        assert runs[0]["_meta"]["mcp-durable/error"]["error"] == "missing_key"
        return tool
    first, second = runs
    before = seen.get((tool, key))
    if before is None:
        assert not first.get("isError") and "mcp-durable/replayed" not in first["_meta"]
        assert first["_meta"]["mcp-durable/key"] == key
        assert second["_meta"]["mcp-durable/replayed"] is True
        assert second["content"] == first["content"]
        assert second["structuredContent"] == first["structuredContent"]
        seen[(tool, key)] = args
    elif before == args:
        assert first["_meta"]["mcp-durable/replayed"] is True and second["_meta"]["mcp-durable/replayed"] is True
    else:
        refusals = (first["_meta"]["mcp-durable/error"], second["_meta"]["mcp-durable/error"])
        assert refusals[0]["error"] == refusals[1]["error"] == "key_reuse"
    return tool


async def test_every_inspector_command_in_the_docs_runs_against_a_real_server(tmp_path: Path) -> None:
    commands = inspector_commands()
    assert commands, "the docs show no Inspector command"
    packages = {m["package"] for m in (INSPECTOR.match(c) for c in commands) if m}
    assert len(packages) == 1, f"the docs pin several Inspector versions: {packages}"
    inspector_or_skip(packages.pop())
    work = workdir(tmp_path)
    ledger = work / ".mcp-durable" / "payments-ledger.db"  # where `make run` keeps it
    env = clean_env(
        MCP_CATALOG_PATH=str(tmp_path / "catalog.json"), MCP_CLIENT_CONFIG_PATH=str(tmp_path / "client.json")
    )
    seen: dict[tuple[str, str], list[str]] = {}
    async with serve_http(
        "tools/payments.py", journal=f"sqlite:///{tmp_path}/journal.db", env={"PAYMENTS_LEDGER": str(ledger)}
    ) as served:
        for command in commands:
            assert PLACEHOLDER_URL in command, command
            argv = shlex.split(command.replace(PLACEHOLDER_URL, served.url))
            runs = []
            # A keyed call runs twice (first run, then the repeat); anything else once.
            for _ in range(2 if "--tool-metadata" in argv else 1):
                proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT)
                assert proc.returncode in (0, 5), f"{command}\n{proc.stdout}\n{proc.stderr}\n{served.stderr()}"
                output = orjson.loads(proc.stdout)
                # The Inspector exits 5 exactly when the tool result has isError: true.
                assert (proc.returncode == 5) == bool(output.get("isError")), proc.stderr
                runs.append(output)
            method = option(argv, "--method")[0]
            if method == "tools/call":
                check_tool_call(argv, runs, seen)
            elif method == "tools/list":
                tools = {tool["name"]: tool for tool in runs[0]["tools"]}
                assert tools["refund"]["annotations"]["idempotentHint"] is True
            elif method == "resources/read":
                record = orjson.loads(runs[0]["contents"][0]["text"])
                assert record["state"] == "completed", record
            else:
                pytest.fail(f"no check for Inspector method {method}: add one ({command})")
    assert seen, "no Inspector command calls a tool with a key"
    # The ledger command the docs show, run as written: one refund.
    (ledger_command,) = {c.text for c in all_commands() if c.text.startswith(LEDGER_COMMAND)}
    proc = subprocess.run(
        shlex.split(ledger_command), cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    effects = ast.literal_eval(proc.stdout.strip())
    assert [e["subject"] for e in effects] == [INSPECTOR_ORDER] and effects[0]["amount_cents"] == 500
    assert len(refunds(ledger, INSPECTOR_ORDER)) == 1


def test_the_replicas_script_demo_refunds_once_through_three_replicas(tmp_path: Path) -> None:
    from tests.conftest import PG_URL, scratch_postgres_schema

    schema = scratch_postgres_schema("t_replicas")
    ledger = tmp_path / "ledger.db"
    for _attempt in range(5):
        ports: set[int] = set()
        while len(ports) < 3:  # three distinct ports, each drawn as any server test's
            ports.add(free_port())
        env = {
            **os.environ,
            "SCHEMA": schema,
            "PORTS": " ".join(map(str, sorted(ports))),
            "PAYMENTS_LEDGER": str(ledger),
            "TMPDIR": str(tmp_path),
        }
        done = subprocess.run(
            ["bash", str(REPO / "examples/replicas.sh"), "--demo", PG_URL],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # Only a port some other process bound between its draw and the replica's start is
        # tried again (as `serve_cli_http` does); any other failure is the test's.
        if done.returncode == 0 or "address already in use" not in done.stderr.lower():
            break
    assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout
    lines = [line for line in output.splitlines() if line.startswith("port ")]
    assert len(lines) == 3, output
    refunds = {line.split()[3] for line in lines}
    assert len(refunds) == 1, output  # one refund, the same id from every replica
    assert [line.rsplit("replayed=", 1)[1] for line in lines] == ["False", "True", "True"], output
    assert len(PaymentProvider(ledger).effects()) == 1
