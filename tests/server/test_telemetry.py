"""OpenTelemetry: the SDK's `tools/call` span carries the durable outcome; child spans and metrics follow.

Spans come from the OpenTelemetry SDK's in-memory exporter on the global tracer provider (the MCP
SDK's own `tools/call` span is made there), metrics from an in-memory reader. Every outcome is
checked in both protocol eras: a run, a replay, a wait (a duplicate latched on to a running call),
an in-doubt call and refusals.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.journal import CallQuery
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState
from mcp_durable.keys import canonical_json, fingerprint
from mcp_durable.operations.telemetry import Telemetry
from tests.helpers import key_meta

MODES = ["legacy", "auto"]
EXPORTER = InMemorySpanExporter()


class Switched(SpanProcessor):
    """Exports spans only while a test of this module runs (the provider is process-global)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)


_SWITCH = Switched(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SWITCH)
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    _SWITCH.on = True
    try:
        yield EXPORTER
    finally:
        _SWITCH.on = False
        EXPORTER.clear()


class WatchedJournal(FileJournal):
    """The file journal, telling the test when a call starts waiting for a duplicate in flight."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.waiting = anyio.Event()

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        self.waiting.set()
        await super().wait_for_change(identity, timeout)


def make_server(tmp_path: Path, reader: InMemoryMetricReader) -> tuple[DurableServer, WatchedJournal, anyio.Event]:
    journal = WatchedJournal(tmp_path / "journal")
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    server = DurableServer("otel", journal=journal, telemetry=telemetry)
    release = anyio.Event()

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        call = current_call()
        first = await call.step("reserve", lambda: f"r-{order_id}")
        second = await call.step("charge", lambda: amount_cents)
        return {"order_id": order_id, "steps": [first, second]}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def slow(order_id: str) -> str:
        await release.wait()
        return f"done {order_id}"

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), in_doubt="refuse"))
    async def ship(order_id: str) -> str:
        return f"shipped {order_id}"

    @server.tool(durable=ToolPolicy(key="required"))
    async def email(to: str) -> str:
        return f"sent to {to}"

    return server, journal, release


async def orphan(journal: WatchedJournal, tool: str, arguments: dict[str, Any], key: str) -> None:
    """A PENDING record whose owner died inside the call, as a SIGKILLed server leaves it."""
    now = time.time()
    record = CallRecord(
        identity=CallIdentity("local", tool, key),
        fingerprint=fingerprint(arguments),
        state=CallState.PENDING,
        version=1,
        run_id="dead-run",
        attempts=1,
        created_at=now - 60,
        updated_at=now - 60,
        owner="a-dead-instance",
        lease_until=now - 30,
        arguments=canonical_json(arguments),
    )
    assert (await journal.claim(record, now))[0]


def call_spans(exporter: InMemorySpanExporter, tool: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"tools/call {tool}"]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[str]:
    assert parent.context is not None
    return [
        s.name
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def calls_counted(reader: InMemoryMetricReader) -> dict[tuple[str, str, str | None], int]:
    return {
        (p.attributes["tool"], p.attributes["outcome"], p.attributes.get("error_code")): p.value
        for p in points(reader, "mcp_durable.calls")
    }


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k.startswith("mcp_durable.")}


@pytest.mark.parametrize("mode", MODES)
async def test_a_run_and_its_replay_mark_the_sdk_span_with_child_spans_for_claim_steps_and_persist(
    mode: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    server, _, _ = make_server(tmp_path, reader)
    async with Client(server, mode=mode) as client:
        first = await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 500})
        again = await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 500})
    assert not first.is_error and not again.is_error
    ran, replayed = call_spans(spans, "refund")
    key_hash = hashlib.sha256(b"O-1").hexdigest()[:32]
    assert attrs(ran) == {
        "mcp_durable.tool": "refund",
        "mcp_durable.principal": "local",
        "mcp_durable.outcome": "ran",
        "mcp_durable.attempt": 1,
        "mcp_durable.state": "completed",
        "mcp_durable.key_hash": key_hash,
    }
    assert attrs(replayed)["mcp_durable.outcome"] == "replayed"
    assert attrs(replayed)["mcp_durable.key_hash"] == key_hash
    assert "O-1" not in str(ran.attributes) + str(replayed.attributes)  # the key only as a hash
    assert children(spans, ran) == ["durable.claim", "durable.step", "durable.step", "durable.persist"]
    steps = [s for s in spans.get_finished_spans() if s.name == "durable.step"]
    assert [(s.attributes or {}).get("mcp_durable.step") for s in steps] == ["reserve", "charge"]
    assert children(spans, replayed) == []  # answered from the journal: no claim, no persist
    assert calls_counted(reader) == {("refund", "ran", None): 1, ("refund", "replayed", None): 1}
    commits = points(reader, "mcp_durable.journal.commit.batch_size")
    assert commits and sum(p.count for p in commits) >= 3  # claim, two steps, persist (and the lifecycle)
    assert sum(p.count for p in points(reader, "mcp_durable.journal.commit.duration")) == sum(p.count for p in commits)


@pytest.mark.parametrize("mode", MODES)
async def test_a_duplicate_that_latched_on_to_a_running_call_is_marked_waited(
    mode: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    server, journal, release = make_server(tmp_path, reader)
    results: list[Any] = []
    async with Client(server, mode=mode) as client, anyio.create_task_group() as group:

        async def call() -> None:
            results.append(await client.call_tool("slow", {"order_id": "O-2"}))

        group.start_soon(call)
        with anyio.fail_after(10):
            while not (await journal.list_calls(CallQuery(tool="slow"))):
                await anyio.sleep(0.01)
        group.start_soon(call)
        with anyio.fail_after(10):
            await journal.waiting.wait()
        release.set()
    assert [r.structured_content for r in results] == [{"result": "done O-2"}] * 2
    outcomes = sorted(attrs(s)["mcp_durable.outcome"] for s in call_spans(spans, "slow"))
    assert outcomes == ["ran", "waited"]
    [waited] = [s for s in call_spans(spans, "slow") if attrs(s)["mcp_durable.outcome"] == "waited"]
    assert attrs(waited)["mcp_durable.waited"] is True
    assert calls_counted(reader) == {("slow", "ran", None): 1, ("slow", "waited", None): 1}


@pytest.mark.parametrize("mode", MODES)
async def test_an_in_doubt_call_and_refusals_carry_their_codes_and_the_gauge_counts_the_call_in_doubt(
    mode: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    server, journal, _ = make_server(tmp_path, reader)
    async with Client(server, mode=mode) as client:
        await orphan(journal, "ship", {"order_id": "O-3"}, "O-3")
        doubted = await client.call_tool("ship", {"order_id": "O-3"})
        refused_again = await client.call_tool("ship", {"order_id": "O-3"})
        missing = await client.call_tool("email", {"to": "a@example.com"})
        await client.call_tool("refund", {"order_id": "O-4", "amount_cents": 1}, meta=key_meta("k-1"))
        reused = await client.call_tool("refund", {"order_id": "O-5", "amount_cents": 2}, meta=key_meta("k-1"))
        [gauge] = points(reader, "mcp_durable.calls.in_doubt")
        assert gauge.value == 1
    assert doubted.is_error and refused_again.is_error and missing.is_error and reused.is_error
    first, second = call_spans(spans, "ship")
    for span in (first, second):
        assert attrs(span)["mcp_durable.outcome"] == "in_doubt"
        assert attrs(span)["mcp_durable.error_code"] == "in_doubt"
        assert attrs(span)["mcp_durable.state"] == "in_doubt"
    assert attrs(first)["mcp_durable.attempt"] == 1 and "mcp_durable.waited" not in attrs(first)
    [email] = call_spans(spans, "email")
    assert (attrs(email)["mcp_durable.outcome"], attrs(email)["mcp_durable.error_code"]) == ("refused", "missing_key")
    refused = [s for s in call_spans(spans, "refund") if attrs(s)["mcp_durable.outcome"] == "refused"]
    assert [attrs(s)["mcp_durable.error_code"] for s in refused] == ["key_reuse"]
    assert attrs(refused[0])["mcp_durable.key_hash"] == hashlib.sha256(b"k-1").hexdigest()[:32]
    assert calls_counted(reader) == {
        ("ship", "in_doubt", "in_doubt"): 2,
        ("email", "refused", "missing_key"): 1,
        ("refund", "ran", None): 1,
        ("refund", "refused", "key_reuse"): 1,
    }


async def test_keys_are_recorded_in_clear_only_when_configured_the_default_hashes_them_and_false_emits_nothing(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    server = DurableServer("otel", journal="memory://", telemetry=Telemetry(record_keys=True))
    default = DurableServer("default", journal="memory://")  # the global providers this module set up
    off = DurableServer("off", journal="memory://", telemetry=False)

    def lookup(order_id: str) -> str:
        return order_id

    for each in (server, default, off):
        each.add_tool(lookup, durable=ToolPolicy(key_fields=("order_id",)))
        async with Client(each) as client:
            await client.call_tool("lookup", {"order_id": "O-9"})
    with_telemetry, by_default, without = call_spans(spans, "lookup")
    assert attrs(with_telemetry)["mcp_durable.key"] == "O-9"
    assert attrs(by_default)["mcp_durable.key_hash"] == hashlib.sha256(b"O-9").hexdigest()[:32]
    assert attrs(by_default)["mcp_durable.outcome"] == "ran" and "O-9" not in str(by_default.attributes)
    assert off.telemetry is None and attrs(without) == {}
    assert without.context is not None
    assert not [
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("durable.") and s.parent is not None and s.parent.span_id == without.context.span_id
    ]


async def test_a_lease_renewal_that_finds_the_call_taken_from_its_owner_is_counted(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    server = DurableServer("otel", journal="memory://", telemetry=telemetry)
    started, release = anyio.Event(), anyio.Event()

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), lease=0.3))
    async def hold(order_id: str) -> str:
        started.set()
        await release.wait()
        return order_id

    async with Client(server) as client, anyio.create_task_group() as group:
        group.start_soon(client.call_tool, "hold", {"order_id": "O-8"})
        await started.wait()
        identity = CallIdentity("local", "hold", "O-8")
        record = await server.journal.get(identity)
        assert record is not None
        # Another party moves the record on (as a replica taking over a lease it saw lapse would).
        assert await server.journal.swap(record.version, record.evolve(state=CallState.IN_DOUBT, owner=None))
        with anyio.fail_after(30):
            while not points(reader, "mcp_durable.lease.renewals_failed"):
                await anyio.sleep(0.05)
        release.set()
    [failed] = points(reader, "mcp_durable.lease.renewals_failed")
    assert failed.value >= 1 and failed.attributes == {"backend": "memory"}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_group_commits_of_sqlite_and_postgres_are_measured_with_their_batch_size(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    from tests.conftest import scratch_postgres_url

    url = f"sqlite:///{tmp_path}/journal.db" if kind == "sqlite" else scratch_postgres_url()
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    server = DurableServer("otel", journal=url, telemetry=telemetry)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def refund(order_id: str) -> str:
        return order_id

    async with Client(server) as client, anyio.create_task_group() as group:
        for i in range(8):  # concurrent calls: their writes share commits
            group.start_soon(client.call_tool, "refund", {"order_id": f"O-{i}"})
    [sizes] = points(reader, "mcp_durable.journal.commit.batch_size")
    [durations] = points(reader, "mcp_durable.journal.commit.duration")
    assert sizes.attributes == {"backend": kind} and durations.attributes == {"backend": kind}
    assert sizes.count == durations.count >= 1 and sizes.sum >= 16  # a claim and a persist per call


async def test_the_in_doubt_gauge_falls_to_zero_by_itself_when_background_recovery_reconciles(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    asked: list[str] = []
    downstream_up = anyio.Event()

    async def found(key: str, arguments: Any) -> Any:
        asked.append(key)
        if not downstream_up.is_set():
            raise ConnectionError("the carrier's API is down")  # the call stays in doubt
        return f"shipped {arguments['order_id']}"

    server = DurableServer(
        "otel",
        journal=f"sqlite:///{tmp_path}/journal.db",
        reconcile_interval=0.2,
        telemetry=Telemetry(meter_provider=MeterProvider(metric_readers=[reader])),
    )

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), reconcile=found))
    async def ship(order_id: str) -> str:
        raise AssertionError("not reached: the hook finds the effect")

    identity = CallIdentity("local", "ship", "O-9")
    await server.engine.start()
    now = time.time()
    planted = CallRecord(
        identity=identity,
        fingerprint=fingerprint({"order_id": "O-9"}),
        state=CallState.IN_DOUBT,
        version=1,
        run_id="dead-run",
        attempts=1,
        created_at=now,
        updated_at=now,
        arguments=canonical_json({"order_id": "O-9"}),
    )
    assert (await server.journal.claim(planted, now))[0]
    async with Client(server):  # no call for the key: the server's background recovery decides it
        with anyio.fail_after(30):  # a bound on a hang, never a timing assertion
            while not asked or (await server.journal.get(identity)).state != CallState.IN_DOUBT:  # type: ignore[union-attr]
                await anyio.sleep(0.05)
        [gauge] = points(reader, "mcp_durable.calls.in_doubt")
        assert gauge.value == 1  # the hook could not tell yet
        downstream_up.set()
        with anyio.fail_after(30):
            while (await server.journal.get(identity)).state != CallState.COMPLETED:  # type: ignore[union-attr]
                await anyio.sleep(0.05)
        [gauge] = points(reader, "mcp_durable.calls.in_doubt")
        assert gauge.value == 0
