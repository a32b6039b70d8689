"""Crash-test target: a payment tool whose downstream honours the key, and the real mailer tool
(whose outbox does not deduplicate), both able to SIGKILL their own process at a chosen point.

Serve it with `mcp-durable serve tests/crash/crash_servers/danger.py:make_server --journal URL`;
settings come from the environment (the stdio client passes them):

- `CRASH_PLAN` — the crash plan file (`hooks.CrashPlan`); `CRASH_COUNTER` — the event counter;
- `PAYMENTS_LEDGER` — the payment provider's ledger; `MAILER_OUTBOX` — the mail outbox;
- `CRASH_MAIL_POLICY` — `reconcile` (tools/mailer.py's own policy) or `refuse`;
- `CRASH_LEASE` — lease seconds (short, so a dead owner's lease expires quickly);
- `CRASH_WAIT` — seconds a duplicate waits for a running call;
- `CRASH_RECONCILE_EVERY` — seconds between background reconcile passes (unset: off, so a
  retry, not the background, meets each in-doubt call).

`in_doubt_calls` and `resolve_call` are test-only operator tools over `Engine.resolve` and
`journal.list_calls(CallQuery(state=IN_DOUBT))`, so a test can act as the operator while the server (which
may hold a single-writer journal's lock) runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# Served by path, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mcp.types import CallToolResult  # noqa: E402

import tools.mailer as mailer  # noqa: E402
from mcp_durable import CallIdentity, CallState, DurableServer, ToolPolicy, current_call  # noqa: E402
from mcp_durable.demo.ledger import PaymentProvider  # noqa: E402
from mcp_durable.demo.outbox import Mail, Outbox  # noqa: E402
from mcp_durable.journal import CallQuery  # noqa: E402
from mcp_durable.journal.model import CallRecord  # noqa: E402
from mcp_durable.server.results import dump_result  # noqa: E402
from tests.crash.crash_servers.hooks import ENV_COUNTER, ENV_PLAN, Counter, CrashPlan  # noqa: E402


class CrashingOutbox(Outbox):
    """The real outbox, with crash points around the send (the mail service's own behaviour is unchanged)."""

    def __init__(self, path: str | None, plan: CrashPlan, counter: Counter) -> None:
        super().__init__(path)
        self.plan = plan
        self.counter = counter

    def send(self, to: str, subject: str, body: str, *, key: str | None = None) -> Mail:
        assert key is not None
        self.counter.hit(f"invoke send_email {key}")
        self.plan.fire(key, "before_effect")
        mail = super().send(to, subject, body, key=key)
        self.plan.fire(key, "danger_window")
        return mail


def make_server(
    journal: str | None = None,
    *,
    mail_policy: str | None = None,
    lease: float | None = None,
    wait: float | None = None,
    plan: str | None = None,
    counter: str | None = None,
    ledger: str | None = None,
    outbox: str | None = None,
) -> DurableServer:
    env = os.environ
    crash_plan = CrashPlan(plan or env.get(ENV_PLAN))
    events = Counter(counter or env.get(ENV_COUNTER))
    lease_s = lease if lease is not None else float(env.get("CRASH_LEASE", "1.0"))
    wait_s = wait if wait is not None else float(env.get("CRASH_WAIT", "10"))
    mode = mail_policy or env.get("CRASH_MAIL_POLICY", "reconcile")
    provider = PaymentProvider(ledger or env.get("PAYMENTS_LEDGER"))
    # The real mailer tool and reconcile hook, sending through this process's crash-hooked outbox.
    mailer.outbox = CrashingOutbox(outbox or env.get("MAILER_OUTBOX"), crash_plan, events)

    reconcile_every = env.get("CRASH_RECONCILE_EVERY")
    server = DurableServer(
        "danger", journal=journal, reconcile_interval=float(reconcile_every) if reconcile_every else None
    )

    def pay(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund through a provider that honours the key (Stripe-like)."""
        key = current_call().scoped_key
        events.hit(f"invoke pay {key}")
        crash_plan.fire(key, "before_effect")
        effect = provider.refund(order_id, amount_cents, idempotency_key=key)
        crash_plan.fire(key, "danger_window")
        return effect.as_dict()

    server.add_tool(pay, durable=ToolPolicy(key="required", in_doubt="retry", lease=lease_s, wait=wait_s))
    if mode == "reconcile":
        mail = ToolPolicy(
            idempotent=False,
            key="required",
            in_doubt="reconcile",
            reconcile=mailer.find_sent_mail,
            lease=lease_s,
            wait=wait_s,
        )
        assert mail.reconcile is mailer.POLICY.reconcile and mail.in_doubt == mailer.POLICY.in_doubt
    elif mode == "refuse":
        mail = ToolPolicy(idempotent=False, key="required", in_doubt="refuse", lease=lease_s, wait=wait_s)
    else:
        raise ValueError(f"CRASH_MAIL_POLICY must be reconcile or refuse, not {mode!r}")
    server.add_tool(mailer.send_email, durable=mail)

    async def after_journal(record: CallRecord) -> None:
        if record.state.is_final:
            crash_plan.fire(record.identity.key, "after_journal")

    server.engine.listeners.append(after_journal)

    @server.tool()
    async def in_doubt_calls(tool: str) -> dict[str, Any]:
        """Test operator: the keys of `tool`'s in-doubt calls, from the journal."""
        records = await server.journal.list_calls(CallQuery(tool=tool, state=CallState.IN_DOUBT, limit=1000))
        return {"keys": sorted(r.identity.key for r in records)}

    @server.tool()
    async def resolve_call(
        tool: str, key: str, resolution: str, result: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Test operator: resolve an in-doubt call (`completed` with the tool's `result`, or `not_applied`)."""
        registered = server._tool_manager.get_tool(tool)
        assert registered is not None
        payload = None
        if result is not None:
            converted = registered.fn_metadata.convert_result(result)
            assert isinstance(converted, CallToolResult)  # a plain result, never an input request
            payload = dump_result(converted)
        record = await server.engine.resolve(
            CallIdentity("local", tool, key), resolution, payload=payload, note="crash test operator"
        )
        return {"state": record.state.value, "attempts": record.attempts}

    return server
