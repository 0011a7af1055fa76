"""The chunk parser (the reader's fast path) reads exactly what ijson reads.

Every reading is compared with the same reading done by ijson alone
(``CHUNK_PARSE_LIMIT = -1`` hands everything to ijson at once): events,
stats, errors with their positions, and rereads in stricter modes.
"""
from __future__ import annotations

import io
import json
import sys
from contextlib import contextmanager
from decimal import Decimal
from unittest import mock

import pytest
from conftest import events_of, load_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace.engine.passes import index_pass
from streamtrace.errors import TraceError
from streamtrace.io import reader as reader_module
from streamtrace.io.source import InputSource


class Collect:
    """A visitor that keeps events: fine for the small inputs of these tests."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def visit(self, event: dict) -> None:
        self.events.append(event)


@contextmanager
def parsing(chunk: int | None):
    """Chunk-parse with ``chunk``-byte reads (the header is read in such
    chunks too), or (None) leave everything to ijson.

    Yields a one-item list counting the elements the chunk parser produced.
    """
    produced = [0]
    real_fast, real_exact = reader_module.chunk_loads_fast, reader_module.chunk_loads_exact

    def counting(loads):
        def wrapped(text: bytes):
            elements = loads(text)
            produced[0] += len(elements) if elements is not None else 0
            return elements
        return wrapped

    with mock.patch.multiple(reader_module, PARSE_CHUNK=chunk or 64, CHUNK_PARSE_BYTES=chunk or 1,
                             CHUNK_PARSE_LIMIT=-1 if chunk is None else 1 << 20,
                             chunk_loads_fast=counting(real_fast), chunk_loads_exact=counting(real_exact)):
        yield produced


def read(data: bytes, chunk: int | None):
    """(events, stats, chunk-parsed count) or (the TraceError, None, count)."""
    with parsing(chunk) as produced:
        try:
            with InputSource(io.BytesIO(data)) as source:
                result = index_pass(source, Collect, keep_events=False)
        except TraceError as exc:
            return exc, None, produced[0]
    return result.visitor.events, result.stats, produced[0]


def reason(error: TraceError) -> str:
    """The message without the context ijson quotes (its window depends on how the bytes came)."""
    return str(error).split(" near ", 1)[0]


def same_reading(data: bytes, chunk: int) -> tuple:
    """Read ``data`` both ways; assert they agree; return the chunked reading.

    One difference is by design: integers in [2^63, 2^64) make ijson ask
    for exact mode, the chunk parser reads them exactly in fast mode.
    """
    chunked = read(data, chunk)
    alone = read(data, None)
    assert alone[2] == 0
    if isinstance(alone[0], TraceError):
        assert isinstance(chunked[0], TraceError), f"ijson refuses ({alone[0]}), the chunk path did not"
        assert (reason(chunked[0]), chunked[0].event_index, chunked[0].byte_offset) == (
            reason(alone[0]), alone[0].event_index, alone[0].byte_offset)
    elif alone[1].exact_numbers and not chunked[1].exact_numbers:
        # ijson needs exact mode for integers in [2^63, 2^64); orjson reads them exactly in fast mode
        assert as_floats(chunked[0]) == as_floats(alone[0])
        assert {**chunked[1].as_dict(), "exact_numbers": True} == alone[1].as_dict()
    else:
        assert chunked[0] == alone[0]
        assert chunked[1].as_dict() == alone[1].as_dict()
        assert (chunked[1].header, chunked[1].trailer) == (alone[1].header, alone[1].trailer)
    return chunked


def as_floats(value: object) -> object:
    """Exact-mode Decimals as the floats a fast-mode reading gives (ints stay exact)."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {key: as_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_floats(item) for item in value]
    return value


def trace(events_text: list[bytes], *, form: str = "object", separator: bytes = b",\n") -> bytes:
    body = b"[" + separator.join(events_text) + b"]"
    if form == "array":
        return body
    return b'{"schemaVersion": 1, "traceEvents": ' + body + b', "deviceProperties": [{"id": 0}, {"id": 1}]}'


