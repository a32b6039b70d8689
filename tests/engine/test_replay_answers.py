"""The replay answers an engine keeps on a journal other processes write (`Engine._answers`).

On a shared journal (SQLite without `single_writer`, Postgres) every repeat reads the record;
what the engine keeps is only the answer it made of a record (`render_replay`), used again for
a record read that is equal to it. Two engines on one SQLite file stand for two replicas: the
one that answered a repeat must not answer the next repeat from its old answer after the other
re-ran the key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.engine import CallOutcome
from mcp_durable.journal import CallIdentity, create_journal
from mcp_durable.steps import DurableCall

KEY_META = "mcp-durable/idempotency-key"
TOOL = "charge"
POLICY = ToolPolicy(idempotent=True)


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[Engine, Engine, list[object]]]:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = Engine(create_journal(url), instance_id="A"), Engine(create_journal(url), instance_id="B")
    rendered: list[object] = []

    def render(outcome: CallOutcome) -> object:
        answer = ("answer", outcome.payload)
        rendered.append(answer)
        return answer

    a.render_replay = b.render_replay = render
    await a.start()
    await b.start()
    yield a, b, rendered
    await a.aclose()
    await b.aclose()


async def call(engine: Engine, amount: int) -> CallOutcome:
    async def run(_: DurableCall | None) -> ToolOutcome:
        data = orjson.dumps({"charged": amount})
        return ToolOutcome(data, data, is_error=False)

    return await engine.execute(tool=TOOL, policy=POLICY, arguments={}, meta={KEY_META: "k"}, run=run)


def charged(outcome: CallOutcome) -> Any:
    assert outcome.payload is not None
    return orjson.loads(outcome.payload)


async def test_a_repeat_reuses_the_answer_made_of_the_same_record(
    replicas: tuple[Engine, Engine, list[object]],
) -> None:
    a, _, rendered = replicas
    first = await call(a, 5)
    assert not first.replayed
    repeats = [await call(a, 5) for _ in range(3)]
    assert all(r.replayed for r in repeats)
    # Made once, from the record the first repeat read; the others read the same record.
    assert len(rendered) == 1
    assert all(r is repeats[0] for r in repeats)
    assert repeats[0].rendered is rendered[0]


async def test_a_re_run_by_another_replica_is_not_answered_with_the_old_answer(
    replicas: tuple[Engine, Engine, list[object]],
) -> None:
    a, b, rendered = replicas
    await call(a, 5)
    before = await call(a, 5)
    assert before.replayed and charged(before) == {"charged": 5}
    # Replica B re-runs the key (an operator's action through it), and runs it again.
    await b.rerun(CallIdentity("local", TOOL, "k"), by="test")
    again = await call(b, 7)
    assert not again.replayed and charged(again) == {"charged": 7}
    # A reads the new record: an answer of its own made of the old one must not be used.
    after = await call(a, 5)
    assert after.replayed and charged(after) == {"charged": 7}
    assert after.rendered == ("answer", after.payload) and len(rendered) == 2
