"""`PgSubscriptionBus`: resource change events cross replicas through Postgres LISTEN/NOTIFY."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated, ServerEvent, ToolsListChanged

from mcp_durable.server.pgbus import PgSubscriptionBus, decode_event, encode_event
from mcp_durable.server.ports import ScopedSubscriptionBus
from tests.conftest import scratch_postgres_url
from tests.helpers import key_meta, serve_http

pytestmark = pytest.mark.postgres


@pytest.fixture
def bus_url() -> str:
    return scratch_postgres_url()


def test_events_survive_their_notify_payload() -> None:
    for event in (ResourceUpdated(uri="journal://calls/refund/k%201"), ToolsListChanged()):
        assert decode_event(encode_event("me", event)) == ("me", event, None)
        assert decode_event(encode_event("me", event, "alice")) == ("me", event, "alice")
    assert decode_event("not json") is None and decode_event('{"t": "unknown", "o": "x"}') is None


def test_the_bus_is_a_scoped_bus_and_the_sdks_is_not(bus_url: str) -> None:
    """What makes `DurableServer` forward record changes across replicas through it."""
    assert isinstance(PgSubscriptionBus(bus_url), ScopedSubscriptionBus)
    assert not isinstance(InMemorySubscriptionBus(), ScopedSubscriptionBus)


async def test_scoped_events_reach_only_scoped_listeners_of_other_replicas(bus_url: str) -> None:
    plain: list[ServerEvent] = []
    scoped: list[tuple[ServerEvent, str]] = []
    async with PgSubscriptionBus(bus_url) as a, PgSubscriptionBus(bus_url) as b:
        a.subscribe(plain.append)
        a.subscribe_scoped(lambda event, principal: scoped.append((event, principal)))
        b.subscribe(plain.append)
        b.subscribe_scoped(lambda event, principal: scoped.append((event, principal)))
        b.forward(ResourceUpdated(uri="journal://calls/refund/alice-1"), principal="alice")
        b.forward(ResourceUpdated(uri="journal://stats"))  # unscoped: every listener of a
        with anyio.fail_after(10):
            while not (scoped and plain):
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)  # anything else (an echo to b, a leak to plain) would be here by now
    assert scoped == [(ResourceUpdated(uri="journal://calls/refund/alice-1"), "alice")]
    assert plain == [ResourceUpdated(uri="journal://stats")]


async def test_two_buses_on_two_connections_deliver_each_others_events_once(bus_url: str) -> None:
    heard: dict[str, list[ServerEvent]] = {"a": [], "b": []}
    async with PgSubscriptionBus(bus_url) as a, PgSubscriptionBus(bus_url) as b:
        a.subscribe(heard["a"].append)
        b.subscribe(heard["b"].append)
        await a.publish(ResourceUpdated(uri="journal://calls/refund/from-a"))
        await b.publish(ResourceUpdated(uri="journal://calls/refund/from-b"))
        await b.publish(ToolsListChanged())
        with anyio.fail_after(10):
            while len(heard["a"]) < 3 or len(heard["b"]) < 3:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)  # an echo of a bus's own event would arrive by now
    expected = [
        ResourceUpdated(uri="journal://calls/refund/from-a"),
        ResourceUpdated(uri="journal://calls/refund/from-b"),
        ToolsListChanged(),
    ]
    # Each bus hears every event exactly once; the order across publishers is not guaranteed.
    assert sorted(map(repr, heard["a"])) == sorted(map(repr, expected))
    assert sorted(map(repr, heard["b"])) == sorted(map(repr, expected))


async def test_buses_on_other_schemas_do_not_hear_each_other(bus_url: str) -> None:
    heard: list[ServerEvent] = []
    other = scratch_postgres_url()
    async with PgSubscriptionBus(bus_url) as a, PgSubscriptionBus(other) as b, PgSubscriptionBus(bus_url) as c:
        b.subscribe(heard.append)
        c.subscribe(heard.append)
        await a.publish(ResourceUpdated(uri="journal://stats"))
        with anyio.fail_after(10):
            while not heard:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)
    assert heard == [ResourceUpdated(uri="journal://stats")]  # c heard it, b did not


async def test_a_client_listening_on_one_replica_hears_of_a_call_completed_on_another(
    replicas_journal: str,
) -> None:
    journal = replicas_journal
    target = "tests/crash/servers/bus_replica.py"
    uri = "journal://calls/refund/order-9"
    env = {"MCP_DURABLE_JOURNAL": journal}  # the bus (built at import) reads the database from it
    async with serve_http(target, journal=journal, env=env) as a, serve_http(target, journal=journal, env=env) as b:
        async with Client(a.url) as listener, Client(b.url) as caller:
            async with listener.listen(resource_subscriptions=[uri]) as subscription:
                result = await caller.call_tool(
                    "refund", {"order_id": "O-9", "amount_cents": 900}, meta=key_meta("order-9")
                )
                assert not result.is_error
                with anyio.fail_after(10):
                    event = await subscription.__anext__()
    assert event == ResourceUpdated(uri=uri)


def test_a_bus_can_be_started_again_on_another_event_loop(bus_url: str) -> None:
    bus = PgSubscriptionBus(bus_url)
    heard: list[ServerEvent] = []
    bus.subscribe(heard.append)

    async def round_trip(uri: str) -> None:
        async with bus, PgSubscriptionBus(bus_url) as other:
            await other.publish(ResourceUpdated(uri=uri))
            with anyio.fail_after(10):
                while ResourceUpdated(uri=uri) not in heard:
                    await anyio.sleep(0.01)

    anyio.run(round_trip, "journal://stats")  # a server run, stopped …
    anyio.run(round_trip, "journal://in-doubt")  # … and run again in a new loop
