"""Column values for the random workload of `sluice chaos sync`, as SQL literals for MariaDB.

Two sources of values, both drawing from one `random.Random` so a seed gives the same values:

- `Values`: random values of a few friendly types (text with quotes, backslashes, emoji and
  U+0000; bytes; decimals; doubles; dates and times; JSON), for the workload's first tables.
- `CatalogValues`: a value of any type of the type catalog (chaos/type_catalog.py): NULL, one of
  the type's edge values (its SQL literal, as the type-matrix test writes it), or a random value
  of the type (an integer in its range, text or bytes of the column's length, a decimal of its
  precision and scale, a date, time, JSON document or geometry). Each draw is a `Drawn`, which
  remembers its type and which edge value it is, so a run can count the types it met.

Value kinds (`VALUE_KINDS`) can be turned off, for both: `nul-text` (U+0000 inside text) and
`non-utf8-binary` (binary values whose bytes are not UTF-8; off, random bytes are printable
ASCII and the edge values that are not UTF-8 are not drawn).

Literals are for a session with the catalog's `SESSION_SQL_MODE` (not strict: zero and invalid
dates, ENUM's error value) and time zone `TIMESTAMP_ZONE` (TIMESTAMP literals are in it).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from pymysql.converters import escape_string

from sluice.chaos.type_catalog import CATALOG, CatalogType
from sluice.sync.types import SourceType, parse_type

VALUE_KINDS = ("nul-text", "non-utf8-binary", "invalid-date")

#: A catalog type's name: its column in the catalog without `c_` (`tinyint_u`, `timestamp6`).
TYPE_NAMES = tuple(t.column.removeprefix("c_") for t in CATALOG)
RANDOM = -1  # `Drawn.edge` of a random value


@dataclass(frozen=True, slots=True)
class Drawn:
    """A value drawn for a catalog type: its SQL literal, the type, and which of the type's edge
    values it is (an index into `CatalogType.values`) or RANDOM."""

    sql: str
    type: str
    edge: int


def lit(value: object) -> str:
    """A SQL literal for MariaDB (backslash escapes on, the default)."""
    if value is None:
        return "NULL"
    if isinstance(value, Drawn):
        return value.sql
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, dt.timedelta):
        total = int(value.total_seconds())
        sign = "-" if total < 0 else ""
        total = abs(total)
        return f"'{sign}{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}'"
    if isinstance(value, (dt.datetime, dt.date)):
        return f"'{value.isoformat(sep=' ') if isinstance(value, dt.datetime) else value.isoformat()}'"
    if isinstance(value, str):
        return "'" + escape_string(value) + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


# --- friendly random values ----------------------------------------------------------------------

_WORDS = ("alpha", "beta", "gamma", "O'Brien", "back\\slash", 'quote"d', "tab\there", "new\nline",
          "café", "naïve", "漢字", "Ελληνικά", "🙂", "emoji🚀x", "  padded  ", "%_like", "")  # fmt: skip
#: Words MySQL's latin1 (cp1252) holds, for latin1 columns.
_LATIN1_WORDS = ("alpha", "O'Brien", "back\\slash", "tab\there", "café", "naïve", "€uro", "  padded  ",
                 "ÿ-umlaut", "")  # fmt: skip


class Values:
    """Random column values from one Random, honouring which value kinds are on."""

    def __init__(self, rng: random.Random, value_kinds: tuple[str, ...]) -> None:
        self.rng = rng
        self.nul = "nul-text" in value_kinds
        self.non_utf8 = "non-utf8-binary" in value_kinds

    def maybe(self, make: Callable[[], object], null_p: float = 0.12) -> object:
        return None if self.rng.random() < null_p else make()

    def text(self, max_chars: int, words: tuple[str, ...] = _WORDS) -> str:
        r = self.rng
        parts = [r.choice(words) for _ in range(r.randint(1, 4))]
        if self.nul and r.random() < 0.15:
            parts.insert(r.randrange(len(parts) + 1), "\x00")
        if r.random() < 0.05:
            parts.append("x" * r.randint(100, 300))
        return " ".join(parts)[:max_chars]

    def binary(self, max_len: int) -> bytes:
        r = self.rng
        n = r.randint(0, max_len)
        if self.non_utf8 and r.random() < 0.5:
            return r.randbytes(n)
        return bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz0123456789+/=") for _ in range(n))

    def decimal(self, digits: int, scale: int) -> decimal.Decimal:
        bound = 10 ** (digits) - 1
        return decimal.Decimal(self.rng.randint(-bound, bound)).scaleb(-scale)

    def double(self) -> float:
        r = self.rng
        pick = r.random()
        if pick < 0.1:
            return r.choice([0.0, -0.0, 1e-9, 123456789.123456789, -2.5e10, 1.7976931348623157e300])
        return r.uniform(-1e6, 1e6)

    def datetime(self, fsp: int) -> dt.datetime:
        r = self.rng
        base = dt.datetime(1990, 1, 1) + dt.timedelta(seconds=r.randint(0, 45 * 365 * 86400))
        micro = r.randint(0, 999_999) // 10 ** (6 - fsp) * 10 ** (6 - fsp) if fsp else 0
        return base.replace(microsecond=micro)

    def date(self) -> dt.date:
        if self.rng.random() < 0.05:
            return self.rng.choice([dt.date(1000, 1, 1), dt.date(9999, 12, 31)])
        return dt.date(1970, 1, 1) + dt.timedelta(days=self.rng.randint(0, 50_000))

    def time(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.rng.randint(0, 99 * 3600))

    def integer(self, bits: int) -> int:
        r = self.rng
        if r.random() < 0.1:
            return r.choice([0, -1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))])
        return r.randint(-(2 ** (bits - 2)), 2 ** (bits - 2))

    def json(self) -> str:
        r = self.rng
        doc: dict[str, object] = {
            "n": r.randint(-1000, 1000),
            "f": round(r.uniform(-100, 100), 3),
            "s": r.choice(_WORDS),
            "ok": r.random() < 0.5,
            "none": None,
        }
        if r.random() < 0.5:
            doc["list"] = [r.randint(0, 9) for _ in range(r.randint(0, 4))]
        if r.random() < 0.3:
            doc["nested"] = {"deep": {"k": r.choice(_WORDS)}}
        return json.dumps(doc, ensure_ascii=False)


# --- every type of the catalog -------------------------------------------------------------------

NULL_P = 0.1  # a catalog column's value is NULL this often
EDGE_P = 0.5  # of the rest, one of the type's edge values this often, else a random value


def literal_bytes(sql: str) -> bytes | None:
    """The bytes a plain literal writes (`x'..'`, or a quoted string with MySQL's backslash
    escapes, as UTF-8); None for anything else (an expression, a number)."""
    if sql[:2] in ("x'", "X'") and sql.endswith("'"):
        return bytes.fromhex(sql[2:-1])
    if len(sql) >= 2 and sql[0] == sql[-1] == "'":
        escapes = {"0": "\x00", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "Z": "\x1a"}
        out: list[str] = []
        body = iter(sql[1:-1])
        for ch in body:
            if ch == "\\":
                nxt = next(body, "")
                out.append(escapes.get(nxt, nxt))
            else:
                out.append(ch)
        return "".join(out).encode("utf-8")
    return None


def _calendar_date(raw: bytes) -> bool:
    """Whether a DATE/DATETIME/TIMESTAMP literal's date is one of the calendar (not a zero date,
    a zero in a date, or a day the month does not have)."""
    try:
        y, m, d = (int(x) for x in raw[:10].decode("ascii").split("-"))
        dt.date(y, m, d)
    except ValueError:
        return False
    return True


def edge_allowed(t: CatalogType, index: int, value_kinds: tuple[str, ...]) -> bool:
    """Whether the value kinds that are on let a type's edge value be drawn: with `nul-text`
    off no text value holds U+0000, with `non-utf8-binary` off every binary value is UTF-8,
    with `invalid-date` off every date is one of the calendar (no zero dates, no zero in a date,
    no February 30th: values MariaDB keeps under ALLOW_INVALID_DATES)."""
    source = parse_type(t.ddl)
    family = source.family
    raw = literal_bytes(t.values[index])
    if raw is None:
        return True
    if source.name in ("date", "datetime", "timestamp") and "invalid-date" not in value_kinds:
        return _calendar_date(raw)
    if family in ("string", "enum", "set") and "nul-text" not in value_kinds:
        return b"\x00" not in raw
    if family == "binary" and "non-utf8-binary" not in value_kinds:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


def _int_range(t: SourceType) -> tuple[int, int]:
    bits = 8 * t.size
    return (0, 2**bits - 1) if t.unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


class CatalogValues:
    """Values of the catalog's types (NULL, an edge value, a random value) from `values`' Random."""

    def __init__(self, values: Values, value_kinds: tuple[str, ...]) -> None:
        self.v = values
        self.rng = values.rng
        self.edges = {
            t.column: tuple(i for i in range(len(t.values)) if edge_allowed(t, i, value_kinds))
            for t in CATALOG
        }
        self.parsed = {t.column: parse_type(t.ddl) for t in CATALOG}

    def draw(self, t: CatalogType) -> Drawn | None:
        r = self.rng
        if r.random() < NULL_P:
            return None
        name = t.column.removeprefix("c_")
        edges = self.edges[t.column]
        if edges and r.random() < EDGE_P:
            i = r.choice(edges)
            return Drawn(t.values[i], name, i)
        return Drawn(self.random_sql(t), name, RANDOM)

    def random_sql(self, catalog_type: CatalogType) -> str:
        """A random value of a type, as a SQL literal."""
        r, v = self.rng, self.v
        t = self.parsed[catalog_type.column]
        latin1 = "character set latin1" in catalog_type.ddl.lower()
        f = t.family
        if f == "int":
            lo, hi = _int_range(t)
            if r.random() < 0.5:  # small numbers are the common case, and the one that collides
                lo, hi = max(lo, -1000), min(hi, 1000)
            return str(r.randint(lo, hi))
        if f == "decimal":
            digits = r.randint(1, t.size)
            d = decimal.Decimal(r.randint(-(10**digits - 1), 10**digits - 1)).scaleb(-min(t.scale, digits))
            return f"'{format(d, 'f')}'"  # quoted: an unquoted 5E-30 would be a DOUBLE
        if f == "float":
            if t.size == 4:
                return repr(r.uniform(-1.0, 1.0) * 10.0 ** r.randint(-38, 37))
            return repr(r.choice((v.double(), r.uniform(-1.0, 1.0) * 10.0 ** r.randint(-300, 300))))
        if f == "bit":
            return "b'" + format(r.getrandbits(t.size), f"0{t.size}b") + "'"
        if f == "temporal":
            return self._temporal(t)
        if f == "string":
            return self._text(t, latin1)
        if f == "binary":
            return lit(v.binary(min(t.size, 64)))
        if f == "enum":
            return lit(r.choice((*t.members, "")))
        if f == "set":
            chosen = [m for m in t.members if r.random() < 0.5]
            r.shuffle(chosen)  # MariaDB stores a set, and prints its members in definition order
            return lit(",".join(chosen))
        if f == "json":
            return lit(v.json())
        if f == "geometry":
            return self._geometry(t.name)
        raise AssertionError(f"no random value for {t}")

    def _text(self, t: SourceType, latin1: bool) -> str:
        r, v = self.rng, self.v
        if latin1:
            if r.random() < 0.5:  # any byte: latin1 holds all 256 (0x81, 0x9D as C1 controls)
                low = 0x00 if v.nul else 0x01
                return lit(bytes(r.randint(low, 0xFF) for _ in range(r.randint(0, t.size))))
            return lit(v.text(t.size, _LATIN1_WORDS))
        return lit(v.text(min(t.size, 400)))

    def _temporal(self, t: SourceType) -> str:
        r = self.rng
        fsp = t.scale
        micro = r.randint(0, 999_999) // 10 ** (6 - fsp) * 10 ** (6 - fsp) if fsp else 0
        frac = f".{micro:06d}"[: fsp + 1] if fsp else ""
        if t.name == "year":
            return str(r.choice((0, r.randint(1901, 2155))))
        if t.name == "date":
            return lit(self.v.date())
        if t.name == "datetime":
            first, last = (1000, 9999) if r.random() < 0.2 else (1970, 2040)
            seconds = r.randint(0, (last - first + 1) * 365 * 86400)
            base = dt.datetime(first, 1, 1) + dt.timedelta(seconds=seconds)
            return f"'{base.isoformat(sep=' ')}{frac}'"
        if t.name == "timestamp":
            # in TIMESTAMP_ZONE (+02:00), inside the range 1970-01-01 00:00:01Z .. 2038-01-19 03:14:07Z
            seconds = r.randint(86_400, 2**31 - 86_400)
            wall = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds + 2 * 3600)
            return f"'{wall.isoformat(sep=' ')}{frac}'"
        if t.name == "time":
            sign = "-" if r.random() < 0.4 else ""
            hours = r.choice((r.randint(0, 23), r.randint(0, 837)))
            return f"'{sign}{hours}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac}'"
        raise AssertionError(f"no random value for {t}")

    def _geometry(self, name: str) -> str:
        r = self.rng

        def xy() -> str:
            return (
                f"{round(r.uniform(-180, 180), r.randint(0, 6))} {round(r.uniform(-90, 90), r.randint(0, 6))}"
            )

        if name == "point" or r.random() < 0.4:
            text = f"POINT({xy()})"
        elif r.random() < 0.5:
            text = f"LINESTRING({', '.join(xy() for _ in range(r.randint(2, 5)))})"
        else:
            ring = [xy() for _ in range(3)]
            text = f"POLYGON(({', '.join([*ring, ring[0]])}))"
        srid = r.choice(("", "", ", 4326", ", 3857"))
        return f"ST_GeomFromText('{text}'{srid})"
