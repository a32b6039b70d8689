"""`file://DIR`: the crash-safe file journal, the embedded default.

URL: `file://PATH` (relative `file://.mcp-durable/journal`, absolute `file:///var/lib/x`; the
prefix is stripped, no netloc rules) with optional query `durability=strict|relaxed` (relaxed:
no fsync, for tests and benchmarks) and `mode=rw|ro` (read-only: no lock, writes raise
`JournalError`; it reads what is on disk at open, e.g. the CLI beside a running server).

On-disk format (directory 0700, files 0600):

    DIR/
      MANIFEST                    JSON: format, journal_id, hash_key, segments (log order), next_segment, seq_floor
      LOCK                        flock'ed by the writer; JSON {pid, host, started_at} of the holder
      seg-00000001.log …          segments: frames, append-only; the manifest's last one is active
      snapshot-<seq hex>.snap     the index at sequence number <seq> (header line + raw arrays)
      seg-….log.torn-<offset>     a torn tail cut off at open, kept aside
      seg-….log.damaged-<offset>  a damaged range skipped at open, kept aside

Frame (one text line; `grep`, `tail -f`, `cut -c37- | jq` work on segments):

    @LLLLLLLL SSSSSSSSSSSSSSSS CCCCCCCC {json payload}\\n
    L payload length (hex), S sequence number (hex, strictly increasing across the journal),
    C CRC-32 of "@L S " and the payload (hex).

Payloads (`t`, codec.py): `c` (a call record, the whole record after a claim, swap or renewal:
the latest frame of an identity is the record; an array in `codec.RECORD_LAYOUT`'s order, with
nothing stored twice or recomputable: no field names, no index hash, no derived key, times as
whole-second offsets where exact, hex digests in base64, a result or arguments that are
canonical JSON as that JSON, trailing nulls left out), `entry` (a process entry; its seq is the frame's; a durable
step is one, of process `steps/<run_id>` and type `step`), `purge` (every record expired at
`now` is gone from there on). Frames of earlier releases are still read: `call` (op, index hash
and the record as `record_json` writes it; one without `reason` reads with `legacy_reason`).
The manifest's `format` (2 since `c` frames) is raised by a writable open; a later one is refused.

Writes: every mutation is one frame. Group commit (commit.py): concurrent writers' frames go out
in one `pwrite` + `fdatasync` per batch, and nothing returns before the flush of its frame
(claims included); reads wait for the frames they return to be on disk. The flush runs inline
in the event loop while fsync is fast, in a worker thread when it is slow. Segments rotate at
64 MiB (the new one is created and fsynced, then the manifest is replaced atomically). The
active segment is allocated 64 KiB ahead of its data (writer.py), so most syncs change no file
size: a segment may end in zero bytes, which are free space, not damage (its data ends at its
last non-zero byte; a frame ends with a newline). Sealed segments and a cleanly closed journal
are trimmed to their data.

Index (index.py): per call record ~38 bytes of flat arrays (80 bits of the hash, segment,
offset and size of the latest frame, version, state, times, tool, principal; the narrow ones
widened when a value does not fit) plus an open-addressing hash table (an int array) keyed by a
128-bit BLAKE2b of `(principal, tool, key)` keyed with the journal's random `hash_key`; every
read also compares the full identity. Results stay on disk and `get()` preads the frame. Process entries:
arrays chained per process (a 64-bit process hash; entries are checked on read), and a count of
the durable steps per (process hash, step index), so `append_step` knows a step is new in one
dict lookup (and reads that process's entries only when the count says it may exist).

Recovery (recovery.py): the newest usable snapshot, then every frame after its end, reading
segments in 8 MiB windows. Snapshots (snapshot.py, format 4: one JSON header line with the
covered segments, end offset, seq, CRC-32 and section list, then the index arrays raw, hash
table included, so loading builds nothing) are written every 100,000 frames (by the writer
that crossed the mark) and at close: temp file, synced every 8 MiB and at its end, rename,
fsync directory; older ones are then deleted. A large index is written by a forked child
(snapshot_child.py), a small one from a copy made in the event loop. A stale (pre-compaction)
or damaged snapshot is ignored, the segments are read; one that cannot be written is logged,
and the write, open or close that started it goes on.

Corruption policy: a torn or corrupt tail (damage no valid frame follows) is cut off at open,
its bytes kept in `<segment>.torn-<offset>` and reported (`recovery.bytes_truncated`,
`truncated_to`, `problems`). Damage before the tail is *resynchronised*: the scanner skips to
the next `@` that starts a valid frame with a higher sequence number, keeps every valid
record after it, and reports the damaged range with its offset in `recovery.problems` (bytes
copied to `<segment>.damaged-<offset>`). A segment named by the manifest but missing, or a
missing manifest beside segments, is refused with `JournalCorruptError`.

Compaction (compaction.py): drops expired records and superseded versions by copying live frames
of the sealed segments verbatim into a new segment, then one atomic manifest rename, then
deleting the old ones: a crash at any point leaves a journal that opens with every live record.

Lock (lock.py): one writer process (`flock` on `LOCK`); a second gets `JournalLockedError`
naming the holder. `verify(directory)` (verify.py) checks every frame without the lock.
"""

from ..base import Problem, VerifyReport
from .compaction import CompactionReport
from .journal import FileJournal
from .verify import verify

__all__ = ["CompactionReport", "FileJournal", "Problem", "VerifyReport", "verify"]
