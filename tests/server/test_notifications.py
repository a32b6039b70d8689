"""A client subscribed to a call's record and to `journal://stats` hears of the call completing:
2026-07-28 through `subscriptions/listen`, 2025-11-25 through `resources/subscribe`, in memory and
over streamable HTTP."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client
from mcp_types import ResourceUpdatedNotification

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.uris import record_uri
from tests.helpers import request_meta, resource_text, serve_app

# resources/subscribe is the 2025-11-25 mechanism under test, deprecated only for the new era.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
WAIT = 20.0  # a bound on a hang, not a timed assertion
KEY = "n/1"
URI = record_uri("ship", KEY)


def build(journal: str = "memory://") -> DurableServer:
    server = DurableServer("notify", journal=journal)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def ship(order_id: str) -> dict[str, Any]:
        return {"shipped": order_id, "run": uuid.uuid4().hex}

    return server


async def state_of(client: Client) -> str:
    result = await client.read_resource(URI)
    return str(orjson.loads(resource_text(result))["state"])


async def listen_and_call(client: Client) -> set[str]:
    seen: set[str] = set()
    async with client.listen(resource_subscriptions=[URI, "journal://stats"]) as subscription:
        result = await client.call_tool("ship", {"order_id": KEY})
        assert not result.is_error
        with anyio.fail_after(WAIT):
            async for event in subscription:
                seen.add(event.uri)  # type: ignore[union-attr]
                if seen == {URI, "journal://stats"}:
                    break
    return seen


async def subscribe_and_call(client: Client, updates: list[str], arrived: anyio.Event) -> None:
    await client.session.subscribe_resource(URI)
    await client.session.subscribe_resource("journal://stats")
    result = await client.call_tool("ship", {"order_id": KEY})
    assert not result.is_error
    with anyio.fail_after(WAIT):
        await arrived.wait()
    assert set(updates) == {URI, "journal://stats"}


def collector() -> tuple[list[str], anyio.Event, Any]:
    updates: list[str] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            updates.append(message.params.uri)
            if {URI, "journal://stats"} <= set(updates):
                arrived.set()

    return updates, arrived, on_message


async def test_a_listening_client_hears_its_call_complete_in_the_2026_era() -> None:
    server = build()
    async with Client(server) as client:
        assert await listen_and_call(client) == {URI, "journal://stats"}
        assert await state_of(client) == "completed"


async def test_a_subscribed_client_hears_its_call_complete_in_the_2025_era() -> None:
    server = build()
    updates, arrived, on_message = collector()
    async with Client(server, mode="legacy", message_handler=on_message) as client:
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe is True
        await subscribe_and_call(client, updates, arrived)
        assert await state_of(client) == "completed"


async def test_an_unsubscribed_client_is_not_told_again() -> None:
    server = build()
    updates, arrived, on_message = collector()
    other = record_uri("ship", "n/2")
    async with Client(server, mode="legacy", message_handler=on_message) as client:
        await subscribe_and_call(client, updates, arrived)
        await client.session.unsubscribe_resource("journal://stats")
        await client.session.subscribe_resource(other)
        stats_before = updates.count("journal://stats")
        await client.call_tool("ship", {"order_id": "n/2"})  # changes its record and the stats, twice
        with anyio.fail_after(WAIT):
            # Each change announces the record, then the stats: once the record's second
            # announcement is here, a stats announcement of the first change would be too.
            while updates.count(other) < 2:
                await anyio.sleep(0.01)
        assert updates.count("journal://stats") == stats_before


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_a_subscribed_client_hears_its_call_complete(mode: str, tmp_path: Path) -> None:
    server = build(f"sqlite:///{tmp_path}/j.db?synchronous=NORMAL")
    app = server.streamable_http_app(streamable_http_path="/mcp")
    async with serve_app(app) as base:
        if mode == "auto":
            async with Client(f"{base}/mcp") as client:
                assert await listen_and_call(client) == {URI, "journal://stats"}
                assert await state_of(client) == "completed"
        else:
            updates, arrived, on_message = collector()
            async with Client(f"{base}/mcp", mode="legacy", message_handler=on_message) as client:
                await subscribe_and_call(client, updates, arrived)
                assert await state_of(client) == "completed"


async def test_with_subscribers_in_both_eras_concurrent_duplicates_still_run_the_tool_once() -> None:
    runs: list[str] = []
    server = DurableServer("notify", journal="memory://")

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("order_id",)))
    async def ship(order_id: str) -> dict[str, Any]:
        runs.append(order_id)
        await anyio.sleep(0.05)
        return {"shipped": order_id}

    _, _, on_message = collector()
    async with Client(server, mode="legacy", message_handler=on_message) as legacy, Client(server) as modern:
        await legacy.session.subscribe_resource("journal://stats")
        await legacy.session.subscribe_resource(URI)
        async with modern.listen(resource_subscriptions=[URI, "journal://stats"]):
            results: list[Any] = []

            async def one(client: Client) -> None:
                results.append(await client.call_tool("ship", {"order_id": KEY}))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, legacy if i % 2 else modern)
    assert runs == [KEY]
    assert all(not r.is_error and r.structured_content == {"shipped": KEY} for r in results)


def _principal_from_meta(context: Any) -> str:
    """Test identities without HTTP: the principal named in the request's `_meta["as"]`."""
    meta = getattr(getattr(context, "request_context", None), "meta", None) or {}
    return str(meta.get("as", "local"))


async def test_a_principal_is_not_told_of_changes_to_another_principals_record_with_the_same_key() -> None:
    server = DurableServer("notify", journal="memory://", principal=_principal_from_meta)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def ship(order_id: str) -> dict[str, Any]:
        return {"shipped": order_id}

    fence = record_uri("ship", "fence")
    updates, _, on_message = collector()
    async with Client(server, mode="legacy", message_handler=on_message) as alice, Client(server) as bob:
        for uri in (URI, fence):
            await alice.session.subscribe_resource(uri, meta=request_meta({"as": "alice"}))
        await bob.call_tool("ship", {"order_id": KEY}, meta=request_meta({"as": "bob"}))  # bob's record, same URI
        await alice.call_tool("ship", {"order_id": KEY}, meta=request_meta({"as": "alice"}))  # claimed and completed
        await alice.call_tool("ship", {"order_id": "fence"}, meta=request_meta({"as": "alice"}))
        with anyio.fail_after(WAIT):
            # Announcements reach a connection in the order the changes happened: once the
            # fence's are here, any announcement of bob's earlier changes would be too.
            while updates.count(fence) < 2:
                await anyio.sleep(0.01)
    assert updates.count(URI) == 2  # alice's claim and completion; nothing of bob's
