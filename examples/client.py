"""Call `refund` twice with one idempotency key and show that the second answer is a replay.

    python examples/client.py stdio              # starts `mcp-durable serve tools/payments.py` itself
    python examples/client.py http URL           # talks to a running server, e.g. http://127.0.0.1:8000/mcp

Options: `--key KEY` (default: a new random key, so every run makes one refund), `--order O-1`,
`--amount 500`, and for stdio `--journal URL` (default: `$MCP_DURABLE_JOURNAL`, else the embedded
journal under `./.mcp-durable/`). The stdio server writes its payment ledger to
`$PAYMENTS_LEDGER`, else `./.mcp-durable/payments-ledger.db`.

The key goes in the request's `_meta` under `mcp-durable/idempotency-key`. The first answer is
the tool's result; the second is the same result read back from the journal, with
`_meta["mcp-durable/replayed"] = true`. Exit status 0 when that is what happened, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

KEY_META = "mcp-durable/idempotency-key"
REPLAYED = "mcp-durable/replayed"
PAYMENTS = Path(__file__).resolve().parent.parent / "tools" / "payments.py"
# The SDK starts a stdio server with a minimal environment; these are passed on when set.
PASSED_ENV = ("MCP_DURABLE_JOURNAL", "PAYMENTS_LEDGER", "PATH", "HOME", "PYTHONPATH")


def stdio_server(journal: str | None) -> StdioServerParameters:
    """How to start `mcp-durable serve tools/payments.py` over stdio with this interpreter."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    args = ["-m", "mcp_durable.cli", "serve", str(PAYMENTS)]
    if journal:
        args += ["--journal", journal]
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=os.getcwd())


def shown(result: Any) -> dict[str, Any]:
    """The parts of a `CallToolResult` worth printing, in wire form."""
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {name: wire[name] for name in ("_meta", "structuredContent", "isError") if name in wire}


async def read_record(client: Client, key: str) -> dict[str, Any] | None:
    """The journal's record of the call (`journal://calls/refund/KEY`), if the server exposes it."""
    templates = await client.list_resource_templates()
    if not any(t.uri_template.startswith("journal://calls/{tool}/") for t in templates.resource_templates):
        return None
    contents = (await client.read_resource(f"journal://calls/refund/{key}")).contents
    text = getattr(contents[0], "text", None)
    return None if text is None else json.loads(text)


async def main(target: Any, key: str, order: str, amount: int) -> int:
    async with Client(target, mode="legacy") as client:
        arguments = {"order_id": order, "amount_cents": amount}
        first = await client.call_tool("refund", arguments, meta={KEY_META: key})
        second = await client.call_tool("refund", arguments, meta={KEY_META: key})
        record = await read_record(client, key)
    print(f"key: {key}")
    print("first call: ", json.dumps(shown(first)))
    print("second call:", json.dumps(shown(second)))
    if record is not None:
        print(f"journal://calls/refund/{key}:", json.dumps(record))
    replayed = bool((second.meta or {}).get(REPLAYED))
    same = first.structured_content == second.structured_content and not first.is_error
    print(
        f"second call replayed from the journal: {'yes' if replayed else 'NO'}; same refund: {'yes' if same else 'NO'}"
    )
    return 0 if replayed and same else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("url", nargs="?", help="the server's MCP endpoint (http only), e.g. http://127.0.0.1:8000/mcp")
    parser.add_argument("--key", default=None, help="the idempotency key (default: a new random one)")
    parser.add_argument("--order", default="O-1")
    parser.add_argument("--amount", type=int, default=500, help="amount in cents")
    parser.add_argument("--journal", default=None, help="journal URL for the stdio server")
    args = parser.parse_args(argv)
    if args.transport == "http" and not args.url:
        parser.error("http needs the server URL, e.g. http://127.0.0.1:8000/mcp")
    if args.transport == "stdio" and args.url:
        parser.error("stdio starts its own server; it takes no URL")
    return args


if __name__ == "__main__":
    options = parse()
    chosen_key = options.key or f"refund-{uuid.uuid4().hex[:12]}"
    server = stdio_server(options.journal) if options.transport == "stdio" else options.url
    sys.exit(anyio.run(main, server, chosen_key, options.order, options.amount))
