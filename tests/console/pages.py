"""Helpers for console tests: a served target with bearer tokens, signing in, reading pages."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.helpers import REPO, ServedHttp, free_port, serve_command, serve_http, wait_listening

COUNTING = "tests/server/servers/counting.py:make_server"
TOKENS = {"alice": "tok-alice-4f1c", "bob": "tok-bob-9a2e", "ops": "tok-ops-77d0"}
ENV = {"MCP_DURABLE_TOKENS": ",".join(f"{t}={p}" for p, t in TOKENS.items()), "MCP_DURABLE_ADMINS": "ops"}


@asynccontextmanager
async def counting_server(tmp_path: Path, journal: str | None = None, **env: str) -> AsyncIterator[ServedHttp]:
    """`mcp-durable serve` of the counting target over HTTP, with the console, tokens for alice,
    bob and ops (an admin)."""
    url = journal or f"file://{tmp_path}/journal"
    env = {**ENV, "COUNTER_FILE": str(tmp_path / "counter"), **env}
    async with serve_http(COUNTING, journal=url, env=env) as served:
        yield served


def console_url(served: ServedHttp) -> str:
    return f"http://127.0.0.1:{served.port}/console"


async def signed_in(browser: Any, base: str, principal: str, *, javascript: bool = False) -> Any:
    """A fresh browser context signed in through the login form as `principal`; returns its page.
    JavaScript is off unless asked for: everything but live updates must work without it."""
    context = await browser.new_context(java_script_enabled=javascript)
    page = await context.new_page()
    response = await page.goto(f"{base}/")
    assert response is not None and response.status == 401  # no token yet: the login page
    await page.fill("input[name=token]", TOKENS[principal])
    await page.click("button[type=submit]")
    assert await page.inner_text(".principal") == principal
    return page


async def table_counts(page: Any, table: str, attribute: str) -> dict[str, int]:
    """`{row's data-attribute: count}` of an overview table."""
    rows = await page.query_selector_all(f"#{table} tbody tr[data-{attribute}]")
    counts = {}
    for row in rows:
        name = await row.get_attribute(f"data-{attribute}")
        counts[str(name)] = int((await (await row.query_selector("td.num")).inner_text()).strip())
    return counts


async def listed_keys(page: Any) -> list[str]:
    rows = await page.query_selector_all("#calls tbody tr[data-key]")
    return [str(await row.get_attribute("data-key")) for row in rows]


@asynccontextmanager
async def standalone_console(journal: str) -> AsyncIterator[str]:
    """`mcp-durable console --journal JOURNAL` (tokens and admins as above) on a free port; yields
    its base URL (`http://127.0.0.1:P/console`) once it listens."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="console-", suffix=".log", delete=False)  # noqa: SIM115
    console = subprocess.Popen(
        [*serve_command(), "console", "--journal", journal, "--port", str(port)],
        cwd=REPO,
        env={**os.environ, **ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    served = ServedHttp(f"http://127.0.0.1:{port}/console", port, console, Path(log.name), [log])
    try:
        assert await wait_listening(served), served.stderr()  # False: the console exited first
        yield served.url
    finally:
        console.terminate()
        console.wait(timeout=10)
        log.close()
        Path(log.name).unlink(missing_ok=True)
