"""Pass 1 on projections: a chunk decoded into the members a visitor reads
indexes as the event-by-event visit does, and its spool lines are the
events' own text only where pass 2 can work on it."""
from __future__ import annotations

import json
import re

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.algo import columns
from streamtrace.algo.secrets import fold
from streamtrace.commands import mergedindex
from streamtrace.commands.attribute import AttributeIndex
from streamtrace.commands.compactindex import CompactIndex
from streamtrace.commands.inspectindex import InspectVisitor
from streamtrace.commands.mergedindex import GPU, LAUNCH, LinksIndex, MergedIndex, RankIndex
from streamtrace.commands.split import SplitIndex
from streamtrace.errors import TraceError
from streamtrace.io.configfiles import load_rules
from streamtrace.io.projection import ProjectedChunk, Projection, attribute, read_alike
from streamtrace.kineto import GPU_CATEGORIES, RUNTIME_CATEGORIES

RULES = load_rules(None)


def odd_events() -> list[dict]:
    """Every kind CompactIndex tells apart, with the odd values it must read as visit() does:
    streams and labels first met by different kinds in turn, ints for times, a missing dur,
    null, empty or non-string args.name, args.original_stream, odd tids, non-numeric flow ts."""
    events = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 9, "args": {"name": "stream 9"}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "PP:0F0", "pid": 0, "tid": 9, "ts": 5, "dur": 2,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.5, "dur": 3.0,
         "args": {"stream": 7, "name": "PP:0F0", "correlation": 3}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 1, "tid": 1, "ts": 1.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 0, "tid": 8, "ts": "late"},
        {"ph": "X", "cat": "Kernel", "name": "nccl", "pid": 0, "tid": 8, "ts": 4, "args": None},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "odd", "ts": 6.25, "dur": 0,
         "args": {"stream": 8, "original_stream": 3, "name": ""}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 7.0, "dur": 1.0,
         "args": {"stream": "7", "name": 5}},
        {"ph": "i", "cat": "kernel", "name": "marker", "pid": 0, "tid": 7, "ts": 8.0},
        {"ph": "i", "cat": "gpu_user_annotation", "name": "instant", "pid": 0, "tid": 7, "ts": 8.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "", "pid": 0, "tid": 11, "ts": 9.0, "dur": 1.0,
         "args": {"External id": 2, "extra": [1, 2]}, "id": 4},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0.5, "dur": 1},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 0.7, "dur": 1},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 12, "args": {"sort_index": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": True, "ts": 0.1, "dur": 0.2},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 13, "ts": 10.0, "dur": 1.0,
         "args": {"stream": 13, "name": "PP:0B0"}},
    ]
    return events


def parts_both_ways(chunks: list[list[dict]]) -> tuple[dict, dict]:
    """take_part() of an index fed event by event, and of one fed the same chunks projected."""
    one_by_one, projected = CompactIndex(RULES), CompactIndex(RULES)
    for chunk in chunks:
        for event in chunk:
            one_by_one.visit(event)
        text = orjson.dumps(chunk)[1:-1]
        decoded = projected.projection.decode_with_lines(text)
        assert decoded is not None
        assert projected.visit_projected(ProjectedChunk(text, decoded[0], decoded[2]))
    return one_by_one.take_part(), projected.take_part()


def test_a_projected_chunk_indexes_as_event_by_event():
    events = odd_events()
    expected, got = parts_both_ways([events[:7], events[7:]])
    assert got == expected
    assert expected["stream_keys"][:3] == [(0, 9), (0, 7), (1, 1)]  # first met by metadata, annotation, slice, flow
    assert expected["label_names"] == ["PP:0F0", "", "PP:0B0"]


def test_streams_and_labels_are_numbered_in_event_order_across_kinds():
    events = odd_events()
    expected, got = parts_both_ways([list(reversed(events))])
    assert got == expected


