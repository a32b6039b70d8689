"""A TCP forwarder that can black-hole its traffic: a network partition between one client and a server.

    with BlackHole("127.0.0.1", 5432) as hole:     # listens on 127.0.0.1:hole.port
        ... point the client at hole.port ...
        hole.cut()       # nothing passes either way; every connection stays open
        hole.heal()      # what was held is delivered, in order, and forwarding resumes

Each accepted connection gets its own upstream connection and two pumps (client → server and
server → client). A cut stops both pumps of every connection before their next write: bytes
that arrive meanwhile are read and held in the pump's queue, in order (the sender's writes
succeed, as into a send buffer when the peer has gone silent), never dropped and never
forwarded, and no connection is closed, so both ends see a silent peer rather than an error,
as across a real partition (the kernels on either side still answer TCP keepalives, so
neither end notices for as long as the test lasts). A connection accepted while cut is held
too: its upstream connection is made only once healed, as a SYN lost in a partition is
retried until it gets through (or the client's connect timeout ends it). `heal()` lets
everything held through in order: the late writes reach the server as if the network had
just come back.

The forwarder runs an asyncio event loop of its own, on a thread of the test process: a test
that blocks its own loop (`subprocess.wait`, a SQLite read) must not stall the traffic of the
server it is waiting for (a replica shutting down talks to its journal through here).
`cut()` and `heal()` return once the forwarder applies them. `held` counts the bytes read
while cut (so a test can check the client really tried to talk through the partition) and
`delivered_after_heal` the bytes forwarded after the last heal. `settled()` says whether
nothing is in flight any more: every byte sent was forwarded and the server has answered it
(for a request-response protocol such as Postgres's: the late writes have been applied).
Leaving the block closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
#: Seconds the test thread waits for the forwarder's loop to start, apply a cut or heal, or close.
CONTROL_TIMEOUT = 10.0


class BlackHole:
    """A forwarder from `127.0.0.1:port` (a free port, chosen at start) to `host:upstream_port`."""

    def __init__(self, host: str, upstream_port: int) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.port = 0
        self.held = 0
        self.delivered_after_heal = 0
        self._healed_once = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="black-hole", daemon=True)
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._links: set[_Link] = set()

    @property
    def is_cut(self) -> bool:
        return self._open is not None and not self._open.is_set()

    def cut(self) -> None:
        """Start the partition: from now on no byte passes either way until `heal`."""
        self._control(self._gate().clear)

    def heal(self) -> None:
        """End the partition: deliver what was held, in order, and forward again."""

        def heal() -> None:
            self._healed_once = True
            self.delivered_after_heal = 0
            self._gate().set()

        self._control(heal)

    def settled(self) -> bool:
        """Whether nothing is in flight: every byte a client sent was forwarded and answered by the
        server (see `_Link`), so a write held by a cut has reached the server and been applied."""

        async def settled() -> bool:
            return all(link.settled for link in self._links)

        return self._run(settled())

    def __enter__(self) -> BlackHole:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._run(self._close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CONTROL_TIMEOUT)
            if not self._thread.is_alive():
                self._loop.close()

    # -- the test's thread ----------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CONTROL_TIMEOUT)

    def _control(self, change: Callable[[], None]) -> None:
        async def apply() -> None:
            change()

        self._run(apply())

    # -- the forwarder's loop -------------------------------------------------------------------------

    def _gate(self) -> asyncio.Event:
        assert self._open is not None, "the forwarder is not started"
        return self._open

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        """Stop listening and close every connection, both sides (held bytes are dropped)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # A plain callback: the link runs in a task of ours, which `_close` cancels.
        self._writers.add(client_writer)
        task = asyncio.ensure_future(self._link(client_reader, client_writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _link(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # The client's bytes are read (and counted while cut) from the start, before the upstream
        # connection exists: a connection made while cut reaches the server only once healed.
        link = _Link(self._flow(client_reader))
        self._links.add(link)
        try:
            await self._forward(link, client_writer)
        finally:
            self._links.discard(link)

    async def _forward(self, link: _Link, client_writer: asyncio.StreamWriter) -> None:
        try:
            await self._gate().wait()
            server_reader, server_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except BaseException:
            await _stopped(link.up.reading)
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            raise
        self._writers.add(server_writer)
        up = asyncio.ensure_future(self._pump(link.up, server_writer))
        down = asyncio.ensure_future(self._pump(self._flow(server_reader, link.answer), client_writer))
        failed = True
        try:
            # An end of stream is passed on (a half-close) and the link lasts until both
            # directions have ended; an error on either side (a reset) ends it at once.
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            failed = not (up.done() and down.done()) or any(t.exception() is not None for t in (up, down))
        finally:
            for writer in (client_writer, server_writer):
                if failed:
                    writer.transport.abort()
                else:
                    writer.close()  # after what is buffered has been sent
                self._writers.discard(writer)
            await _stopped(up)
            await _stopped(down)

    def _flow(self, reader: asyncio.StreamReader, on_chunk: Callable[[], None] | None = None) -> _Flow:
        """One direction: every chunk `reader` delivers is queued (None at its end) by a task of its own."""
        flow = _Flow()
        flow.reading = asyncio.ensure_future(self._receive(reader, flow, on_chunk))
        return flow

    async def _receive(self, reader: asyncio.StreamReader, flow: _Flow, on_chunk: Callable[[], None] | None) -> None:
        """Read everything that arrives, cut or not (counting what is held), then None at its end."""
        try:
            while data := await reader.read(65536):
                if not self._gate().is_set():
                    self.held += len(data)
                flow.read += 1
                flow.chunks.put_nowait(data)
                if on_chunk is not None:
                    on_chunk()
        finally:
            flow.chunks.put_nowait(None)  # also after a reset: the pump ends, and raises it

    async def _pump(self, flow: _Flow, writer: asyncio.StreamWriter) -> None:
        """Write what `flow` queues to `writer`, in order, each chunk only while not cut."""
        try:
            while (data := await flow.chunks.get()) is not None:
                await self._gate().wait()
                writer.write(data)
                await writer.drain()
                flow.written += 1
                if self._healed_once:
                    self.delivered_after_heal += len(data)
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            await _stopped(flow.reading)
        failure = flow.reading.exception()
        if failure is not None:
            raise failure  # a reset on the reading side ends the link (`_forward`)


class _Flow:
    """One direction of a link: chunks `read` into `chunks` by the task `reading`, `written` onward."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.reading: asyncio.Task[None]
        self.read = 0
        self.written = 0


class _Link:
    """One client connection: its flow to the server, and how much of it the server has answered.

    The server's side of the protocol (Postgres) answers every statement, and the client (libpq)
    sends the next only after that answer: a link whose every chunk was written to the server
    and followed by an answer from it has nothing in flight (`settled`)."""

    def __init__(self, up: _Flow) -> None:
        self.up = up
        self.answered = 0  # `up.written` when the server last sent something

    def answer(self) -> None:
        self.answered = self.up.written

    @property
    def settled(self) -> bool:
        return self.up.read == self.up.written == self.answered


async def _stopped(task: asyncio.Task[None]) -> None:
    """Cancel `task` (if still running) and wait for it to end; its own failure is not raised here."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
        await task
