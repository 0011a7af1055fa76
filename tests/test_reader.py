"""The reader on hand-built edge cases: the shapes and damage real traces have."""
from __future__ import annotations

import gzip
import io
import json
from decimal import Decimal

import pytest

import streamtrace
from streamtrace.engine.passes import index_pass
from streamtrace.errors import TraceError
from streamtrace.io import eventtext
from streamtrace.io import reader as reader_module
from streamtrace.io.source import InputSource


class Collect:
    """A visitor that keeps events: fine for the tiny inputs of these tests."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def visit(self, event: dict) -> None:
        self.events.append(event)


def read(data: bytes, **kwargs):
    with InputSource(io.BytesIO(data)) as source:
        result = index_pass(source, Collect, keep_events=False, **kwargs)
    return result.visitor.events, result.stats


def convert_bytes(data: bytes, tmp_path, **kwargs) -> bytes:
    src = tmp_path / "in.json"
    src.write_bytes(data)
    out = tmp_path / "out.json"
    streamtrace.convert(src, out, **kwargs)
    return out.read_bytes()


@pytest.fixture(params=[7, 64, 1 << 18], ids=["chunk7", "chunk64", "chunk256k"])
def chunk_size(request, monkeypatch):
    """Run a test with tiny parse chunks too (ijson's and the chunk parser's), so every boundary case is hit."""
    monkeypatch.setattr(reader_module, "PARSE_CHUNK", request.param)
    monkeypatch.setattr(reader_module, "CHUNK_PARSE_BYTES", request.param)
    return request.param


def test_keys_before_and_after_trace_events_kept_in_order(tmp_path, chunk_size):
    data = (b'{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "G\\"PU]"}],\n'
            b' "traceEvents": [{"ph": "X", "name": "a]}", "ts": 1.5, "dur": 2.25}],\n'
            b' "distributedInfo": {"rank": 3, "pg_config": [{"ranks": [0, 1]}]}, "traceName": "t]", "list": [1, [2]]}')
    events, stats = read(data)
    assert events == [{"ph": "X", "name": "a]}", "ts": 1.5, "dur": 2.25}]
    assert [k for k, _ in stats.header] == ["schemaVersion", "deviceProperties"]
    assert [k for k, _ in stats.trailer] == ["distributedInfo", "traceName", "list"]
    out = json.loads(convert_bytes(data, tmp_path))
    assert out == json.loads(data)
    assert list(out) == ["schemaVersion", "deviceProperties", "traceEvents", "distributedInfo", "traceName", "list"]


def test_trailer_scanned_in_the_last_pieces_first_comes_out_as_in_the_whole_tail(chunk_size, monkeypatch):
    """The trailer is scanned in the last pieces read first and in the whole
    tail when they are too few: the same members whatever the first window,
    also where a piece starts inside a run of backslashes before a quote."""
    trailer = {"traceName": "x" + "\\" * 33 + '"' + "\\" * 8, "distributedInfo": {"rank": 1, "ranks": [0, [1]]},
               "z": "]}", "w": "\\" * 21}
    data = b'{"traceEvents": [{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2}], ' + json.dumps(trailer)[1:].encode()
    for first_try in [*range(1, 200, 3), 1 << 20]:
        monkeypatch.setattr(reader_module, "TRAILER_FIRST_TRY", first_try)
        events, stats = read(data)
        assert len(events) == 2
        assert {key: json.loads(value) for key, value in stats.trailer} == trailer, first_try


@pytest.mark.parametrize("pad", range(4))
def test_trailer_longer_than_the_first_window_is_read_whole(pad):
    """A trailer of several MiB (every member within the walk limit) spans
    many pieces, and pieces start inside runs of backslashes before quotes:
    scanned first in the last MiB, then in the whole tail, it comes out whole."""
    trailer = {f"k{n}": "\\" * 30000 + '"' + "\\" * n for n in range(50)}
    data = (b'{"traceEvents": [{"ph": "i", "ts": 1}], "pad": "' + b"x" * pad + b'", '
            + json.dumps(trailer)[1:].encode())
    events, stats = read(data)
    assert len(events) == 1
    assert {key: json.loads(value) for key, value in stats.trailer if key != "pad"} == trailer


def test_trailing_array_member_whose_last_element_looks_like_an_event(tmp_path, chunk_size):
    data = b'{"traceEvents": [{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2}], "extra": [{"ph": "i", "ts": 1}]}'
    events, stats = read(data)
    assert len(events) == 2
    assert [k for k, _ in stats.trailer] == ["extra"]


def test_empty_trace_events(tmp_path, chunk_size):
    data = b'{"a": 1, "traceEvents": [ ], "b": 2}'
    events, stats = read(data)
    assert events == [] and [k for k, _ in stats.trailer] == ["b"]
    assert json.loads(convert_bytes(data, tmp_path)) == {"a": 1, "traceEvents": [], "b": 2}


def test_big_integers_and_exact_numbers_round_trip(tmp_path, chunk_size):
    data = (b'{"baseTimeNanoseconds": 1767189312000000123, "traceEvents": ['
            b'{"ph": "X", "ts": 1365627949869.794, "dur": 0.100, "args": {"Comms Id": 18446744073709551615}},'
            b'{"ph": "X", "ts": 5.000, "dur": 1e400, "args": {"big": -99999999999999999999999}}]}')
    events, stats = read(data)
    assert stats.exact_numbers
    assert events[0]["args"]["Comms Id"] == 2**64 - 1
    text = convert_bytes(data, tmp_path)
    for literal in (b"1767189312000000123", b"1365627949869.794", b"0.100", b"18446744073709551615",
                    b"5.000", b"-99999999999999999999999"):
        assert literal in text
    exact = json.loads(text, parse_float=Decimal)
    assert exact["traceEvents"][1]["dur"] == Decimal("1e400")


def test_fast_mode_floats_keep_their_values(tmp_path, chunk_size):
    data = b'{"baseTimeNanoseconds": 1767189312000000000, "traceEvents": [{"ph": "X", "ts": 1365627949869.794, "dur": 12.345}]}'
    events, stats = read(data)
    assert not stats.exact_numbers
    out = json.loads(convert_bytes(data, tmp_path))
    assert out["traceEvents"][0]["ts"] == 1365627949869.794
    assert out["baseTimeNanoseconds"] == 1767189312000000000


def test_invalid_utf8_is_replaced_and_counted(tmp_path, chunk_size):
    data = '{"traceEvents": [{"ph": "X", "name": "caf\u00e9 \u4e2d", "ts": 1}, {"ph": "X", "name": "x'.encode() + b'\xff\xc3' + b'y", "ts": 2}]}'
    events, stats = read(data)
    assert events[0]["name"] == "caf\u00e9 \u4e2d"
    assert events[1]["name"] == "x\ufffd\ufffdy"
    assert stats.invalid_utf8_repaired == 2
    json.loads(convert_bytes(data, tmp_path))


def test_raw_control_characters_inside_strings_are_escaped(tmp_path, chunk_size):
    data = b'{"traceEvents": [\n {"ph": "X", "name": "a\nb\tc\\\\", "ts": 1},\n {"ph": "X", "name": "q\\"\x01\\n", "ts": 2}\n]}'
    events, stats = read(data)
    assert [e["name"] for e in events] == ["a\nb\tc\\", 'q"\x01\n']
    assert stats.control_chars_repaired == 3
    assert json.loads(convert_bytes(data, tmp_path))["traceEvents"] == events


def test_bare_array_with_and_without_closing_bracket(tmp_path, chunk_size):
    events, stats = read(b'[{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2}]')
    assert len(events) == 2 and stats.form == "array" and not stats.unterminated_array
    events, stats = read(b'[{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2},\n')
    assert len(events) == 2 and stats.unterminated_array


def test_array_cut_inside_an_event_needs_salvage(tmp_path, chunk_size):
    data = b'[{"ph": "i", "ts": 1}, {"ph": "i", "args": {"x": {"y": 1}}}, {"ph": "i", "args": {"x": {"y": 1}'
    with pytest.raises(TraceError, match="truncated.*after 2 complete events.*--salvage"):
        read(data)
    events, stats = read(data, salvage=True)
    assert len(events) == 2 and stats.truncated


def test_object_cut_mid_array(tmp_path, chunk_size):
    data = b'{"schemaVersion": 1, "traceEvents": [{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2}, {"ph": "i", "na'
    with pytest.raises(TraceError, match="truncated"):
        read(data)
    with pytest.raises(TraceError):
        convert_bytes(data, tmp_path)
    assert not (tmp_path / "out.json").exists()
    out = json.loads(convert_bytes(data, tmp_path, salvage=True))
    assert out == {"schemaVersion": 1, "traceEvents": [{"ph": "i", "ts": 1}, {"ph": "i", "ts": 2}]}


def test_truncated_gzip_is_an_error_or_salvaged(tmp_path):
    events = [{"ph": "X", "name": f"k{i}", "ts": i * 1.5, "dur": 1.0} for i in range(20000)]
    blob = gzip.compress(json.dumps({"traceEvents": events}).encode())
    cut = blob[: len(blob) // 2]
    with pytest.raises(TraceError, match="truncated"):
        read(cut)
    salvaged, stats = read(cut, salvage=True)
    assert 0 < len(salvaged) < len(events) and stats.truncated
    assert salvaged == events[: len(salvaged)]


@pytest.mark.parametrize("data, message", [
    (b"", "empty input"),
    (b"   \n ", "empty input"),
    (b"42", "top level is a number"),
    (b'"x"', "top level is a string"),
    (b"null", "top level is null"),
    (b"hello", "not JSON"),
    (b'{"a": 1}', "no traceEvents key"),
    (b'{"traceEvents": {"a": 1}}', "traceEvents is an object"),
    (b'{"traceEvents": null}', "traceEvents is null"),
    (b'{"traceEvents": [1, 2]}', "event is a number"),
    (b'{"traceEvents": [{"ph": "X", "ts": NaN}]}', "malformed JSON"),
    (b'{"traceEvents": [{"ph": "X"}]} trailing', "malformed JSON"),
])
def test_malformed_inputs_fail_with_a_located_message(data, message):
    with pytest.raises(TraceError, match=message) as info:
        read(data)
    assert "\n" not in str(info.value)


def test_error_names_event_index_and_byte_offset():
    data = b'{"traceEvents": [{"ph": "i"}, {"ph": "i"}, {"ph": "i", "ts": @}]}'
    with pytest.raises(TraceError) as info:
        read(data)
    assert info.value.event_index == 2
    assert info.value.byte_offset == data.index(b"@")


@pytest.mark.parametrize("text, expected", [
    (b'{"id": 18446744073709551615, "ts": 1.5}', 18446744073709551615),  # u64 max: orjson holds it
    (b'{"id": 18446744073709551616, "ts": 1.5}', 18446744073709551616),  # beyond: the exact decoder
    (b'{"id": -9223372036854775809, "ts": 1.5}', -9223372036854775809),
    (b'{"id": 123456789012345678901234567890, "ts": 1.5}', 123456789012345678901234567890),
    (b'{"id": 7, "ts": 1e400}', 7),
])
def test_exact_mode_lines_decode_exactly(text, expected):
    from streamtrace.io.eventtext import loads_spooled
    event = loads_spooled(text)
    assert event["id"] == expected and type(event["id"]) is int
    assert float(event["ts"]) in (1.5, float("inf"))


@pytest.mark.parametrize("text, beyond", [
    (b'{"a": 18446744073709551615}', False),
    (b'{"a": 18446744073709551616}', True),
    (b'{"a": -9223372036854775808}', False),
    (b'{"a": -9223372036854775809}', True),
    (b'{"a": 123456789012345678901234567890, "b": 1}', True),
    (b'{"a": 0.1000000000000000055511151231257827}', False),  # a float's digits, not an integer
    (b'{"a": 1000000000000000000000.5, "b": 1000000000000000000000e5, "c": 10000000000000000000E5}', False),
    (b'{"a": 1234567890123456789, "b": 99999999999999999999}', True),  # the second run decides
])
def test_integers_orjson_would_round_are_found(text, beyond):
    assert eventtext.has_int_beyond_fast_reading(text) is beyond


def test_exact_mode_batches_decode_exactly():
    """The parse child sends lines as JSON arrays; a batch with an integer beyond orjson's range decodes exactly."""
    plain = b'[{"id": 18446744073709551615, "ts": 1.5}, {"ts": 2}]'
    assert eventtext.loads_spooled(memoryview(plain)) == [{"id": 2**64 - 1, "ts": 1.5}, {"ts": 2}]
    big = b'[{"ts": 1.5}, {"id": 123456789012345678901234567890, "ts": 2.50}]'
    events = eventtext.loads_spooled(memoryview(big))
    assert events[1]["id"] == 123456789012345678901234567890 and str(events[1]["ts"]) == "2.50"
    assert eventtext.loads_spooled(b'[{"ts": 1e400}]')[0]["ts"] == Decimal("1e400")


