"""The seed experiment's refund worker on the process journal, and a runner that kills it.

The worker refunds orders O-0 … O-9 one by one through a payment provider
(`mcp_durable.demo.ledger.PaymentProvider`, whose ledger records every effect). After each refund
it journals `context_update {last_done: i}`; on start it recovers `last_done` with
`ReplayEngine.recover()` and resumes after it. That recovers the *position*, but a crash after a
refund and before its journal write (the danger window) refunds that order again on resume,
unless the refund carries an idempotency key the provider honours.

    python examples/refund_worker.py worker --dir DIR [--key] [--crash-step N --crash-phase PHASE]
    python examples/refund_worker.py trials --n 50

`worker` runs once (and SIGKILLs itself at step N, phase `before` the refund, `danger` after the
refund before the journal write, or `after` the journal write, when told to). `trials` runs N
trials per variant (without and with the key): a worker killed at a random step and phase, then
a fresh worker that resumes; it prints how many resumed, how many refunded an order twice, and
how many crashes fell in the danger window. Expected: resumed N/N in both variants; without the
key, duplicates exactly in the danger-window trials; with the key, none.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson

from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.journal import create_journal
from mcp_durable.journal.processes import ProcessJournal, ReplayEngine

ORDERS = 10
AMOUNT_CENTS = 1_250
PROCESS_ID = "refund-worker"
PHASES = ("before", "danger", "after")


def _die_if(step: int, phase: str, crash_step: int | None, crash_phase: str | None) -> None:
    if step == crash_step and phase == crash_phase:
        os.kill(os.getpid(), signal.SIGKILL)


async def work(
    directory: Path, *, key: bool, crash_step: int | None = None, crash_phase: str | None = None
) -> dict[str, Any]:
    """Refund the orders not done yet; returns where it resumed from and what it refunded."""
    journal = create_journal(f"file://{directory}/journal")
    provider = PaymentProvider(directory / "ledger.db")
    await journal.open()
    try:
        recovered = await ReplayEngine(journal).recover(PROCESS_ID)
        last_done = int(recovered.context_state.get("last_done", -1))
        process = ProcessJournal(journal, PROCESS_ID, state=recovered)
        await process.transition("running")
        refunded: list[str] = []
        for step in range(last_done + 1, ORDERS):
            order = f"O-{step}"
            _die_if(step, "before", crash_step, crash_phase)
            idempotency_key = f"{PROCESS_ID}:refund:{order}" if key else None
            provider.refund(order, AMOUNT_CENTS, idempotency_key=idempotency_key)
            refunded.append(order)
            _die_if(step, "danger", crash_step, crash_phase)
            await process.update_context(last_done=step)
            _die_if(step, "after", crash_step, crash_phase)
        await process.transition("done")
        await process.checkpoint()
        return {"resumed_from": last_done + 1, "refunded": refunded}
    finally:
        await journal.aclose()


# -- the runner ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trial:
    key: bool
    step: int
    phase: str
    killed: bool
    resumed: bool
    duplicates: int

    @property
    def danger(self) -> bool:
        return self.phase == "danger"


def _worker(directory: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, __file__, "worker", "--dir", str(directory), *args], capture_output=True, timeout=300
    )


def run_trial(root: Path, index: int, key: bool, step: int, phase: str) -> Trial:
    """One trial: a worker killed at (`step`, `phase`), then a worker that resumes and finishes."""
    directory = root / f"{'key' if key else 'nokey'}-{index}"
    directory.mkdir(parents=True)
    flags = ["--key"] if key else []
    crashed = _worker(directory, *flags, "--crash-step", str(step), "--crash-phase", phase)
    killed = crashed.returncode == -signal.SIGKILL
    resumed_run = _worker(directory, *flags)
    if resumed_run.returncode != 0:
        raise RuntimeError(f"the resuming worker failed: {resumed_run.stderr.decode()[-2000:]}")
    outcome = orjson.loads(resumed_run.stdout.splitlines()[-1])
    expected_from = step + 1 if phase == "after" else step
    effects = Counter(e["subject"] for e in PaymentProvider(directory / "ledger.db").effects(op="refund"))
    complete = set(effects) == {f"O-{i}" for i in range(ORDERS)}
    return Trial(
        key,
        step,
        phase,
        killed,
        outcome["resumed_from"] == expected_from and complete,
        sum(1 for count in effects.values() if count > 1),
    )


def run_trials(
    n: int, *, seed: int | None = None, parallel: int | None = None, root: Path | None = None
) -> list[Trial]:
    """`n` trials per variant (without, then with the idempotency key), at random steps and phases."""
    rng = random.Random(seed)
    plan = [(i, key, rng.randrange(ORDERS), rng.choice(PHASES)) for key in (False, True) for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="refund-trials-") as tmp:
        base = root or Path(tmp)
        with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 2) as pool:
            return list(pool.map(lambda p: run_trial(base, *p), plan))


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows = []
    for key in (False, True):
        mine = [t for t in trials if t.key == key]
        rows.append(
            {
                "variant": "with idempotency key" if key else "without key",
                "trials": len(mine),
                "killed": sum(t.killed for t in mine),
                "resumed": sum(t.resumed for t in mine),
                "trials_with_duplicates": sum(t.duplicates > 0 for t in mine),
                "danger_window_crashes": sum(t.danger for t in mine),
                "duplicates_outside_danger_window": sum(t.duplicates > 0 and not t.danger for t in mine),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Refund worker killed with SIGKILL (file journal, 10 refunds per trial)")
    for column in ("variant", "trials", "resumed", "trials with duplicates", "crashes in the danger window"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in rows:
        table.add_row(
            r["variant"],
            str(r["trials"]),
            f"{r['resumed']}/{r['trials']}",
            str(r["trials_with_duplicates"]),
            str(r["danger_window_crashes"]),
        )
    Console(width=120).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="run the worker once")
    worker.add_argument("--dir", type=Path, required=True, help="where the journal and the ledger live")
    worker.add_argument("--key", action="store_true", help="send an idempotency key with each refund")
    worker.add_argument("--crash-step", type=int)
    worker.add_argument("--crash-phase", choices=PHASES)
    trials = commands.add_parser("trials", help="kill workers at random steps and phases; print the table")
    trials.add_argument("--n", type=int, default=50, help="trials per variant")
    trials.add_argument("--seed", type=int)
    trials.add_argument("--parallel", type=int, help="trials at once (default: one per CPU)")
    trials.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    args = parser.parse_args(argv)
    if args.command == "worker":
        outcome = anyio.run(
            lambda: work(args.dir, key=args.key, crash_step=args.crash_step, crash_phase=args.crash_phase)
        )
        sys.stdout.write(orjson.dumps(outcome).decode() + "\n")
        return 0
    rows = summarize(run_trials(args.n, seed=args.seed, parallel=args.parallel))
    if args.json:
        sys.stdout.write(orjson.dumps(rows).decode() + "\n")
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
