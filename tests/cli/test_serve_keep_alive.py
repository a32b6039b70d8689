"""`mcp-durable serve --transport http` keeps an idle connection open longer than clients reuse one.

The MCP SDK's HTTP client (httpx) reuses a pooled connection that has been idle for up to 5 s,
and uvicorn's default closes a connection idle for 5 s: a request sent on a connection the
server is closing at that moment fails with `ReadError` (the connection is reset), which took
down a client of the replica concurrency test on a loaded machine. The server must be the side
that waits longer.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.helpers import serve_http

PAYMENTS = "tools/payments.py"
#: Longer than the idle time after which the SDK's client stops reusing a connection (httpx: 5 s).
CLIENT_IDLE_REUSE = 6.0


async def _answer(stream: anyio.abc.ByteStream) -> bytes:
    """One request's whole answer on a kept-alive connection (status line, headers and the
    `Content-Length` body, however the server's segments split them), or b'' if it was closed.
    Reading the answer whole matters: a body left unread would be taken for the next answer."""
    await stream.send(b"GET /no-such-page HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            answer += await stream.receive()
        head, _, body = answer.partition(b"\r\n\r\n")
        lengths = [
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        ]
        length = lengths[0] if lengths else 0
        while len(body) < length:
            body += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
        return b""
    return answer


async def test_a_connection_idle_as_long_as_a_client_reuses_one_is_still_answered(tmp_path: Path) -> None:
    env = {"PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}
    async with serve_http(PAYMENTS, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        with anyio.fail_after(60):
            stream = await anyio.connect_tcp("127.0.0.1", served.port)
            async with stream:
                assert (await _answer(stream)).startswith(b"HTTP/1.1 404")
                await anyio.sleep(CLIENT_IDLE_REUSE)  # idle, as a pooled connection between calls
                assert (await _answer(stream)).startswith(b"HTTP/1.1 404"), "the server closed an idle connection"
