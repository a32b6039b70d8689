"""A password in the journal URL (`user:pass@` or `?password=`) is never printed: not by the serve
banner (stdio and HTTP), not by the warning when the journal is unavailable at start, not by
`mcp-durable journal … stats`. The real console script runs as a subprocess; its whole output
is searched for the secrets."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from mcp_durable.journal import display_url
from tests.conftest import scratch_postgres_url
from tests.helpers import REPO, free_port, serve_command

USERINFO_SECRET = "S3cret-in-userinfo"
QUERY_SECRET = "S3cret-in-query"
SSL_SECRET = "S3cret-sslpassword"
SECRETS = (USERINFO_SECRET, QUERY_SECRET, SSL_SECRET)
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"probe","version":"0"}}}\n'
)


def _with_secrets(url: str, *, port: int | None = None) -> str:
    """`url` with a password in its user info and as `?password=` / `&sslpassword=`."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{port or parts.port or 5432}"
    netloc = f"{parts.username or 'postgres'}:{USERINFO_SECRET}@{host}"
    query = f"{parts.query}&" if parts.query else ""
    query += f"password={QUERY_SECRET}&sslpassword={SSL_SECRET}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _env() -> dict[str, str]:
    # Wide enough that the log handler does not wrap a line (and split a secret across two).
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}, "COLUMNS": "2000"}


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} printed:\n{text}"


def test_the_one_masking_function_masks_user_info_and_secret_parameters() -> None:
    url = _with_secrets("postgresql://app@db.example:5432/prod?schema=s")
    shown = display_url(url)
    _assert_no_secret(shown)
    assert shown == "postgresql://app:***@db.example:5432/prod?schema=s&password=***&sslpassword=***"
    assert display_url("sqlite:///tmp/a:b@c.db") == "sqlite:///tmp/a:b@c.db"  # a path, not user info
    assert display_url("host=db password='p w' dbname=x") == "host=db password=*** dbname=x"


def test_journal_stats_never_prints_the_password_of_its_url() -> None:
    url = _with_secrets(scratch_postgres_url("secrets"))  # trust auth: the password is ignored
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            [*serve_command(), "journal", "--journal", url, *extra, "stats"],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=REPO,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "backend" in proc.stdout
        _assert_no_secret(proc.stdout + proc.stderr)
    shown = subprocess.run(
        [*serve_command(), "journal", "--journal", url, "stats"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
    )
    assert "postgres:***@" in shown.stdout + shown.stderr  # the URL is shown, masked


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_serve_masks_the_password_in_its_banner_and_in_the_journal_unavailable_warning(
    tmp_path: Path, transport: str
) -> None:
    # Nothing listens on this port: the journal is unavailable at start, and the server says so.
    url = _with_secrets("postgresql://postgres@127.0.0.1/db?pool_timeout=1&connect_timeout=1", port=free_port())
    log = tmp_path / "serve.log"
    args = [*serve_command(), "serve", "tests/hardening/target.py", "--journal", url, "--transport", transport]
    if transport == "http":
        args += ["--host", "127.0.0.1", "--port", str(free_port())]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            args, cwd=REPO, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err
        )
        try:
            if transport == "stdio":  # a stdio server starts its journal when a client arrives
                assert proc.stdin is not None
                proc.stdin.write(INITIALIZE)
                proc.stdin.flush()
            deadline = time.monotonic() + 60  # a bound on a hang, not an assertion on time
            while "unavailable at start" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait(timeout=10)
    text = log.read_text(errors="replace")
    assert "mcp-durable: serving" in text and "postgres:***@" in text  # banner and warning, masked
    _assert_no_secret(text)


@pytest.mark.parametrize(
    "url",
    [
        _with_secrets("postgresql://postgres@127.0.0.1/db?pool_timeout=1&connect_timeout=1", port=free_port()),
        _with_secrets("postgress://postgres@127.0.0.1/db"),  # a misspelt scheme: the error quotes the URL
    ],
    ids=["unreachable", "unknown-scheme"],
)
def test_journal_errors_that_quote_the_url_never_print_its_password(url: str) -> None:
    proc = subprocess.run(
        [*serve_command(), "journal", "--journal", url, "stats"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    _assert_no_secret(proc.stdout + proc.stderr)