@pytest.mark.parametrize("damage", [
    {"pid": None},  # a GPU slice without its device
    {"ts": "soon"},
    {"dur": -1.0},
    {"dur": None},
    {"name": ["a", "list"]},
])
def test_what_visit_would_refuse_is_refused(damage):
    """The chunk goes to the event-by-event reading, which names the event."""
    event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0, **damage}
    text = orjson.dumps([event])[1:-1]
    index = CompactIndex(RULES)
    decoded = index.projection.decode_with_lines(text)
    with pytest.raises((TraceError, TypeError)):
        if decoded is None or not index.visit_projected(ProjectedChunk(text, decoded[0], decoded[2])):
            raise TraceError("refused")
    with pytest.raises((TraceError, TypeError)):
        CompactIndex(RULES).visit(event)


def test_args_that_are_not_an_object_refuse_the_projection():
    assert CompactIndex.projection.decode(b'{"ph":"X","args":[1]}') is None
    assert CompactIndex.projection.decode(b'{"ph":"X","args":null}')[0].args is None


@pytest.mark.parametrize("text, lines", [
    (b'{"a": 1, "b": [1, 2]},\r\n{"c":"x y"}', b'{"a": 1, "b": [1, 2]}\n{"c":"x y"}'),
    (b'{"a":1.50,"b":1e-400},{"c":"\xc3\xa9"}', b'{"a":1.50,"b":1e-400}\n{"c":"\xc3\xa9"}'),
    (b'{"a":1}', b'{"a":1}'),
    # Kineto's layout: an event over several lines is one line, without the breaks and the indentation after them
    (b'{\n    "a": 1, "b": "x  y",\n    "args": {\n      "c": [1,\n 2]\n    }\n  },\n  {"d":\t2}',
     b'{"a": 1, "b": "x  y","args": {"c": [1,2]}}\n{"d":\t2}'),
    (b'{\r\n "a":\r\n\t1\r\n},\r\n{"b":2}', b'{ "a": 1 }\n{"b":2}'),  # CRLF: a return is a space
])
def test_spool_lines_keep_the_events_own_text(text, lines):
    events, got, elements = Projection({"a": None}).decode_with_lines(text)
    assert got == lines and [json.loads(bytes(element)) for element in elements] == json.loads(b"[" + text + b"]")
    assert [json.loads(line) for line in got.split(b"\n")] == json.loads(b"[" + text + b"]")


@pytest.mark.parametrize("indent", [1, 2, 4, 9, "\t", " \t ", "\t\t  "])
def test_indented_events_become_lines_without_breaks_or_indentation(indent):
    """However an event is indented, its spool line is the event with every
    line break and the spaces and tabs after them gone (text inside strings kept)."""
    events = [{"ph": "X", "name": "a  b c", "args": {"x": [1, {"y": "  "}], "z": {}}}, {"d": [[]], "e": "  "}]
    text = b",\n".join(json.dumps(event, indent=indent).encode() for event in events)
    _, lines, _ = Projection({"ph": None}).decode_with_lines(text)
    expected = [re.sub(rb"\n[ \t]*", b"", json.dumps(event, indent=indent).encode()) for event in events]
    assert lines.split(b"\n") == expected and [json.loads(line) for line in expected] == events


@pytest.mark.parametrize("text", [
    b'{"a":"x\\/y"}',  # any escape
    b'{"a":"\xff"}',  # invalid UTF-8, in a member the projection skips
    b'{"b":1e400}',  # a float that overflows: the fast reading refuses it
    b'{"b":1E+0309}',
    b'{"b":1' + b"0" * 320 + b'.5}',
    b'{"b":123456789012345678901234567890}',  # an integer orjson would round
])
def test_text_pass_2_cannot_take_is_refused(text):
    assert Projection({"a": None}).decode_with_lines(text) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"1", b"9", b"0", b"e", b"E", b"+", b"-", b".", b" ", b'"', b"x", b"e999", b"1e+3"]),
                max_size=40))