def plain_events(count: int) -> list[bytes]:
    return [b'{"ph": "X", "cat": "kernel", "name": "k%d", "pid": 0, "tid": 7, "ts": %d.5, "dur": 1.25, '
            b'"args": {"correlation": %d, "list": [{"a": 1}, {"b": [2, {"c": 3}]}]}}' % (n, n, n)
            for n in range(count)]


@pytest.mark.parametrize("chunk", [4096, 1 << 16])
def test_real_traces_read_the_same_chunk_by_chunk(real_trace, chunk):
    data = real_trace.read_bytes()
    events, stats, chunk_parsed = same_reading(data, chunk)
    assert events == events_of(load_json(real_trace))
    if stats.bytes_decompressed > 4 * chunk:
        assert chunk_parsed == len(events), "the chunk parser left events to ijson"


@pytest.mark.parametrize("form", ["object", "array"])
@pytest.mark.parametrize("chunk", [16, 97, 1000])
def test_cuts_inside_strings_and_nested_values_are_never_taken(form, chunk):
    tricky_names = [b'"}, {"', b'"},{\\"ph\\": \\"X\\"}, {"', b'"a\\\\"', b'"\\\\\\"}, {"', b'"}\\n,\\n{"',
                    b'"\\u007d, \\u007b"', b'"caf\xc3\xa9 }, {"']
    events = [b'{"ph": "i", "name": %s, "ts": %d, "args": {"x": [{"y": "}, {"}, {"z": {}}]}}' % (name, n)
              for n, name in enumerate(tricky_names * 20)]
    data = trace(events, form=form, separator=b" ,\r\n\t ")
    read_events, _, chunk_parsed = same_reading(data, chunk)
    assert read_events == events_of(json.loads(data))
    if chunk > 16:  # tiny chunks: every cut tried lies in a string, and ijson reads the rest
        assert chunk_parsed > 0


@pytest.mark.parametrize("chunk", [64, 333])
def test_an_element_larger_than_a_chunk_then_the_fast_path_again(chunk):
    events = plain_events(50)
    events[10] = b'{"ph": "X", "name": "%s", "ts": 1}' % (b"x" * 12000)
    data = trace(events)
    read_events, _, chunk_parsed = same_reading(data, chunk)
    assert read_events[10]["name"] == "x" * 12000
    assert chunk_parsed > 25


@pytest.mark.parametrize("damage, where", [
    (b'"ts": NaN', "nan"), (b'"ts": @', "garbage"), (b'"ts": Infinity', "infinity"),
    (b'"ts": 1e400', "float overflow"), (b'"ts": 01', "leading zero"), (b'"ts": 1,', "trailing comma"),
])
@pytest.mark.parametrize("chunk", [50, 700])
def test_damage_mid_array_is_reported_exactly_as_ijson_reports_it(damage, where, chunk):
    events = plain_events(40)
    events[25] = b'{"ph": "X", %s}' % damage
    chunked = same_reading(trace(events), chunk)
    if where == "float overflow":  # reread in exact mode: read, with the number kept
        assert chunked[1].exact_numbers and chunked[0][25]["ts"] == Decimal("1e400")
    else:
        assert isinstance(chunked[0], TraceError) and chunked[0].event_index == 25


@pytest.mark.parametrize("chunk", [40, 512])
def test_an_element_that_is_not_an_object_mid_array(chunk):
    events = plain_events(30)
    events[20] = b"[1, 2]"
    events[21] = b"5"
    error = same_reading(trace(events), chunk)[0]
    assert isinstance(error, TraceError) and "event is a list" in str(error) and error.event_index == 20


@pytest.mark.parametrize("chunk", [64, 900])
def test_integer_beyond_64_bits_mid_array_rereads_in_exact_mode(chunk):
    events = plain_events(40)
    events[30] = b'{"ph": "i", "name": "nccl", "ts": 1.50, "args": {"Comms Id": 123456789012345678901234567890}}'
    read_events, stats, chunk_parsed = same_reading(trace(events), chunk)
    assert stats.exact_numbers
    assert read_events[30]["args"]["Comms Id"] == 123456789012345678901234567890
    assert read_events[30]["ts"] == Decimal("1.50") and str(read_events[30]["ts"]) == "1.50"
    assert chunk_parsed > 20  # the exact-mode reading was chunk-parsed too


