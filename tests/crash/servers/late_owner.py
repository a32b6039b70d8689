"""A test target for late owners: a replica cut off from its journal (a partition) or stopped (SIGSTOP).

Serve it with `mcp-durable serve tests/crash/servers/late_owner.py --transport http --journal
postgresql://…`. Every tool makes one effect downstream and can be held at a chosen point, so a
test can cut the replica off (or stop it) exactly before or after that effect:

- downstreams: `ledger` (`mcp_durable.demo.ledger.PaymentProvider` at `$PAYMENTS_LEDGER`, which
  honours the key: a repeat is `deduplicated`) and `outbox` (`mcp_durable.demo.outbox.Outbox` at
  `$MAILER_OUTBOX`, which does not: every send is a new mail);
- tools `<downstream>_<policy>(order_id, effect_first)` for each in-doubt policy (`retry`,
  `reconcile`, `refuse`): the effect under the call's key, and the hold after it
  (`effect_first`) or before it; `reconcile`'s hook looks the key up downstream;
- `outbox_steps(order_id)`: two durable steps, each a mail under its step's key, with the hold
  between them.

The hold: when `$HOLD_FILE` is set, a tool reaching its hold point writes `$HOLD_FILE.reached`
(its key) and waits until `$HOLD_FILE` exists, then writes `$HOLD_FILE.left` (`released`, or
`stopped: …` when its run was cancelled while it waited); unset, it does not wait. `$REPLICA_NAME` names
the replica in every result (`by`) and in every mail's body, so a test sees whose run made an
effect and whose result the journal kept. Lease 1 s: a replica that stops renewing loses its
claim to another soon.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from mcp_durable import NOT_APPLIED, DurableServer, ToolPolicy, current_call
from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.outbox import Outbox
from mcp_durable.policy import InDoubtPolicy

LEASE = 1.0
POLICIES: tuple[InDoubtPolicy, ...] = ("retry", "reconcile", "refuse")
REPLICA = os.environ.get("REPLICA_NAME", str(os.getpid()))
HOLD = os.environ.get("HOLD_FILE")
AMOUNT_CENTS = 1250

server = DurableServer("late-owner")
provider = PaymentProvider()
outbox = Outbox()

#: Makes the effect under a downstream key; returns what the tool answers (without `by`).
Effect = Callable[[str, str], dict[str, Any]]
#: Finds the effect made under a downstream key, if any.
Lookup = Callable[[str], dict[str, Any] | None]


def _refund(order_id: str, key: str) -> dict[str, Any]:
    return provider.refund(order_id, AMOUNT_CENTS, idempotency_key=key).as_dict()


def _find_refund(key: str) -> dict[str, Any] | None:
    found = provider.find(key)
    return None if found is None else found.as_dict()


def _mail(order_id: str, key: str) -> dict[str, Any]:
    return outbox.send("customer@example.com", f"refund {order_id}", f"sent by {REPLICA}", key=key).as_dict()


def _find_mail(key: str) -> dict[str, Any] | None:
    found = outbox.find(key)
    return None if found is None else found.as_dict()


DOWNSTREAMS: dict[str, tuple[Effect, Lookup]] = {"ledger": (_refund, _find_refund), "outbox": (_mail, _find_mail)}


async def hold() -> None:
    """Wait at the hold point until `$HOLD_FILE` exists (at once when it is unset).

    Writes `$HOLD_FILE.reached` on arrival and `$HOLD_FILE.left` on leaving: `released` when the
    file appeared, else the name of what stopped the wait (a cancel of the run)."""
    if HOLD is None:
        return
    Path(f"{HOLD}.reached").write_text(current_call().key)
    left = "released"
    try:
        while not Path(HOLD).exists():
            await anyio.sleep(0.02)
    except BaseException as exc:
        left = f"stopped: {type(exc).__name__}"
        raise
    finally:
        Path(f"{HOLD}.left").write_text(left)


def _reconcile_hook(lookup: Lookup) -> Callable[[str, Mapping[str, Any]], Awaitable[Any]]:
    async def reconcile(key: str, arguments: Mapping[str, Any]) -> Any:
        """The effect made under the in-doubt call's key, as the tool would have answered it."""
        found = await anyio.to_thread.run_sync(lookup, current_call().scoped_key)
        return NOT_APPLIED if found is None else {**found, "by": f"{REPLICA} (reconciled)"}

    return reconcile


def _register(downstream: str, policy: InDoubtPolicy) -> None:
    effect, lookup = DOWNSTREAMS[downstream]

    async def tool(order_id: str, effect_first: bool) -> dict[str, Any]:
        """Make the effect under the call's key; held after it (`effect_first`) or before it."""
        key = current_call().scoped_key
        if not effect_first:
            await hold()
        made = await anyio.to_thread.run_sync(effect, order_id, key)
        if effect_first:
            await hold()
        return {**made, "by": REPLICA}

    server.add_tool(
        tool,
        f"{downstream}_{policy}",
        durable=ToolPolicy(
            key="required",
            idempotent=downstream == "ledger",
            lease=LEASE,
            in_doubt=policy,
            reconcile=_reconcile_hook(lookup) if policy == "reconcile" else None,
        ),
    )


for _downstream in DOWNSTREAMS:
    for _policy in POLICIES:
        _register(_downstream, _policy)


@server.tool(durable=ToolPolicy(key="required", idempotent=False, lease=LEASE, in_doubt="retry"))
async def outbox_steps(order_id: str) -> dict[str, Any]:
    """Two durable steps, a mail each under its step's key, held between them."""
    call = current_call()
    first = await call.step("first", lambda: _mail(order_id, call.step_key("first")))
    await hold()
    second = await call.step("second", lambda: _mail(order_id, call.step_key("second")))
    return {"first": first["id"], "second": second["id"], "by": REPLICA}
