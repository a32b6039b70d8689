"""SIGKILL a process appending to the file journal at random moments; nothing acknowledged is lost.

Each trial starts `tests/crash/file_writer.py` (several tasks appending entries of mixed sizes
up to 1 MiB, printing each acknowledged seq after its append returned), kills it with SIGKILL
after a random delay, then opens the journal here: every acknowledged entry must be present and
intact (same seq, same data), recovery must find nothing but a torn tail, and one more append
followed by a reopen must be there (the seed framework lost it in 8 of 60 such trials). Trials
run in groups of four on one journal, so later trials also crash a journal that was recovered.

Trials: `$MCP_DURABLE_TRIALS` (default 12, about 30 s; the acceptance run uses 200).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from mcp_durable.journal import create_journal
from mcp_durable.journal.file import verify
from tests.crash.file_writer import PROCESS, entry_data

TRIALS = int(os.environ.get("MCP_DURABLE_TRIALS", "12"))
ROOT = Path(__file__).resolve().parents[2]
WRITERS = 4


def run_writer(url: str, start: int, delay: float) -> tuple[list[tuple[int, int]], int]:
    """Start a writer, SIGKILL it `delay` seconds after it is ready; its acks and its exit code."""
    child = subprocess.Popen([sys.executable, "-m", "tests.crash.file_writer", url, str(start), str(WRITERS)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    first = child.stdout.readline()
    assert first == b"ready\n", (first, child.stderr.read() if child.stderr else b"")
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=60)
    acks: list[tuple[int, int]] = []
    for line in out.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ack":  # a line cut by the kill is not an ack
            acks.append((int(parts[1]), int(parts[2])))
    return acks, child.returncode


async def test_every_acknowledged_entry_survives_sigkill_and_the_next_append_is_never_lost(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("MCP_DURABLE_SEED", time.time_ns())))
    acked_total = truncations = 0
    acked: dict[int, int] = {}  # n -> seq, across the trials on one journal
    markers: dict[int, dict[str, object]] = {}  # seq -> data of the appends made after a kill
    next_n = 0
    url = ""
    for trial in range(TRIALS):
        if trial % 4 == 0:
            url, acked, markers = f"file://{tmp_path}/journal-{trial}", {}, {}
        acks, code = run_writer(url, next_n, rng.uniform(0.0, 0.8))
        assert code == -signal.SIGKILL
        acked.update({n: seq for seq, n in acks})
        acked_total += len(acks)
        next_n += 100_000

        journal = create_journal(url)
        await journal.open()
        try:
            assert journal.recovery is not None
            assert all("torn or corrupt tail" in p for p in journal.recovery.problems), journal.recovery.problems
            truncations += journal.recovery.bytes_truncated > 0
            found = {e.data["n"]: e for e in await journal.entries(process_id=PROCESS)}
            for n, seq in acked.items():
                assert n in found, f"trial {trial}: acknowledged entry {n} (seq {seq}) is missing"
                assert found[n].seq == seq and found[n].data == entry_data(n), f"trial {trial}: entry {n} differs"
            by_seq = {e.seq: e.data for e in found.values()}
            assert all(by_seq.get(seq) == data for seq, data in markers.items()), f"trial {trial}: a marker is lost"
            marker = await journal.append(PROCESS, "context_update", {"n": -trial - 1, "after_kill": True}, 0.0)
        finally:
            await journal.aclose()

        again = create_journal(url)
        await again.open()
        try:
            after = await again.entries(process_id=PROCESS, after=marker.seq - 1)
            assert after and after[0].seq == marker.seq and after[0].data == marker.data
            assert again.recovery is not None and not again.recovery.problems
        finally:
            await again.aclose()
        report = verify(url[len("file://") :])
        assert report.ok, report.problems
        markers[marker.seq] = marker.data
    print(f"{TRIALS} trials, {acked_total} acknowledged appends, {truncations} torn tails cut")
    assert acked_total > 0
