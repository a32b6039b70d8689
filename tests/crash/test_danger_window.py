"""SIGKILL a real `mcp-durable serve` process before, inside and after the danger window, then retry.

Each trial arms a crash at one point of one call (`crash_servers/hooks.py`), calls the tool over
stdio, sees the server die, starts a new server process on the same journal and retries with
the same key until the call is done (acting as the operator when the policy refuses). The
downstream systems — a ledger that honours keys, an outbox that does not — are real SQLite files
read by the test, never by the server.

Trials per configuration: `$MCP_DURABLE_TRIALS` (default 3: each crash point once; the recorded
full run uses 200 — see docs/crash-results.md). A crash is armed at an exact point of the code,
so a further trial at the same point repeats the same path: the default proves every point on
every journal and policy, the long run the absence of rare timing effects. One server boot per
trial: the process that finishes trial i runs trial i+1 until that one kills it.
"""

from __future__ import annotations

import os
from collections import Counter as Tally
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.outbox import Outbox
from tests.crash.crash_servers.harness import StdioServer, error_code, journal_url
from tests.crash.crash_servers.hooks import POINTS, Counter, CrashPlan
from tests.journal_kept import kept_disagreements_at

TRIALS = int(os.environ.get("MCP_DURABLE_TRIALS", "3"))
TARGET = "tests.crash.crash_servers.danger:make_server"
JOURNALS = ["sqlite", "sqlite-single-writer", "file", "postgres"]
RECONCILED = "mcp-durable/reconciled"
REPLAYED = "mcp-durable/replayed"


@dataclass
class Run:
    """One configuration's trials and what they showed."""

    tmp: Path
    journal: str
    mail_policy: str = "reconcile"
    outcomes: Tally[str] = field(default_factory=Tally)

    def __post_init__(self) -> None:
        self.plan = CrashPlan(self.tmp / "plan.json")
        self.events = Counter(self.tmp / "events.log")
        self.ledger = PaymentProvider(self.tmp / "ledger.db")
        self.outbox = Outbox(self.tmp / "outbox.db")
        env = {
            "CRASH_PLAN": str(self.plan.path),
            "CRASH_COUNTER": str(self.events.path),
            "PAYMENTS_LEDGER": str(self.ledger.path),
            "MAILER_OUTBOX": str(self.outbox.path),
            "CRASH_MAIL_POLICY": self.mail_policy,
            "CRASH_LEASE": "0.5",
            "CRASH_WAIT": "10",
        }
        self.url = journal_url(self.journal, self.tmp)  # on Postgres a fresh schema: made once
        self.server = StdioServer(TARGET, self.url, env)

    async def check_kept(self) -> None:
        """After the last server stopped: the journal's kept counts and open listings, rebuilt or
        carried through every SIGKILL, agree with its records (`tests/journal_kept.py`)."""
        assert await kept_disagreements_at(self.url) == []

    def report(self, name: str) -> None:
        print(
            f"\n{name} on {self.journal}: {TRIALS} trials, {self.server.boots.started} boots, "
            f"{self.server.boots.killed} SIGKILLs, outcomes {dict(self.outcomes)}"
        )


