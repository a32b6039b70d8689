"""Faults under the journal: a full disk, a read-only directory, a SQLite database locked by another process.

The promise under every fault: the tool does not run, the caller gets `journal_unavailable`, a
result acknowledged before the fault is still replayed, and once the fault is gone everything
works with nothing lost, also across a restart.

The full disk is a real one: a 16 MiB tmpfs mounted for the test and filled to the last byte
(this needs root, which the test machines give; the tests skip with the reason otherwise). A
read-only directory is a read-only bind mount (chmod does not stop root).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable.journal import CallIdentity, CallState, create_journal
from mcp_durable.journal.sqlite import SQLiteJournal
from tests.hardening.conftest import Runs, build_server, snapshot, text_of
from tests.helpers import key_meta, meta_of

# Each call journals a ~100 KB claim and a ~200 KB result record: more than the space the file
# journal allocates ahead of its data (64 KiB, journal/file/writer.py), so a full disk cannot take
# even the claim.
BIG = "B" * 100_000


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


class TinyDisk:
    """A small tmpfs that a test can fill to the last byte and free again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as handle:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                try:
                    while True:
                        handle.write(b"\0" * chunk)
                except OSError:
                    continue
        assert os.statvfs(self.root).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def leave(self, free_bytes: int) -> None:
        """Fill the disk, then give back about `free_bytes`."""
        self.fill()
        size = self.filler.stat().st_size
        os.truncate(self.filler, max(0, size - free_bytes))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[TinyDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = _mount("-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(root))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield TinyDisk(root)
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)


@pytest.fixture(params=["sqlite", "file"])
def url_in(request: pytest.FixtureRequest) -> Any:
    kind: str = request.param
    return lambda root: f"sqlite:///{root}/journal.db" if kind == "sqlite" else f"file://{root}/journal"


async def test_a_full_disk_refuses_new_calls_and_once_space_is_back_nothing_is_lost(
    tiny_disk: TinyDisk, url_in: Any, mode: str
) -> None:
    runs = Runs()
    url = url_in(tiny_disk.root)
    server = build_server(url, runs)
    async with Client(server, mode=mode) as client:
        before = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
        assert not before.is_error
        tiny_disk.fill()
        refused: list[str] = []
        for i in range(8):
            key = f"B{i}"
            ran = runs.count("echo")
            result = await client.call_tool("echo", {"text": f"{BIG}{i}"}, meta=key_meta(key))
            if result.is_error:
                assert meta_of(result)["mcp-durable/error"]["error"] == "journal_unavailable", text_of(result)
                assert runs.count("echo") == ran, "the tool ran although its claim could not be journaled"
                refused.append(key)
            else:
                # A journal with space set aside may still take a call; it must then be durable.
                assert meta_of(result)["mcp-durable/key"] == key and runs.count("echo") == ran + 1
        assert refused, "no call was refused on a full disk"
        replay = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
        assert meta_of(replay)["mcp-durable/replayed"] is True and replay.content == before.content

        tiny_disk.free()
        # Once space is back the same server works again, without a restart or a new connection
        # (an HTTP server has no reconnect to reopen its journal): SQLite by itself, the file
        # journal by recovering from disk in place after its failed flush.
        probe = await client.call_tool("echo", {"text": f"{BIG}0"}, meta=key_meta("B0"))
        assert not probe.is_error, text_of(probe)
    async with Client(server, mode=mode) as client:
        # (a new connection reopens the journal when the previous one closed it)
        for i in range(8):
            result = await client.call_tool("echo", {"text": f"{BIG}{i}"}, meta=key_meta(f"B{i}"))
            assert not result.is_error, text_of(result)
        assert runs.count("echo") == 1 + 8  # each key ran exactly once, the refused ones after the fault
        records, _ = await snapshot(server.journal)
        assert {r.identity.key: r.state for r in records} == {
            "A": CallState.COMPLETED,
            **{f"B{i}": CallState.COMPLETED for i in range(8)},
        }

    # A restart on the same journal: everything acknowledged is replayed, nothing runs again.
    again = build_server(url, runs)
    async with Client(again, mode=mode) as client:
        for key, text in [("A", "acknowledged"), *((f"B{i}", f"{BIG}{i}") for i in range(8))]:
            result = await client.call_tool("echo", {"text": text}, meta=key_meta(key))
            assert meta_of(result)["mcp-durable/replayed"] is True, key
    assert runs.count("echo") == 9


async def test_a_result_the_full_disk_cannot_take_is_never_acknowledged_and_is_resolved_as_in_doubt(
    tiny_disk: TinyDisk, url_in: Any
) -> None:
    """The disk fills between the claim and the result: the danger window, made real."""
    runs = Runs()
    url = url_in(tiny_disk.root)
    server = build_server(url, runs)
    async with Client(server, mode="legacy") as client:
        await client.call_tool("echo", {"text": "warm-up"}, meta=key_meta("A"))
        tiny_disk.leave(64 * 1024)  # room for a claim, not for a 1 MB result
        lost = await client.call_tool("blob", {"size": 1_000_000}, meta=key_meta("big"))
        assert lost.is_error and meta_of(lost)["mcp-durable/error"]["error"] == "journal_unavailable", text_of(lost)
        assert runs.count("blob") == 1  # it ran: the effect happened, the result could not be kept
        tiny_disk.free()
    reader = create_journal(url)  # what is on disk now (the file journal refuses reads once poisoned)
    await reader.open()
    try:
        record = await reader.get(CallIdentity("local", "blob", "big"))
    finally:
        await reader.aclose()
    assert record is not None and record.state in (CallState.PENDING, CallState.IN_DOUBT) and record.result is None
    async with Client(server, mode="legacy") as client:
        # Never acknowledged, so never replayed: the idempotent tool's in-doubt policy is retry.
        again = await client.call_tool("blob", {"size": 1_000_000}, meta=key_meta("big"))
        replay = await client.call_tool("blob", {"size": 1_000_000}, meta=key_meta("big"))
    assert not again.is_error and meta_of(again).get("mcp-durable/replayed") is None
    assert meta_of(replay)["mcp-durable/replayed"] is True and runs.count("blob") == 2


async def test_a_server_started_on_a_full_disk_refuses_calls_until_space_is_back(
    tiny_disk: TinyDisk, url_in: Any
) -> None:
    runs = Runs()
    url = url_in(tiny_disk.root)
    first = build_server(url, runs)
    async with Client(first, mode="legacy") as client:
        await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
    tiny_disk.fill()
    server = build_server(url, runs)
    async with Client(server, mode="legacy") as client:
        refused = await client.call_tool("echo", {"text": BIG}, meta=key_meta("B"))
        assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "journal_unavailable"
        assert runs.count("echo") == 1
        tiny_disk.free()
        ok = await client.call_tool("echo", {"text": BIG}, meta=key_meta("B"))
        replay = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
    assert not ok.is_error and meta_of(replay)["mcp-durable/replayed"] is True
    assert runs.count("echo") == 2


async def test_a_read_only_journal_directory_refuses_calls_until_it_is_writable(tmp_path: Path, url_in: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (chmod does not stop root)")
    source, view = tmp_path / "source", tmp_path / "view"
    source.mkdir()
    view.mkdir()
    runs = Runs()
    first = build_server(url_in(source), runs)
    async with Client(first, mode="auto") as client:
        await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
    if _mount("--bind", str(source), str(view)).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        assert _mount("-o", "remount,bind,ro", str(view)).returncode == 0
        server = build_server(url_in(view), runs)
        async with Client(server, mode="auto") as client:
            refused = await client.call_tool("echo", {"text": "new"}, meta=key_meta("B"))
            assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "journal_unavailable"
            assert runs.count("echo") == 1
            await server.engine.aclose()  # let go of the files before making the mount writable
            assert _mount("-o", "remount,bind,rw", str(view)).returncode == 0
            ok = await client.call_tool("echo", {"text": "new"}, meta=key_meta("B"))
            replay = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
        assert not ok.is_error, text_of(ok)
        assert meta_of(replay)["mcp-durable/replayed"] is True and runs.count("echo") == 2
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # hold the lock until told to let go
conn.execute("ROLLBACK")
"""


async def test_a_sqlite_journal_locked_by_another_process_refuses_calls_until_the_lock_is_gone(
    tmp_path: Path, mode: str
) -> None:
    db = tmp_path / "journal.db"
    runs = Runs()
    server = build_server(SQLiteJournal(db, busy_timeout=0.3), runs)
    async with Client(server, mode=mode) as client:
        acknowledged = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            refused = await client.call_tool("echo", {"text": "new"}, meta=key_meta("B"))
            assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "journal_unavailable"
            assert "locked" in refused.structured_content["message"]
            assert runs.count("echo") == 1
            # A repeat claims before it reads (one write transaction), so under another process's
            # write lock it is refused too; it must never run the tool or answer anything else.
            during = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
            if during.is_error:
                assert meta_of(during)["mcp-durable/error"]["error"] == "journal_unavailable"
            else:
                assert meta_of(during)["mcp-durable/replayed"] is True and during.content == acknowledged.content
            assert runs.count("echo") == 1
        finally:
            assert holder.stdin is not None
            holder.stdin.write("go\n")
            holder.stdin.close()
            holder.wait(timeout=10)
        ok = await client.call_tool("echo", {"text": "new"}, meta=key_meta("B"))
        replay = await client.call_tool("echo", {"text": "acknowledged"}, meta=key_meta("A"))
    assert not ok.is_error and replay.content == acknowledged.content and meta_of(replay)["mcp-durable/replayed"]
    assert runs.count("echo") == 2
