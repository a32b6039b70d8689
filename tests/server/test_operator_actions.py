"""Operator actions beside resolve: re-run a completed call (from a durable step, like a fork), end to end
over MCP (admin tool, two principals over HTTP) and the CLI, each with an audit entry (who, why)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client

from mcp_durable import CallIdentity, create_journal
from mcp_durable.engine.operators import audit_entries
from tests.helpers import client_as, serve_command, serve_http
from tests.server.servers.counting import Counter
from tests.server.servers.five_steps import STEPS, make_server

MODES = ["legacy", "auto"]
TARGET = "tests/server/servers/five_steps.py:make_server"


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


def runs_per_step(log: Counter, job: str) -> list[int]:
    return [log.count(f"{name} {job}") for name in STEPS]


@pytest.mark.parametrize("mode", MODES)
async def test_a_rerun_from_step_3_of_a_five_step_tool_replays_steps_before_it_and_runs_3_and_after_again(
    mode: str, tmp_path: Path
) -> None:
    log = Counter(tmp_path / "steps.log")
    server = make_server(f"sqlite:///{tmp_path}/journal.db", str(log.path), admins=("local",))
    async with Client(server, mode=mode) as client:
        first = structured(await client.call_tool("five_steps", {"job": "J-1"}))
        refused = await client.call_tool("journal_rerun", {"tool": "five_steps", "key": "J-1", "from_step": 6})
        rerun = structured(
            await client.call_tool(
                "journal_rerun",
                {"tool": "five_steps", "key": "J-1", "from_step": 3, "note": "the carrier lost the parcel"},
            )
        )
        second = structured(await client.call_tool("five_steps", {"job": "J-1"}))
        repeat = await client.call_tool("five_steps", {"job": "J-1"})
        (audit,) = await audit_entries(server.journal, CallIdentity("local", "five_steps", "J-1"))
    assert refused.is_error and "from_step must be 0 … 5" in str(refused.content)
    assert rerun["state"] == "released"
    assert runs_per_step(log, "J-1") == [1, 1, 1, 2, 2]  # steps 0-2 replayed; 3 and 4 ran again
    assert second["steps"][:3] == first["steps"][:3] and second["steps"][3] != first["steps"][3]
    assert second["steps"][4] != first["steps"][4]
    assert (second["attempt"], second["replayed"], second["ran"]) == (2, 3, 2)
    assert repeat.meta is not None and repeat.meta["mcp-durable/replayed"] is True
    assert structured(repeat) == second
    assert audit.data["action"] == "rerun from step 3" and audit.data["by"] == "local"
    assert audit.data["note"] == "the carrier lost the parcel"
    assert (audit.data["from"], audit.data["to"]) == ("completed", "released")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_only_an_admin_reruns_and_only_the_named_principals_record(mode: str, tmp_path: Path) -> None:
    env = {
        "STEPS_LOG": str(tmp_path / "steps.log"),
        "MCP_DURABLE_TOKENS": "tokA=alice,tokB=bob,tokO=ops",
        "MCP_DURABLE_ADMINS": "ops",
    }
    log = Counter(tmp_path / "steps.log")
    async with serve_http(TARGET, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        async with client_as(served.url, "tokA", mode) as alice:
            alice_first = structured(await alice.call_tool("five_steps", {"job": "J-2"}))
        async with client_as(served.url, "tokB", mode) as bob:
            bob_first = structured(await bob.call_tool("five_steps", {"job": "J-2"}))
            denied = await bob.call_tool("journal_rerun", {"tool": "five_steps", "key": "J-2", "principal": "alice"})
        async with client_as(served.url, "tokO", mode) as ops:
            done = structured(
                await ops.call_tool(
                    "journal_rerun", {"tool": "five_steps", "key": "J-2", "principal": "alice", "from_step": 0}
                )
            )
        async with client_as(served.url, "tokB", mode) as bob:
            bob_again = await bob.call_tool("five_steps", {"job": "J-2"})
        async with client_as(served.url, "tokA", mode) as alice:
            alice_again = structured(await alice.call_tool("five_steps", {"job": "J-2"}))
    assert denied.is_error and "forbidden" in str(denied.content)
    assert done["principal"] == "alice" and done["state"] == "released"
    assert structured(bob_again) == bob_first and (bob_again.meta or {}).get("mcp-durable/replayed") is True
    assert alice_again["steps"] != alice_first["steps"] and alice_again["attempt"] == 2
    assert runs_per_step(log, "J-2") == [3] * 5  # alice twice (every step re-ran), bob once


def cli(journal: str, *args: str, check: int = 0) -> subprocess.CompletedProcess[str]:
    command, *prefix = serve_command()
    proc = subprocess.run(
        [command, *prefix, "journal", "--journal", journal, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == check, proc.stderr
    return proc


async def test_the_cli_reruns_a_call_from_a_step_and_the_next_call_runs_only_the_steps_from_there(
    tmp_path: Path,
) -> None:
    journal, log = f"sqlite:///{tmp_path}/journal.db", Counter(tmp_path / "steps.log")
    async with Client(make_server(journal, str(log.path))) as client:
        first = structured(await client.call_tool("five_steps", {"job": "J-3"}))
    assert "journaled 5 step(s)" in cli(journal, "rerun", "five_steps", "J-3", "--from-step", "9", check=1).stderr
    assert "no call five_steps/nope" in cli(journal, "rerun", "five_steps", "nope", check=1).stderr
    (view,) = [
        orjson.loads(line)
        for line in cli(
            journal, "--json", "rerun", "five_steps", "J-3", "--from-step", "3", "--note", "retry the shipment"
        ).stdout.splitlines()
    ]
    assert view["state"] == "released"
    assert "only a completed or failed call" in cli(journal, "rerun", "five_steps", "J-3", check=1).stderr
    async with Client(make_server(journal, str(log.path)), mode="legacy") as client:
        second = structured(await client.call_tool("five_steps", {"job": "J-3"}))
    assert runs_per_step(log, "J-3") == [1, 1, 1, 2, 2]
    assert second["steps"][:3] == first["steps"][:3] and (second["replayed"], second["ran"]) == (3, 2)
    store = create_journal(journal)
    await store.open()
    try:
        (audit,) = await audit_entries(store, CallIdentity("local", "five_steps", "J-3"))
    finally:
        await store.aclose()
    assert audit.data["action"] == "rerun from step 3" and audit.data["note"] == "retry the shipment"
    assert audit.data["by"]  # the OS user who ran the CLI


def refusal_code(result: Any) -> str | None:
    error = (result.meta or {}).get("mcp-durable/error") if result.is_error else None
    return None if error is None else str(error["error"])


async def wait_for(log: Counter, event: str) -> None:
    with anyio.fail_after(60):  # a bound on a hang, never a timing assertion
        while not log.count(event):
            await anyio.sleep(0.02)


@pytest.mark.parametrize("mode", MODES)
async def test_cancelling_a_running_call_stops_its_tool_and_the_call_is_never_resumed(
    mode: str, tmp_path: Path
) -> None:
    log = Counter(tmp_path / "steps.log")
    server = make_server(f"sqlite:///{tmp_path}/journal.db", str(log.path), admins=("local",))
    results: list[Any] = []
    async with Client(server, mode=mode) as client:
        async with anyio.create_task_group() as group:

            async def held() -> None:
                with anyio.fail_after(60):  # a bound on a hang, never a timing assertion
                    results.append(await client.call_tool("five_steps", {"job": "J-4", "hold": True}))

            group.start_soon(held)
            await wait_for(log, "charge J-4")
            done = structured(
                await client.call_tool(
                    "journal_cancel", {"tool": "five_steps", "key": "J-4", "note": "customer withdrew"}
                )
            )
        log.open_gate()
        again = await client.call_tool("five_steps", {"job": "J-4", "hold": True})
        refused = await client.call_tool("journal_cancel", {"tool": "five_steps", "key": "J-4"})
        (audit,) = await audit_entries(server.journal, CallIdentity("local", "five_steps", "J-4"))
    assert done["state"] == "released" and "cancelled by an operator" in done["error"]
    [stopped] = results
    assert refusal_code(stopped) == "cancelled"
    assert refusal_code(again) == "cancelled"  # never resumed: the repeat is refused, nothing runs
    assert runs_per_step(log, "J-4") == [1, 1, 0, 0, 0]
    assert refused.is_error and "only a running or in-doubt call" in str(refused.content)
    assert (audit.data["action"], audit.data["by"], audit.data["note"]) == ("cancel", "local", "customer withdrew")
    assert (audit.data["from"], audit.data["to"]) == ("pending", "released")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_a_non_admin_cannot_cancel_another_principals_call(mode: str, tmp_path: Path) -> None:
    env = {
        "STEPS_LOG": str(tmp_path / "steps.log"),
        "MCP_DURABLE_TOKENS": "tokA=alice,tokB=bob,tokO=ops",
        "MCP_DURABLE_ADMINS": "ops",
    }
    log = Counter(tmp_path / "steps.log")
    results: list[Any] = []
    async with serve_http(TARGET, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        async with anyio.create_task_group() as group:

            async def alice_call() -> None:
                with anyio.fail_after(60):  # a bound on a hang, never a timing assertion
                    async with client_as(served.url, "tokA", mode) as alice:
                        results.append(await alice.call_tool("five_steps", {"job": "J-5", "hold": True}))

            group.start_soon(alice_call)
            await wait_for(log, "charge J-5")
            async with client_as(served.url, "tokB", mode) as bob:
                denied = await bob.call_tool(
                    "journal_cancel", {"tool": "five_steps", "key": "J-5", "principal": "alice"}
                )
                own = await bob.call_tool("journal_cancel", {"tool": "five_steps", "key": "J-5"})
            async with client_as(served.url, "tokO", mode) as ops:
                done = structured(
                    await ops.call_tool("journal_cancel", {"tool": "five_steps", "key": "J-5", "principal": "alice"})
                )
    assert refusal_code(denied) == "forbidden" and refusal_code(own) == "forbidden"
    assert done["principal"] == "alice" and done["state"] == "released"
    assert [refusal_code(r) for r in results] == ["cancelled"]
    assert runs_per_step(log, "J-5") == [1, 1, 0, 0, 0]
