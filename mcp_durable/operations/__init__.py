"""What runs beside the engine while a server serves: background recovery of in-doubt calls
(`recovery.py`), retention (`retention.py`), the periodic runner of both (`schedule.py`) and
OpenTelemetry (`telemetry.py`, extra `otel`). None of it decides a call: it acts through the
engine and the journal."""
