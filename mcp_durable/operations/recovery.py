"""Background recovery: reconcile in-doubt calls without waiting for their key to be called again.

A call left in doubt by a crash is normally decided when the same key is called again. Under
the `reconcile` policy the decision needs no caller: the tool's hook asks the downstream system.
So a server runs `reconcile_in_doubt` at start and then every `interval` seconds
(`DurableServer(reconcile_interval=…)`): it first marks PENDING records whose owner is gone as
in doubt (`Engine.sweep`), then offers each in-doubt record of a `reconcile` tool to its hook
(`Engine.reconcile_unattended`): found → completed (repeats replay it), not applied → released
(the next call runs it), hook failed → left in doubt. Parked records (attempts used up) and
tools under `retry` or `refuse` are left alone: `retry` needs a caller to run for, `refuse` a
person. Records of several replicas are safe to reconcile from any of them: the record is taken
over by compare-and-set first, so one replica reconciles it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from ..engine import Encoder, Engine
from ..errors import DurableError
from ..journal.base import CallQuery, each_call
from ..journal.model import CallState
from ..policy import ToolPolicy
from .schedule import run_every

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ReconcilePass:
    """What one pass did: records looked at, and how each reconciled one ended."""

    at: float
    examined: int = 0
    completed: int = 0
    released: int = 0
    undecided: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "at": self.at,
            "examined": self.examined,
            "completed": self.completed,
            "released": self.released,
            "undecided": self.undecided,
            "errors": self.errors[:10],
        }


async def reconcile_in_doubt(
    engine: Engine, policies: Mapping[str, ToolPolicy], encoder: Callable[[str], Encoder | None]
) -> ReconcilePass:
    """One pass over the journal's in-doubt calls (see the module docstring)."""
    await engine.start()
    report = ReconcilePass(at=engine.clock())
    await engine.sweep()
    # The IN_DOUBT records only (the journal's index of open records), page after page.
    async for record in each_call(engine.journal, CallQuery(state=CallState.IN_DOUBT, limit=200)):
        policy = policies.get(record.identity.tool)
        if policy is None or policy.reconcile is None or policy.in_doubt_policy != "reconcile":
            continue
        if record.attempts >= policy.max_attempts:
            continue  # parked: an operator's
        encode = encoder(record.identity.tool)
        if encode is None:
            continue
        report.examined += 1
        try:
            after = await engine.reconcile_unattended(record, policy, encode)
        except DurableError as exc:
            report.undecided += 1
            report.errors.append(f"{record.identity.tool}/{record.identity.key}: {exc.message}")
            continue
        if after is not None and after.state.is_final:
            report.completed += 1
        elif after is not None and after.state == CallState.RELEASED:
            report.released += 1
    return report


@dataclass(eq=False)
class BackgroundRecovery:
    """Runs `reconcile_in_doubt` at start and every `interval` seconds until cancelled."""

    engine: Engine
    policies: Mapping[str, ToolPolicy]
    encoder: Callable[[str], Encoder | None]
    interval: float
    after_pass: Callable[[ReconcilePass], Awaitable[None]] | None = None
    #: The latest pass, None until one ran.
    last: ReconcilePass | None = field(default=None, init=False)

    def wanted(self) -> bool:
        """Whether any tool could be reconciled unattended (else the pass is skipped)."""
        return any(p.reconcile is not None and p.in_doubt_policy == "reconcile" for p in self.policies.values())

    async def run_once(self) -> ReconcilePass | None:
        """One pass (None when no tool could be reconciled unattended)."""
        if not self.wanted():
            return None
        self.last = await reconcile_in_doubt(self.engine, self.policies, self.encoder)
        if self.after_pass is not None:
            await self.after_pass(self.last)
        return self.last

    async def run_forever(self) -> None:
        await run_every(self.interval, self.run_once, "recovery")
