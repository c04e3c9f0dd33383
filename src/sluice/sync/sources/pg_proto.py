"""pgoutput, PostgreSQL's logical replication output: its messages decoded from their bytes.

The layouts are PostgreSQL's ("Logical Replication Message Formats" in the protocol chapter of
its documentation), for protocol version 2 with `messages` and `streaming` on, which the
PostgreSQL source asks for (sync/sources/postgresql.py): one message per XLogData payload,
big-endian integers, NUL-terminated strings, LSNs as 64-bit integers, times as microseconds
since 2000-01-01 UTC.

Version 2 adds the streaming of transactions still in progress: a transaction larger than the
server's logical_decoding_work_mem comes in blocks (Stream Start ... Stream Stop) between other
transactions, and ends with Stream Commit or Stream Abort. Inside a block, each Relation, Type,
Insert, Update, Delete, Truncate and Message has the (sub)transaction's xid after its type
byte (`streamed` takes it off: the rest is the version 1 message).

Only what the source needs is kept of each message. A message this module does not know (a
newer protocol's) is an error, never skipped: a skipped message could be a change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: pgoutput's epoch (2000-01-01 00:00 UTC) in Unix milliseconds
PG_EPOCH_MS = 946_684_800_000

#: a TupleData column: (kind, text). kind "n" null, "u" an unchanged TOASTed value (not sent),
#: "t" text, "b" binary (never asked for here).
Column = tuple[str, bytes | None]


class ProtocolError(ValueError):
    """Bytes that are not a pgoutput message of the version asked for."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_ms: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # the end of the commit record: where a restart after this transaction begins
    commit_ms: int


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    key: bool  # part of the replica identity


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str  # "" is pg_catalog
    name: str
    identity: str  # "d" default, "n" nothing, "f" full, "i" index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation: int
    new: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relation: int
    old: tuple[Column, ...] | None  # the old key (K) or the whole old row (O), when sent
    old_is_key: bool
    new: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation: int
    old: tuple[Column, ...]
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int  # the top-level transaction's
    first: bool  # its first block


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ms: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int  # the top-level transaction
    subxid: int  # the (sub)transaction aborted: all of it when equal to xid


Decoded = (
    Begin | Commit | Relation | TypeInfo | Insert | Update | Delete | Truncate | Message | Origin
    | StreamStart | StreamStop | StreamCommit | StreamAbort
)  # fmt: skip

#: the message types that carry an xid inside a stream block
_STREAMED_KINDS = frozenset(b"RYIUDTM")


class _Reader:
    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise ProtocolError(f"message ends after {len(self.data)} bytes, {end} needed")
        out = self.data[self.at : end]
        self.at = end
        return out

    def unpack(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))

    def int8(self) -> int:
        return self.unpack(">b")[0]

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def int16(self) -> int:
        return self.unpack(">h")[0]

    def int32(self) -> int:
        return self.unpack(">i")[0]

    def uint32(self) -> int:
        return self.unpack(">I")[0]

    def int64(self) -> int:
        return self.unpack(">q")[0]

    def uint64(self) -> int:
        return self.unpack(">Q")[0]

    def string(self) -> str:
        end = self.data.find(b"\x00", self.at)
        if end < 0:
            raise ProtocolError("a string without its terminating NUL")
        out = self.data[self.at : end].decode("utf-8")
        self.at = end + 1
        return out

    def tuple_data(self) -> tuple[Column, ...]:
        out, self.at = tuple_data(self.data, self.at)
        return out

    def end(self, what: str) -> None:
        if self.at != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.at} bytes left after a {what} message")


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_KINDS = {110: "n", 117: "u", 116: "t", 98: "b"}


def tuple_data(data: bytes, at: int) -> tuple[tuple[Column, ...], int]:
    """A TupleData at `at`: its columns and where it ends (the hot loop of every change: one
    pass, no calls per field but the slicing)."""
    size = len(data)
    if at + 2 > size:
        raise ProtocolError(f"message ends after {size} bytes, {at + 2} needed")
    (count,) = _I16.unpack_from(data, at)
    at += 2
    out: list[Column] = []
    for _ in range(count):
        if at >= size:
            raise ProtocolError(f"message ends after {size} bytes, {at + 1} needed")
        kind = data[at]
        at += 1
        if kind == 116 or kind == 98:  # t, b: a value and its length
            if at + 4 > size:
                raise ProtocolError(f"message ends after {size} bytes, {at + 4} needed")
            (length,) = _I32.unpack_from(data, at)
            at += 4
            end = at + length
            if length < 0 or end > size:
                raise ProtocolError(f"message ends after {size} bytes, {end} needed")
            out.append(("t" if kind == 116 else "b", data[at:end]))
            at = end
        elif kind == 110 or kind == 117:  # n, u
            out.append((_KINDS[kind], None))
        else:
            raise ProtocolError(f"a tuple column of unknown kind {chr(kind)!r}")
    return tuple(out), at


