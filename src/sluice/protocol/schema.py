"""A small DSL mirroring Kafka's JSON message specs, compiled per version into fast codecs.

A message is declared as a tree of ``Field`` objects, each with the same attributes as the
spec: a type (``int8`` ... ``float64``, ``bool``, ``string``, ``bytes``, ``records``, ``uuid``,
``[]T`` arrays, and struct / ``[]Struct`` types with nested ``fields``), the versions that
contain it, the versions where it is nullable, tagged versions and tag, and a default.

``Message.codec(version)`` compiles the tree once per version (and caches it) into closures
that decode from a ``Reader`` into plain ``dict`` objects and encode such dicts into a
``Writer``. The tree is never walked at decode/encode time.

Data model:

* Keys are ``snake_case(spec_name)``: ``TopicData`` -> ``topic_data``, ``ThrottleTimeMs`` ->
  ``throttle_time_ms``, ``IsrNodes`` -> ``isr_nodes``, ``timeoutMs`` -> ``timeout_ms``.
* Decoding yields every field of the struct, whatever the version: a field the version does not
  carry (or a tagged field that was not sent) is filled with its default. Defaults: the spec's
  ``default`` if given; otherwise 0 for numbers, ``False`` for bools, ``""`` for strings,
  ``b""`` for bytes, ``None`` for records, the zero UUID, ``[]`` for arrays, and for structs a
  dict of the sub-fields' defaults. A spec default of ``"null"`` gives ``None``.
* Encoding takes a missing key as the field's default. Fields the version does not carry are
  skipped silently. Tagged fields are written only when their value differs from the default.
* ``bytes`` decode to zero-copy ``memoryview`` slices; so do ``records``. When encoding, a
  ``records`` value may be a bytes-like object *or* a list/tuple of bytes-like chunks (e.g.
  several log-segment slices): the length is the sum of the chunks and the chunks are appended to
  the ``Writer`` by reference.
* ``uuid`` decodes to ``uuid.UUID``; encoding also accepts 16 raw bytes.

Flexible versions use compact strings, bytes and arrays (unsigned varint length + 1) and end
every struct with a tagged-fields section; unknown tags are skipped when decoding.
"""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.protocol.primitives import Buffer, DecodeError, EncodeError, Reader, Writer

__all__ = [
    "Codec",
    "Field",
    "Message",
    "Versions",
    "snake_case",
]

Body = dict[str, Any]
ReadFn = Callable[[Reader], Any]
WriteFn = Callable[[Writer, Any], None]
Factory = Callable[[], Any]

_MISSING: Any = object()
_ZERO_UUID = uuid.UUID(int=0)

_SNAKE_1 = re.compile(r"(.)([A-Z][a-z]+)")
_SNAKE_2 = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """Convert a spec field name to the dict key used by the codec.

    ``TopicData`` -> ``topic_data``; ``ThrottleTimeMs`` -> ``throttle_time_ms``;
    ``IsrNodes`` -> ``isr_nodes``; ``timeoutMs`` -> ``timeout_ms``; ``TopicID`` -> ``topic_id``.
    """
    s = _SNAKE_1.sub(r"\1_\2", name)
    return _SNAKE_2.sub(r"\1_\2", s).lower()


