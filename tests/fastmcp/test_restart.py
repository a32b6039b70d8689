"""The journal outlives the server object: a FastMCP server started again on the same journal
answers a repeat of a key from it, without running the tool again.

The engine starts and stops with the server's lifespan (`EngineLifespan`): leaving the last
client closes the journal (the file journal's one-writer lock is released), and a new server
object on the same journal opens it again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fastmcp.servers import CLIENTS, Shop, connected, make_durable, shop_app
from tests.helpers import body_bytes, meta_of

REFUND = {"order_id": "O-3", "amount_cents": 300}
MAIL = {"to": "ada@example.com", "subject": "Refunded", "body": "300 cents."}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("journal", ["file", "sqlite"])
async def test_a_repeat_after_a_restart_on_the_same_journal_replays_the_first_answer(
    client: str, journal: str, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/journal" if journal == "file" else f"sqlite:///{tmp_path}/journal.db"
    shop = Shop(tmp_path)
    first_app = shop_app(shop)
    first_durable = make_durable(first_app, journal=url, policies=shop.policies)
    async with connected(client, first_app) as caller:
        refund = await caller.call("refund", REFUND, key="refund-O-3")
        mail = await caller.call("send_mail", MAIL, key="mail-O-3")
    assert not first_durable.engine.opened  # the server stopped: its journal is closed

    restarted = shop_app(shop)  # a new server object, the same journal and stand-ins
    make_durable(restarted, journal=url, policies=shop.policies)
    async with connected(client, restarted) as caller:
        refund_again = await caller.call("refund", REFUND, key="refund-O-3")
        mail_again = await caller.call("send_mail", MAIL, key="mail-O-3")
    assert len(shop.ledger.requests()) == 1 and len(shop.outbox.mails()) == 1
    for first, again in ((refund, refund_again), (mail, mail_again)):
        assert not first.is_error, first
        assert body_bytes(again) == body_bytes(first)
        assert meta_of(again)["mcp-durable/replayed"] is True
        assert meta_of(again)["mcp-durable/first-completed-at"] == meta_of(first)["mcp-durable/first-completed-at"]
