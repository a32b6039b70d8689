"""A storage fault met while serving a call is `journal_unavailable`, never the SDK's anonymous error:
here a file journal whose segment holding a call is lost under the running server."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_durable import DurableServer
from mcp_durable.journal.file import FileJournal
from tests.helpers import first_text, key_meta
from tests.server.servers.counting import Counter, make_server


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_lost_segment_of_the_file_journal_is_answered_journal_unavailable(mode: str, tmp_path: Path) -> None:
    directory, counter = tmp_path / "journal", tmp_path / "counter"

    def server() -> DurableServer:
        # Tiny segments: each frame in a segment of its own, so the segments holding k-1 are not
        # the ones the server reads (and keeps open) at start for its lifecycle.
        built = make_server(counter=counter, journal="memory://")
        built.use_journal(FileJournal(directory, segment_bytes=1))
        return built

    async with Client(server(), mode=mode) as client:
        first = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
    assert not first.is_error
    # A new server (nothing of k-1 in its memory) on the same journal; then k-1's segments go.
    async with Client(server(), mode=mode) as client:
        lost = [s for s in directory.glob("seg-*.log") if b'"k-1"' in s.read_bytes()]
        assert lost
        for segment in lost:
            segment.unlink()
        repeat = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
        with pytest.raises(MCPError) as read:
            await client.read_resource("journal://calls/record/k-1")
    assert repeat.is_error and repeat.meta is not None, repeat
    assert repeat.meta["mcp-durable/error"]["error"] == "journal_unavailable", repeat
    assert "cannot read seg-" in first_text(repeat)
    assert read.value.error.message.startswith("journal_unavailable: ")
    assert Counter(counter).count("record") == 1  # the tool did not run again