# ----------------------------------------------------------------------------------------------
# Version ranges


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range as written in the specs: ``"0+"``, ``"3-7"``, ``"5"``, ``"none"``."""

    lo: int
    hi: int  # inclusive; a large number for open ranges

    NONE_SPEC = "none"
    OPEN = 0x7FFF

    @classmethod
    def parse(cls, spec: str | None) -> Versions:
        if spec is None or spec == cls.NONE_SPEC or spec == "":
            return cls(1, 0)  # empty
        spec = spec.strip()
        if spec.endswith("+"):
            return cls(int(spec[:-1]), cls.OPEN)
        if "-" in spec:
            lo, hi = spec.split("-", 1)
            return cls(int(lo), int(hi))
        v = int(spec)
        return cls(v, v)

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def intersects(self, lo: int, hi: int) -> bool:
        return not self.empty and self.lo <= hi and lo <= self.hi


# ----------------------------------------------------------------------------------------------
# The DSL

_INT_TYPES = {"int8", "int16", "int32", "int64", "uint16", "uint32"}
_FIXED_SIZE = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint16": 2,
    "uint32": 4,
    "float64": 8,
    "bool": 1,
    "uuid": 16,
}
_PRIMITIVES = {*_FIXED_SIZE, "string", "bytes", "records"}


class Field:
    """One field of a message or struct, mirroring a field object of a Kafka JSON spec.

    ``type`` is a primitive name, ``"[]<primitive>"``, ``"[]<StructName>"`` or ``"<StructName>"``;
    the latter two need ``fields``. ``versions``, ``nullable`` and ``tagged`` are version-range
    strings. ``default`` is the spec's default (a string like ``"-1"``, ``"null"``, ``"true"``,
    ``"0x7fffffff"`` or a Python value). ``ignorable`` is recorded for documentation only:
    encoding a field in a version that lacks it always silently drops it.
    """

    __slots__ = (
        "default",
        "fields",
        "ignorable",
        "key",
        "name",
        "nullable",
        "tag",
        "tagged",
        "type",
        "versions",
    )

    def __init__(
        self,
        name: str,
        type: str,
        versions: str = "0+",
        *,
        nullable: str | None = None,
        tagged: str | None = None,
        tag: int | None = None,
        default: Any = _MISSING,
        ignorable: bool = False,
        fields: Sequence[Field] | None = None,
    ) -> None:
        self.name = name
        self.key = snake_case(name)
        self.type = type
        self.versions = Versions.parse(versions)
        self.nullable = Versions.parse(nullable)
        self.tagged = Versions.parse(tagged)
        self.tag = tag
        self.default = default
        self.ignorable = ignorable
        self.fields: tuple[Field, ...] = tuple(fields or ())
        elem = type[2:] if type.startswith("[]") else type
        if elem not in _PRIMITIVES and not self.fields:
            raise ValueError(f"field {name}: struct type {type} needs fields")
        if elem in _PRIMITIVES and self.fields:
            raise ValueError(f"field {name}: primitive type {type} cannot have fields")
        if not self.tagged.empty and tag is None:
            raise ValueError(f"field {name}: tagged versions need a tag")
        keys = [f.key for f in self.fields]
        if len(keys) != len(set(keys)):
            raise ValueError(f"field {name}: duplicate sub-field names")

    def default_value(self) -> Any:
        """A fresh copy of this field's default value (see the module docstring)."""
        const, factory = _default_factory(self, 0)
        return const if factory is None else factory()

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        """True for struct and array-of-struct fields."""
        return bool(self.fields)

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.type!r})"


class Message:
    """A request or response body schema: top-level fields plus valid and flexible versions."""

    def __init__(
        self,
        name: str,
        api_key: int,
        valid: str,
        flexible: str,
        fields: Sequence[Field],
    ) -> None:
        self.name = name
        self.api_key = api_key
        self.valid = Versions.parse(valid)
        self.flexible = Versions.parse(flexible)
        self.fields: tuple[Field, ...] = tuple(fields)
        self._codecs: dict[int, Codec] = {}

    def codec(self, version: int) -> Codec:
        """The compiled codec for ``version`` (compiled on first use, then cached)."""
        c = self._codecs.get(version)
        if c is None:
            if version not in self.valid:
                raise ValueError(f"{self.name} has no version {version}")
            c = Codec(self, version)
            self._codecs[version] = c
        return c

    def versions(self) -> range:
        return range(self.valid.lo, self.valid.hi + 1)

    def __repr__(self) -> str:
        return f"Message({self.name!r}, versions {self.valid.lo}-{self.valid.hi})"


# ----------------------------------------------------------------------------------------------
# Compilation


def _int_default(spec: Any) -> int:
    if spec is _MISSING:
        return 0
    if isinstance(spec, bool):
        return int(spec)
    if isinstance(spec, int):
        return spec
    s = str(spec).strip().lower()
    if s.startswith(("0x", "-0x")):
        return int(s, 16)
    return int(s)


