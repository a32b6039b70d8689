"""A FastMCP 4 shop made durable by `make_durable`, as a server process of its own: what the
TypeScript SDK client calls over streamable HTTP (test_typescript_client.py) and what the crash
tests SIGKILL over stdio (test_crash.py).

    python tests/fastmcp/shop_server.py --journal URL [--transport stdio|http] [--port P]

Settings come from the environment (the stdio client passes only what it is given):

- `SHOP_LEDGER` — the payment provider's ledger (`PaymentProvider`, honours the key it is given);
- `SHOP_OUTBOX` — the outbox (`Outbox`, sends every request: it does not deduplicate);
- `SHOP_MAIL_POLICY` — `send_mail`'s in-doubt policy: `reconcile` (its hook looks the key up in
  the outbox) or `refuse`;
- `SHOP_LEASE` — the durable tools' lease in seconds (short in the crash tests, so the lease of a
  killed owner on a shared SQLite journal runs out soon);
- `SHOP_RECONCILE_EVERY` — seconds between background reconcile passes (unset: off, so a retry,
  not the background, meets each in-doubt call);
- `CRASH_PLAN`, `CRASH_COUNTER` — the crash plan and the event counter of
  `tests/crash/crash_servers/hooks.py`: the process SIGKILLs itself at `before_effect` (claim
  journaled, no effect yet), `danger_window` (effect made, result not journaled) or
  `after_journal` (result journaled, not answered) of the armed key.

Tools: `refund` (`idempotentHint: true`; its policy here only for the lease and `in_doubt =
"retry"`), `send_mail` (`key = "required"`, `SHOP_MAIL_POLICY`), and two test-only operator tools
that are not durable, `in_doubt_calls` and `resolve_call` (over the middleware's engine and
journal, which a test cannot open while the server holds the file journal's lock).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Run by path, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio.to_thread  # noqa: E402
from fastmcp import FastMCP  # noqa: E402
from mcp_types import ToolAnnotations  # noqa: E402

from mcp_durable import NOT_APPLIED, CallIdentity, CallState, ToolPolicy, current_call  # noqa: E402
from mcp_durable.demo.ledger import PaymentProvider  # noqa: E402
from mcp_durable.demo.outbox import Outbox  # noqa: E402
from mcp_durable.fastmcp import DurableMiddleware, make_durable  # noqa: E402
from mcp_durable.fastmcp.calls import call_result  # noqa: E402
from mcp_durable.journal import CallQuery  # noqa: E402
from mcp_durable.journal.model import CallRecord  # noqa: E402
from mcp_durable.server.results import dump_result  # noqa: E402
from tests.crash.crash_servers.hooks import ENV_COUNTER, ENV_PLAN, Counter, CrashPlan  # noqa: E402


def shop(journal: str) -> tuple[FastMCP[Any], DurableMiddleware]:
    """The shop on `journal`, made durable, with its crash points armed from the environment."""
    env = os.environ
    plan = CrashPlan(env.get(ENV_PLAN))
    events = Counter(env.get(ENV_COUNTER))
    ledger = PaymentProvider(env.get("SHOP_LEDGER"))
    outbox = Outbox(env.get("SHOP_OUTBOX"))
    lease = float(env.get("SHOP_LEASE", "30"))
    app: FastMCP[Any] = FastMCP("shop")

    @app.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
    def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order; the provider deduplicates by the key it is given."""
        key = current_call().scoped_key
        events.hit(f"invoke refund {key}")
        plan.fire(key, "before_effect")
        effect = ledger.refund(order_id, amount_cents, idempotency_key=key)
        plan.fire(key, "danger_window")
        return effect.as_dict()

    @app.tool(annotations=ToolAnnotations(destructive_hint=True))
    def send_mail(to: str, subject: str, body: str) -> dict[str, Any]:
        """Send a mail; the outbox sends every request it gets (it does not deduplicate)."""
        key = current_call().scoped_key
        events.hit(f"invoke send_mail {key}")
        plan.fire(key, "before_effect")
        mail = outbox.send(to, subject, body, key=key)
        plan.fire(key, "danger_window")
        return mail.as_dict()

    async def find_sent_mail(key: str, arguments: Mapping[str, Any]) -> Any:
        """`send_mail`'s reconcile hook: the mail sent under the call's scoped key, or NOT_APPLIED."""
        mail = await anyio.to_thread.run_sync(outbox.find, current_call().scoped_key)
        return NOT_APPLIED if mail is None else mail.as_dict()

    mode = env.get("SHOP_MAIL_POLICY", "reconcile")
    if mode == "reconcile":
        mail_policy = ToolPolicy(
            idempotent=False, key="required", in_doubt="reconcile", reconcile=find_sent_mail, lease=lease
        )
    elif mode == "refuse":
        mail_policy = ToolPolicy(idempotent=False, key="required", in_doubt="refuse", lease=lease)
    else:
        raise SystemExit(f"SHOP_MAIL_POLICY must be reconcile or refuse, not {mode!r}")
    durable = make_durable(
        app,
        journal=journal,
        policies={"refund": ToolPolicy(in_doubt="retry", lease=lease), "send_mail": mail_policy},
        reconcile_interval=float(env["SHOP_RECONCILE_EVERY"]) if env.get("SHOP_RECONCILE_EVERY") else None,
    )

    async def after_journal(record: CallRecord) -> None:
        if record.state.is_final:
            plan.fire(record.identity.key, "after_journal")

    durable.engine.listeners.append(after_journal)

    @app.tool
    async def in_doubt_calls(tool: str) -> dict[str, Any]:
        """Test operator: the keys of `tool`'s in-doubt calls, from the journal."""
        records = await durable.journal.list_calls(CallQuery(tool=tool, state=CallState.IN_DOUBT, limit=1000))
        return {"keys": sorted(record.identity.key for record in records)}

    @app.tool
    async def resolve_call(
        tool: str, key: str, resolution: str, result: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Test operator: resolve an in-doubt call (`completed` with the tool's `result`, or `not_applied`)."""
        payload = None
        if result is not None:
            found = await app.get_tool(tool)
            assert found is not None
            payload = dump_result(call_result(found.convert_result(result)))
        record = await durable.engine.resolve(
            CallIdentity("local", tool, key), resolution, payload=payload, note="crash test operator"
        )
        return {"state": record.state.value, "attempts": record.attempts}

    return app, durable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", required=True)
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    app, _ = shop(options.journal)
    if options.transport == "http":
        app.run(transport="http", host="127.0.0.1", port=options.port, show_banner=False)
    else:
        app.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