def spool_lines(events: list) -> list[bytes]:
    array, lines = eventtext.dumped_batch(events, 0)
    assert json.loads(array) == events
    return bytes(lines).split(b"\n")


@pytest.mark.parametrize("events", [
    [{"ph": "X", "name": "a},{b"}, {"ph": "i"}],  # the separator inside a string
    [{"args": {"shapes": [{"a": 1}, {"b": 2}]}}, {"ph": "i"}],  # and between nested objects
    [{}, {}, {"x": {}}, {}],  # empty objects meet as },{ too
    [{"id": 2**64 + 1}, {"ts": Decimal("1.50")}],  # beyond orjson: written one by one, exactly
])
def test_spool_lines_are_one_event_each_whatever_the_text_holds(events):
    lines = spool_lines(events)
    assert len(lines) == len(events)
    assert [json.loads(line, parse_float=Decimal) for line in lines] == events


def test_spool_lines_come_from_one_encoding_on_plain_events(monkeypatch):
    """The per-event fallback is not taken when nothing calls for it."""
    calls = []
    monkeypatch.setattr(eventtext, "dumps_event", lambda event: calls.append(event))
    events = [{"ph": "X", "name": f"k{n}", "args": {"grid": [1, 2, 3], "n": n}} for n in range(50)]
    assert [json.loads(line) for line in spool_lines(events)] == events
    assert calls == []


def test_too_deep_event_is_refused_with_its_index():
    deep: dict = {}
    for _ in range(300):
        deep = {"a": deep}
    with pytest.raises(TraceError, match="nested") as info:
        eventtext.dumped_batch([{"ph": "i"}, {"ph": "i", "args": deep}], 40)
    assert info.value.event_index == 41


def test_visitor_error_names_the_event_inside_a_batch(tmp_path):
    """Pass 1 with a spool hands the visitor whole parsed chunks; its complaint still names the event."""
    events = [{"ph": "i", "n": n} for n in range(3000)]

    class Picky:
        def visit(self, event: dict) -> None:
            if event["n"] == 2345:
                raise TraceError("this one")

    with InputSource(io.BytesIO(json.dumps({"traceEvents": events}).encode())) as source:
        with pytest.raises(TraceError, match="this one") as info:
            index_pass(source, Picky, keep_events=True, spool_dir=str(tmp_path))
    assert info.value.event_index == 2345
    assert list(tmp_path.iterdir()) == []