def _change(payload: bytes) -> Decoded | None:
    """Insert, Update and Delete without the general reader (most messages are these)."""
    kind = payload[0]
    size = len(payload)
    if size < 6:
        return None
    (rel,) = _U32.unpack_from(payload, 1)
    marker = payload[5]
    if kind == 73:  # I
        if marker != 78:
            raise ProtocolError("an Insert without its new tuple")
        new, at = tuple_data(payload, 6)
        out: Decoded = Insert(rel, new)
    elif kind == 85:  # U
        old: tuple[Column, ...] | None = None
        at = 6
        if marker in (75, 79):  # K, O
            old, at = tuple_data(payload, 6)
            if at >= size:
                raise ProtocolError(f"message ends after {size} bytes, {at + 1} needed")
            marker = payload[at]
            at += 1
        if marker != 78:
            raise ProtocolError(f"an Update with {chr(marker)!r} where its new tuple begins")
        new, at = tuple_data(payload, at)
        out = Update(rel, old, payload[5] == 75, new)
    elif kind == 68:  # D
        if marker not in (75, 79):
            raise ProtocolError(f"a Delete with {chr(marker)!r} where its old tuple begins")
        old_row, at = tuple_data(payload, 6)
        out = Delete(rel, old_row, marker == 75)
    else:
        return None
    if at != size:
        raise ProtocolError(f"{size - at} bytes left after a {type(out).__name__} message")
    return out


def to_unix_ms(pg_us: int) -> int:
    return PG_EPOCH_MS + pg_us // 1000


def streamed(payload: bytes) -> tuple[int, bytes]:
    """A message inside a stream block: its (sub)transaction's xid, and the message without it."""
    if len(payload) < 5 or payload[0] not in _STREAMED_KINDS:
        kind = chr(payload[0]) if payload else "nothing"
        raise ProtocolError(f"message type {kind!r} inside a stream block carries no xid")
    (xid,) = _U32.unpack_from(payload, 1)
    return xid, payload[:1] + payload[5:]


def decode(payload: bytes) -> Decoded:
    """One pgoutput message (protocol version 2, outside a stream block: see `streamed`)."""
    if not payload:
        raise ProtocolError("an empty message")
    if payload[0] in (73, 85, 68):  # I, U, D
        change = _change(bytes(payload))
        if change is not None:
            return change
    r = _Reader(bytes(payload))
    kind = r.byte()
    out: Decoded
    if kind == "B":
        final_lsn, ts = r.uint64(), r.int64()
        out = Begin(final_lsn, to_unix_ms(ts), r.uint32())
    elif kind == "C":
        r.int8()  # flags, unused
        commit_lsn, end_lsn, ts = r.uint64(), r.uint64(), r.int64()
        out = Commit(commit_lsn, end_lsn, to_unix_ms(ts))
    elif kind == "R":
        oid, namespace, name = r.uint32(), r.string(), r.string()
        identity = r.byte()
        cols = []
        for _ in range(r.int16()):
            flags = r.int8()
            col_name = r.string()
            cols.append(RelationColumn(col_name, r.uint32(), r.int32(), bool(flags & 1)))
        out = Relation(oid, namespace, name, identity, tuple(cols))
    elif kind == "Y":
        out = TypeInfo(r.uint32(), r.string(), r.string())
    elif kind == "I":
        rel = r.uint32()
        if r.byte() != "N":
            raise ProtocolError("an Insert without its new tuple")
        out = Insert(rel, r.tuple_data())
    elif kind == "U":
        rel = r.uint32()
        marker = r.byte()
        old: tuple[Column, ...] | None = None
        old_is_key = False
        if marker in ("K", "O"):
            old, old_is_key = r.tuple_data(), marker == "K"
            marker = r.byte()
        if marker != "N":
            raise ProtocolError(f"an Update with {marker!r} where its new tuple begins")
        out = Update(rel, old, old_is_key, r.tuple_data())
    elif kind == "D":
        rel = r.uint32()
        marker = r.byte()
        if marker not in ("K", "O"):
            raise ProtocolError(f"a Delete with {marker!r} where its old tuple begins")
        out = Delete(rel, r.tuple_data(), marker == "K")
    elif kind == "T":
        count = r.int32()
        options = r.int8()
        rels = tuple(r.uint32() for _ in range(count))
        out = Truncate(rels, bool(options & 1), bool(options & 2))
    elif kind == "M":
        flags = r.int8()
        lsn, prefix = r.uint64(), r.string()
        out = Message(bool(flags & 1), lsn, prefix, r.take(r.int32()))
    elif kind == "O":
        out = Origin(r.uint64(), r.string())
    elif kind == "S":
        out = StreamStart(r.uint32(), r.int8() == 1)
    elif kind == "E":
        out = StreamStop()
    elif kind == "c":
        xid = r.uint32()
        r.int8()  # flags, unused
        commit_lsn, end_lsn, ts = r.uint64(), r.uint64(), r.int64()
        out = StreamCommit(xid, commit_lsn, end_lsn, to_unix_ms(ts))
    elif kind == "A":
        out = StreamAbort(r.uint32(), r.uint32())
    else:
        raise ProtocolError(f"message type {kind!r} is not one of protocol version 2's")
    r.end(type(out).__name__)
    return out


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints it (`16/B374D848`)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, sep, lo = str(text).partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r} (expected X/Y, as pg_current_wal_lsn() prints it)")
    return int(hi, 16) << 32 | int(lo, 16)
