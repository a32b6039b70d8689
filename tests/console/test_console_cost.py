"""The console costs a tool call nothing while nobody has a live page open: it adds no engine
listener, and watches the change notifications only while an event stream is connected."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
from mcp import Client

from mcp_durable.console import mount_console
from tests.helpers import key_meta, serve_app
from tests.server.servers.counting import make_server


async def test_the_console_watches_changes_only_while_a_live_page_is_open(tmp_path: Path) -> None:
    server = make_server(journal=f"file://{tmp_path}/journal", counter=tmp_path / "counter")
    listeners = list(server.engine.listeners)
    app = server.streamable_http_app(host="127.0.0.1")
    mount_console(app, server)
    notifier = server.journal_notifier

    def watchers() -> int:
        return 0 if notifier._bus is None else len(notifier._bus._listeners)

    async with serve_app(app) as base:
        assert server.engine.listeners == listeners  # mounting added no listener to the engine
        async with httpx2.AsyncClient(base_url=base, follow_redirects=True) as http:
            page = await http.get("/console/")  # no auth on this server: a session for `local`
            assert page.status_code == 200 and ">local<" in page.text
            async with Client(f"{base}/mcp") as client:
                await client.call_tool("record", {"text": "unwatched"}, meta=key_meta("k-0"))
            assert watchers() == 0
            async with http.stream("GET", "/console/events") as events:
                lines = events.aiter_lines()
                assert await lines.__anext__() == "retry: 3000"
                assert watchers() == 1
                async with Client(f"{base}/mcp") as client:
                    await client.call_tool("record", {"text": "watched"}, meta=key_meta("k-1"))
                with anyio.fail_after(10):
                    async for line in lines:
                        if line.startswith("data: journal://calls/record/k-1"):
                            break
            with anyio.fail_after(10):
                while watchers():  # the stream's end unsubscribes it
                    await anyio.sleep(0.01)
        assert server.engine.listeners == listeners


async def test_a_live_stream_carries_only_the_changes_its_principal_may_see(tmp_path: Path) -> None:
    from tests.console.pages import TOKENS, console_url, counting_server
    from tests.helpers import client_as

    async def first_change(stream: object) -> str:
        with anyio.fail_after(20):
            async for line in stream:  # type: ignore[attr-defined]
                if line.startswith("data: journal://calls/"):
                    return str(line[len("data: ") :])
        raise AssertionError("the stream ended")

    async with counting_server(tmp_path) as served:
        base = console_url(served)
        async with httpx2.AsyncClient(timeout=30) as http:

            def headers(who: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {TOKENS[who]}"}

            async with (
                http.stream("GET", f"{base}/events", headers=headers("bob")) as bob_events,
                http.stream("GET", f"{base}/events", headers=headers("ops")) as ops_events,
            ):
                bob_lines, ops_lines = bob_events.aiter_lines(), ops_events.aiter_lines()
                assert await bob_lines.__anext__() == "retry: 3000"
                assert await ops_lines.__anext__() == "retry: 3000"
                async with client_as(served.url, TOKENS["alice"], "auto") as alice:
                    await alice.call_tool("record", {"text": "a"}, meta=key_meta("alices"))
                async with client_as(served.url, TOKENS["bob"], "auto") as bob:
                    await bob.call_tool("record", {"text": "b"}, meta=key_meta("bobs"))
                # Events arrive in order: bob's first is his own call; alice's never reached him.
                assert await first_change(bob_lines) == "journal://calls/record/bobs"
                assert await first_change(ops_lines) == "journal://calls/record/alices"  # an admin hears all
