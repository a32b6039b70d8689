"""The seed's crash experiment over MCP: `kill -9` a refund server mid-batch, restart, retry — count refunds.

    python examples/crash_demo.py [--trials 50] [--seed 7] [--journal sqlite|file]
    mcp-durable demo crash [same options]

Each trial a client drives a batch of 10 refunds (`refund(order_id, amount_cents)`) against a
server started by `mcp-durable serve` over stdio. At one refund, chosen at random, the server
SIGKILLs itself at one of three points, balanced over the trials:

- before the side effect (the refund is not made);
- inside the danger window (the provider made the refund; its answer is not journaled/sent);
- after journaling (plain server: after the tool returned), before the answer reaches the client.

The client starts a new server process and retries the same refund (with the same key) until it
gets an answer, then carries on. Two servers run the same schedule:

- a plain `MCPServer` (examples/plain_payments.py) — no journal, no key passed downstream;
- mcp-durable (tools/payments.py): the call's key is journaled before the refund and passed to
  the provider; a call orphaned by the crash is found IN_DOUBT on restart and retried with the
  same key, so the provider deduplicates it.

The ledger of the stand-in provider (mcp_durable.demo.ledger) counts the refunds really made.
One table compares both: duplicates, lost refunds, in-doubt calls detected and how they were
resolved. Exit status 0 when mcp-durable made no duplicate and lost nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tools/ and examples/ when this file is served by path

import anyio  # noqa: E402
import orjson  # noqa: E402

from mcp_durable.demo.ledger import PaymentProvider  # noqa: E402

POINTS = ("before_effect", "danger_window", "after_journal")
BATCH = 10
ENV_PLAN = "CRASH_PLAN"


# -- inside the server process -------------------------------------------------------------------


class CrashPlan:
    """The one crash armed for this trial: `(order_id, point)` in a file; consumed when it fires."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def arm(self, order_id: str, point: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({"order_id": order_id, "point": point}))
        os.replace(tmp, self.path)

    def fire(self, order_id: str | None, point: str) -> None:
        try:
            plan = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return
        if plan == {"order_id": order_id, "point": point}:
            self.path.unlink()
            os.kill(os.getpid(), signal.SIGKILL)


class CrashingProvider(PaymentProvider):
    """The real stand-in provider with the two crash points around the refund itself."""

    def __init__(self, plan: CrashPlan) -> None:
        super().__init__()
        self.plan = plan

    def refund(self, order_id: str, amount_cents: int, idempotency_key: str | None = None) -> Any:
        self.plan.fire(order_id, "before_effect")
        effect = super().refund(order_id, amount_cents, idempotency_key=idempotency_key)
        self.plan.fire(order_id, "danger_window")
        return effect


def durable_server() -> Any:
    """Serve target: tools/payments.py's server with the crash points (`…/crash_demo.py:durable_server`)."""
    import tools.payments as payments
    from mcp_durable.journal.model import CallRecord

    plan = CrashPlan(os.environ[ENV_PLAN])
    payments.provider = CrashingProvider(plan)

    async def after_journal(record: CallRecord) -> None:
        if record.state.is_final:  # the result is on disk; the answer is not yet sent
            plan.fire(record.identity.key, "after_journal")

    payments.server.engine.listeners.append(after_journal)
    return payments.server


