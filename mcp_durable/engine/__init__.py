"""The engine: what a durable call does, decided in one place (no `mcp` import).

Read in this order: `decide.py` (what a call does about its key's record, a pure function),
`transitions.py` (every change of a record, named), `runner.py` (a record this instance owns
runs under its lease, fenced, then its outcome is written), `engine.py` (`Engine`: the call's
loop and the operators' actions), `tasks.py` (MCP tasks on the engine), `lifecycle.py` (start,
background runs, close). Beside them: `leases.py`, `live_owners.py`, `operators.py` (verdicts,
pure), `outcomes.py` (what the face and the engine hand each other).
"""

from __future__ import annotations

from ..keys import LOCAL_PRINCIPAL
from .engine import FINALS_KEPT, FINALS_MAX_RESULT, Engine, replayed, superseded
from .outcomes import CallArguments, CallOutcome, ChangeListener, Encoder, Runner, TaskResumer, ToolOutcome

__all__ = [
    "FINALS_KEPT",
    "FINALS_MAX_RESULT",
    "LOCAL_PRINCIPAL",
    "CallArguments",
    "CallOutcome",
    "ChangeListener",
    "Encoder",
    "Engine",
    "Runner",
    "TaskResumer",
    "ToolOutcome",
    "replayed",
    "superseded",
]
