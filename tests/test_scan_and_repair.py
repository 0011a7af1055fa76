"""Pure byte-level pieces: header/trailer scanners and repair filters."""
from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.io import jsonscan
from streamtrace.io.repair import ControlCharRepair, Utf8Repair


def test_header_scan_needs_more_data_until_trace_events():
    doc = b'{"a": [1, {"b": "]}\\""}], "traceEvents": [ {}]}'
    for cut in range(doc.index(b"[ {}")):
        with pytest.raises(jsonscan.MoreData):
            jsonscan.scan_header(doc[:cut])
    form, members, at = jsonscan.scan_header(doc)
    assert form == "object" and at == doc.index(b"[ {}")
    assert members == [("a", b'[1, {"b": "]}\\""}]')]


def test_header_scan_of_bare_array_and_bom():
    assert jsonscan.scan_header(b"\xef\xbb\xbf  [1]")[0] == "array"


def _trailer(doc: bytes, last: dict) -> list[tuple[str, object]]:
    members = jsonscan.scan_trailer(doc, True, lambda text: json.loads(text) == last)
    return [(key, json.loads(raw)) for key, raw in members]


def test_trailer_scan_handles_escapes_and_nested_arrays():
    last = {"name": 'x\\"]', "ph": "i"}
    tail = {"k\\\"": "v\\\\", "arr": [[1], {"z": ["]"]}], "s": "\"},{"}
    doc = json.dumps({"head": 1, "traceEvents": [{"ph": "i"}, last], **tail}).encode()
    assert _trailer(doc, last) == list(tail.items())


def test_trailer_scan_with_empty_events_and_no_trailer():
    assert _trailer(b'{"traceEvents": []}', {}) == []
    assert _trailer(b'{"traceEvents": [], "a": 1}', {}) == [("a", 1)]
    assert _trailer(b'{"traceEvents": [{"ph": "i"}]}\n', {"ph": "i"}) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\]}[{ ,:\n'),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet='k"\\]'), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(head=st.dictionaries(st.text(alphabet='h"\\ ]'), json_values, max_size=3),
       tail=st.dictionaries(st.text(alphabet='t"\\ ]'), json_values, max_size=3),
       events=st.lists(st.dictionaries(st.sampled_from(["ph", "name"]), json_values, max_size=2), min_size=1, max_size=3))
def test_scanners_split_any_document_exactly(head, tail, events):
    head.pop("traceEvents", None)
    tail = {key: value for key, value in tail.items() if key not in head and key != "traceEvents"}
    doc = json.dumps({**head, "traceEvents": events, **tail}).encode()
    form, members, at = jsonscan.scan_header(doc)
    assert [(k, json.loads(v)) for k, v in members] == list(head.items())
    assert doc[at:at + 1] == b"["
    assert _trailer(doc, events[-1]) == list(tail.items())


def test_utf8_repair_keeps_valid_sequences_split_across_chunks():
    text = "é中😀".encode() * 3
    for size in range(1, 6):
        repair = Utf8Repair()
        out = b"".join(repair.feed(text[i:i + size]) for i in range(0, len(text), size)) + repair.finish()
        assert out == text and repair.repaired == 0


def test_utf8_repair_counts_each_bad_sequence():
    repair = Utf8Repair()
    out = repair.feed(b'"a\xffb\xc3') + repair.feed(b'(c"') + repair.finish()
    assert out.decode() == '"a\ufffdb\ufffd(c"'
    assert repair.repaired == 2
    repair = Utf8Repair()
    assert repair.feed(b"x\xe4\xb8") + repair.finish() == "x\ufffd".encode()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_control_repair_tracks_strings_and_escapes_across_chunks(size):
    doc = b'{"a\nb": "x\\"\t\\\\", "c": [1,\n2], "d": "\\\\\x01"}\n'
    repair = ControlCharRepair()
    out = b"".join(repair.feed(doc[i:i + size]) for i in range(0, len(doc), size))
    assert json.loads(out) == {"a\nb": 'x"\t\\', "c": [1, 2], "d": "\\\x01"}
    assert repair.repaired == 3


def _guard_refusal(document: bytes, step: int) -> jsonscan.ScanError | None:
    """Feed ``document`` to a nesting guard ``step`` bytes at a time; its refusal, if any."""
    guard = jsonscan.NestingGuard()
    try:
        for at in range(0, len(document), step):
            guard.feed(document[at:at + step])
    except jsonscan.ScanError as exc:
        return exc
    return None


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1 << 20])
def test_nesting_guard_reads_what_orjson_reads(step):
    """The guard refuses an event exactly when the chunk parser (orjson, reading
    ``[event]``) refuses it for depth, however the bytes are cut, with strings
    holding brackets, escaped quotes and backslashes across the cuts."""
    for levels in (1020, 1021, 1022, 1023, 1024):
        event = (b'{"ph":"X","name":"a\\"[{\\\\","args":' + b'{"k\\"]":' * levels + b'"}\\\\"'
                 + b"}" * levels + b"}")
        try:
            orjson.loads(b"[" + event + b"]")
            orjson_reads = True
        except orjson.JSONDecodeError:
            orjson_reads = False
        refusal = _guard_refusal(b'{"traceEvents":[' + event + b'],"x":"]]"}', step)
        assert (refusal is None) == orjson_reads, levels
        if refusal is not None:
            assert "nested more than 1024 levels deep" in str(refusal)


def test_nesting_guard_refuses_a_long_key_path():
    """ijson's memory grows with depth times key-path length, so a path over
    64 KiB is refused; long keys at shallow depth and long values are not."""
    long_key = b'"' + b"k" * 20_000 + b'"'
    assert _guard_refusal(b'{"traceEvents":[{' + long_key + b':"' + b"v" * 100_000 + b'"}]}', 4096) is None
    deep_long = b'{"traceEvents":[{"args":' + (b"{" + long_key + b":") * 5 + b"1" + b"}" * 5 + b"}]}"
    refusal = _guard_refusal(deep_long, 4096)
    assert refusal is not None and "KiB" in str(refusal)
