"""What every case shares: tables, targets, timing, the machine, and which journals to measure.

Figures are medians of many samples and ratios taken within one run, because the machine is
shared and noisy: an absolute figure says little, a ratio measured side by side says more.
Nothing here asserts on time; a case only measures and reports.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

#: The Postgres the benchmarks use when the Postgres journal is importable (a schema per run).
PG_BASE = os.environ.get("MCP_DURABLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True, slots=True)
class Settings:
    """How hard a run measures: `quick` is a smoke run (CI), the default the published figures."""

    quick: bool
    workdir: Path
    cache_dir: Path
    fsync_s: float

    def pick(self, quick: int, full: int) -> int:
        return quick if self.quick else full


@dataclass(slots=True)
class Table:
    """One printed and published table: a title, columns, rows of text, notes under it."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])


@dataclass(frozen=True, slots=True)
class Target:
    """A performance bar: what was measured against it and whether it is met (None: not measured)."""

    name: str
    bar: str
    measured: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "NOT met")


@dataclass(slots=True)
class CaseResult:
    """What a case hands back: its tables and the targets it judged."""

    name: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    seconds: float = 0.0


T = TypeVar("T")


def in_turn(sides: Sequence[T], repetition: int) -> Sequence[T]:
    """`sides` in order on even repetitions, reversed on odd ones (ABBA): a burst inherits the
    machine's drift and the collector's debt of the burst before it, so no side always goes
    first or always follows another."""
    return sides if repetition % 2 == 0 else sides[::-1]


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else float("nan")


def us(seconds: float) -> str:
    """Seconds as microseconds, for latency cells."""
    return f"{seconds * 1e6:,.0f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def rate(per_second: float) -> str:
    return f"{per_second:,.0f}/s"


def ratio(value: float, digits: int = 2) -> str:
    """`value` as a ratio; judged against a bar it sits at, pass `digits=3` so that a verdict
    of "NOT met" never stands beside a figure that rounds to the bar (1.004 shown as 1.00x)."""
    return f"{value:.{digits}f}x"


def mb(size_bytes: float) -> str:
    return f"{size_bytes / 1e6:,.0f} MB"


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "NOT met")


# -- the machine -------------------------------------------------------------------------------------


class FsyncProbe:
    """Times one `write(size)` + `fsync` appended to a scratch file in `directory` (the journals'
    disk). A case can sample it between its own measurements, so that a bar stated in fsyncs is
    judged against the disk as it was during that case (its latency drifts over minutes)."""

    def __init__(self, directory: Path, size: int = 4096) -> None:
        self.path = directory / f"fsync-probe-{uuid.uuid4().hex[:8]}"
        self._block = os.urandom(size)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def sample(self, count: int) -> list[float]:
        """Seconds of each of `count` appends, each followed by its fsync."""
        times: list[float] = []
        fd, block = self._fd, self._block
        for _ in range(count):
            began = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - began)
        return times

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


def measure_fsync(directory: Path, samples: int = 200, size: int = 4096) -> float:
    """Median seconds of one `write(size)` + `fsync` on a file in `directory` (the journals' disk)."""
    probe = FsyncProbe(directory, size)
    try:
        return median(probe.sample(samples))
    finally:
        probe.close()


def memory_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 0


def machine(fsync_s: float) -> dict[str, str]:
    """The facts the published figures depend on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "memory": f"{memory_total() / 2**30:.1f} GiB",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "fsync (4 KiB write + fsync, median)": us(fsync_s),
        "load average at start": " / ".join(f"{x:.2f}" for x in load),
    }


# -- journals ------------------------------------------------------------------------------------------


def file_journal_available() -> bool:
    try:
        from mcp_durable.journal.file import FileJournal  # noqa: F401
    except ImportError:  # not built yet (or half-built: the package exists without the class)
        return False
    return True


_pg_checked: bool | None = None


def postgres_available() -> bool:
    """Whether the Postgres journal is importable and a server answers (checked once per run)."""
    global _pg_checked
    if _pg_checked is None:
        try:
            import psycopg

            from mcp_durable.journal.postgres import PostgresJournal  # noqa: F401

            with psycopg.connect(PG_BASE, connect_timeout=2):
                pass
            _pg_checked = True
        except Exception:  # noqa: BLE001 - any failure means "not measured here"
            _pg_checked = False
    return _pg_checked


_pg_schemas: list[str] = []


def postgres_url() -> str:
    """A Postgres journal URL in a schema of its own (dropped by `cleanup_postgres`)."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    _pg_schemas.append(schema)
    return f"{PG_BASE}?schema={schema}"


def cleanup_postgres() -> None:
    if not _pg_schemas:
        return
    try:
        import psycopg

        with psycopg.connect(PG_BASE, connect_timeout=2, autocommit=True) as conn:
            for schema in _pg_schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except Exception:  # noqa: BLE001 - best effort: a leftover schema only costs disk
        pass
    _pg_schemas.clear()


def journal_urls(settings: Settings, *, memory: bool = True) -> dict[str, str]:
    """A fresh journal URL per available backend, each on its own storage, default durability."""
    base = settings.workdir / f"j-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    urls: dict[str, str] = {}
    if memory:
        urls["memory"] = "memory://"
    if file_journal_available():
        urls["file"] = f"file://{base}/file"
    urls["sqlite"] = f"sqlite:///{base}/journal.db"
    if postgres_available():
        urls["postgres"] = postgres_url()
    return urls


def skipped_journals() -> list[str]:
    """Notes for the backends this run could not measure, and why."""
    notes = []
    if not file_journal_available():
        notes.append("file journal: not importable in this build (mcp_durable.journal.file), not measured")
    if not postgres_available():
        notes.append("postgres journal: not importable or no server at " + PG_BASE + ", not measured")
    return notes


def default_cache_dir() -> Path:
    """Where built journals are kept between runs: `$MCP_DURABLE_BENCH_CACHE`, or
    `<tmp>/mcp-durable-bench-cache`."""
    return Path(os.environ.get("MCP_DURABLE_BENCH_CACHE", Path(tempfile.gettempdir()) / "mcp-durable-bench-cache"))


def make_settings(quick: bool) -> Settings:
    """A run's settings; measures the fsync latency of the disk the journals are written to."""
    workdir = Path(tempfile.mkdtemp(prefix="mcp-durable-bench-"))
    cache = default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    fsync_s = measure_fsync(workdir, samples=50 if quick else 300)
    return Settings(quick=quick, workdir=workdir, cache_dir=cache, fsync_s=fsync_s)


def remove_workdir(settings: Settings) -> None:
    shutil.rmtree(settings.workdir, ignore_errors=True)


def dir_size(path: Path) -> int:
    """Bytes of every regular file under `path` (or of `path` itself when it is a file)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class GcMeter:
    """Time the interpreter's cyclic garbage collector spends while inside `with meter:`.

    Not a figure to judge, a diagnosis: durable calls wait for fsync with their whole request
    state alive, so more of it survives into the older generations, and full collections (which
    walk every object of the process) come more often. Counts `seconds`, `full` collections and
    `collections` per generation (young, middle, full).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.collections = [0, 0, 0]
        self._started: float | None = None
        self._inside = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self._inside:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            generation = info.get("generation", 0)
            self.full += generation == 2
            self.collections[generation] += 1
            self._started = None

    def __enter__(self) -> GcMeter:
        import gc

        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        self._inside = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._inside = False