def test_exact_mode_keeps_number_text_through_convert(tmp_path):
    events = plain_events(200)
    events[0] = b'{"ph": "i", "ts": 1, "args": {"big": 18446744073709551616}}'
    events[150] = b'{"ph": "i", "ts": 2.50, "dur": 1E+2, "args": {"tiny": 0.1000000000000000055511151231257827}}'
    src = tmp_path / "in.json"
    src.write_bytes(trace(events))
    with parsing(256) as produced:
        streamtrace.convert(src, tmp_path / "out.json")
    assert produced[0] > 100
    out = (tmp_path / "out.json").read_bytes()
    assert b'"ts":2.50' in out and b'"tiny":0.1000000000000000055511151231257827' in out
    assert b"18446744073709551616" in out


@pytest.mark.parametrize("chunk", [128, 2048])
def test_deep_nesting_mid_array_is_refused_as_ijson_refuses_it(chunk):
    """orjson refuses more than 1024 levels and hands over; the guard before
    ijson refuses the event at the same place; 1000 levels are read both ways."""
    events = plain_events(20)
    events[5] = b'{"ph": "i", "args": ' + b'{"a": ' * 1500 + b"1" + b"}" * 1500 + b"}"
    error = same_reading(trace(events), chunk)[0]
    assert isinstance(error, TraceError) and error.event_index == 5
    assert "nested more than 1024 levels deep" in str(error)
    events[5] = b'{"ph": "i", "args": ' + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # to compare the events
    try:
        read_events, _, _ = same_reading(trace(events), chunk)
    finally:
        sys.setrecursionlimit(limit)
    assert len(read_events) == 20


@pytest.mark.parametrize("chunk", [64, 4096])
def test_truncated_and_unterminated_arrays_end_as_with_ijson(chunk):
    data = trace(plain_events(100), form="array")
    assert same_reading(data[:-1], chunk)[1].unterminated_array
    error = same_reading(data[: len(data) // 2], chunk)[0]
    assert isinstance(error, TraceError) and "truncated" in str(error)


_TEXT = st.text(alphabet=st.sampled_from(list('}{[],:" \\\n\tab\u00e9\u2603')), max_size=12)
_SCALAR = st.one_of(st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False, allow_infinity=False), _TEXT,
                    st.booleans(), st.none())
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(_TEXT, inner, max_size=3)), max_leaves=8)
_EVENT = st.dictionaries(_TEXT, _VALUE, max_size=5)


@pytest.mark.slow  # fuzzing
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_EVENT, min_size=1, max_size=30), chunk=st.integers(8, 400),
       form=st.sampled_from(["object", "array"]), indent=st.sampled_from([None, 1, "\t"]))
def test_random_documents_read_the_same(events, chunk, form, indent):
    texts = [json.dumps(event, indent=indent, ensure_ascii=False).encode() for event in events]
    data = trace(texts, form=form, separator=b",\n " if indent is None else b",")
    read_events, stats, _ = same_reading(data, chunk)
    expected = events_of(json.loads(data, parse_float=Decimal if stats.exact_numbers else float))
    assert read_events == expected


@pytest.mark.parametrize("form", ["object", "array"])
@pytest.mark.parametrize("where", [3, 39])
def test_unsigned_64_bit_integers_stay_in_fast_mode_up_to_the_last_event(form, where, tmp_path):
    """NCCL's Comms Id is often in [2^63, 2^64): yajl overflows there, orjson does not.

    The last event is parsed by the chunk parser too (up to the array's
    ``]``), so ijson, which would ask for exact mode, sees none of them.
    """
    events = plain_events(40)
    events[where] = b'{"ph": "X", "name": "nccl", "ts": 2.50, "args": {"Comms Id": 18446744073709539270}}'
    data = trace(events, form=form)
    read_events, stats, chunk_parsed = same_reading(data, 300)
    assert not stats.exact_numbers and chunk_parsed == 40
    assert read_events[where]["args"]["Comms Id"] == 18446744073709539270
    src = tmp_path / "in.json"
    src.write_bytes(data)
    with parsing(300):
        streamtrace.convert(src, tmp_path / "out.json")
    assert b'"Comms Id":18446744073709539270' in (tmp_path / "out.json").read_bytes()
