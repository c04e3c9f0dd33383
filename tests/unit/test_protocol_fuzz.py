"""Fuzzing decode_request: any byte string yields a result, DecodeError or UnsupportedVersion.

Inputs are random frames (with a plausible header so the body decoders are reached) and valid
encoded requests of every API and version with bytes flipped, truncated, overwritten with
huge length-like values, or extended.
"""

from __future__ import annotations

import random
import struct
import tracemalloc
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.api import SUPPORTED, UnsupportedVersion, decode_request, encode_request
from sluice.protocol.messages import REQUESTS
from sluice.protocol.primitives import DecodeError

MAX_EXTRA_BYTES = 4 << 20  # no decode may allocate more than this on top of its input


def _corpus() -> list[bytes]:
    """Valid request frames (without size prefix) for every supported API and version."""
    rng = random.Random(1234)
    frames: list[bytes] = []
    for key, (lo, hi) in SUPPORTED.items():
        for version in range(lo, hi + 1):
            fields = REQUESTS[key].fields
            frames.append(encode_request(key, version, 1, "fuzz", {})[4:])
            for _ in range(2):
                body = _sample(fields, version, rng)
                frames.append(encode_request(key, version, rng.randrange(1 << 31), "c", body)[4:])
    return frames


def _sample(fields: Any, version: int, rng: random.Random) -> dict[str, Any]:
    """A deterministic non-trivial body: every present field set, arrays with one or two items."""
    out: dict[str, Any] = {}
    for f in fields:
        if version not in f.versions:
            continue
        count = rng.randint(1, 2) if f.is_array else 1
        if f.is_struct:
            values = [_sample(f.fields, version, rng) for _ in range(count)]
        else:
            values = [_scalar(f.element_type, rng) for _ in range(count)]
        out[f.key] = values if f.is_array else values[0]
    return out


def _scalar(t: str, rng: random.Random) -> Any:
    if t in ("int8", "int16", "int32", "int64"):
        return rng.randint(-100, 100)
    if t in ("uint16", "uint32"):
        return rng.randint(0, 100)
    if t == "float64":
        return rng.random()
    if t == "bool":
        return rng.random() < 0.5
    if t == "string":
        return "".join(rng.choice("abcé") for _ in range(rng.randint(0, 6)))
    if t in ("bytes", "records"):
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 10)))
    if t == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    raise AssertionError(t)


CORPUS = _corpus()

_LENGTHY = [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00", b"\xff\xff", b"\x7f\xff",
            b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x07", b"\x80\x80\x80\x80\x80\x80"]  # fmt: skip

_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("overwrite"), st.integers(0, 10_000), st.integers(0, len(_LENGTHY) - 1)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, len(_LENGTHY) - 1)),
    st.tuples(st.just("extend"), st.integers(0, 255), st.integers(1, 8)),
)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(CORPUS)))
    for op, a, b in draw(st.lists(_mutation, min_size=1, max_size=4)):
        n = len(frame)
        if op == "flip" and n:
            frame[a % n] ^= b
        elif op == "truncate":
            del frame[a % (n + 1) :]
        elif op == "overwrite" and n:
            i = a % n
            frame[i : i + len(_LENGTHY[b])] = _LENGTHY[b]
        elif op == "insert":
            i = a % (n + 1)
            frame[i:i] = _LENGTHY[b]
        elif op == "extend":
            frame += bytes([a]) * b
    return bytes(frame)


@st.composite
def _random_frame(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from([int(k) for k in SUPPORTED] + [7, 99, -1]))
    lo, hi = SUPPORTED.get(key, (0, 0))  # type: ignore[call-overload]
    version = draw(st.integers(lo - 1, hi + 1))
    header = struct.pack(">hhi", key, version, draw(st.integers(0, 2**31 - 1)))
    return header + draw(st.binary(max_size=80))


FRAMES = st.one_of(_mutated(), _random_frame(), st.binary(max_size=40))


def test_corpus_is_valid() -> None:
    assert len(CORPUS) > 300
    for frame in CORPUS:
        decode_request(frame)


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(FRAMES)
def test_decode_request_never_raises_unexpected(frame: bytes) -> None:
    # Memory is traced around the decode only: traced all along, every allocation of hypothesis's
    # own example generation went through tracemalloc too, and the test took minutes.
    tracemalloc.start()
    try:
        try:
            decode_request(frame)
        except (DecodeError, UnsupportedVersion):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_EXTRA_BYTES + len(frame)
