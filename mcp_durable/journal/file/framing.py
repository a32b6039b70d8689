"""Frames: the unit of the segment files, and the scanner that finds them (with resynchronisation).

A frame is one text line:

    @LLLLLLLL SSSSSSSSSSSSSSSS CCCCCCCC <payload: L bytes of JSON>\\n

`L` is the payload length (8 hex digits), `S` the sequence number (16 hex digits), `C` the
CRC-32 (8 hex digits) of the first 27 bytes (`@L S `) followed by the payload. orjson never
writes a raw newline inside a document: the only `\\n` bytes of a segment end frames, and a
frame can never be hidden inside another's payload: after damage the scanner resynchronises on
the next `@` that starts a valid frame.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

HEADER_SIZE = 36  # "@" 8 " " 16 " " 8 " "
OVERHEAD = HEADER_SIZE + 1  # header and the closing newline
MAX_PAYLOAD = 0xFFFFFFFF
_AT = 0x40
_NL = 0x0A
_SP = 0x20


def encode_frame(seq: int, payload: bytes) -> bytes:
    """One frame around `payload` (JSON without a raw newline)."""
    head = b"@%08x %016x " % (len(payload), seq)
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"%s%08x %s\n" % (head, crc, payload)


@dataclass(frozen=True, slots=True)
class Frame:
    """A valid frame found at `offset`; its payload is `buf[start:start + length]`."""

    offset: int
    seq: int
    start: int
    length: int

    @property
    def size(self) -> int:
        return self.length + OVERHEAD

    @property
    def end(self) -> int:
        return self.offset + self.length + OVERHEAD


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes `[start, end)` that are not frames. `tail` when nothing valid follows them."""

    start: int
    end: int
    reason: str
    tail: bool


def parse_at(buf: bytes, pos: int, end: int) -> Frame | str:
    """The frame starting at `pos` (not beyond `end`), or why there is none."""
    if end - pos < OVERHEAD:
        return "incomplete frame header"
    if buf[pos] != _AT or buf[pos + 9] != _SP or buf[pos + 26] != _SP or buf[pos + 35] != _SP:
        return "not a frame header"
    try:
        length = int(buf[pos + 1 : pos + 9], 16)
        seq = int(buf[pos + 10 : pos + 26], 16)
        crc = int(buf[pos + 27 : pos + 35], 16)
    except ValueError:
        return "not a frame header"
    stop = pos + HEADER_SIZE + length
    if stop + 1 > end:
        return "frame runs past the end of the file"
    if buf[stop] != _NL:
        return "frame does not end with a newline"
    if zlib.crc32(buf[pos + HEADER_SIZE : stop], zlib.crc32(buf[pos : pos + 27])) != crc:
        return "checksum mismatch"
    return Frame(pos, seq, pos + HEADER_SIZE, length)


def scan(buf: bytes, start: int = 0, last_seq: int = 0) -> Iterator[Frame | Damage]:
    """Every frame of `buf[start:]` in order, and every damaged range between them.

    Policy: on damage, resynchronise on the next `@` that starts a valid frame whose sequence
    number is above the last good one, and keep going; the bytes skipped are reported as a
    `Damage`. Damage with no valid frame after it is the tail (`tail=True`). A frame whose
    sequence number does not increase is treated as damage too (a stale copy is never replayed
    over newer records).
    """
    end = len(buf)
    pos = start
    crc32 = zlib.crc32
    while pos < end:
        # The fast path (a valid frame), inline: recovery runs it once per frame.
        try:
            if buf[pos] == _AT and buf[pos + 35] == _SP:
                length = int(buf[pos + 1 : pos + 9], 16)
                seq = int(buf[pos + 10 : pos + 26], 16)
                stop = pos + HEADER_SIZE + length
                if (
                    stop < end
                    and buf[stop] == _NL
                    and seq > last_seq
                    and buf[pos + 9] == _SP
                    and buf[pos + 26] == _SP
                    and length >= 0
                    and crc32(buf[pos + HEADER_SIZE : stop], crc32(buf[pos : pos + 27]))
                    == int(buf[pos + 27 : pos + 35], 16)
                ):
                    last_seq = seq
                    yield Frame(pos, seq, pos + HEADER_SIZE, length)
                    pos = stop + 1
                    continue
        except (ValueError, IndexError):
            pass
        found = parse_at(buf, pos, end)
        reason = found if isinstance(found, str) else "sequence number does not increase"
        resume = _resync(buf, pos, end, last_seq)
        if resume is None:
            yield Damage(pos, end, reason, tail=True)
            return
        yield Damage(pos, resume, reason, tail=False)
        pos = resume


def _resync(buf: bytes, pos: int, end: int, last_seq: int) -> int | None:
    # Any "@" may start the next frame (garbage need not end with a newline); a false start
    # fails the header or the checksum, and a frame cannot hide inside a payload because a
    # payload never holds the raw newline a frame ends with.
    search = pos + 1
    while True:
        candidate = buf.find(b"@", search, end)
        if candidate < 0:
            return None
        found = parse_at(buf, candidate, end)
        if isinstance(found, Frame) and found.seq > last_seq:
            return candidate
        search = candidate + 1
