"""Where the CPU of a multi-process measurement goes: each process's CPU per call and the idle cores.

Case 5 runs three kinds of process on the machine's two cores: the measuring process (16 MCP
clients), the server, and for the Postgres journal the database's own processes. A ratio under
its bar can then mean two different things: the cores are full (the durable side costs more CPU
per call than the plain one leaves free), or they are not and calls wait (for a commit, for a
process to be scheduled), so the clients sit idle with nothing to send. `CpuMeter` tells the two
apart; it is a diagnosis printed beside the figures, never a figure judged.
Case 10 reads the database's share with `postgres_cpu` from the same `/proc` figures.

Linux only (`/proc`); elsewhere every figure is None and the table shows a dash.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far; None if it is gone or unreadable."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat(5))


def postgres_pids() -> list[int]:
    """The processes of a Postgres running on this machine (named `postgres`): postmaster,
    backends, WAL writer, checkpointer. Empty when none runs here (or `/proc` is missing)."""
    pids: list[int] = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return pids
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == "postgres":
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def postgres_cpu() -> float | None:
    """CPU seconds every local Postgres process has used so far (None when none runs here)."""
    used = [seconds for seconds in map(process_cpu, postgres_pids()) if seconds is not None]
    return sum(used) if used else None


def idle_seconds() -> float | None:
    """Idle CPU seconds of the whole machine so far, summed over its cores (`/proc/stat`)."""
    try:
        fields = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return int(fields[4]) / _TICK  # cpu  user nice system idle …


class CpuMeter:
    """CPU used by this process, one server process and the local Postgres while inside `with
    meter:`, and the machine's idle time; added up over every `with` (several repetitions).

    A Postgres process that ends inside a window loses that window's share, and one that starts
    inside it counts whole: backends live as long as the journal's pool, so neither happens in
    a measurement.
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.calls = 0
        self.wall = 0.0
        self.client = 0.0
        self.server = 0.0
        self.database = 0.0
        self.idle = 0.0
        self.complete = True  # False once a figure could not be read
        self._start: tuple[float | None, float | None, dict[int, float], float | None] | None = None
        self._began = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = (process_cpu(os.getpid()), self._server_cpu(), self._database_cpu(), idle_seconds())
        self._began = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        client, server, database, idle = self._start
        self.wall += time.perf_counter() - self._began
        now_client, now_server, now_idle = process_cpu(os.getpid()), self._server_cpu(), idle_seconds()
        if client is None or now_client is None or idle is None or now_idle is None:
            self.complete = False
            return
        self.client += now_client - client
        self.idle += now_idle - idle
        if server is not None and now_server is not None:
            self.server += now_server - server
        for pid, used in self._database_cpu().items():
            self.database += used - database.get(pid, 0.0)

    def count(self, calls: int) -> None:
        """Record that `calls` calls were made inside the windows measured."""
        self.calls += calls

    def _server_cpu(self) -> float | None:
        return None if self.server_pid is None else process_cpu(self.server_pid)

    @staticmethod
    def _database_cpu() -> dict[int, float]:
        used = {pid: process_cpu(pid) for pid in postgres_pids()}
        return {pid: seconds for pid, seconds in used.items() if seconds is not None}

    def per_call(self) -> tuple[float, float, float] | None:
        """Seconds of CPU per call: client, server, Postgres; None when not measured."""
        if not self.complete or self.calls == 0:
            return None
        return self.client / self.calls, self.server / self.calls, self.database / self.calls

    def idle_cores(self) -> float | None:
        """Cores idle on average while measuring (0 = every core busy all the time)."""
        if not self.complete or self.wall <= 0:
            return None
        return self.idle / self.wall
