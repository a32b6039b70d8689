#!/usr/bin/env bash
# Three replicas of tools/payments.py over streamable HTTP, sharing one Postgres journal.
#
#   examples/replicas.sh [POSTGRES_URL]          serve on ports 8001-8003 until Ctrl-C
#   examples/replicas.sh --demo [POSTGRES_URL]   start them, refund once through all three, stop
#
# PORTS="P1 P2 P3" picks the three ports (BASE_PORT=P: P, P+1 and P+2).
# POSTGRES_URL defaults to $MCP_DURABLE_PG, else postgresql://postgres@127.0.0.1:5432/test. The
# journal's tables go in the schema $SCHEMA (default mcp_durable_replicas, created if missing).
# Put a load balancer in front of the three ports (docs/deployment.md); here a client simply
# picks a port. The payment provider's ledger ($PAYMENTS_LEDGER) is one SQLite file all three
# share: it stands for the downstream system.
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
if [[ "${1:-}" == "--demo" ]]; then demo=1; shift; fi
pg="${1:-${MCP_DURABLE_PG:-postgresql://postgres@127.0.0.1:5432/test}}"
schema="${SCHEMA:-mcp_durable_replicas}"
base_port="${BASE_PORT:-8001}"
bin="${BIN:-.venv/bin}"
[[ -x "$bin/mcp-durable" ]] || bin="$(dirname "$(command -v mcp-durable)")"
if [[ "$pg" == *\?* ]]; then journal="$pg&schema=$schema"; else journal="$pg?schema=$schema"; fi
export PAYMENTS_LEDGER="${PAYMENTS_LEDGER:-.mcp-durable/replicas-ledger.db}"
mkdir -p "$(dirname "$PAYMENTS_LEDGER")"

pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
trap 'exit 130' INT TERM

if [[ -n "${PORTS:-}" ]]; then
    read -r -a ports <<<"$PORTS"
else
    ports=("$base_port" "$((base_port + 1))" "$((base_port + 2))")
fi
for port in "${ports[@]}"; do
    MCP_DURABLE_INSTANCE="replica-$port" "$bin/mcp-durable" serve tools/payments.py --transport http \
        --host 127.0.0.1 --port "$port" --journal "$journal" 2>"${TMPDIR:-/tmp}/mcp-durable-replica-$port.log" &
    pids+=("$!")
done

# Wait until every replica accepts connections (each one migrates the schema on start, under
# an advisory lock, so starting them together is safe).
for port in "${ports[@]}"; do
    for _ in $(seq 1 150); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        sleep 0.1
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || {
        echo "replica on port $port did not start:" >&2
        cat "${TMPDIR:-/tmp}/mcp-durable-replica-$port.log" >&2
        exit 1
    }
    echo "replica: http://127.0.0.1:$port/mcp"
done
echo "journal: ${journal}"

if [[ "$demo" == 0 ]]; then
    echo "Ctrl-C stops all three."
    wait
    exit 0
fi

# The demo: one refund, sent with the same key to each replica in turn.
"$bin/python" - "${ports[@]}" <<'PY'
import sys, uuid
import anyio
from mcp import Client

async def main() -> None:
    key = f"demo-{uuid.uuid4().hex[:8]}"
    for port in sys.argv[1:]:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            result = await client.call_tool("refund", {"order_id": key, "amount_cents": 1500},
                                            meta={"mcp-durable/idempotency-key": key})
        meta = result.meta or {}
        print(f"port {port}: refund {result.structured_content['id']}  "
              f"replayed={meta.get('mcp-durable/replayed', False)}")

anyio.run(main)
PY
