"""`mcp-durable journal …` run as the real console script (a subprocess) against real journals:
listing, showing (masked), stats, tail (and --follow), verify on a flipped byte, export/import
between backends, resolve, exit codes, and reading a file journal a running server holds."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.keys import fingerprint
from tests.helpers import REPO, key_meta, serve_command

WAIT = 30.0  # a bound on a hang, never an assertion on time


def run(*args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}
    proc = subprocess.run([*serve_command(), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def json_lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in proc.stdout.splitlines() if line.strip()]


async def populate(url: str) -> None:
    """Calls through a real client: three refunds (card sensitive), one decline, and one call in
    doubt (a PENDING record whose owner died: its lease ran out long ago)."""
    server = DurableServer("cli", journal=url)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("card",)))
    def refund(order_id: str, card: str) -> dict[str, Any]:
        return {"order_id": order_id, "card": card, "run": uuid.uuid4().hex}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    def decline(order_id: str) -> dict[str, Any]:
        raise ToolError(f"declined {order_id}")

    async with Client(server, mode="legacy") as client:
        for i in (1, 2, 3):
            await client.call_tool("refund", {"order_id": f"r/{i}", "card": "4111-0000"})
        await client.call_tool("decline", {"order_id": "d-1"})
    journal = create_journal(url)
    await journal.open()
    arguments = {"order_id": "ghost", "card": "4111-0000"}
    ghost = CallRecord(
        identity=CallIdentity("local", "refund", "ghost"),
        fingerprint=fingerprint(arguments),
        state=CallState.PENDING,
        version=1,
        run_id="r",
        attempts=1,
        created_at=2.0,
        updated_at=2.0,
        owner="dead-replica",
        lease_until=3.0,
        arguments=orjson.dumps(arguments),
    )
    await journal.claim(ghost, 2.0)
    await journal.aclose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/journal.db"
    anyio.run(populate, url)
    return url


def test_list_show_stats_and_tail_print_what_the_journal_holds_with_sensitive_values_masked(sqlite_url: str) -> None:
    listed = json_lines(run("journal", "--journal", sqlite_url, "list", "--json"))
    assert [(r["tool"], r["key"], r["state"]) for r in listed] == [
        ("decline", "d-1", "failed"),
        ("refund", "r/3", "completed"),
        ("refund", "r/2", "completed"),
        ("refund", "r/1", "completed"),
        ("refund", "ghost", "pending"),
    ]
    filtered = json_lines(
        run(
            "journal",
            "list",
            "--journal",
            sqlite_url,
            "--tool",
            "refund",
            "--state",
            "completed",
            "--limit",
            "2",
            "--json",
        )
    )
    assert [r["key"] for r in filtered] == ["r/3", "r/2"]
    assert json_lines(run("journal", "list", "--journal", sqlite_url, "--principal", "nobody", "--json")) == []

    shown = json_lines(run("journal", "show", "refund", "r/1", "--journal", sqlite_url, "--json"))
    assert len(shown) == 1 and shown[0]["arguments"] == {"order_id": "r/1", "card": "[redacted]"}
    assert shown[0]["result"]["structuredContent"]["card"] == "[redacted]"
    human = run("journal", "--journal", sqlite_url, "show", "refund", "r/1")
    assert "[redacted]" in human.stdout and "r/1" in human.stdout and "4111-0000" not in human.stdout

    (stats,) = json_lines(run("journal", "--journal", sqlite_url, "--json", "stats"))
    assert stats["backend"] == "sqlite" and stats["calls"] == 5
    assert stats["calls_by_state"] == {"completed": 3, "failed": 1, "pending": 1}
    assert stats["calls_by_tool"] == {"refund": 4, "decline": 1}

    tail = json_lines(run("journal", "--journal", sqlite_url, "tail", "-n", "3", "--json"))
    assert len(tail) == 3 and [e["seq"] for e in tail] == sorted(e["seq"] for e in tail)
    assert tail[-1]["process_id"] == "server/cli" and tail[-1]["entry_type"] == "checkpoint"
    assert tail[-1]["seq"] == stats["entries"]  # the last entry of the log (SQLite numbers from 1)


def test_show_finds_a_call_of_every_principal_through_the_index_not_by_reading_the_tool(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`journal show TOOL KEY` without `--principal` shows the call of each principal that has
    one, newest first, and reads no other record of the tool: here another refund's row no
    longer decodes (a state no release wrote), and the show does not meet it."""
    import sqlite3

    async def more() -> None:
        journal = create_journal(sqlite_url)
        await journal.open()
        try:
            for n, principal in enumerate(("bob", "alice")):
                record = CallRecord(
                    CallIdentity(principal, "refund", "r/1"), "f", CallState.PENDING, 1, "r", 1, 2e9 + n, 2e9
                )
                await journal.claim(record, 0.0)
        finally:
            await journal.aclose()

    anyio.run(more)
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        conn.execute("UPDATE calls SET state = 'mangled' WHERE key = 'r/2'")
    shown = json_lines(run("journal", "show", "refund", "r/1", "--journal", sqlite_url, "--json"))
    assert [r["principal"] for r in shown] == ["alice", "bob", "local"]
    alone = json_lines(run("journal", "show", "refund", "r/1", "--principal", "bob", "--journal", sqlite_url, "--json"))
    assert [r["principal"] for r in alone] == ["bob"]
    assert run("journal", "show", "refund", "r/9", "--journal", sqlite_url, check=1).returncode == 1


