"""A throwaway PostgreSQL cluster for tests that stop and start the database.

    with PgCluster.create() as cluster:        # initdb + pg_ctl start on a free port
        url = cluster.url("postgres")
        cluster.stop()                         # the database is down …
        cluster.start()                        # … and back, same data, same port

The shared server at 127.0.0.1:5432 must never be stopped by a test, so tests of outages run
their own cluster: `initdb` and `pg_ctl` from `/usr/lib/postgresql/*/bin` (or `$PATH`) on a
temporary directory. Postgres refuses to run as root, so as root the commands run as the
`postgres` user (`runuser -u postgres --`) on a directory owned by it. The cluster is
throwaway: `fsync=off`, trust auth, unix socket in the data directory.

`PgCluster.create()` skips the test when no binaries are found, and fails instead under `CI`.

`scratch_schema()` is for tests on the shared server: its URL with a fresh `?schema=`, dropped
afterwards (the journal creates it on open).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.conftest import PG_URL, schema_url, scratch_postgres_schema
from tests.helpers import free_port


@contextmanager
def scratch_schema() -> Iterator[str]:
    """The test Postgres URL with `schema=t_<random>` (`scratch_postgres_schema`); the schema is
    dropped on exit, not only when the test ends."""
    schema = scratch_postgres_schema()
    try:
        yield schema_url(schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


class PgCluster:
    """One running (or stopped) throwaway cluster: `url()`, `stop()`, `start()`."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.port = port
        self.log = root / "server.log"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.data}'\n"
                "fsync = off\nfull_page_writes = off\nshared_buffers = 16MB\nmax_connections = 60\n"
            )

    def start(self) -> None:
        """Start (or restart) the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: sessions are terminated; `immediate`: like a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    @contextmanager
    def create(cls) -> Iterator[PgCluster]:
        bindir = _bindir()
        if bindir is None or not (bindir / "initdb").exists():
            if os.environ.get("CI"):
                pytest.fail("initdb/pg_ctl are required in CI for the Postgres outage tests")
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        root = Path(tempfile.mkdtemp(prefix="mcp-durable-pg-"))
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(root, pg.pw_uid, pg.pw_gid)
        cluster = cls(bindir, root, free_port())
        try:
            cluster.init()
            cluster.start()
            yield cluster
        finally:
            cluster.destroy()
