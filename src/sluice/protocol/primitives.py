"""Primitive types of the Kafka wire protocol: a bounds-checked ``Reader`` and a chunking ``Writer``.

Everything here is big-endian as the protocol requires. Decoding never trusts a length read
from the wire: every length is checked against the bytes that remain *before* anything is
sliced or allocated, and every malformed input raises ``DecodeError`` (a ``ValueError``).

Conventions:

* ``bytes``-typed fields decode to a ``memoryview`` slice of the input buffer (zero copy). The
  view keeps the whole input frame alive; call ``bytes(view)`` to detach it.
* ``uuid`` fields decode to ``uuid.UUID``; the encoder also accepts 16 raw ``bytes``.
* ``Writer`` accumulates small writes in a ``bytearray`` and keeps large byte blobs (record
  sets) as separate chunks *by reference*, so a response can be sent with
  ``transport.writelines(writer.chunks())`` without ever copying the blobs.
* A ``FileRegion`` (bytes of an open file: a Fetch answer's record sets, read from the log's
  segment files) is a blob the ``Writer`` keeps as its own chunk without reading it: the
  connection sends it from the file (``sendfile``, broker/zero_copy.py) or reads it then.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterable

__all__ = [
    "BIG_CHUNK",
    "Buffer",
    "Chunk",
    "DecodeError",
    "EncodeError",
    "FileRegion",
    "Reader",
    "RegionTruncatedError",
    "Writer",
    "size_of_unsigned_varint",
]

Buffer = bytes | bytearray | memoryview
"""Any contiguous bytes-like object accepted by the codec."""


class RegionTruncatedError(OSError):
    """A ``FileRegion``'s file ended before the region did: it was truncated after the region
    was taken (a log truncated to a leader's epoch). The bytes announced cannot be sent."""


class FileRegion:
    """``size`` bytes of an open file from ``offset``: a record set as it lies in a segment file.

    It owns ``fd``, its own descriptor of the file (``os.dup`` of the segment's), so the bytes
    stay readable while it exists even when the segment is closed, deleted or replaced by a
    compacted one meanwhile (Kafka's FileRecords keeps its channel the same way). ``close()``
    gives the descriptor back; an unclosed region closes it when collected."""

    __slots__ = ("fd", "offset", "size")

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self.fd = fd
        self.offset = offset
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The region's bytes (one ``pread``, looped over short reads)."""
        parts = []
        got = 0
        while got < self.size:
            more = os.pread(self.fd, self.size - got, self.offset + got)
            if not more:
                raise RegionTruncatedError(f"file ended {self.size - got} bytes before the region's end")
            parts.append(more)
            got += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, size={self.size})"


Chunk = bytes | memoryview | FileRegion
"""A piece of an encoding: bytes, or a region of a file sent as it is."""

BIG_CHUNK = 512
"""Byte blobs at least this long are appended to a ``Writer`` by reference instead of copied."""

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")

_ZERO_UUID = uuid.UUID(int=0)


class DecodeError(ValueError):
    """The input is not a valid encoding (short, negative length, bad UTF-8, overlong varint...)."""


class EncodeError(ValueError):
    """A value cannot be encoded (wrong type, out of range, None for a non-nullable field...)."""


