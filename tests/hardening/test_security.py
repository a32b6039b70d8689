"""Security: who may call and see what, files only their owner reads, secrets kept out of views and logs,
DNS-rebinding protection on local HTTP.

- On HTTP with a token map (`DurableServer(tokens=…)`), a request without valid credentials is
  refused with 401 before anything runs; the principal comes from the token only, and two
  principals with the same key and the same arguments never replay each other's result.
- Journal files and directories are created readable by their owner only, whatever the umask.
- `ToolPolicy.sensitive` keeps secrets out of every journal resource (wherever they appear in the
  record, not only under their own name) and out of the logs, while the journal keeps what replay
  needs: the owner's repeat is still answered byte-identical.
- `mcp-durable serve --transport http` keeps the SDK's DNS-rebinding protection: a foreign `Host`
  or `Origin` is refused.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallQuery, create_journal
from tests.hardening.conftest import KEY_META, MODES, Runs, text_of
from tests.helpers import body_bytes, client_as, key_meta, meta_of, resource_text, serve_app, serve_http

CARD = "4111-2222-3333-4444"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
JSON_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _secret_server(journal: str, runs: Runs, **kwargs: Any) -> DurableServer:
    server = DurableServer("secrets", journal=journal, **kwargs)

    @server.tool(durable=ToolPolicy(sensitive=("card",)))
    def charge(order_id: str, card: str, amount_cents: int, decline: bool = False) -> dict[str, Any]:
        runs.calls.append(("charge", order_id))
        if decline:
            raise ToolError(f"card {card} was declined")  # a deliberate error: persisted and replayed
        return {"order_id": order_id, "card": card, "receipt": f"charged {amount_cents} to card {card}"}

    @server.tool(durable=True)
    def whoami(text: str) -> dict[str, Any]:
        runs.calls.append(("whoami", text))
        return {"text": text, "run": len(runs.calls)}

    return server


# -- HTTP authentication and principals --------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_on_http_only_a_valid_token_gets_in_and_principals_never_replay_each_other(
    tmp_path: Path, mode: str
) -> None:
    runs = Runs()
    journal = f"sqlite:///{tmp_path}/journal.db"
    server = _secret_server(journal, runs, tokens={"tok-alice": "alice", "tok-bob": "bob"})
    async with serve_app(server.streamable_http_app(streamable_http_path="/mcp")) as base:
        url = f"{base}/mcp"
        async with httpx2.AsyncClient(timeout=30.0) as http:
            for headers in (
                {},
                {"Authorization": "Bearer tok-mallory"},
                {"Authorization": "Bearer tok-alic"},
                {"Authorization": "Basic dG9rLWFsaWNlOg=="},
                {"Authorization": "Bearer"},
            ):
                refused = await http.post(url, json=INITIALIZE, headers={**JSON_HEADERS, **headers})
                assert refused.status_code == 401, headers
        assert runs.calls == []

        # Same key, same arguments, and a `_meta` that claims to be someone else: the token decides.
        call: dict[str, Any] = {
            "name": "whoami",
            "arguments": {"text": "same"},
            "meta": {KEY_META: "shared", "mcp-durable/principal": "alice", "principal": "alice"},
        }
        async with client_as(url, "tok-alice", mode) as alice:
            alice_first = await alice.call_tool(**call)
        async with client_as(url, "tok-bob", mode) as bob:
            bob_first = await bob.call_tool(**call)
            bob_again = await bob.call_tool(**call)
            bob_view = await bob.read_resource("journal://calls/whoami/shared")
        async with client_as(url, "tok-alice", mode) as alice:
            alice_again = await alice.call_tool(**call)
    assert runs.count("whoami") == 2  # once per principal
    assert alice_first.structured_content != bob_first.structured_content
    assert body_bytes(alice_again) == body_bytes(alice_first) and body_bytes(bob_again) == body_bytes(bob_first)
    assert orjson.loads(resource_text(bob_view))["principal"] == "bob"

    reader = create_journal(journal)
    await reader.open()
    try:
        records = await reader.list_calls(CallQuery(tool="whoami"))
    finally:
        await reader.aclose()
    assert sorted(r.identity.principal for r in records) == ["alice", "bob"]
    assert {r.identity.key for r in records} == {"shared"}


# -- file modes -------------------------------------------------------------------------------------


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _modes(root: Path) -> dict[str, str]:
    found = {}
    for path in [root, *root.rglob("*")]:
        try:
            found[str(path.relative_to(root.parent))] = stat.filemode(path.stat().st_mode)
        except FileNotFoundError:  # SQLite's -wal/-shm come and go
            continue
    return found


@pytest.mark.parametrize("kind", ["sqlite", "file"])
async def test_journal_files_and_directories_are_readable_by_their_owner_only(tmp_path: Path, kind: str) -> None:
    if kind == "file":
        pytest.importorskip("mcp_durable.journal.file", reason="the file journal is not built yet")
    # Neither directory exists yet: the journal creates them. SQLite's directory holds the database
    # and its -wal/-shm files; the file journal's is the journal itself.
    root = tmp_path / "state" if kind == "sqlite" else tmp_path / "state" / "journal"
    url = f"sqlite:///{root}/journal.db" if kind == "sqlite" else f"file://{root}"
    runs = Runs()
    with _umask(0o022):  # the usual umask, which alone would leave files world-readable
        server = _secret_server(url, runs)
        async with Client(server, mode="legacy") as client:
            for i in range(3):
                await client.call_tool("charge", {"order_id": f"O-{i}", "card": CARD, "amount_cents": 5})
            modes = _modes(root)  # while open: SQLite's -wal and -shm exist now
        modes |= _modes(root)
    assert len(modes) >= 3, modes
    leaky = {path: mode for path, mode in modes.items() if mode[4:] != "------"}
    assert not leaky, f"journal paths readable by others: {leaky}"


# -- secrets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_sensitive_arguments_are_masked_in_every_journal_resource_but_replay_is_byte_identical(
    tmp_path: Path, mode: str
) -> None:
    runs = Runs()
    url = f"sqlite:///{tmp_path}/journal.db"
    server = _secret_server(url, runs)
    async with Client(server, mode=mode) as client:
        paid = await client.call_tool(
            "charge", {"order_id": "O-1", "card": CARD, "amount_cents": 500}, meta=key_meta("pay-1")
        )
        declined = await client.call_tool(
            "charge", {"order_id": "O-2", "card": CARD, "amount_cents": 9, "decline": True}, meta=key_meta("pay-2")
        )
        assert CARD in text_of(paid) and declined.is_error and CARD in text_of(declined)
        views = {}
        for uri in (
            "journal://calls/charge/pay-1",
            "journal://calls/charge/pay-2",
            "journal://calls",
            "journal://calls?tool=charge",
            "journal://in-doubt",
            "journal://stats",
            "journal://recovery",
        ):
            views[uri] = resource_text(await client.read_resource(uri))
        # The owner's repeats are answered from the journal, secrets included, byte for byte.
        paid_again = await client.call_tool(
            "charge", {"order_id": "O-1", "card": CARD, "amount_cents": 500}, meta=key_meta("pay-1")
        )
        declined_again = await client.call_tool(
            "charge", {"order_id": "O-2", "card": CARD, "amount_cents": 9, "decline": True}, meta=key_meta("pay-2")
        )
    leaks = {uri: text for uri, text in views.items() if CARD in text}
    assert not leaks, f"the card number leaked into {sorted(leaks)}"
    one = orjson.loads(views["journal://calls/charge/pay-1"])
    assert one["arguments"]["card"] == "[redacted]" and one["arguments"]["order_id"] == "O-1"
    assert meta_of(paid_again)["mcp-durable/replayed"] is True and body_bytes(paid_again) == body_bytes(paid)
    assert meta_of(declined_again)["mcp-durable/replayed"] is True and body_bytes(declined_again) == body_bytes(
        declined
    )
    assert runs.count("charge") == 2
    # The journal itself keeps what replay needs: the stored bytes hold the real result.
    reader = create_journal(url)
    await reader.open()
    try:
        stored = await reader.get(CallIdentity("local", "charge", "pay-1"))
    finally:
        await reader.aclose()
    assert stored is not None and CARD.encode() in (stored.result or b"")


async def test_secrets_in_arguments_do_not_reach_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs = Runs()
    server = _secret_server(f"sqlite:///{tmp_path}/journal.db", runs)
    caplog.set_level(logging.DEBUG)  # every logger, at its most talkative
    for mode in MODES:
        async with Client(server, mode=mode) as client:
            args = {"order_id": "O-1", "card": CARD, "amount_cents": 500}
            await client.call_tool("charge", args, meta=key_meta("pay-1"))
            await client.call_tool("charge", args, meta=key_meta("pay-1"))  # replayed
            await client.call_tool("charge", {**args, "amount_cents": 501}, meta=key_meta("pay-1"))  # key_reuse
            await client.read_resource("journal://calls/charge/pay-1")
    assert caplog.records, "nothing was logged at all: the check would be vacuous"
    leaked = [r.getMessage() for r in caplog.records if CARD in r.getMessage()]
    assert not leaked, leaked


# -- DNS rebinding -----------------------------------------------------------------------------------


async def test_local_http_refuses_a_foreign_host_or_origin(tmp_path: Path) -> None:
    async with serve_http("tests/hardening/target.py", journal=f"sqlite:///{tmp_path}/journal.db") as served:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            local = await http.post(served.url, json=INITIALIZE, headers=JSON_HEADERS)
            foreign_host = await http.post(
                served.url, json=INITIALIZE, headers={**JSON_HEADERS, "Host": f"evil.example:{served.port}"}
            )
            foreign_origin = await http.post(
                served.url, json=INITIALIZE, headers={**JSON_HEADERS, "Origin": "http://evil.example"}
            )
    assert local.status_code == 200
    assert foreign_host.status_code == 421, foreign_host.text
    assert foreign_origin.status_code == 403, foreign_origin.text
