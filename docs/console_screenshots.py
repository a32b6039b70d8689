"""Regenerate the console screenshots in docs/img/ (`make console-screenshots`).

Serves `tools/shipping.py` over HTTP with bearer tokens on a scratch SQLite journal, ships a few
orders as two principals (each in three durable steps), leaves one call in doubt (a claim whose
owner is gone), then has Debian's headless chromium (driven by Playwright, never `playwright
install`) sign in as the admin and capture the overview and one call's page.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_durable import KEY_META
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.keys import fingerprint

ROOT = Path(__file__).resolve().parent.parent
IMAGES = Path(os.environ.get("MCP_DURABLE_SCREENSHOTS", ROOT / "docs" / "img"))  # tests write elsewhere
CHROMIUM = os.environ.get("MCP_DURABLE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKENS = {"alice": "demo-alice", "bob": "demo-bob", "ops": "demo-ops"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def ship(url: str, principal: str, orders: list[str]) -> None:
    headers = {"Authorization": f"Bearer {TOKENS[principal]}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:  # type: ignore[arg-type]
            for order in orders:
                await client.call_tool("ship_order", {"order_id": order, "sku": "SKU-7"}, meta={KEY_META: order})


async def leave_in_doubt(journal_url: str) -> None:
    """A claim of a previous server that died mid-call (its lease long expired)."""
    journal = create_journal(journal_url)
    await journal.open()
    now = time.time() - 1800
    arguments = {"order_id": "A-1013", "sku": "SKU-7"}
    ghost = CallRecord(CallIdentity("alice", "ship_order", "A-1013"), fingerprint(arguments), CallState.PENDING, 1,
                       "run-lost", 1, now, now, owner="replica-gone", lease_until=now + 30,
                       arguments=b'{"order_id":"A-1013","sku":"SKU-7"}')
    await journal.claim(ghost, now)
    await journal.aclose()


async def main() -> None:
    from playwright.async_api import async_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        journal = f"sqlite:///{tmp}/journal.db"
        await leave_in_doubt(journal)
        port = free_port()
        env = {**os.environ, "MCP_DURABLE_TOKENS": ",".join(f"{t}={p}" for p, t in TOKENS.items()),
               "MCP_DURABLE_ADMINS": "ops", "WAREHOUSE_DB": f"{tmp}/warehouse.db"}
        server = subprocess.Popen([sys.executable, "-m", "mcp_durable.cli", "serve", "tools/shipping.py", "--transport",
                                   "http", "--port", str(port), "--journal", journal], cwd=ROOT, env=env)
        try:
            for _ in range(600):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            url = f"http://127.0.0.1:{port}/mcp"
            await ship(url, "alice", [f"A-{n}" for n in range(1001, 1010)])
            await ship(url, "bob", ["B-2001", "B-2002", "B-2003"])
            await ship(url, "alice", ["A-1010", "A-1011", "A-1012"])
            base = f"http://127.0.0.1:{port}/console"
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = await browser.new_page(viewport={"width": 1180, "height": 900})
                await page.goto(f"{base}/login")
                await page.fill("input[name=token]", TOKENS["ops"])
                await page.click("button[type=submit]")
                await page.screenshot(path=str(IMAGES / "console-overview.png"), full_page=True)
                await page.goto(f"{base}/call?principal=alice&tool=ship_order&key=A-1012")
                await page.screenshot(path=str(IMAGES / "console-call.png"), full_page=True)
                await page.goto(f"{base}/in-doubt")
                await page.screenshot(path=str(IMAGES / "console-in-doubt.png"), full_page=True)
                await browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(f"wrote {', '.join(p.name for p in sorted(IMAGES.glob('console-*.png')))} in {IMAGES}")


if __name__ == "__main__":
    anyio.run(main)
