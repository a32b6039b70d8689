"""OpenTelemetry set up from the standard `OTEL_*` environment, for `mcp-durable serve` and `proxy`.

The library never sets the global providers (an application or `opentelemetry-instrument` does);
the command line owns its process, so it sets them up as `opentelemetry-instrument` would, when
the user asks for it through the standard variables and the OpenTelemetry SDK is installed
(`pip install 'mcp-durable[otel]'`). `configure_from_environment` decides and does it:

- nothing when `OTEL_SDK_DISABLED` is true, or when none of `OTEL_TRACES_EXPORTER`,
  `OTEL_METRICS_EXPORTER`, `OTEL_LOGS_EXPORTER` or an OTLP endpoint
  (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`) is set;
- nothing when a global tracer or meter provider is set already (the process runs under
  `opentelemetry-instrument`, or the served module set its own): the first setup stands;
- otherwise the SDK's own configuration from the environment (the configurator that
  `opentelemetry-distro` subclasses: exporters, sampler, resource, `OTEL_SERVICE_NAME`, …), with
  three choices of ours: an OTLP endpoint set makes `otlp` the exporter of a signal whose
  exporter variable is unset (the specification's default; the SDK's own is none); the console
  span exporter exports each span as it ends (the others in batches); over stdio the console
  exporters write to stderr, as stdout carries the protocol.

Set up here, the providers are also flushed when a server stops serving (`flush`): the SDK flushes
them at the interpreter's exit, which a server stopped by SIGTERM never reaches (uvicorn re-raises
the signal once it has shut down gracefully), so the last batch of spans and the metrics since
the last periodic export would be lost.

What the SDK's configuration cannot do (an exporter not installed, a bad value) fails open, as
under `opentelemetry-instrument`: one line on stderr and the server serves without exporting.

The SDK offers this configuration only through private names (`opentelemetry.sdk._configuration`);
they are used here and nowhere else, each named in `INTERNALS`, and
tests/cli/test_otel_environment.py fails, naming the internal, when an SDK release changes one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ENDPOINTS",
    "EXPORTERS",
    "INTERNALS",
    "configure_from_environment",
    "configured",
    "configured_exporters",
    "flush",
    "requested",
]

#: The exporter variables, by signal: any of them set asks for OpenTelemetry (`none` included).
EXPORTERS: Mapping[str, str] = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}
#: The OTLP endpoint variables that ask for OpenTelemetry, by the signal they make `otlp` for.
ENDPOINTS: Mapping[str, tuple[str, ...]] = {
    "traces": ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    "metrics": ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
}
SDK_DISABLED = "OTEL_SDK_DISABLED"
#: The SDK's entry-point names for `otlp` by protocol (`OTEL_EXPORTER_OTLP[_SIGNAL]_PROTOCOL`);
#: without a protocol the SDK means gRPC by `otlp`, and so do we.
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
#: Where the variables name an exporter that is not installed: the hint printed with the failure.
_EXPORTER_HINT = "the OTLP exporters: pip install opentelemetry-exporter-otlp"

#: Whether this process's global providers were set up here (set once, by the command's main thread).
_configured = False

#: Each private name of OpenTelemetry used, with why (checked by tests/cli/test_otel_environment.py).
INTERNALS: Mapping[str, str] = {
    "opentelemetry.sdk._configuration._OTelSDKConfigurator": (
        "the SDK's configuration from the `OTEL_*` variables, the one `opentelemetry-instrument` runs "
        "through a distro; the SDK has no public entry point for it, and says to subclass it; its "
        "`configure` takes `exporter_args_map` and `export_span_processor` (SDK 1.40)"
    ),
    "opentelemetry.metrics._internal._ProxyMeterProvider": (
        "the meter provider's stand-in until one is set, to leave a provider set before us alone; "
        "the API exports `ProxyTracerProvider` for traces but nothing for metrics"
    ),
    "opentelemetry.sdk._logs.export.ConsoleLogRecordExporter": (
        "the logs console exporter, sent to stderr over stdio; the logs SDK is private as a whole"
    ),
}


def requested(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for OpenTelemetry (see the module docstring)."""
    if environ.get(SDK_DISABLED, "").strip().lower() == "true":
        return False
    names = [*EXPORTERS.values(), *(name for names in ENDPOINTS.values() for name in names)]
    return any(environ.get(name, "").strip() for name in names)