def _default_factory(f: Field, version: int) -> tuple[Any, Factory | None]:
    """Return ``(constant, None)`` for immutable defaults or ``(None, factory)`` for mutable ones."""
    d = f.default
    if d is None or (isinstance(d, str) and d == "null"):
        return None, None
    if f.is_array:
        return None, list
    if f.is_struct:
        sub = _StructCompiler(f.fields, version, flexible=False, path=f.key)
        return None, sub.make_default
    t = f.type
    if t in _INT_TYPES:
        return _int_default(d), None
    if t == "float64":
        return (0.0 if d is _MISSING else float(d)), None
    if t == "bool":
        if d is _MISSING:
            return False, None
        if isinstance(d, str):
            return d.strip().lower() == "true", None
        return bool(d), None
    if t == "string":
        return ("" if d is _MISSING else str(d)), None
    if t == "bytes":
        return b"", None
    if t == "records":
        return None, None
    if t == "uuid":
        if d is _MISSING:
            return _ZERO_UUID, None
        return (d if isinstance(d, uuid.UUID) else uuid.UUID(str(d))), None
    raise ValueError(f"unknown type {t}")


def _const(value: Any) -> Factory:
    return lambda: value


def _read_fn(t: str, nullable: bool, flexible: bool) -> ReadFn:
    if t in _FIXED_SIZE:
        return {
            "int8": Reader.int8,
            "int16": Reader.int16,
            "int32": Reader.int32,
            "int64": Reader.int64,
            "uint16": Reader.uint16,
            "uint32": Reader.uint32,
            "float64": Reader.float64,
            "bool": Reader.boolean,
            "uuid": Reader.uuid,
        }[t]
    if t == "string":
        if flexible:
            return Reader.compact_nullable_string if nullable else Reader.compact_string
        return Reader.nullable_string if nullable else Reader.string
    if t in ("bytes", "records"):
        if flexible:
            return Reader.compact_nullable_bytes if nullable else Reader.compact_bytes
        return Reader.nullable_bytes if nullable else Reader.bytes
    raise ValueError(f"unknown type {t}")


def _blob_len(v: Any) -> int:
    return int(v.nbytes) if isinstance(v, memoryview) else len(v)  # a FileRegion's len is its size


def _records_writer(nullable: bool, flexible: bool) -> WriteFn:
    def write(w: Writer, v: Any) -> None:
        if v is None:
            if not nullable:
                raise EncodeError("None for non-nullable records")
            if flexible:
                w.unsigned_varint(0)
            else:
                w.int32(-1)
            return
        if isinstance(v, (list, tuple)):
            n = 0
            for c in v:
                n += _blob_len(c)
            if flexible:
                w.unsigned_varint(n + 1)
            else:
                w.int32(n)
            w.write_blobs(v)
            return
        if flexible:
            w.unsigned_varint(_blob_len(v) + 1)
        else:
            w.int32(_blob_len(v))
        w.write_blob(v)

    return write


def _write_fn(t: str, nullable: bool, flexible: bool) -> WriteFn:
    if t == "records":
        return _records_writer(nullable, flexible)
    if t in _FIXED_SIZE:
        table: dict[str, WriteFn] = {
            "int8": Writer.int8,
            "int16": Writer.int16,
            "int32": Writer.int32,
            "int64": Writer.int64,
            "uint16": Writer.uint16,
            "uint32": Writer.uint32,
            "float64": Writer.float64,
            "bool": Writer.boolean,
            "uuid": Writer.uuid,
        }
        return table[t]
    if t == "string":
        if flexible:
            return Writer.compact_nullable_string if nullable else Writer.compact_string
        return Writer.nullable_string if nullable else Writer.string
    if t == "bytes":
        if flexible:
            return Writer.compact_nullable_bytes if nullable else Writer.compact_bytes
        return Writer.nullable_bytes if nullable else Writer.bytes
    raise ValueError(f"unknown type {t}")


def _min_size(t: str, flexible: bool) -> int:
    if t in _FIXED_SIZE:
        return _FIXED_SIZE[t]
    if t == "string":
        return 1 if flexible else 2
    return 1 if flexible else 4  # bytes, records


def _array_reader(elem: ReadFn, elem_min: int, nullable: bool, flexible: bool) -> ReadFn:
    m = max(1, elem_min)
    if flexible:
        length = Reader.compact_nullable_array_length if nullable else Reader.compact_array_length
    else:
        length = Reader.nullable_array_length if nullable else Reader.array_length

    def read(r: Reader) -> list[Any] | None:
        n = length(r, m)
        if n < 0:
            return None
        return [elem(r) for _ in range(n)]

    return read


