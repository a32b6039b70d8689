"""An application that configures OpenTelemetry globally, run in a process of its own by
tests/server/test_telemetry_global.py (the global providers can be set once per process).

    python -m tests.server.otel_global configured|late TMPDIR

Servers are built without `telemetry=`, as a library's user builds them; the OpenTelemetry SDK is
set up on the global providers with an in-memory span exporter and metric reader, and the calls
go through real MCP clients. The last line printed is a JSON report: the spans (name, kind,
parent, the `mcp_durable.*` attributes), the `mcp_durable.calls` counts, the in-doubt gauge, the
journal commits measured and the warnings OpenTelemetry logged.

- `configured`: server `a` is built before OpenTelemetry is set up (its module imported first)
  and served over streamable HTTP (2025-11-25 client); `b` is built after and reached in memory
  (2026-07-28); `off` has `telemetry=False`. Each journal holds one call in doubt.
- `late`: one server, called before OpenTelemetry is set up and again after (once the quiet
  server has asked the API again).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState
from mcp_durable.keys import canonical_json, fingerprint
from mcp_durable.operations.telemetry import QUIET_RECHECK_S
from tests.helpers import key_meta, serve_app


class Logged(logging.Handler):
    """OpenTelemetry's warnings (a duplicate instrument, a provider set twice)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


LOGGED = Logged()
logging.getLogger("opentelemetry").addHandler(LOGGED)


def configure() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """What an application (or `opentelemetry-instrument`) does at start: the global providers."""
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracing)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, reader


def build(name: str, journal: str, **options: Any) -> DurableServer:
    server = DurableServer(name, journal=journal, **options)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        call = current_call()
        reserved = await call.step("reserve", lambda: f"r-{order_id}")
        charged = await call.step("charge", lambda: amount_cents)
        return {"order_id": order_id, "steps": [reserved, charged]}

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), in_doubt="refuse"))
    async def ship(order_id: str) -> str:
        return f"shipped {order_id}"

    return server


async def plant_in_doubt(server: DurableServer, order_id: str) -> None:
    """A `ship` call left in doubt (as a crash mid-call leaves it for an operator)."""
    await server.engine.start()
    now = time.time()
    arguments = {"order_id": order_id}
    record = CallRecord(
        identity=CallIdentity("local", "ship", order_id),
        fingerprint=fingerprint(arguments),
        state=CallState.IN_DOUBT,
        version=1,
        run_id="dead-run",
        attempts=1,
        created_at=now,
        updated_at=now,
        arguments=canonical_json(arguments),
    )
    assert (await server.journal.claim(record, now))[0]


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points of metric `name` the reader collects now."""
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


def report(exporter: InMemorySpanExporter, reader: InMemoryMetricReader, **extra: Any) -> dict[str, Any]:
    spans = [
        {
            "name": s.name,
            "kind": s.kind.name,
            "id": s.context.span_id if s.context is not None else None,
            "parent": s.parent.span_id if s.parent is not None else None,
            "attributes": {k: v for k, v in (s.attributes or {}).items() if k.startswith("mcp_durable.")},
        }
        for s in exporter.get_finished_spans()
    ]
    calls = [
        [p.attributes["tool"], p.attributes["outcome"], p.attributes.get("error_code"), p.value]
        for p in points(reader, "mcp_durable.calls")
    ]
    return {
        "spans": spans,
        "calls": sorted(calls, key=str),
        "commits": sum(p.count for p in points(reader, "mcp_durable.journal.commit.batch_size")),
        "warnings": LOGGED.messages,
        **extra,
    }


async def configured(tmp: Path) -> dict[str, Any]:
    a = build("a", f"sqlite:///{tmp}/a.db")
    exporter, reader = configure()
    b = build("b", f"file://{tmp}/b")
    off = build("off", "memory://", telemetry=False)
    await plant_in_doubt(a, "O-3")
    await plant_in_doubt(b, "O-4")
    order = {"order_id": "O-1", "amount_cents": 500}
    async with (
        serve_app(a.streamable_http_app()) as url,
        Client(f"{url}/mcp", mode="legacy") as over_http,
        Client(b, mode="auto") as in_memory,
        Client(off) as unobserved,
    ):
        answers = [
            await over_http.call_tool("refund", order),
            await over_http.call_tool("refund", order),
            await over_http.call_tool("refund", {"order_id": "O-2", "amount_cents": 1}, meta=key_meta("O-1")),
            await over_http.call_tool("ship", {"order_id": "O-3"}),
            await in_memory.call_tool("refund", {"order_id": "O-5", "amount_cents": 7}),
            await unobserved.call_tool("refund", {"order_id": "O-6", "amount_cents": 9}),
        ]
        gauge = [p.value for p in points(reader, "mcp_durable.calls.in_doubt")]  # while all three are served
    return report(exporter, reader, errors=[bool(r.is_error) for r in answers], in_doubt=gauge)


async def late(tmp: Path) -> dict[str, Any]:
    server = build("late", "memory://")
    async with Client(server) as client:
        before = await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 1})
        exporter, reader = configure()
        # A server already serving when the providers are set asks the API again within
        # QUIET_RECHECK_S (docs/telemetry.md): waited out, not timed.
        await anyio.sleep(QUIET_RECHECK_S + 0.05)
        after = [
            await client.call_tool("refund", {"order_id": "O-2", "amount_cents": 2}),
            await client.call_tool("refund", {"order_id": "O-1", "amount_cents": 1}),
        ]
    return report(
        exporter,
        reader,
        before=before.structured_content,
        errors=[bool(r.is_error) for r in [before, *after]],
        observed=server.telemetry is not None,
    )


def main() -> None:
    scenario, tmp = sys.argv[1], Path(sys.argv[2])
    run = {"configured": configured, "late": late}[scenario]
    print(json.dumps(anyio.run(run, tmp)))


if __name__ == "__main__":
    main()
