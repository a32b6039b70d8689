"""One refund through one peer, in a process of its own: the SIGKILL harness of the `peers` case.

`python -m benchmarks._peer_child PEER STORE ORDER` with `$PAYMENTS_LEDGER` set, and
`$PEERS_CRASH_AFTER_EFFECT=1` to be killed (SIGKILL, by itself) right after the refund's money
moved and before the peer recorded the result. PEER is `durable` (STORE a journal URL), `dbos`
(STORE a system database URL, `#schema` appended for Postgres) or `powertools` (STORE a Redis
port). Prints one line: `ok <text>` or `refused <text>` (the call answered an error).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack

import anyio
from mcp.server.mcpserver import MCPServer

from .peer_servers import REFUND, dbos_peer, dbos_session, durable_peer, powertools_peer

AMOUNT = 1250


async def call(server: MCPServer, order: str) -> str:
    try:
        result = await server.call_tool(REFUND, {"order": order, "amount_cents": AMOUNT})
    except Exception as exc:  # noqa: BLE001 - what the peer raised is the outcome
        return f"refused {type(exc).__name__}: {exc}"[:300]
    text = " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))
    return ("refused " if getattr(result, "is_error", False) else "ok ") + text[:300]


async def main(peer: str, store: str, order: str) -> None:
    with ExitStack() as stack:
        if peer == "durable":
            # A short lease: on a shared journal a crashed owner's call is in doubt once it ends.
            durable = durable_peer(store, lease=1.0)
            line = await call(durable, order)  # the engine opens its journal on the first call
            await durable.aclose()
        elif peer == "dbos":
            url, _, schema = store.partition("#")
            stack.enter_context(dbos_session(url, schema or None))
            line = await call(dbos_peer(), order)
        else:
            line = await call(powertools_peer(int(store)), order)
    print(line.replace("\n", " "), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
