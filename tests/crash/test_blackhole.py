"""The partition forwarder itself (blackhole.py): while cut nothing passes and nothing closes; a heal delivers all.

An echo server in this event loop stands behind the forwarder (which runs on its own thread);
clients talk to it through the forwarder before, during and after a cut.
"""

from __future__ import annotations

import asyncio

import anyio

from tests.crash.blackhole import BlackHole
from tests.crash.late_owners import until


class Echo:
    """A TCP echo server on 127.0.0.1 that keeps what it received and counts its connections."""

    def __init__(self) -> None:
        self.received = b""
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while data := await reader.read(1024):
            self.received += data
            writer.write(data)
            await writer.drain()
        writer.close()


async def _read(reader: asyncio.StreamReader, size: int) -> bytes:
    with anyio.fail_after(5):
        return await reader.readexactly(size)


async def test_a_cut_holds_every_byte_and_connection_until_the_heal_delivers_them_in_order() -> None:
    echo = Echo()
    await echo.start()
    try:
        with BlackHole("127.0.0.1", echo.port) as hole:
            reader, writer = await asyncio.open_connection("127.0.0.1", hole.port)
            writer.write(b"one")
            assert await _read(reader, 3) == b"one"

            hole.cut()
            writer.write(b"two")
            late_reader, late_writer = await asyncio.open_connection("127.0.0.1", hole.port)  # made while cut
            late_writer.write(b"three")
            await until(lambda: hole.held == len(b"twothree"), "the forwarder to hold what was sent while cut")
            assert echo.received == b"one" and echo.connections == 1  # nothing passed, no connection made
            assert not reader.at_eof() and not late_reader.at_eof()  # nothing was closed either
            assert not hole.settled()

            hole.heal()
            assert await _read(reader, 3) == b"two"
            assert await _read(late_reader, 5) == b"three"
            writer.write(b"four")
            assert await _read(reader, 4) == b"four"  # the same connection goes on
            assert echo.connections == 2 and hole.delivered_after_heal > 0
            assert hole.settled()  # every byte forwarded and answered
            for stream in (writer, late_writer):
                stream.close()
    finally:
        echo.close()