def test_huge_exponents_are_found_wherever_they_stand(pieces):
    """The exponent test (numpy comparing the folded text as 16-bit words,
    at even and at odd offsets, for an ``e`` after a digit, then finding
    those ``e``s) answers as one search of the raw text would, at the
    text's edges too, and alike with the caller's folded copy."""
    text = b"".join(pieces)
    refused = re.search(rb"[0-9][eE]\+?[0-9]{3}", text) is not None or re.search(rb"[0-9]{19}", text) is not None
    assert read_alike(text) is not refused
    assert read_alike(text, fold(text)) is not refused


@pytest.mark.parametrize("exponents", [1, 200])
def test_a_huge_exponent_among_many_small_ones_refuses(exponents):
    plain = b'{"a":1.5e-05,"b":2E+10,"name":"e999"},' * exponents
    assert read_alike(plain + b'{"c":1}')
    assert not read_alike(plain + b'{"c":1e999}') and not read_alike(b'{"c":7E+308},' + plain + b'{"c":1}')


def inspect_events() -> list[dict]:
    """GPU events inspect's projected reading takes as columns, with the odd
    values it must read as visit() does: two devices in one chunk, int and
    float times, a negative and a zero dur, GPU events that are not slices,
    a kernel without a name, graph and plain launches before and after
    their kernels, PP annotations and a step."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 90},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 2.5, "dur": 3.25,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": None, "pid": 2, "tid": 7, "ts": 3, "dur": 2, "args": {"correlation": 8}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 4, "dur": 1,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": 8, "ts": 1 << 60, "dur": 0},
        {"ph": "X", "cat": "kernel", "name": "late", "pid": 0, "tid": 8, "ts": 6.0, "dur": -1.0},
        {"ph": "i", "cat": "kernel", "name": "marker", "pid": 0, "tid": 7, "ts": 8.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 2, "tid": 9, "ts": 6.25, "dur": 0.5,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "PP:0F0", "pid": 0, "tid": 7, "ts": 2, "dur": 4},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 9.125, "dur": 1e-30},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.5, "dur": 0.25},
    ]
    return events


@pytest.mark.parametrize("order", ["as written", "reversed", "plain"])
def test_a_projected_chunk_indexes_for_inspect_as_event_by_event(order):
    events = inspect_events()
    if order == "reversed":
        events.reverse()
    if order == "plain":
        events = plain(events)
    one_by_one, projected = InspectVisitor(), InspectVisitor()
    for event in events:
        one_by_one.visit(event)
    assert projected.visit_projected(ProjectedChunk(orjson.dumps(events)[1:-1],
                                                    projected.projection.decode(orjson.dumps(events)[1:-1])))
    expected, got = one_by_one.take_part(), projected.take_part()
    for part in (expected, got):
        undecided = part.pop("undecided")  # as (pid, id, launched) in order: the two readings number pids apart
        part["undecided"] = (list(zip(map(undecided.pids.__getitem__, undecided.positions), undecided.correlations,
                                      undecided.launched)), undecided.odd)
        part["findings"] = part["findings"].counts if part["findings"] is not None else None
    assert got == expected
    if order == "plain":
        assert set(expected["busy"]) == {0, 2} and sum(count for count, _, _ in expected["kernels"].values()) == 2
    else:
        assert set(expected["busy"]) == {0, 2} and expected["kernels"]["None"][0] == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["X", "i", "s"]), st.one_of(st.integers(-3, 3), st.sampled_from([-0.0, 0.0, 1.5])),
                          st.one_of(st.integers(-2, 2), st.sampled_from([0.0, -0.0, 0.5, -1.5]))), min_size=1, max_size=8))
def test_the_last_end_of_projected_events_is_the_one_max_finds(events):
    """The latest end inspect takes from C-level maxima is the very value (type and sign of zero included)
    that one max() over every event's end, in event order, gives."""
    from types import SimpleNamespace

    from streamtrace.commands.inspectindex import _last_end

    expected = max(ts + dur if ph == "X" else ts for ph, ts, dur in events)
    got = _last_end([ph for ph, _, _ in events], [ts for _, ts, _ in events],
                    [SimpleNamespace(dur=dur) for _, _, dur in events])
    assert (got, type(got), repr(got)) == (expected, type(expected), repr(expected))