def _array_writer(elem: WriteFn, nullable: bool, flexible: bool) -> WriteFn:
    def write(w: Writer, v: Any) -> None:
        if v is None:
            if not nullable:
                raise EncodeError("None for a non-nullable array")
            if flexible:
                w.unsigned_varint(0)
            else:
                w.int32(-1)
            return
        if flexible:
            w.unsigned_varint(len(v) + 1)
        else:
            w.int32(len(v))
        for x in v:
            elem(w, x)

    return write


_WRAPPABLE = (struct.error, TypeError, AttributeError, OverflowError, UnicodeEncodeError, ValueError)


class _StructCompiler:
    """Compiles a list of fields at one version into a decoder, an encoder and a default maker."""

    def __init__(self, fields: Sequence[Field], version: int, flexible: bool, path: str) -> None:
        self.version = version
        self.flexible = flexible
        self.path = path
        # (key, read, write, default factory) for regular fields present in this version
        self.regular: list[tuple[str, ReadFn, WriteFn, Factory]] = []
        # tag -> (key, read, write, default constant or _MISSING, default factory)
        self.tagged: dict[int, tuple[str, ReadFn, WriteFn, Factory]] = {}
        self.absent_const: dict[str, Any] = {}
        self.absent_mut: list[tuple[str, Factory]] = []
        self.all_const: dict[str, Any] = {}
        self.all_mut: list[tuple[str, Factory]] = []
        self.min_size = 1 if flexible else 0
        for f in fields:
            const, factory = _default_factory(f, version)
            if factory is None:
                self.all_const[f.key] = const
                dflt = _const(const)
            else:
                self.all_mut.append((f.key, factory))
                dflt = factory
            present = version in f.versions
            is_tagged = present and flexible and version in f.tagged
            if not present or is_tagged:
                if factory is None:
                    self.absent_const[f.key] = const
                else:
                    self.absent_mut.append((f.key, factory))
            if not present:
                continue
            nullable = version in f.nullable
            read, write, size = self._field_codec(f, nullable)
            if is_tagged:
                assert f.tag is not None
                if f.tag in self.tagged:
                    raise ValueError(f"{path}: duplicate tag {f.tag}")
                self.tagged[f.tag] = (f.key, read, write, dflt)
            else:
                self.regular.append((f.key, read, write, dflt))
                self.min_size += size
        self.tagged = dict(sorted(self.tagged.items()))

    def _field_codec(self, f: Field, nullable: bool) -> tuple[ReadFn, WriteFn, int]:
        flexible = self.flexible
        sub_path = f"{self.path}.{f.key}" if self.path else f.key
        if f.is_struct:
            sub = _StructCompiler(f.fields, self.version, flexible, sub_path)
            if f.is_array:
                return (
                    _array_reader(sub.decode, sub.min_size, nullable, flexible),
                    _array_writer(sub.encode, nullable, flexible),
                    1 if flexible else 4,
                )
            return sub.decode, sub.encode, sub.min_size
        if f.is_array:
            et = f.element_type
            return (
                _array_reader(_read_fn(et, False, flexible), _min_size(et, flexible), nullable, flexible),
                _array_writer(_write_fn(et, False, flexible), nullable, flexible),
                1 if flexible else 4,
            )
        return (
            _read_fn(f.type, nullable, flexible),
            _write_fn(f.type, nullable, flexible),
            _min_size(f.type, flexible),
        )

    # -- built closures ------------------------------------------------------------------------

    def make_default(self) -> Body:
        d = dict(self.all_const)
        for k, fac in self.all_mut:
            d[k] = fac()
        return d

    def build(self) -> tuple[ReadFn, WriteFn]:
        steps_r = [(k, rd) for k, rd, _, _ in self.regular]
        absent_const = self.absent_const
        absent_mut = self.absent_mut
        tagged = self.tagged
        flexible = self.flexible
        path = self.path

        if not flexible and not absent_const and not absent_mut:

            def decode(r: Reader) -> Body:
                return {k: rd(r) for k, rd in steps_r}

        elif not flexible:

            def decode(r: Reader) -> Body:
                d = {k: rd(r) for k, rd in steps_r}
                d.update(absent_const)
                for k, fac in absent_mut:
                    d[k] = fac()
                return d

        else:
            tag_readers = {tag: (k, rd) for tag, (k, rd, _, _) in tagged.items()}

            def decode(r: Reader) -> Body:
                d = {k: rd(r) for k, rd in steps_r}
                d.update(absent_const)
                for k, fac in absent_mut:
                    d[k] = fac()
                n = r.unsigned_varint()
                if n:
                    if n * 2 > r.end - r.pos:
                        raise DecodeError(f"{n} tagged fields overrun the buffer")
                    for _ in range(n):
                        tag = r.unsigned_varint()
                        size = r.unsigned_varint()
                        start = r.pos
                        stop = start + size
                        if stop > r.end:
                            raise DecodeError(f"tagged field {tag} of {size} bytes overruns the buffer")
                        entry = tag_readers.get(tag)
                        if entry is not None:
                            d[entry[0]] = entry[1](Reader(r.buf, start, stop))
                        r.pos = stop
                return d

        steps_w = [(k, wr, dflt) for k, _, wr, dflt in self.regular]
        # A tagged field is written only when its encoding differs from the default's encoding
        # (comparing bytes treats a partial struct that equals the default as the default).
        tag_writers = []
        for tag, (k, _, wr, dflt) in tagged.items():
            dw = Writer()
            wr(dw, dflt())
            tag_writers.append((tag, k, wr, dw.getvalue()))

        def encode(w: Writer, d: Mapping[str, Any]) -> None:
            get = d.get
            for k, wr, dflt in steps_w:
                v = get(k, _MISSING)
                if v is _MISSING:
                    v = dflt()
                try:
                    wr(w, v)
                except EncodeError as e:
                    raise EncodeError(f"{path}.{k}: {e}" if path else f"{k}: {e}") from None
                except _WRAPPABLE as e:
                    raise EncodeError(f"{path}.{k}: {e!r}" if path else f"{k}: {e!r}") from e
            if flexible:
                if not tag_writers:
                    w.unsigned_varint(0)
                    return
                parts: list[tuple[int, bytes]] = []
                for tag, k, wr, default_bytes in tag_writers:
                    v = get(k, _MISSING)
                    if v is _MISSING:
                        continue
                    sub = Writer()
                    try:
                        wr(sub, v)
                    except EncodeError as e:
                        raise EncodeError(f"{path}.{k}: {e}" if path else f"{k}: {e}") from None
                    except _WRAPPABLE as e:
                        raise EncodeError(f"{path}.{k}: {e!r}" if path else f"{k}: {e!r}") from e
                    data = sub.getvalue()
                    if data != default_bytes:
                        parts.append((tag, data))
                w.unsigned_varint(len(parts))
                for tag, data in parts:
                    w.unsigned_varint(tag)
                    w.unsigned_varint(len(data))
                    w.write(data)

        return decode, encode

    @property
    def decode(self) -> ReadFn:
        return self._built()[0]

    @property
    def encode(self) -> WriteFn:
        return self._built()[1]

    _cache: tuple[ReadFn, WriteFn] | None = None

    def _built(self) -> tuple[ReadFn, WriteFn]:
        if self._cache is None:
            self._cache = self.build()
        return self._cache