def configure_from_environment(environ: Mapping[str, str], *, stdio: bool) -> str | None:
    """Set the global providers up from `environ` if it asks for it; returns the line to print
    (what was set up, or why not), None when it did not ask.

    `stdio`: the server's stdout carries the protocol, so the console exporters write to stderr.
    The SDK itself reads the process's environment: `environ` is that environment (a copy).
    """
    if not requested(environ):
        return None
    try:
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator
    except ImportError:
        return "mcp-durable: OTEL_* is set, but the OpenTelemetry SDK is not installed: pip install 'mcp-durable[otel]'"
    if _providers_set():
        return None  # opentelemetry-instrument, or the served module, set OpenTelemetry up already

    class Configurator(_OTelSDKConfigurator):
        """The SDK's configurator, subclassed as its docstring asks a distro to (it is a singleton)."""

    names = configured_exporters(environ)
    try:
        Configurator().configure(  # type: ignore[no-untyped-call] # the SDK leaves it unannotated
            trace_exporter_names=names["traces"],
            metric_exporter_names=names["metrics"],
            exporter_args_map=_console_to_stderr() if stdio else None,
            export_span_processor=_span_processor,
        )
    except Exception as exc:  # noqa: BLE001 - fails open, as opentelemetry-instrument's start-up does
        _note_configured()  # a provider the SDK set before it failed is still flushed
        # The SDK raises RuntimeError for an exporter (or other component) it cannot find.
        hint = f" ({_EXPORTER_HINT})" if isinstance(exc, RuntimeError) else ""
        return f"mcp-durable: OpenTelemetry not set up from OTEL_*: {exc}{hint}"
    _note_configured()
    return f"mcp-durable: OpenTelemetry set up from OTEL_* ({_describe(environ, names)})"


def _note_configured() -> None:
    global _configured
    _configured = _providers_set()


def configured() -> bool:
    """Whether `configure_from_environment` set the global providers up in this process."""
    return _configured


def flush() -> None:
    """Export what the providers set up here hold (spans not yet sent, the metrics now); nothing
    if they were not set up here. The SDK's exit hook still shuts them down at a normal exit."""
    if not _configured:
        return
    from opentelemetry import metrics, trace

    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        force_flush = getattr(provider, "force_flush", None)  # the SDK's providers have it
        if force_flush is not None:
            force_flush()


def _providers_set() -> bool:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    unset = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and isinstance(
        metrics.get_meter_provider(), _ProxyMeterProvider
    )
    return not unset


def configured_exporters(environ: Mapping[str, str]) -> dict[str, list[str]]:
    """The exporters (the SDK's entry-point names) handed to the SDK by signal, besides those its
    own variables name: `otlp` for a signal with an OTLP endpoint and no exporter variable."""
    return {signal: _otlp_by_default(environ, signal) for signal in ENDPOINTS}


def _otlp_by_default(environ: Mapping[str, str], signal: str) -> list[str]:
    if environ.get(EXPORTERS[signal], "").strip() or not any(environ.get(name) for name in ENDPOINTS[signal]):
        return []
    protocol = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    return [_OTLP_BY_PROTOCOL.get(protocol.strip(), "otlp_proto_grpc")]


def _console_to_stderr() -> dict[type, dict[str, Any]]:
    from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return {
        exporter: {"out": sys.stderr}
        for exporter in (ConsoleSpanExporter, ConsoleMetricExporter, ConsoleLogRecordExporter)
    }


def _span_processor(exporter: Any) -> Any:
    """Each span printed as it ends on the console (a first look, in order with the server's own
    lines); every other exporter batched, as the SDK does by default."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    return SimpleSpanProcessor(exporter) if isinstance(exporter, ConsoleSpanExporter) else BatchSpanProcessor(exporter)


def _describe(environ: Mapping[str, str], defaults: Mapping[str, list[str]]) -> str:
    parts = []
    for signal, variable in EXPORTERS.items():
        named = environ.get(variable, "").strip() or ",".join(defaults.get(signal, ())) or "none"
        parts.append(f"{signal}: {named}")
    return "; ".join(parts)
