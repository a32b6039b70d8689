"""E-mail over MCP: `send_email`, sent at most once per key even though the mail service is not idempotent.

Serve it with `mcp-durable serve tools/mailer.py`. The mail goes out through a local stand-in
outbox (`mcp_durable.demo.outbox`, `$MAILER_OUTBOX`) that does NOT deduplicate: a second send
is a second mail. So the tool cannot simply be retried after a crash in the danger window
(mail sent, result not yet journaled). Instead:

- `key="required"`: the caller names the operation (`_meta["mcp-durable/idempotency-key"]`);
- `in_doubt="reconcile"`: after such a crash, the reconcile hook looks the key up in the
  outbox: found → the call completes with that mail (no second send); not found → it runs;
- the outbox cannot answer (down, corrupt) → the hook raises, and the call falls back to
  `refuse`: it answers `in_doubt` until the outbox answers or an operator resolves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio.to_thread

from mcp_durable import NOT_APPLIED, DurableServer, ToolPolicy, current_call
from mcp_durable.demo.outbox import Outbox

outbox = Outbox()


async def find_sent_mail(key: str, arguments: Mapping[str, Any]) -> Any:
    """Reconcile hook: the mail sent under this call's key, or `NOT_APPLIED`.

    Raises `OutboxUnavailable` when the outbox cannot tell (the engine then refuses the call).
    """
    scoped = current_call().scoped_key  # what send_email passed to the outbox
    mail = await anyio.to_thread.run_sync(outbox.find, scoped)
    return NOT_APPLIED if mail is None else mail.as_dict()


POLICY = ToolPolicy(idempotent=False, key="required", in_doubt="reconcile", reconcile=find_sent_mail)

server = DurableServer("mailer", instructions="Send e-mail at most once per idempotency key.")


@server.tool(durable=POLICY)
def send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send an e-mail. Requires an idempotency key in _meta['mcp-durable/idempotency-key']."""
    return outbox.send(to, subject, body, key=current_call().scoped_key).as_dict()


if __name__ == "__main__":
    server.run()
