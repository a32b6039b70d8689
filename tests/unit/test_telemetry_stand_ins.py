"""What `Instruments.observing` takes for "OpenTelemetry not set up": the API's own providers
(its no-op ones and the stand-ins it answers with until the application sets one), never an
SDK's — else a configured application would lose its spans and counts."""

from __future__ import annotations

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_durable.operations.telemetry import Instruments, api_stand_in


def test_the_apis_providers_are_stand_ins_an_sdks_are_not() -> None:
    assert api_stand_in(trace.NoOpTracerProvider())
    assert api_stand_in(trace.ProxyTracerProvider())
    assert api_stand_in(metrics.NoOpMeterProvider())
    assert not api_stand_in(TracerProvider())
    assert not api_stand_in(MeterProvider())


def test_given_providers_always_observe() -> None:
    # Providers passed in report whatever the global ones are (no question asked of the API).
    assert Instruments(TracerProvider(), None).observing()
    assert Instruments(None, MeterProvider()).observing()
