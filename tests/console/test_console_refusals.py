"""The console answers each refusal with its own HTTP status: the row of its code in
`wire_errors.WIRE`, the table every face uses (403 `forbidden`, 404 `not_found`, 409
`operator_error`, 503 `journal_unavailable`), never one status for every `DurableError`.

Over HTTP, no browser: a `DurableServer` with bearer tokens for alice and ops (an admin), its
console mounted as `mcp-durable serve` mounts it, served by uvicorn in this process. Each page
says which refusal it is (`data-code`), so a 403 for a missing CSRF token cannot pass for one.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.console import mount_console
from mcp_durable.journal import create_journal
from mcp_durable.wire_errors import WIRE
from tests.helpers import client_as, key_meta, serve_app

TOKENS = {"tok-alice": "alice", "tok-ops": "ops"}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
CODE = re.compile(r'data-code="([^"]+)"')


@dataclass
class Console:
    mcp: str
    base: str


@asynccontextmanager
async def console(journal: str) -> AsyncIterator[Console]:
    """A server on `journal` with the console mounted, served over HTTP until the block exits."""
    server = DurableServer("shop", journal=journal, tokens=TOKENS, admin_principals=("ops",))

    @server.tool(durable=ToolPolicy(key="required"))
    def ship(order_id: str) -> dict[str, Any]:
        return {"shipped": order_id}

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    mount_console(app, server)
    async with serve_app(app) as base:
        yield Console(f"{base}/mcp", f"{base}/console")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refusal(response: httpx2.Response) -> tuple[int, str | None]:
    """The status of a console answer and the refusal code its page names."""
    found = CODE.search(response.text)
    return response.status_code, found.group(1) if found else None


async def signed_in(http: httpx2.AsyncClient, base: str, token: str) -> str:
    """Sign `http` in through the login form (a session cookie); returns the session's CSRF token."""
    login = await http.post(f"{base}/login", data={"token": token, "next": f"{base}/"})
    assert login.status_code == 303, login.text
    found = CSRF.search((await http.get(f"{base}/")).text)  # the sign-out form carries it
    assert found is not None
    return found.group(1)


async def test_a_non_admin_acting_is_answered_403_forbidden(tmp_path: Path) -> None:
    async with console(f"file://{tmp_path}/journal") as served:
        async with client_as(served.mcp, "tok-alice", "auto") as alice:
            await alice.call_tool("ship", {"order_id": "o-1"}, meta=key_meta("k-1"))
        async with httpx2.AsyncClient(timeout=30.0) as http:
            csrf = await signed_in(http, served.base, "tok-alice")  # a valid session and CSRF token
            posted = await http.post(
                f"{served.base}/act",
                data={"csrf": csrf, "action": "forget", "principal": "alice", "tool": "ship", "key": "k-1"},
            )
            confirm = await http.get(
                f"{served.base}/act", params={"principal": "alice", "tool": "ship", "key": "k-1", "action": "forget"}
            )
    assert refusal(posted) == (403, "forbidden") == (WIRE["forbidden"].status, "forbidden")
    assert refusal(confirm) == (403, "forbidden")
    assert "Forbidden" in posted.text


async def test_acting_on_a_call_that_is_not_in_doubt_is_answered_409_operator_error(tmp_path: Path) -> None:
    async with console(f"file://{tmp_path}/journal") as served:
        async with client_as(served.mcp, "tok-alice", "auto") as alice:
            await alice.call_tool("ship", {"order_id": "o-1"}, meta=key_meta("k-1"))
        call = {"principal": "alice", "tool": "ship", "key": "k-1"}
        async with httpx2.AsyncClient(timeout=30.0, headers=bearer("tok-ops")) as http:
            confirm = await http.get(f"{served.base}/act", params={**call, "action": "forget"})
            found = CSRF.search(confirm.text)
            assert confirm.status_code == 200 and found is not None
            forget = await http.post(f"{served.base}/act", data={**call, "action": "forget", "csrf": found.group(1)})
            shown = await http.get(f"{served.base}/call", params=call)
    assert refusal(forget) == (409, "operator_error")
    assert "completed, not in doubt" in forget.text  # the engine's reason, on the form shown again
    assert shown.status_code == 200 and "completed" in shown.text  # nothing changed


async def test_a_call_that_does_not_exist_is_answered_404_not_found(tmp_path: Path) -> None:
    async with console(f"file://{tmp_path}/journal") as served:
        missing = {"principal": "alice", "tool": "ship", "key": "nope"}
        async with httpx2.AsyncClient(timeout=30.0, headers=bearer("tok-ops")) as http:
            page = await http.get(f"{served.base}/call", params=missing)
            confirm = await http.get(f"{served.base}/act", params={**missing, "action": "forget"})
        async with httpx2.AsyncClient(timeout=30.0, headers=bearer("tok-alice")) as http:
            own = await http.get(f"{served.base}/call", params={"tool": "ship", "key": "nope"})
    assert refusal(page) == refusal(confirm) == refusal(own) == (404, "not_found")
    assert "No call ship/nope" in page.text


async def test_a_journal_that_fails_is_answered_503_journal_unavailable(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/journal"
    holder = create_journal(url)
    await holder.open()  # another writer holds the journal: every access of the server's fails
    try:
        async with console(url) as served:
            async with httpx2.AsyncClient(timeout=30.0, headers=bearer("tok-ops")) as http:
                pages = [await http.get(f"{served.base}{path}") for path in ("/", "/calls", "/in-doubt")]
    finally:
        await holder.aclose()
    assert [refusal(page) for page in pages] == [(503, "journal_unavailable")] * 3
    assert all("The journal is unavailable" in page.text and "locked by another writer" in page.text for page in pages)