def test_tail_follow_prints_entries_appended_after_it_started(sqlite_url: str) -> None:
    (stats,) = json_lines(run("journal", "--journal", sqlite_url, "stats", "--json"))
    args = [
        *serve_command(),
        "journal",
        "--journal",
        sqlite_url,
        "tail",
        "--after",
        str(stats["entries"]),
        "--follow",
        "--json",
        "--interval",
        "0.05",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)

    async def append_and_read() -> list[dict[str, Any]]:
        journal = create_journal(sqlite_url)
        await journal.open()
        seen: list[dict[str, Any]] = []
        try:
            with anyio.fail_after(WAIT):
                for i in range(3):
                    await journal.append("worker/7", "context_update", {"step": i}, 10.0 + i)
                assert proc.stdout is not None
                while len(seen) < 3:
                    line = await anyio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
                    assert line, proc.stderr.read() if proc.stderr else ""
                    seen.append(orjson.loads(line))
        finally:
            await journal.aclose()
        return seen

    try:
        seen = anyio.run(append_and_read)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert [(e["process_id"], e["data"]) for e in seen] == [("worker/7", {"step": i}) for i in range(3)]


def _flip_calls_root_page(path: Path) -> int:
    """Flip every bit of the page-type byte of the `calls` table's root page; returns its offset."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
        root: int = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'calls'").fetchone()[0]
    finally:
        conn.close()
    offset = (root - 1) * page_size + (100 if root == 1 else 0)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    return (root - 1) * page_size


def test_verify_passes_a_sound_sqlite_journal_and_exits_1_naming_the_place_of_a_flipped_byte(
    sqlite_url: str, tmp_path: Path
) -> None:
    sound = run("journal", "--journal", sqlite_url, "verify")
    assert "ok" in sound.stderr
    page_offset = _flip_calls_root_page(tmp_path / "journal.db")
    corrupt = run("journal", "--journal", sqlite_url, "verify", "--json", check=1)
    problems = json_lines(corrupt)
    assert problems and all(p["path"].startswith(str(tmp_path / "journal.db")) for p in problems)
    assert any(p["offset"] == page_offset for p in problems), problems
    assert "corrupt" in corrupt.stderr


def test_verify_exits_1_on_a_file_journal_with_a_flipped_byte(sqlite_url: str, tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    run("journal", "--journal", sqlite_url, "export", str(export))
    directory = tmp_path / "fj"
    run("journal", "--journal", f"file://{directory}", "import", str(export))
    run("journal", "--journal", f"file://{directory}", "verify")
    (segment,) = sorted(directory.glob("seg-*.log"))
    data = bytearray(segment.read_bytes())
    at = data.index(b'"r/2"')  # inside a frame's payload: its checksum no longer matches
    data[at + 2] ^= 0x01
    segment.write_bytes(bytes(data))
    corrupt = run("journal", "--journal", f"file://{directory}", "verify", "--json", check=1)
    problems = json_lines(corrupt)
    assert problems and problems[0]["path"] == str(segment)
    assert 0 <= problems[0]["offset"] <= at


def _export_lines(url: str, path: Path) -> tuple[list[bytes], list[dict[str, Any]]]:
    run("journal", "--journal", url, "export", str(path))
    lines = path.read_bytes().splitlines()
    assert orjson.loads(lines[0])["format"] == "mcp-durable-journal"
    calls = sorted(line for line in lines[1:] if orjson.loads(line)["type"] == "call")
    entries = [orjson.loads(line) for line in lines[1:] if orjson.loads(line)["type"] == "entry"]
    for entry in entries:
        del entry["seq"]  # numbered anew by the importing journal, in the same order
    return calls, entries


def _target_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/copy.db"
    if kind == "file":
        return f"file://{tmp_path}/copy"
    from tests.conftest import scratch_postgres_url

    try:
        import mcp_durable.journal.postgres  # noqa: F401
    except ImportError:
        pytest.skip("the Postgres journal is not built yet")
    return scratch_postgres_url("cli")


@pytest.mark.parametrize("kind", ["sqlite", "file", "postgres"])
def test_export_then_import_round_trips_every_record_and_entry(sqlite_url: str, tmp_path: Path, kind: str) -> None:
    calls, entries = _export_lines(sqlite_url, tmp_path / "a.jsonl")
    assert len(calls) == 5
    target = _target_url(kind, tmp_path)
    imported = run("journal", "--journal", target, "import", str(tmp_path / "a.jsonl"))
    assert "imported 5 call record(s)" in imported.stderr
    again_calls, again_entries = _export_lines(target, tmp_path / "b.jsonl")
    assert again_calls == calls  # every field of every record, byte for byte
    assert again_entries == entries
    if kind == "sqlite":  # (once: each run of the CLI costs a second or two of start-up)
        repeat = run("journal", "--journal", target, "import", str(tmp_path / "a.jsonl"))
        assert "5 already present" in repeat.stderr  # an import never overwrites a record
        assert f"{len(entries)} entries already present" in repeat.stderr  # nor appends an entry twice
        assert _export_lines(target, tmp_path / "c.jsonl") == (calls, entries)


def test_a_round_trip_through_a_memory_journal_keeps_every_record(sqlite_url: str, tmp_path: Path) -> None:
    from mcp_durable.journal.transfer import export_journal, import_journal, read_header

    async def round_trip() -> tuple[bytes, bytes]:
        source = create_journal(sqlite_url)
        memory = create_journal("memory://")
        await source.open()
        await memory.open()
        first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
        with first.open("wb") as out:
            await export_journal(source, out)
        with first.open("rb") as lines:
            read_header(lines.readline())
            counts = await import_journal(memory, lines)
        assert counts.calls == 5 and counts.skipped == 0
        with second.open("wb") as out:
            await export_journal(memory, out)
        await source.aclose()
        return first.read_bytes(), second.read_bytes()

    first, second = anyio.run(round_trip)

    def calls(data: bytes) -> list[bytes]:
        return sorted(line for line in data.splitlines()[1:] if b'"type":"call"' in line)

    assert calls(first) == calls(second) and len(calls(first)) == 5


def test_an_interrupted_import_run_again_ends_with_each_entry_once_and_keeps_the_sources_repeats(
    tmp_path: Path,
) -> None:
    from mcp_durable.journal.transfer import export_journal, import_journal, read_header

    async def scenario() -> None:
        source = create_journal("memory://")
        await source.open()
        for step in range(6):
            await source.append("worker", "step", {"i": step}, 1000.0 + step)
        for _ in range(2):  # the same entry twice (same time, same data): both are history
            await source.append("worker", "tick", {"same": True}, 2000.0)
        export = tmp_path / "source.jsonl"
        with export.open("wb") as out:
            await export_journal(source, out)
        header, *lines = export.read_bytes().splitlines(keepends=True)
        read_header(header)

        target = create_journal("memory://")
        await target.open()
        first = await import_journal(target, lines[:4])  # cut off after four entries
        assert (first.entries, first.skipped_entries) == (4, 0)
        again = await import_journal(target, lines)
        assert (again.entries, again.skipped_entries) == (4, 4)
        once_more = await import_journal(target, lines)
        assert (once_more.entries, once_more.skipped_entries) == (0, 8)

        def history(entries: list[Any]) -> list[tuple[str, str, dict[str, Any], float]]:
            return [(e.process_id, e.entry_type, e.data, e.ts) for e in entries]

        assert history(await target.entries(after=0, limit=100)) == history(await source.entries(after=0, limit=100))

    anyio.run(scenario)


def test_resolve_settles_a_call_in_doubt_and_errors_have_exit_codes_without_tracebacks(sqlite_url: str) -> None:
    j = ("journal", "--journal", sqlite_url)
    run(*j, "resolve", "refund", "ghost", "--as", "completed", check=2)  # completed needs --result
    run(*j, "resolve", "refund", "ghost", "--as", "done", check=2)
    run(*j, "resolve", "refund", "ghost", "--as", "completed", "--result", "{not json", check=2)
    run(*j, "list", "--state", "lost", check=2)
    missing = run(*j, "show", "refund", "never", check=1)
    assert "no call refund/never" in missing.stderr

    resolved = json_lines(
        run(*j, "resolve", "refund", "ghost", "--as", "completed", "--result", '{"refunded": "by hand"}', "--json")
    )
    assert resolved[0]["state"] == "completed" and resolved[0]["arguments"]["card"] == "[redacted]"
    (shown,) = json_lines(run(*j, "show", "refund", "ghost", "--json"))
    assert shown["state"] == "completed" and shown["result"]["structuredContent"] == {"refunded": "by hand"}
    twice = run(*j, "resolve", "refund", "ghost", "--as", "not_applied", check=1)
    assert "not in doubt" in twice.stderr

    async def replayed() -> Any:
        server = DurableServer("cli", journal=sqlite_url)

        @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("card",)))
        def refund(order_id: str, card: str) -> dict[str, Any]:
            raise AssertionError("a resolved call must not run again")

        async with Client(server, mode="legacy") as client:
            return await client.call_tool("refund", {"order_id": "ghost", "card": "4111-0000"})

    result = anyio.run(replayed)
    assert result.structured_content == {"refunded": "by hand"}
    assert result.meta is not None and result.meta["mcp-durable/replayed"] is True


def test_forget_lets_a_call_in_doubt_run_anew_with_other_arguments_and_leaves_an_audit_entry(sqlite_url: str) -> None:
    j = ("journal", "--journal", sqlite_url)
    run(*j, "forget", "refund", "never", check=1)
    (forgotten,) = json_lines(run(*j, "forget", "refund", "ghost", "--note", "card declined upstream", "--json"))
    assert forgotten["state"] == "released" and forgotten["arguments"]["card"] == "[redacted]"
    assert "no call refund/ghost" in run(*j, "forget", "refund", "ghost", check=1).stderr  # forgotten already
    (entry,) = [e for e in json_lines(run(*j, "tail", "--json")) if e["process_id"] == "mcp-durable/operator-actions"]
    assert entry["data"]["action"] == "forget" and entry["data"]["by"].startswith("cli")
    assert entry["data"]["note"] == "card declined upstream" and entry["data"]["key"] == "ghost"

    async def anew() -> Any:
        server = DurableServer("cli", journal=sqlite_url)

        @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("card",)))
        def refund(order_id: str, card: str) -> dict[str, Any]:
            return {"order_id": order_id, "ran": True}

        async with Client(server, mode="legacy") as client:  # another card: not key_reuse, a new call
            return await client.call_tool("refund", {"order_id": "ghost", "card": "5500-0000"})

    result = anyio.run(anew)
    assert result.structured_content == {"order_id": "ghost", "ran": True}


async def test_reading_commands_work_while_a_server_holds_the_file_journal(tmp_path: Path) -> None:
    from tests.helpers import serve_http

    url = f"file://{tmp_path}/held"
    env = {"COUNTER_FILE": str(tmp_path / "counter")}
    async with serve_http("tests/server/servers/counting.py:make_server", journal=url, env=env) as served:
        async with Client(served.url) as client:
            await client.call_tool("record", {"text": "x"}, meta=key_meta("held-1"))
        listed = await anyio.to_thread.run_sync(lambda: json_lines(run("journal", "--journal", url, "list", "--json")))
        assert [(r["tool"], r["key"], r["state"]) for r in listed] == [("record", "held-1", "completed")]
        await anyio.to_thread.run_sync(lambda: run("journal", "--journal", url, "verify"))
        locked = await anyio.to_thread.run_sync(lambda: run("journal", "--journal", url, "compact", check=1))
        assert "locked" in locked.stderr


@pytest.mark.parametrize("existing", [False, True])
def test_export_writes_a_file_only_its_owner_can_read_under_the_usual_umask(
    sqlite_url: str, tmp_path: Path, existing: bool
) -> None:
    target = tmp_path / "export.jsonl"
    if existing:  # an older export left world-readable is narrowed, not kept 0644
        target.write_bytes(b"old")
        target.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}
    proc = subprocess.run(
        [*serve_command(), "journal", "--journal", sqlite_url, "export", str(target)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        umask=0o022,
    )
    assert proc.returncode == 0, proc.stderr
    assert oct(target.stat().st_mode & 0o777) == oct(0o600)
    assert target.read_bytes().startswith(b'{"type":"header"')