def test_whole_events_are_the_fast_readings():
    events = odd_events()
    text = orjson.dumps(events)[1:-1]
    projected, _, elements = CompactIndex.projection.decode_with_lines(text)
    for chunk in (ProjectedChunk(text, projected, elements), ProjectedChunk(text, projected)):
        assert chunk.whole([0, 10, len(events) - 1]) == [events[0], events[10], events[-1]]


def merged_events() -> list[dict]:
    """Every kind relink's index tells apart, with the odd values it must read as visit() does:
    pids first met by metadata, by a GPU event and by a launch; ids that are not usable (absent,
    a bool, a float, past the id space); ranks that are not plain (a bool, a float, negative);
    GPU events that are not slices; runtime calls without a time; ranks in process names."""
    return [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "rank 3 - GPU"}},
        {"ph": "M", "name": "process_name", "pid": "host", "args": {"name": "python", "rank": 2}},
        {"ph": "M", "name": "thread_name", "pid": 9, "tid": 1, "args": {"name": "rank 5"}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.5, "dur": 3.0,
         "args": {"stream": 7, "correlation": 3, "rank": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 1, "ts": 1.0, "dur": 1,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 11, "tid": 1, "ts": 2, "dur": 1,
         "args": {"correlation": 4, "rank": True}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 11, "tid": 1, "ts": "late",
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 12, "tid": 1, "ts": 3.0,
         "args": {"correlation": True}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSync", "pid": 12, "tid": 1, "ts": 3.5, "args": None},
        {"ph": "X", "cat": "Kernel", "name": "nccl", "pid": 0, "tid": 8, "ts": 4, "args": {"correlation": 1 << 62}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": 13, "tid": 8, "ts": 4.5, "dur": 0,
         "args": {"correlation": 4.0, "rank": -1}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 13, "tid": 8, "ts": "soon", "args": {"rank": 2.0}},
        {"ph": "i", "cat": "kernel", "name": "marker", "pid": 14, "tid": 7, "ts": 8.0, "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 15, "tid": 7, "ts": 9.0},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 11, "tid": 1, "ts": 1.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "pid": 0, "tid": 7, "ts": 1.5, "bp": "e"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 1, "ts": 0.1, "dur": 0.2,
         "args": {"correlation": 8}},
        {"ph": "M", "cat": "kernel", "name": "process_name", "pid": 16, "args": {"name": "rank 9"}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 7, "tid": 7, "ts": 10.0, "dur": 1.0,
         "args": {"correlation": 6}},
    ]


def attribute_events() -> list[dict]:
    """What attribute's index reads besides the merged index's: CPU ops and
    annotations (timed, untimed, not slices), GPU events whose own cells need
    quoting or escaping, odd launch times and lengths."""
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 1, "ts": 0.5, "dur": 2, "args": {"rank": 1}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 11, "tid": 1, "ts": 0, "dur": 9.5},
        {"ph": "X", "cat": "cpu_op", "name": 7, "pid": 11, "tid": "main", "ts": 1, "dur": "long"},
        {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 11, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": ["odd"], "pid": 12, "tid": 1, "ts": 1.25, "dur": 0},
        {"ph": "X", "cat": "kernel", "name": 'say "hi", then\nbye', "pid": "gpu, 0", "tid": 7, "ts": 1 << 60,
         "dur": 2.5e-7, "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "\u0000nul first", "pid": "\u0000gpu", "tid": None, "ts": 2.0, "dur": True,
         "args": {"correlation": [1]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 1, "ts": 5, "dur": "x",
         "args": {"correlation": 21}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 2, "ts": 6.5,
         "args": {"correlation": 22, "rank": 1}},
    ]


def plain(events: list[dict]) -> list[dict]:
    """The events of ``events`` a plain trace has, which the projected readings
    take by C-level passes alone: launches and GPU events with a usable
    correlation id, no ``args.rank``, flow ids that are integers in range."""
    def is_plain(event: dict) -> bool:
        args = event.get("args")
        if isinstance(args, dict) and "rank" in args:
            return False
        if event.get("cat") in GPU_CATEGORIES or event.get("cat") in RUNTIME_CATEGORIES:
            return isinstance(args, dict) and type(args.get("correlation")) is int and 0 <= args["correlation"] < 1 << 62
        return "id" not in event or (type(event["id"]) is int and 0 <= event["id"] < 1 << 63)
    return [event for event in events if is_plain(event)]


def slow_paths_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the per-event readings of ids and ranks fail, so that a projected
    reading of plain events shows it took the column passes."""
    def fail(value: object) -> None:
        raise AssertionError(f"a per-event reading of {value!r}")
    monkeypatch.setattr(mergedindex, "_usable_id", fail)
    monkeypatch.setattr(columns, "plain_rank", fail)


@pytest.mark.parametrize("order", ["as written", "reversed", "plain"])
@pytest.mark.parametrize("indexes", [(MergedIndex, LinksIndex), (SplitIndex, SplitIndex),
                                     (lambda: AttributeIndex(None), lambda: AttributeIndex(None))],
                         ids=["relink", "split", "attribute"])
def test_a_projected_chunk_indexes_for_relink_and_split_as_event_by_event(order, indexes):
    """LinksIndex reading projections records what MergedIndex's visit records
    (pid slots in the order first met, each pid's evidence, arrays, samples),
    split's index each event's owner as its visit does, and attribute's
    index the same launch details, CPU ops (threads and names numbered
    alike) and GPU rows."""
    events = [*merged_events(), *attribute_events()] if order != "reversed" else \
        [*reversed(merged_events()), *reversed(attribute_events())]
    events.append({"ph": "X", "cat": "cpu_op", "name": "no pid", "ts": 11.0, "args": {"rank": 1 << 40}})
    if order == "plain":
        events = plain(events)
    one_by_one, projected = indexes[0](), indexes[1]()
    for chunk in (events[:6], events[6:]):
        for event in chunk:
            one_by_one.visit(event)
        text = orjson.dumps(chunk)[1:-1]
        with pytest.MonkeyPatch.context() as monkeypatch:
            if order == "plain":
                slow_paths_fail(monkeypatch)
            assert projected.visit_projected(ProjectedChunk(text, projected.projection.decode(text)))
    assert [facts.pid for facts in projected.pids] == [facts.pid for facts in one_by_one.pids]
    expected, got = one_by_one.take_part(), projected.take_part()
    assert got == expected
    assert sum(expected["actions"].count(kind) for kind in (LAUNCH, GPU)) == (4 if order == "plain" else 12)
    if order != "plain":
        assert expected["pids"][0].pid == 7 and expected["pids"][0].name_ranks == {3}
    if "rows" in expected and order != "plain":
        assert len(expected["rows"]) == 8 and len(expected["ops"]) == 4 * 25 and len(expected["launch_end"]) == 4


def test_the_other_merged_indexes_keep_the_event_by_event_reading():
    """Indexes that extend visit() must not be read from projections, which would pass their visit by."""
    for index in (MergedIndex, RankIndex):
        assert getattr(index, "projection", None) is None


def slice_events() -> list[dict]:
    """What slice's index reads of every event: flows (odd ids and categories), steps (odd
    spans and ranks), times and lengths of every kind, names and pids a selection drops."""
    return [
        {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1 << 63, "pid": 11, "tid": 1, "ts": 1.0},
        {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": "x7", "pid": 11, "tid": 1, "ts": 2, "bp": "e"},
        {"ph": "t", "cat": None, "name": "flow", "id": -3, "pid": 12, "tid": 1, "ts": "soon"},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 2.5, "pid": 12, "tid": 1, "ts": 3},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": [4], "pid": 12, "tid": 1, "ts": 3},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 11, "tid": 1, "ts": 10, "dur": 5,
         "args": {"rank": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#5", "pid": 11, "tid": 1, "ts": 15.5, "dur": -1},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#x", "pid": 11, "tid": 1, "ts": 21, "dur": 1},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "pid": 11.5, "tid": 1, "ts": 22, "dur": 1.5,
         "args": {"rank": 1 << 40}},
        {"ph": "X", "cat": "python_function", "name": "drop me", "pid": None, "tid": 1, "ts": 4, "dur": True},
        {"ph": "X", "cat": "python_function", "name": 5, "pid": "host", "tid": 1, "ts": 4, "dur": "long",
         "args": {"rank": 3}},
        {"ph": "X", "cat": "cpu_op", "name": "drop me too", "pid": 11, "tid": 1, "ts": 4.25, "dur": 1 << 60,
         "args": {"rank": True}},
        {"ph": "M", "name": "thread_name", "pid": 14, "tid": 1, "args": {"name": "main", "rank": 0}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 11, "tid": 1, "ts": 30, "dur": 2},
    ]


@pytest.mark.parametrize("order", ["as written", "reversed", "plain"])
@pytest.mark.parametrize("selection", ["none", "every criterion"])
def test_a_projected_chunk_indexes_for_slice_as_event_by_event(order, selection):
    """Slice's index reading projections records every event's columns
    (times, pid slots, flags, ranks), the flows' keys and the step spans
    as its visit does, whatever the selection flags."""
    from streamtrace.commands.sliceindex import Selection, SliceIndex
    events = [*merged_events(), *slice_events()] if order != "reversed" else \
        [*reversed(slice_events()), *reversed(merged_events())]
    if order == "plain":
        events = plain(events)
    chosen = Selection() if selection == "none" else \
        Selection(drop_categories=frozenset({"python_function", None}), drop_name=re.compile("drop"),
                  pids=frozenset({"11", "None", "host"}))
    one_by_one, projected = SliceIndex(chosen, None), SliceIndex(chosen, None)
    one_by_one.partial = projected.partial = True
    for chunk in (events[:9], events[9:]):
        for event in chunk:
            one_by_one.visit(event)
        text = orjson.dumps(chunk)[1:-1]
        with pytest.MonkeyPatch.context() as monkeypatch:
            if order == "plain":
                slow_paths_fail(monkeypatch)
            assert projected.visit_projected(ProjectedChunk(text, projected.projection.decode(text)))
    expected, got = one_by_one.take_part(), projected.take_part()
    assert [column.tobytes() for column in got.pop("columns")] == \
        [column.tobytes() for column in expected["columns"]]  # (bytes: NaN times are not equal to themselves)
    assert got == {name: value for name, value in expected.items() if name != "columns"}
    assert (len(expected["step_spans"]), len(expected["flows"][0])) == ((1, 2) if order == "plain" else (3, 7))
    assert len(expected["columns"][0]) == len(events)
    flags = {(packed >> 24) & 0xFF for packed in expected["columns"][2]}
    assert len(flags) >= (6 if selection == "every criterion" else 3)


def test_members_named_with_spaces_are_read_as_attributes():
    """Kineto's arg names are not identifiers ("Collective name"): such a member is read under
    projection.attribute's name for it, absent or null as its default."""
    projection = Projection({"args": {"Collective name": None, "In msg nelems": -1, "1st": None}})
    events = projection.decode(b'{"args": {"Collective name": "allreduce", "In msg nelems": 8, "1st": [1]}}, {"args": {}}')
    assert [attribute(key) for key in ("Collective name", "In msg nelems", "1st")] == ["Collective_name", "In_msg_nelems",
                                                                                      "_1st"]
    assert (events[0].args.Collective_name, events[0].args.In_msg_nelems, events[0].args._1st) == ("allreduce", 8, [1])
    assert (events[1].args.Collective_name, events[1].args.In_msg_nelems) == (None, -1)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=12))
def test_slice_positions_gather_every_slice_in_order(slices):
    """Against the slices spelled out one by one."""
    first = np.array([start for start, _ in slices], dtype=np.int64)
    count = np.array([size for _, size in slices], dtype=np.int64)
    expected = [position for start, size in slices for position in range(start, start + size)]
    got = columns.slice_positions(first, count)
    assert got.dtype == np.int64 and got.tolist() == expected