async def _crash(run: Run, tool: str, args: dict[str, Any], key: str, point: str) -> None:
    """Arm a crash at `point` for `key`, call, and check the server died there; restart it."""
    run.plan.arm(key, point)
    result = await run.server.call(tool, args, key)
    assert result is None, f"the server should have been killed at {point} of {key}, but answered {result}"
    assert run.plan.armed() is None, "the crash plan fired (and was consumed)"
    await run.server.start()


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_tool_whose_downstream_honours_the_key_never_duplicates_or_loses_a_result_under_retry(
    journal: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, journal)
    async with run.server:
        for trial in range(TRIALS):
            point, key = POINTS[trial % len(POINTS)], f"refund-{trial}"
            args = {"order_id": f"O-{trial}", "amount_cents": 100 + trial}
            await _crash(run, "pay", args, key, point)
            result = await run.server.call("pay", args, key)
            assert result is not None and not result.is_error, result
            effects = run.ledger.effects(subject=f"O-{trial}")
            assert len(effects) == 1, f"trial {trial} ({point}): {len(effects)} refunds"
            assert result.structured_content is not None and result.structured_content["id"] == effects[0]["id"]
            invoked = run.events.count(f"invoke pay {key}")
            # Retried after a crash before journaling (same key: the provider deduplicates); replayed after it.
            assert invoked == (1 if point == "after_journal" else 2), (trial, point, invoked)
            run.outcomes["replayed" if (result.meta or {}).get(REPLAYED) else f"retried after {point}"] += 1
    requests = run.ledger.requests()
    assert sum(r["outcome"] == "applied" for r in requests) == TRIALS
    await run.check_kept()
    run.report("pay/retry")


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_mail_the_outbox_would_send_twice_is_sent_once_under_reconcile(journal: str, tmp_path: Path) -> None:
    run = Run(tmp_path, journal, mail_policy="reconcile")
    async with run.server:
        for trial in range(TRIALS):
            point, key = POINTS[trial % len(POINTS)], f"mail-{trial}"
            args = {"to": f"c{trial}@example.com", "subject": "Your refund", "body": f"trial {trial}"}
            await _crash(run, "send_email", args, key, point)
            result = await run.server.call("send_email", args, key)
            assert result is not None and not result.is_error, result
            mails = run.outbox.mails(key=key)
            assert len(mails) == 1, f"trial {trial} ({point}): {len(mails)} mails sent"
            assert result.structured_content is not None and result.structured_content["id"] == mails[0]["id"]
            meta = result.meta or {}
            invoked = run.events.count(f"invoke send_email {key}")
            if point == "before_effect":
                assert invoked == 2 and not meta.get(RECONCILED), "not found downstream: the call ran"
            elif point == "danger_window":
                assert invoked == 1 and meta.get(RECONCILED) is True, "found downstream: completed, not resent"
            else:
                assert invoked == 1 and meta.get(REPLAYED) is True
            run.outcomes[
                {
                    "before_effect": "reconciled: not applied, ran",
                    "danger_window": "reconciled: found",
                    "after_journal": "replayed",
                }[point]
            ] += 1
    await run.check_kept()
    run.report("send_email/reconcile")


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_mail_under_refuse_never_runs_twice_automatically_and_stays_in_doubt_until_resolved(
    journal: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, journal, mail_policy="refuse")
    async with run.server:
        for trial in range(TRIALS):
            point, key = POINTS[trial % len(POINTS)], f"mail-{trial}"
            args = {"to": f"c{trial}@example.com", "subject": "Your refund", "body": f"trial {trial}"}
            await _crash(run, "send_email", args, key, point)
            result = await run.server.call("send_email", args, key)
            assert result is not None
            if point == "after_journal":
                assert not result.is_error and (result.meta or {}).get(REPLAYED) is True
                run.outcomes["replayed"] += 1
            else:
                # Crashed after the claim: in doubt, asked again still in doubt, listed, never re-run.
                assert error_code(result) == "in_doubt", result
                again = await run.server.call("send_email", args, key)
                assert again is not None and error_code(again) == "in_doubt"
                listed = await run.server.call("in_doubt_calls", {"tool": "send_email"})
                assert listed is not None and key in listed.structured_content["keys"]
                assert run.events.count(f"invoke send_email {key}") == 1, "refuse must never run it again by itself"
                # The operator looks at the outbox and resolves.
                sent = run.outbox.mails(key=key)
                assert len(sent) == (1 if point == "danger_window" else 0)
                if sent:
                    found = {"id": sent[0]["id"], "to": sent[0]["to"], "subject": sent[0]["subject"], "status": "sent"}
                    resolution = {"tool": "send_email", "key": key, "resolution": "completed", "result": found}
                else:
                    resolution = {"tool": "send_email", "key": key, "resolution": "not_applied"}
                resolved = await run.server.call("resolve_call", resolution)
                assert resolved is not None and not resolved.is_error, resolved
                listed = await run.server.call("in_doubt_calls", {"tool": "send_email"})
                assert listed is not None and key not in listed.structured_content["keys"]
                result = await run.server.call("send_email", args, key)
                assert result is not None and not result.is_error, result
                run.outcomes[f"in doubt, operator: {resolution['resolution']}"] += 1
            mails = run.outbox.mails(key=key)
            assert len(mails) == 1, f"trial {trial} ({point}): {len(mails)} mails sent"
            assert result.structured_content is not None and result.structured_content["id"] == mails[0]["id"]
    await run.check_kept()
    run.report("send_email/refuse")
