"""Group commit for the SQLite journal: one thread owns the connection and commits in batches.

Every read and write of a `SQLiteJournal` is an *op* (a function of the connection) put on a
queue. The writer thread takes everything queued, runs the reads (each its own implicit read
transaction, answered at once), then runs the writes in ONE transaction — one WAL fsync for the
whole batch — and answers them after the COMMIT returned:

    claim A ─┐                          ┌─ SAVEPOINT op; claim A; RELEASE op ─┐
    swap  B ─┼─ queue ─▶ writer thread ─┼─ SAVEPOINT op; swap B;  RELEASE op ─┼─ COMMIT (fsync) ─▶ A, B, C answered
    renew C ─┘                          └─ SAVEPOINT op; renew C; RELEASE op ─┘

Atomicity per call, as with one transaction per call:
- Each write runs inside its own SAVEPOINT: an op that raises is rolled back to it alone and fails
  alone; the others of the batch are not affected. Ops of one batch see each other in queue
  order (two claims of one identity: the first inserts, the second reads the first and loses),
  exactly as if they had committed one after the other.
- Nobody is answered before the COMMIT of their batch returned, so a caller never acts on (and
  no other process ever reads) a claim that is not durable, and no claim that lost is visible.
- A batch whose transaction cannot begin or commit (the database locked past `busy_timeout`, a
  full disk, an I/O error) fails every op in it with that error, and SQLite has rolled all of it
  back: nothing of a failed batch is half-written. Likewise when an op's error aborts the whole
  transaction (SQLite does that on SQLITE_FULL, SQLITE_IOERR, …).

Ops submitted during one turn of the event loop are handed over together at the next turn (one
queue put): handed over one by one, the first op of a burst woke the idle thread and went
alone, and at 64 concurrent MCP calls batches held ~8 writes instead of ~60. An op whose call
is the only one in flight is handed over at once instead (`journal/callers.py`): nobody could
add one in that turn.
Results reach the loop with one `call_soon_threadsafe` per batch.

Inline commits: when the ops of a turn find the thread idle (nothing handed to it unanswered)
and recent commits were fast (a moving average under `INLINE_COMMIT_S`, as the file journal
decides where it syncs), the event loop's thread runs them itself, as one batch with the same
rules, blocking the loop for one fast commit. The hop to the thread and back (two wake-ups, one
of an idle thread) cost more than that: docs/performance.md, "The SQLite journal". Whoever uses
the connection holds `_conn_lock`; the loop only tries it, never waits for it. Inline, the
connection's `busy_timeout` is 0: when another process holds the write lock (or a read finds
the database busy) the ops concerned go to the thread, which waits for the lock as before, so
the loop never waits for another process. Concurrent calls still batch: while a batch is with
the thread, the ops of later turns queue behind it.

The thread also writes the WAL ahead with zeros while idle (`_grow_wal`), so that commits do
not extend the file (an extension makes each `fdatasync` commit the file's size as well).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread

from .. import observe
from .callers import alone

T = TypeVar("T")

#: At most this many writes share a transaction (bounds how long one COMMIT holds other processes).
MAX_BATCH = 512
#: The event loop commits inline while the commits' moving average is under this (a fast fsync);
#: slower disks keep the loop free and commit in the thread.
INLINE_COMMIT_S = 0.001
#: The WAL is written ahead (zeros) to `wal_autocheckpoint` pages plus this many, in chunks of
#: `WAL_GROW_CHUNK` bytes taken while the thread is idle (each holds the write lock ~1 ms).
WAL_SLACK_FRAMES = 64
#: ... once this many batches were committed: a journal opened to be read (the operator CLI) or
#: to write a line or two never writes the ~4 MB of zeros (SQLite deletes the WAL at close).
GROW_AFTER_BATCHES = 16
WAL_GROW_CHUNK = 256 * 1024
_WAL_HEADER, _WAL_FRAME_HEADER = 32, 24


class _Op(Generic[T]):
    __slots__ = ("body", "write", "future", "result", "error")

    def __init__(
        self,
        body: Callable[[sqlite3.Connection], T],
        write: bool,
        future: asyncio.Future[T] | concurrent.futures.Future[T],
    ) -> None:
        self.body = body
        self.write = write
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None


_STOP = object()
_GROW = object()  # queued once the connection has committed `GROW_AFTER_BATCHES` batches


class SQLiteWriter:
    """The thread owning one SQLite connection; `read`/`write` run a function on it.

    `connect` runs in the thread (the connection never leaves it). After `stop()` every op fails
    with `sqlite3.ProgrammingError` (the journal turns it into `JournalError`).
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str, *, wal_path: str | None = None) -> None:
        self._connect = connect
        self._name = name
        #: The connection's WAL file, to be written ahead with zeros (see `_grow_wal`); None: not.
        self._wal_path = wal_path
        self._wal_target = 0
        self._queue: queue.SimpleQueue[_Op[Any] | list[_Op[Any]] | object] = queue.SimpleQueue()
        # Ops submitted during one turn of the event loop, handed to the thread together at the
        # next turn (one queue put, one batch): see `_submit`.
        self._gathered: list[_Op[Any]] = []
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        # Whoever uses the connection holds this: the thread for each batch, the event loop for
        # an inline commit (which only tries it, never waits for it).
        self._conn_lock = threading.Lock()
        #: Ops handed to the thread and not yet answered (counted on the event loop's thread):
        #: while any are, new ops queue behind them, so concurrent calls batch.
        self._handed = 0
        #: Moving average of a commit's duration (begin to commit returned), inline or not.
        self.commit_s = 0.0
        self._busy_ms = 0  # the connection's busy_timeout, as set by `connect`
        self._busy_zero = False  # busy_timeout is 0 now (set so for inline commits)
        #: Batches committed and writes in them since start (for tests and the benchmark notes);
        #: `inline_batches` of them committed on the event loop's thread.
        self.batches = 0
        self.writes = 0
        self.inline_batches = 0

    @property
    def running(self) -> bool:
        return self._thread is not None

    async def start(self) -> None:
        """Start the thread and open the connection in it; raises what `connect` raised."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve, name=f"mcp-durable sqlite {self._name}", daemon=True)
        self._thread.start()
        try:
            await self._submit(self._open, write=False)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Finish what is queued, close the connection and end the thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._hand_over()  # ops gathered in this turn go before the stop (nothing can join after)
        self._queue.put(_STOP)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join)

    async def read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body(conn)` outside any transaction (SQLite gives it a consistent snapshot per statement)."""
        return await self._submit(body, write=False)

    async def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body(conn)` inside the next batch's transaction; returns once that batch is committed."""
        return await self._submit(body, write=True)

    async def _submit(self, body: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        if self._thread is None:
            raise sqlite3.ProgrammingError("the journal's connection is closed")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): wait for the op in a worker thread instead
            waited: concurrent.futures.Future[T] = concurrent.futures.Future()
            self._queue.put(_Op(body, write, waited))
            return await anyio.to_thread.run_sync(waited.result)  # not cancellable either
        future: asyncio.Future[T] = loop.create_future()
        # Gathered, not queued at once: every task that runs in this turn of the loop adds its op,
        # and the next turn hands them all over together (or this one, when this call is the
        # only one in flight: `callers.alone`). Queued one by one, the first op of a burst woke
        # the idle thread and went alone, the rest waiting for the next batch.
        gathering = not self._gathered
        self._gathered.append(_Op(body, write, future))
        if gathering:
            if alone():
                self._hand_over()
            else:
                loop.call_soon(self._hand_over)
        # Not cancellable once queued, as a call to a worker thread is not: the op runs (and its
        # batch commits) whatever the caller does, so its caller must learn how it ended.
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    def _hand_over(self) -> None:
        gathered, self._gathered = self._gathered, []
        if not gathered:
            return
        if (
            self._handed == 0
            and self.commit_s < INLINE_COMMIT_S
            and self._conn is not None
            and self._conn_lock.acquire(blocking=False)
        ):
            try:
                gathered = self._run_inline(gathered)
            finally:
                self._conn_lock.release()
            if not gathered:
                return
        self._handed += len(gathered)
        self._queue.put(gathered)

    def _run_inline(self, ops: list[_Op[Any]]) -> list[_Op[Any]]:
        """Run `ops` on this (the event loop's) thread; return those left for the thread.

        Holds `_conn_lock`. Never waits for another process: with `busy_timeout` 0, a busy
        database sends the ops concerned to the thread. Every op it does not return is answered.
        """
        conn = self._conn
        assert conn is not None
        left: list[_Op[Any]] = []
        try:
            if not self._busy_zero:
                conn.execute("PRAGMA busy_timeout=0")
                self._busy_zero = True
            writes = [op for op in ops if op.write]
            for op in ops:
                if not op.write:
                    try:
                        op.result = op.body(conn)
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        if _is_busy(exc):
                            left.append(op)
                        else:
                            op.error = exc
            if writes and not self._commit(conn, writes, inline=True):
                left.extend(writes)
        except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
            for op in ops:
                if op not in left and op.error is None:
                    op.error = exc
        _settle([op for op in ops if op not in left] if left else ops)
        return left

    def _open(self, _: object) -> None:
        conn = self._conn = self._connect()
        self._busy_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        if self._wal_path is not None:
            page = int(conn.execute("PRAGMA page_size").fetchone()[0])
            pages = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
            # What the WAL reaches before its first checkpoint lets SQLite write it from the start again.
            self._wal_target = _WAL_HEADER + (max(pages, 0) + WAL_SLACK_FRAMES) * (_WAL_FRAME_HEADER + page)

    def _grow_wal(self) -> bool:
        """Extend the WAL with zeros by one chunk toward `_wal_target`; False when done (or not possible).

        A commit's `fdatasync` that also extends the file must commit the file's new size too
        (on ext4 a journal commit: a second device flush). Until the WAL first wraps (at
        `wal_autocheckpoint` pages) every commit did; with zeros written ahead none does. Zeros
        past SQLite's last valid frame are as harmless as the stale frames it leaves there after
        every wrap: its recovery reads frames up to the first invalid one. They are written only
        while holding the database's write lock (`BEGIN IMMEDIATE`), so no connection of any
        process writes frames meanwhile; synced after the lock is released (whoever syncs first
        pays for the new size once).
        """
        conn, path = self._conn, self._wal_path
        if conn is None or path is None:
            return False
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return False  # no WAL yet (or none we may write): nothing to grow
        try:
            with self._conn_lock:
                if not self._busy_zero:  # never wait for another process's lock for this
                    conn.execute("PRAGMA busy_timeout=0")
                    self._busy_zero = True
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error:
                    return False  # busy or broken: the commits work as they would without
                try:
                    size = os.fstat(fd).st_size
                    if size < self._wal_target:
                        os.pwrite(fd, bytes(min(WAL_GROW_CHUNK, self._wal_target - size)), size)
                finally:
                    conn.execute("COMMIT")  # nothing was changed: writes no frame, syncs nothing
            os.fdatasync(fd)
            return os.fstat(fd).st_size < self._wal_target
        except (OSError, sqlite3.Error):
            return False
        finally:
            os.close(fd)

    # -- the thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        stopping = False
        growing = False
        while not stopping:
            if growing and self._conn is not None and self._queue.empty():
                growing = self._grow_wal()  # a chunk while nothing else is to be done
                continue
            first = get()
            ops: list[_Op[Any]] = []
            item: _Op[Any] | object = first
            writes = 0
            while True:
                if item is _STOP:
                    stopping = True
                    break
                if item is _GROW:
                    growing = True
                elif isinstance(item, list):
                    ops.extend(item)
                    writes += sum(op.write for op in item)
                else:
                    assert isinstance(item, _Op)
                    ops.append(item)
                    writes += item.write
                if writes >= MAX_BATCH:
                    break
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if ops:
                with self._conn_lock:
                    answered = self._run_batch(ops)
                self._deliver(answered)
        with self._conn_lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
        self._fail_late()

    def _fail_late(self) -> None:
        """Fail anything queued after the stop rather than leave its caller waiting."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            late = item if isinstance(item, list) else [item] if isinstance(item, _Op) else []
            for op in late:
                op.error = sqlite3.ProgrammingError("the journal's connection is closed")
            self._deliver(late)

    def _run_batch(self, ops: list[_Op[Any]]) -> list[_Op[Any]]:
        """Run `ops` (holding `_conn_lock`); return those to answer once the lock is released.

        Answered after the release, so that a caller resuming on the event loop finds the
        connection free for its next (inline) commit.
        """
        conn = self._conn
        if conn is not None and self._busy_zero:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")  # the thread may wait for other processes
            self._busy_zero = False
        reads = [op for op in ops if not op.write]
        writes = [op for op in ops if op.write] if len(reads) < len(ops) else []
        for op in reads:
            try:
                op.result = op.body(conn)  # type: ignore[arg-type]  # None only for `_open`, which ignores it
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                op.error = exc
        if not writes:
            return reads
        if reads:
            self._deliver(reads)  # not kept waiting for the commit
        if conn is None:
            error = sqlite3.ProgrammingError("the journal's connection is not open")
            for op in writes:
                op.error = error
        else:
            self._commit(conn, writes, inline=False)
        return writes

    def _commit(self, conn: sqlite3.Connection, writes: list[_Op[Any]], *, inline: bool) -> bool:
        """Run `writes` in one transaction, each in its own savepoint; set each op's outcome.

        Returns False, having run nothing, when `inline` and the database is busy (another
        process holds the write lock): the thread then runs the batch and waits for the lock.
        """
        began = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:  # noqa: BLE001 - every op of the batch fails with it
            if inline and _is_busy(exc):
                return False
            _fail_all(writes, exc)
            return True
        try:
            if len(writes) == 1:
                # Alone in its transaction, an op needs no savepoint: the transaction is its.
                op = writes[0]
                try:
                    op.result = op.body(conn)
                except BaseException as exc:  # noqa: BLE001 - the op fails, nothing of it stays
                    op.error = exc
                    raise
            else:
                for op in writes:
                    conn.execute("SAVEPOINT op")
                    try:
                        op.result = op.body(conn)
                    except BaseException as exc:  # noqa: BLE001 - this op alone fails …
                        op.error = exc
                        if not conn.in_transaction:
                            raise  # … unless SQLite aborted the whole transaction with it
                        conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - the batch is lost as a whole
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # closing the connection (or the next BEGIN) rolls it back
            if len(writes) == 1 and writes[0].error is not None:
                return True  # the op's own error, already its outcome (and nothing committed)
            _fail_all(writes, exc)
            return True
        self._committed(time.perf_counter() - began, len(writes), inline)
        return True

    def _committed(self, seconds: float, writes: int, inline: bool) -> None:
        self.commit_s = 0.8 * self.commit_s + 0.2 * seconds
        observe.journal_committed("sqlite", seconds, writes)
        self.batches += 1
        self.writes += writes
        self.inline_batches += inline
        if self.batches == GROW_AFTER_BATCHES and self._wal_path is not None:
            self._queue.put(_GROW)  # this connection writes: the thread may write the WAL ahead

    def _deliver(self, ops: list[_Op[Any]]) -> None:
        """Hand each op's outcome to its event loop: one wake-up per loop per batch."""
        loops: dict[asyncio.AbstractEventLoop, list[_Op[Any]]] = {}
        for op in ops:
            if isinstance(op.future, concurrent.futures.Future):
                _settle([op])  # a thread waits on it (not asyncio): thread-safe to settle from here
            else:
                loops.setdefault(op.future.get_loop(), []).append(op)
        for loop, mine in loops.items():
            try:
                loop.call_soon_threadsafe(self._answered, mine)
            except RuntimeError:
                pass  # that loop is closed: nobody is waiting any more

    def _answered(self, ops: list[_Op[Any]]) -> None:
        """On the event loop: the thread's answers to ops it was handed."""
        self._handed -= len(ops)
        _settle(ops)


def _is_busy(exc: BaseException) -> bool:
    """Whether `exc` is SQLite's "database is locked" (another connection holds what is needed)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def _fail_all(ops: list[_Op[Any]], exc: BaseException) -> None:
    for op in ops:
        op.result = None
        op.error = exc


def _settle(ops: list[_Op[Any]]) -> None:
    for op in ops:
        if op.future.done():
            continue
        if op.error is not None:
            op.future.set_exception(op.error)
        else:
            op.future.set_result(op.result)