class Reader:
    """Sequential, bounds-checked reader over a bytes-like buffer.

    ``pos`` is the offset of the next byte to read; ``end`` is one past the last readable byte.
    """

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: Buffer, pos: int = 0, end: int | None = None) -> None:
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        self.buf: memoryview = mv
        n = len(mv)
        self.end: int = n if end is None else min(end, n)
        if pos < 0 or pos > self.end:
            raise DecodeError(f"start position {pos} outside buffer of {self.end} bytes")
        self.pos: int = pos

    # -- helpers ---------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        """Number of bytes left to read."""
        return self.end - self.pos

    def _need(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise DecodeError(f"need {n} bytes at offset {p}, only {self.end - p} left")
        self.pos = p + n
        return p

    def skip(self, n: int) -> None:
        """Advance by ``n`` bytes (bounds-checked)."""
        self._need(n)

    def raw(self, n: int) -> memoryview:
        """Return the next ``n`` bytes as a zero-copy view."""
        p = self._need(n)
        return self.buf[p : p + n]

    # -- fixed-size integers ---------------------------------------------------------------

    def int8(self) -> int:
        p = self.pos
        if p + 1 > self.end:
            raise DecodeError(f"short read of int8 at offset {p}")
        self.pos = p + 1
        return int(_I8.unpack_from(self.buf, p)[0])

    def int16(self) -> int:
        p = self.pos
        if p + 2 > self.end:
            raise DecodeError(f"short read of int16 at offset {p}")
        self.pos = p + 2
        return int(_I16.unpack_from(self.buf, p)[0])

    def int32(self) -> int:
        p = self.pos
        if p + 4 > self.end:
            raise DecodeError(f"short read of int32 at offset {p}")
        self.pos = p + 4
        return int(_I32.unpack_from(self.buf, p)[0])

    def int64(self) -> int:
        p = self.pos
        if p + 8 > self.end:
            raise DecodeError(f"short read of int64 at offset {p}")
        self.pos = p + 8
        return int(_I64.unpack_from(self.buf, p)[0])

    def uint16(self) -> int:
        p = self._need(2)
        return int(_U16.unpack_from(self.buf, p)[0])

    def uint32(self) -> int:
        p = self._need(4)
        return int(_U32.unpack_from(self.buf, p)[0])

    def float64(self) -> float:
        p = self._need(8)
        return float(_F64.unpack_from(self.buf, p)[0])

    def boolean(self) -> bool:
        """A bool is one byte; any non-zero value is true (as Kafka's reader does)."""
        p = self.pos
        if p + 1 > self.end:
            raise DecodeError(f"short read of bool at offset {p}")
        self.pos = p + 1
        return self.buf[p] != 0

    def uuid(self) -> uuid.UUID:
        p = self._need(16)
        return uuid.UUID(bytes=bytes(self.buf[p : p + 16]))

    # -- variable-length integers ----------------------------------------------------------

    def unsigned_varint(self) -> int:
        """Unsigned LEB128 of at most 5 bytes holding a value below 2**32."""
        buf = self.buf
        p = self.pos
        end = self.end
        value = 0
        shift = 0
        while True:
            if p >= end:
                raise DecodeError("short read of varint")
            b = buf[p]
            p += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 28:
                raise DecodeError("varint is longer than 5 bytes")
        if value > 0xFFFFFFFF:
            raise DecodeError("varint does not fit 32 bits")
        self.pos = p
        return value

    def unsigned_varlong(self) -> int:
        """Unsigned LEB128 of at most 10 bytes holding a value below 2**64."""
        buf = self.buf
        p = self.pos
        end = self.end
        value = 0
        shift = 0
        while True:
            if p >= end:
                raise DecodeError("short read of varlong")
            b = buf[p]
            p += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise DecodeError("varlong is longer than 10 bytes")
        if value > 0xFFFFFFFFFFFFFFFF:
            raise DecodeError("varlong does not fit 64 bits")
        self.pos = p
        return value

    def varint(self) -> int:
        """Zigzag-encoded signed 32-bit varint."""
        v = self.unsigned_varint()
        return (v >> 1) ^ -(v & 1)

    def varlong(self) -> int:
        """Zigzag-encoded signed 64-bit varint."""
        v = self.unsigned_varlong()
        return (v >> 1) ^ -(v & 1)

    # -- strings -----------------------------------------------------------------------------

    def _text(self, n: int) -> str:
        p = self.pos
        if p + n > self.end:
            raise DecodeError(f"string of {n} bytes at offset {p} overruns the buffer")
        self.pos = p + n
        try:
            return str(self.buf[p : p + n], "utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"invalid UTF-8 in string at offset {p}") from e

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise DecodeError(f"negative string length {n}")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < 0:
            if n == -1:
                return None
            raise DecodeError(f"negative string length {n}")
        return self._text(n)

    def compact_string(self) -> str:
        n = self.unsigned_varint()
        if n == 0:
            raise DecodeError("null compact string in a non-nullable field")
        return self._text(n - 1)

    def compact_nullable_string(self) -> str | None:
        n = self.unsigned_varint()
        if n == 0:
            return None
        return self._text(n - 1)

    # -- byte blobs ------------------------------------------------------------------------

    def bytes(self) -> memoryview:
        n = self.int32()
        if n < 0:
            raise DecodeError(f"negative bytes length {n}")
        return self.raw(n)

    def nullable_bytes(self) -> memoryview | None:
        n = self.int32()
        if n < 0:
            if n == -1:
                return None
            raise DecodeError(f"negative bytes length {n}")
        return self.raw(n)

    def compact_bytes(self) -> memoryview:
        n = self.unsigned_varint()
        if n == 0:
            raise DecodeError("null compact bytes in a non-nullable field")
        return self.raw(n - 1)

    def compact_nullable_bytes(self) -> memoryview | None:
        n = self.unsigned_varint()
        if n == 0:
            return None
        return self.raw(n - 1)

    # -- array lengths -----------------------------------------------------------------------

    def _check_count(self, n: int, min_element_size: int) -> int:
        if n * min_element_size > self.end - self.pos:
            raise DecodeError(
                f"array of {n} elements (at least {min_element_size} bytes each) overruns the buffer"
            )
        return n

    def array_length(self, min_element_size: int = 1) -> int:
        """A non-nullable int32 array length, sanity-checked against the remaining bytes."""
        n = self.int32()
        if n < 0:
            raise DecodeError(f"negative array length {n}")
        return self._check_count(n, min_element_size)

    def nullable_array_length(self, min_element_size: int = 1) -> int:
        """An int32 array length where -1 means null (returned as -1)."""
        n = self.int32()
        if n < 0:
            if n == -1:
                return -1
            raise DecodeError(f"negative array length {n}")
        return self._check_count(n, min_element_size)

    def compact_array_length(self, min_element_size: int = 1) -> int:
        """A non-nullable compact array length (unsigned varint N+1)."""
        n = self.unsigned_varint()
        if n == 0:
            raise DecodeError("null compact array in a non-nullable field")
        return self._check_count(n - 1, min_element_size)

    def compact_nullable_array_length(self, min_element_size: int = 1) -> int:
        """A compact array length where 0 on the wire means null (returned as -1)."""
        n = self.unsigned_varint()
        if n == 0:
            return -1
        return self._check_count(n - 1, min_element_size)


def size_of_unsigned_varint(value: int) -> int:
    """Number of bytes ``value`` takes as an unsigned varint."""
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


def _uvarint_bytes(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_UVARINTS = [bytes((i,)) for i in range(0x80)]


class Writer:
    """Builds an encoding as a list of chunks.

    Small values go into an internal ``bytearray``; blobs of at least ``BIG_CHUNK`` bytes passed
    to ``write_blob`` are kept by reference as their own chunk. ``size`` is the total number of
    bytes written so far.
    """

    __slots__ = ("_buf", "_chunks", "size")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._chunks: list[Chunk] = []
        self.size = 0

    # -- output --------------------------------------------------------------------------------

    def chunks(self) -> list[Chunk]:
        """The encoding as a list of chunks; large blobs and file regions appear as the
        caller's own objects."""
        if self._buf:
            self._chunks.append(bytes(self._buf))
            self._buf = bytearray()
        return list(self._chunks)

    def getvalue(self) -> bytes:
        """The encoding as one ``bytes`` object (this copies the blobs and reads the regions)."""
        return b"".join(c.read() if isinstance(c, FileRegion) else c for c in self.chunks())

    # -- raw -----------------------------------------------------------------------------------

    def write(self, data: Buffer) -> None:
        """Copy ``data`` into the writer."""
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        self._buf += data
        self.size += n

    def write_blob(self, data: Buffer | FileRegion) -> None:
        """Append ``data``; large blobs and file regions are kept by reference (zero copy),
        small blobs copied."""
        if isinstance(data, FileRegion):
            if self._buf:
                self._chunks.append(bytes(self._buf))
                self._buf = bytearray()
            self._chunks.append(data)
            self.size += data.size
            return
        if isinstance(data, memoryview):
            if data.format != "B" or data.ndim != 1:
                data = data.cast("B")
            n = data.nbytes
        else:
            n = len(data)
        if n >= BIG_CHUNK:
            if self._buf:
                self._chunks.append(bytes(self._buf))
                self._buf = bytearray()
            self._chunks.append(data if not isinstance(data, bytearray) else memoryview(data))
        else:
            self._buf += data
        self.size += n

    def write_blobs(self, chunks: Iterable[Buffer | FileRegion]) -> None:
        for c in chunks:
            self.write_blob(c)

    # -- fixed-size integers ---------------------------------------------------------------

    def int8(self, v: int) -> None:
        self._buf += _I8.pack(v)
        self.size += 1

    def int16(self, v: int) -> None:
        self._buf += _I16.pack(v)
        self.size += 2

    def int32(self, v: int) -> None:
        self._buf += _I32.pack(v)
        self.size += 4

    def int64(self, v: int) -> None:
        self._buf += _I64.pack(v)
        self.size += 8

    def uint16(self, v: int) -> None:
        self._buf += _U16.pack(v)
        self.size += 2

    def uint32(self, v: int) -> None:
        self._buf += _U32.pack(v)
        self.size += 4

    def float64(self, v: float) -> None:
        self._buf += _F64.pack(v)
        self.size += 8

    def boolean(self, v: bool) -> None:
        self._buf.append(1 if v else 0)
        self.size += 1

    def uuid(self, v: uuid.UUID | bytes | None) -> None:
        if v is None:
            raw = _ZERO_UUID.bytes
        elif isinstance(v, uuid.UUID):
            raw = v.bytes
        else:
            raw = bytes(v)
            if len(raw) != 16:
                raise EncodeError(f"uuid must be 16 bytes, got {len(raw)}")
        self._buf += raw
        self.size += 16

    # -- variable-length integers ----------------------------------------------------------

    def unsigned_varint(self, v: int) -> None:
        if v < 0 or v > 0xFFFFFFFF:
            raise EncodeError(f"unsigned varint out of range: {v}")
        b = _uvarint_bytes(v)
        self._buf += b
        self.size += len(b)

    def unsigned_varlong(self, v: int) -> None:
        if v < 0 or v > 0xFFFFFFFFFFFFFFFF:
            raise EncodeError(f"unsigned varlong out of range: {v}")
        b = _uvarint_bytes(v)
        self._buf += b
        self.size += len(b)

    def varint(self, v: int) -> None:
        if v < -(1 << 31) or v >= 1 << 31:
            raise EncodeError(f"varint out of range: {v}")
        self.unsigned_varint(((v << 1) ^ (v >> 31)) & 0xFFFFFFFF)

    def varlong(self, v: int) -> None:
        if v < -(1 << 63) or v >= 1 << 63:
            raise EncodeError(f"varlong out of range: {v}")
        self.unsigned_varlong(((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF)

    # -- strings -----------------------------------------------------------------------------

    def string(self, v: str) -> None:
        if v is None:
            raise EncodeError("None for a non-nullable string")
        b = v.encode("utf-8")
        if len(b) > 0x7FFF:
            raise EncodeError(f"string of {len(b)} bytes is too long")
        self._buf += _I16.pack(len(b))
        self._buf += b
        self.size += 2 + len(b)

    def nullable_string(self, v: str | None) -> None:
        if v is None:
            self.int16(-1)
        else:
            self.string(v)

    def compact_string(self, v: str) -> None:
        if v is None:
            raise EncodeError("None for a non-nullable string")
        b = v.encode("utf-8")
        self.unsigned_varint(len(b) + 1)
        self._buf += b
        self.size += len(b)

    def compact_nullable_string(self, v: str | None) -> None:
        if v is None:
            self._buf.append(0)
            self.size += 1
        else:
            self.compact_string(v)

    # -- byte blobs ------------------------------------------------------------------------

    def bytes(self, v: Buffer) -> None:
        if v is None:
            raise EncodeError("None for non-nullable bytes")
        n = v.nbytes if isinstance(v, memoryview) else len(v)
        self.int32(n)
        self.write_blob(v)

    def nullable_bytes(self, v: Buffer | None) -> None:
        if v is None:
            self.int32(-1)
        else:
            self.bytes(v)

    def compact_bytes(self, v: Buffer) -> None:
        if v is None:
            raise EncodeError("None for non-nullable bytes")
        n = v.nbytes if isinstance(v, memoryview) else len(v)
        self.unsigned_varint(n + 1)
        self.write_blob(v)

    def compact_nullable_bytes(self, v: Buffer | None) -> None:
        if v is None:
            self._buf.append(0)
            self.size += 1
        else:
            self.compact_bytes(v)