def plain_server() -> Any:
    """Serve target: examples/plain_payments.py with the same crash points (`…:plain_server`)."""
    import examples.plain_payments as plain

    plan = CrashPlan(os.environ[ENV_PLAN])
    plain.provider = CrashingProvider(plan)
    original = plain.server.call_tool

    async def call_tool(name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        result = await original(name, arguments, context)
        plan.fire(arguments.get("order_id"), "after_journal")  # no journal: after the tool returned
        return result

    plain.server.call_tool = call_tool  # type: ignore[method-assign]
    return plain.server


# -- the client side -------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one server did over all trials."""

    server: str
    trials: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    duplicate_trials: Counter[str] = field(default_factory=Counter)  # by crash point
    duplicate_refunds: int = 0
    lost_refunds: int = 0
    in_doubt: int = 0
    resolutions: Counter[str] = field(default_factory=Counter)
    boots: int = 0


def schedule(trials: int, seed: int) -> list[tuple[int, str]]:
    """(refund index, crash point) per trial; the points are balanced, their order shuffled."""
    rng = random.Random(seed)
    points = [POINTS[i % len(POINTS)] for i in range(trials)]
    rng.shuffle(points)
    return [(rng.randrange(BATCH), point) for point in points]


def _serve_command() -> list[str]:
    script = Path(sys.executable).parent / "mcp-durable"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mcp_durable.cli"]


async def _run_server(kind: str, plan_of: list[tuple[int, str]], workdir: Path, journal: str) -> Tally:
    from mcp import Client, MCPError, StdioServerParameters

    home = workdir / kind
    home.mkdir(parents=True, exist_ok=True)
    ledger = PaymentProvider(home / "ledger.db")
    plan = CrashPlan(home / "plan.json")
    url = f"sqlite:///{home}/journal.db?single_writer=1" if journal == "sqlite" else f"file://{home}/journal"
    factory = "durable_server" if kind == "mcp-durable" else "plain_server"
    command, *prefix = _serve_command()
    params = StdioServerParameters(
        command=command,
        args=[*prefix, "serve", f"{Path(__file__).resolve()}:{factory}", "--journal", url],
        env={"PAYMENTS_LEDGER": str(ledger.path), ENV_PLAN: str(plan.path), "PATH": os.environ.get("PATH", "")},
        cwd=str(home),
    )
    tally = Tally("plain MCPServer" if kind == "plain" else "mcp-durable")
    acknowledged: dict[str, str] = {}
    replayed = 0

    async def session(trial: int, index: int, point: str) -> bool:
        """Drive the batch from refund `index` on; False when the server died (start a new one)."""
        nonlocal replayed
        async with Client(params, mode="legacy") as client:
            tally.boots += 1
            for i in range(index, BATCH):
                order = f"T{trial:03d}-O{i}"
                if (i, point) == crash and not fired[0]:
                    plan.arm(order, point)
                    fired[0] = True
                try:
                    key: Any = {"mcp-durable/idempotency-key": order}  # _meta: the plain server ignores it
                    result = await client.call_tool("refund", {"order_id": order, "amount_cents": 100 + i}, meta=key)
                except MCPError:
                    tally.kills[point] += 1
                    progress[0] = i  # retry this refund, with the same key, on a new server
                    return False
                if result.is_error:
                    raise RuntimeError(f"{tally.server}: refund {order} failed: {result.content}")
                acknowledged[order] = str((result.structured_content or {}).get("id"))
                replayed += bool((result.meta or {}).get("mcp-durable/replayed"))
        progress[0] = BATCH
        return True

    for trial, crash in enumerate(plan_of):
        fired, progress = [False], [0]
        while progress[0] < BATCH:
            await session(trial, progress[0], crash[1])
        tally.trials += 1
        effects = ledger.effects()
        by_order = Counter(e["subject"] for e in effects if e["subject"].startswith(f"T{trial:03d}-"))
        extra = sum(n - 1 for n in by_order.values() if n > 1)
        tally.duplicate_refunds += extra
        if extra:
            tally.duplicate_trials[crash[1]] += 1
    made = {e["id"] for e in ledger.effects()}
    expected = {f"T{t:03d}-O{i}" for t in range(len(plan_of)) for i in range(BATCH)}
    tally.lost_refunds = sum(1 for order in expected if acknowledged.get(order) not in made)
    if kind == "mcp-durable":
        await _explain_durable(tally, url, ledger, replayed)
    else:
        tally.resolutions["none: the retry ran it again"] = sum(tally.kills.values())
    return tally


async def _explain_durable(tally: Tally, url: str, ledger: PaymentProvider, replayed: int) -> None:
    """Read the journal: calls that needed more than one attempt were found in doubt and retried."""
    from mcp_durable import create_journal
    from mcp_durable.journal import CallQuery

    journal = create_journal(url)
    await journal.open()
    try:
        doubted = [r for r in await journal.list_calls(CallQuery(tool="refund", limit=100_000)) if r.attempts > 1]
    finally:
        await journal.aclose()
    outcomes = Counter((r["idempotency_key"], r["outcome"]) for r in ledger.requests())
    tally.in_doubt = len(doubted)
    for record in doubted:
        if outcomes[(record.identity.key, "deduplicated")]:
            tally.resolutions["retried, provider deduplicated"] += 1
        else:
            tally.resolutions["retried, had not happened"] += 1
    if replayed:
        tally.resolutions["replayed from journal (not in doubt)"] += replayed


async def run_experiment(
    trials: int = 50, seed: int = 7, journal: str = "sqlite", workdir: Path | None = None
) -> list[Tally]:
    """Run both servers over the same crash schedule; returns their tallies (plain first)."""
    plan_of = schedule(trials, seed)
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="mcp-durable-crash-demo-")) if workdir is None else workdir
    try:
        return [await _run_server(kind, plan_of, root, journal) for kind in ("plain", "mcp-durable")]
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def render(tallies: Sequence[Tally], *, seed: int, journal: str) -> Any:
    """The one table comparing the servers."""
    from rich.table import Table

    table = Table(title=f"kill -9 during a 10-refund batch over MCP (seed {seed}, journal {journal})")
    for column in (
        "server",
        "trials",
        "kills before/window/after",
        "trials with duplicates",
        "duplicate refunds",
        "lost refunds",
        "in doubt detected",
        "resolved by",
    ):
        table.add_column(column, overflow="fold", no_wrap=column == "server")
    for t in tallies:
        kills = " / ".join(str(t.kills[p]) for p in POINTS)
        dup = sum(t.duplicate_trials.values())
        where = ", ".join(f"{n} {p.replace('_', ' ')}" for p, n in sorted(t.duplicate_trials.items()))
        detected = str(t.in_doubt) if t.server == "mcp-durable" else "— no journal"
        how = "\n".join(f"{n} {what}" for what, n in t.resolutions.items()) or "—"
        table.add_row(
            t.server,
            str(t.trials),
            kills,
            f"{dup}/{t.trials}" + (f" ({where})" if where else ""),
            str(t.duplicate_refunds),
            str(t.lost_refunds),
            detected,
            how,
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crash_demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--journal", choices=("sqlite", "file"), default="sqlite")
    parser.add_argument("--workdir", type=Path, help="keep ledgers and journals here (default: a temporary folder)")
    args = parser.parse_args(argv)
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(f"running {args.trials} trials on each server (a server boot per kill; this takes a while)…")
    tallies = anyio.run(run_experiment, args.trials, args.seed, args.journal, args.workdir)
    console.print(render(tallies, seed=args.seed, journal=args.journal))
    durable = tallies[-1]
    return 0 if durable.duplicate_refunds == 0 and durable.lost_refunds == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
