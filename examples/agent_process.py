"""An agent process written against the seed's API (`mcp_durable.compat.promptise`), killed and recovered.

The agent works through a plan of research steps. Each step journals what it learnt as a
`context_update` (`{key, value}`, the seed's shape), the agent moves through lifecycle states
with `state_transition` entries, and checkpoints its whole state every `--checkpoint-every`
steps. On start it recovers with `ReplayEngine(journal).recover()` and resumes after the last
step it journaled.

    python examples/agent_process.py run --journal file:DIR | sqlite:PATH [--steps N] [--crash-after K]

`--crash-after K` SIGKILLs the process right after step K is journaled. Each run prints one JSON
line: what it recovered (`recovered`: context, lifecycle, entries replayed) and the steps it ran.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import anyio
import orjson

from mcp_durable.compat.promptise import FileJournal, JournalEntry, ReplayEngine, SeedJournal, SQLiteJournal

PROCESS_ID = "research-agent"


def open_seed_journal(spec: str) -> SeedJournal:
    kind, _, where = spec.partition(":")
    if kind == "file":
        return FileJournal(base_path=where)
    if kind == "sqlite":
        return SQLiteJournal(where)
    raise SystemExit(f"--journal must be file:DIR or sqlite:PATH, not {spec!r}")


async def transition(journal: SeedJournal, from_state: str, to_state: str) -> None:
    await journal.append(
        JournalEntry(
            process_id=PROCESS_ID, entry_type="state_transition", data={"from_state": from_state, "to_state": to_state}
        )
    )


async def run(spec: str, steps: int, checkpoint_every: int, crash_after: int | None) -> dict[str, Any]:
    async with open_seed_journal(spec) as journal:
        recovered = await ReplayEngine(journal).recover(PROCESS_ID)
        context = dict(recovered["context_state"])
        lifecycle = recovered["lifecycle_state"]
        if lifecycle != "running":
            await transition(journal, lifecycle, "running")
        ran: list[int] = []
        for step in range(int(context.get("steps_done", 0)), steps):
            finding = f"finding {step}"
            for key, value in ((f"finding_{step}", finding), ("steps_done", step + 1)):
                context[key] = value
                await journal.append(
                    JournalEntry(process_id=PROCESS_ID, entry_type="context_update", data={"key": key, "value": value})
                )
            ran.append(step)
            if (step + 1) % checkpoint_every == 0:
                await journal.checkpoint(PROCESS_ID, {"context_state": context, "lifecycle_state": "running"})
            if crash_after is not None and step == crash_after:
                os.kill(os.getpid(), signal.SIGKILL)
        await transition(journal, "running", "done")
        await journal.checkpoint(PROCESS_ID, {"context_state": context, "lifecycle_state": "done"})
        return {
            "recovered": {k: recovered[k] for k in ("context_state", "lifecycle_state", "entries_replayed")},
            "ran": ran,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    once = commands.add_parser("run", help="run (or resume) the agent once")
    once.add_argument("--journal", required=True, help="file:DIR or sqlite:PATH")
    once.add_argument("--steps", type=int, default=10)
    once.add_argument("--checkpoint-every", type=int, default=3)
    once.add_argument("--crash-after", type=int, help="SIGKILL this process right after step K is journaled")
    args = parser.parse_args(argv)
    outcome = anyio.run(run, args.journal, args.steps, args.checkpoint_every, args.crash_after)
    sys.stdout.write(orjson.dumps(outcome).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