class Codec:
    """A message schema compiled for one version."""

    __slots__ = ("_decode", "_encode", "_struct", "flexible", "message", "version")

    def __init__(self, message: Message, version: int) -> None:
        self.message = message
        self.version = version
        self.flexible = version in message.flexible
        self._struct = _StructCompiler(message.fields, version, self.flexible, "")
        self._decode, self._encode = self._struct.build()

    def decode(self, r: Reader) -> Body:
        """Decode one body from ``r`` (advancing it); raises ``DecodeError`` on bad input."""
        result: Body = self._decode(r)
        return result

    def encode(self, w: Writer, body: Mapping[str, Any]) -> None:
        """Encode ``body`` into ``w``; raises ``EncodeError`` for values that cannot be encoded."""
        if not isinstance(body, Mapping):
            raise EncodeError(f"{self.message.name} body must be a mapping, got {type(body).__name__}")
        self._encode(w, body)

    def default(self) -> Body:
        """A body with every field set to its default."""
        return self._struct.make_default()

    def decode_bytes(self, buf: Buffer) -> Body:
        """Decode a whole buffer holding just this body (trailing bytes are ignored)."""
        return self.decode(Reader(buf))

    def encode_bytes(self, body: Mapping[str, Any]) -> bytes:
        """Encode ``body`` to one ``bytes`` object."""
        w = Writer()
        self.encode(w, body)
        return w.getvalue()

    def __repr__(self) -> str:
        return f"Codec({self.message.name}, v{self.version}{' flexible' if self.flexible else ''})"
