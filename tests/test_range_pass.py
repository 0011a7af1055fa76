"""Pass 1 by ranges: chunks cut without parsing, indexed by workers, joined in order.

The reader's side is tested with a stand-in for the workers that parses each
chunk in this process and refuses the ones a test picks; the engine's side by
comparing every command's output with the one-process reading (``-j 1``), on
inputs made to put cuts where they go wrong: nested lists of objects in
``args``, lists of objects after the events array, integers beyond 64 bits.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REAL_TRACES, events_of, large_ones_slow, load_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace import resources
from streamtrace.engine import indexworkers, parseproc, passes
from streamtrace.errors import TraceError
from streamtrace.io import reader as reader_module
from streamtrace.io.chunkcut import chunk_events
from streamtrace.io.reader import ChunkRefused, ReadMode, TraceReader
from streamtrace.io.source import InputSource
from streamtrace.io.spool import EventSpool
from streamtrace.synth import SynthConfig, write_traces


class InProcessHandOff:
    """Parses each chunk here, as a worker would; refuses the chunks numbered in ``refuse``."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.parsed: list[dict] = []
        self.chunks = 0
        self.refused = False
        self.input = b""
        self.texts: list[bytes] = []  # of the chunks handed out

    def submit(self, text: bytes, offset: int | None) -> int:
        assert not self.refused, "a chunk handed off after a refusal"
        assert offset is not None and self.input[offset:offset + len(text)] == text  # where a worker would read it
        number = self.chunks
        self.chunks += 1
        self.texts.append(text)
        events = chunk_events(text)
        if number in self.refuse or events is None:
            self.refused = True
            raise ChunkRefused(number)
        self.parsed.extend(events)
        return self.chunks

    def settle(self) -> int:
        assert not self.refused, "settled after a refusal"
        return self.chunks


def read_with_hand_off(data: bytes, hand_off: InProcessHandOff, chunk_bytes: int) -> list[dict]:
    """Every event, in order: the chunks the hand-off parsed, then what the reader parsed itself."""
    hand_off.input = data
    with InputSource(io.BytesIO(data)) as source:
        reader = TraceReader(source.open(), ReadMode())
        here = [event for batch in reader.batches(hand_off=hand_off, chunk_bytes=chunk_bytes) for event in batch]
    assert reader.stats.events == len(here)
    return hand_off.parsed + here


def pretty_trace(count: int) -> bytes:
    """Pretty-printed (so cuts fall inside events too), with lists of objects
    in args and after the events array."""
    events = []
    for n in range(count):  # a launch and its kernel, on two ranks
        rank = n % 2
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100 + rank, "tid": 1,
                       "ts": float(n), "dur": 0.5, "args": {"correlation": n, "rank": rank}})
        events.append({"ph": "X", "cat": "kernel", "name": f"k{n % 7}", "pid": rank, "tid": 7 + n % 3,
                       "ts": n + 2.0, "dur": 1.0,
                       "args": {"inputs": [{"shape": [n, 2]}, {"shape": []}], "correlation": n, "rank": rank}})
    document = {"schemaVersion": 1, "traceEvents": events,
                "distributedInfo": {"groups": [{"ranks": [0, 1]}, {"ranks": [2, 3]}]}, "traceName": "t"}
    return json.dumps(document, indent=2).encode()


@pytest.mark.parametrize("refuse", [set(), {0}, {3}, {1, 2}, set(range(100))])
def test_reader_hands_off_chunks_and_takes_back_refused_ones(refuse):
    data = pretty_trace(400)
    expected = json.loads(data)["traceEvents"]
    hand_off = InProcessHandOff(refuse)
    assert read_with_hand_off(data, hand_off, chunk_bytes=2048) == expected
    # nested lists of objects put candidate cuts inside events: the indentation picks the true ones
    assert hand_off.chunks == (min(refuse) + 1 if refuse else hand_off.chunks)
    assert hand_off.chunks > 5 or refuse


@settings(max_examples=60, deadline=None)
@given(count=st.integers(0, 120), chunk=st.integers(64, 4096), refuse=st.sets(st.integers(0, 40), max_size=3),
       indent=st.sampled_from([None, 0, 1, 4]))
def test_any_chunk_size_and_layout_reads_every_event_once_in_order(count, chunk, refuse, indent):
    document = json.loads(pretty_trace(count))
    data = json.dumps(document, indent=indent).encode()
    assert read_with_hand_off(data, InProcessHandOff(refuse), chunk) == document["traceEvents"]


class PlacesHandOff(InProcessHandOff):
    """Reads each chunk handed out by its place from the file, as workers
    given a plain file do; counts the chunks the reader did not read itself."""

    reads_places = True

    def __init__(self, refuse: set[int], path: Path) -> None:
        super().__init__(refuse)
        self.path = path
        self.unread = 0

    def submit_place(self, offset: int, length: int) -> int:
        self.unread += 1
        with open(self.path, "rb") as file:
            file.seek(offset)
            return self.submit(file.read(length), offset)


def read_file_with_hand_off(path: Path, hand_off: PlacesHandOff, chunk_bytes: int) -> list[dict]:
    """As :func:`read_with_hand_off`, from a plain file (which the reader may cut by windows)."""
    hand_off.input = path.read_bytes()
    with InputSource(str(path)) as source:
        reader = TraceReader(source.open(), ReadMode())
        here = [event for batch in reader.batches(hand_off=hand_off, chunk_bytes=chunk_bytes) for event in batch]
        assert reader.stats.bytes_decompressed == reader.stats.bytes_raw == len(hand_off.input)
    return hand_off.parsed + here


def event_lines(document: dict) -> bytes:
    """The document with one event a line, as profilers and streamtrace write them."""
    events = b",\n".join(json.dumps(event, separators=(",", ":")).encode() for event in document["traceEvents"])
    rest = json.dumps({key: value for key, value in document.items() if key != "traceEvents"})
    return b'{"traceEvents":[\n' + events + b"\n]," + rest[1:].encode()


@pytest.mark.parametrize("refuse", [set(), {0}, {7}, {3, 20}])
@pytest.mark.parametrize("layout", ["lines", "indented", "one large event"])
def test_a_plain_files_chunks_are_cut_by_windows_and_read_by_the_workers(tmp_path, monkeypatch, refuse, layout):
    """Only a window at each chunk's end is read here (chunks handed out by
    place alone) up to the last chunks and the trailer, which are read as
    they come; a refused chunk is read here from its start on."""
    monkeypatch.setattr(reader_module, "TAIL_WINDOW", 4 << 10)
    document = json.loads(pretty_trace(1500))
    if layout == "one large event":  # longer than a window: the ordinary cutting takes over there
        document["traceEvents"][2000]["name"] = "k" * (8 << 10)
    path = tmp_path / "trace.json"
    path.write_bytes(json.dumps(document, indent=2).encode() if layout == "indented" else event_lines(document))
    hand_off = PlacesHandOff(refuse, path)
    assert read_file_with_hand_off(path, hand_off, 4 << 10) == document["traceEvents"]
    whole_chunks = InProcessHandOff(refuse)  # the chunks of a reading that reads every byte
    read_with_hand_off(path.read_bytes(), whole_chunks, 4 << 10)
    assert hand_off.texts == whole_chunks.texts
    if refuse:
        assert hand_off.unread == hand_off.chunks == min(refuse) + 1
    else:
        read_here = hand_off.chunks - hand_off.unread  # after the windows: the chunks cut as they came
        assert hand_off.unread > 50 and (read_here > 20 if layout == "one large event" else read_here <= 4)


def test_a_file_shortened_while_its_chunks_are_read_elsewhere_is_refused_where_it_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module, "TAIL_WINDOW", 4 << 10)
    path = tmp_path / "trace.json"
    path.write_bytes(event_lines(json.loads(pretty_trace(1500))))

    class Shortening(PlacesHandOff):
        """Cuts the file off where chunk 10 starts, as it is handed out."""

        def submit_place(self, offset: int, length: int) -> int:
            if self.chunks == 10:
                os.truncate(self.path, offset)
                self.cut_at = offset
            return super().submit_place(offset, length)

    hand_off = Shortening(set(), path)
    with pytest.raises(TraceError, match="shortened to [0-9,]+ bytes while it was read") as caught:
        read_file_with_hand_off(path, hand_off, 4 << 10)
    assert caught.value.byte_offset == hand_off.cut_at == path.stat().st_size and caught.value.path == str(path)


@pytest.fixture
def ranges_only(monkeypatch) -> list[bool]:
    """Every file read by pass-1 workers in 4 KiB chunks, cut by windows up
    to its last 12 KiB; the list records, per pass 1, whether the ranges
    reading was used (True) or gave way."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 4 << 10)
    monkeypatch.setattr(reader_module, "TAIL_WINDOW", 4 << 10)
    used: list[bool] = []
    real = indexworkers.index_by_ranges

    def recording(*args, **kwargs):
        used.append(False)  # (it may raise: the input needs a stricter reading)
        result = real(*args, **kwargs)
        used[-1] = result is not None
        return result

    monkeypatch.setattr(passes, "index_by_ranges", recording)
    return used


def outputs(tmp_path: Path, trace: Path, jobs: int) -> dict[str, bytes]:
    """compact's, relink's and split's output bytes at ``jobs`` (or their error)."""
    out = tmp_path / f"j{jobs}"
    out.mkdir()
    refusals = {}
    for name, run in (("compact.json", streamtrace.compact), ("relink.json", streamtrace.relink),
                      ("ranks", streamtrace.split)):
        try:
            run(str(trace), str(out / name), jobs=jobs)
        except TraceError as exc:  # e.g. split of a trace without ranks
            refusals[name] = str(exc).replace(str(out), "OUT").encode()
    files = {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    return files | refusals


def test_ranges_are_used_and_match_one_process(tmp_path, ranges_only, monkeypatch):
    trace = tmp_path / "pretty.json"
    trace.write_bytes(pretty_trace(3000))
    real_segments, segment_counts = EventSpool.segments, []

    def recorded(spool):
        found = real_segments(spool)
        segment_counts.append(None if found is None else len(found))
        return found

    monkeypatch.setattr(EventSpool, "segments", recorded)
    assert outputs(tmp_path, trace, 2) == outputs(tmp_path, trace, 1)
    assert ranges_only == [True] * 6  # -j 1 too: this process indexes the same chunks
    assert len(segment_counts) == 2 and all(count and count > 10 for count in segment_counts)  # compact's and
    # relink's pass-2 workers each read only their share of pass 1's frames (split writes in this process)


@pytest.mark.slow
def test_an_integer_beyond_64_bits_mid_file_gives_way_to_the_exact_reading(tmp_path, ranges_only):
    document = json.loads(pretty_trace(3000))
    document["traceEvents"][1500]["args"]["big"] = 1 << 70
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps(document))
    single = outputs(tmp_path, trace, 1)
    assert outputs(tmp_path, trace, 3) == single
    assert ranges_only == [False] * 6  # the exact mode is the ordinary reading's
    assert str(1 << 70) in single["compact.json"].decode()


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES[:4]), ids=lambda path: path.name)
def test_real_traces_through_ranges(tmp_path, ranges_only, trace):
    assert outputs(tmp_path, trace, 2) == outputs(tmp_path, trace, 1)
    assert len(ranges_only) == 6


class EventCounter:
    """A visitor whose work does not split by ranges (it says nothing of parts)."""

    def __init__(self) -> None:
        self.events = 0

    def visit(self, event: dict) -> None:
        self.events += 1


def test_a_visitor_that_does_not_split_is_read_the_ordinary_way(tmp_path, ranges_only):
    trace = tmp_path / "pretty.json"
    trace.write_bytes(pretty_trace(500))
    with InputSource(str(trace)) as source:
        result = passes.index_pass(source, EventCounter, keep_events=False, jobs=2)
    assert ranges_only == [False] and result.visitor.events == len(events_of(load_json(trace)))


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(256, 16384), workers=st.integers(2, 4))
def test_joined_index_equals_one_process_for_any_chunking(tmp_path_factory, monkeypatch, chunk, workers):
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", chunk)
    directory = tmp_path_factory.mktemp("chunking")
    trace = directory / "pretty.json"
    trace.write_bytes(pretty_trace(600))
    compact_one = directory / "one.json"
    compact_many = directory / "many.json"
    streamtrace.compact(str(trace), str(compact_one), jobs=1)
    streamtrace.compact(str(trace), str(compact_many), jobs=workers)
    assert compact_many.read_bytes() == compact_one.read_bytes()
    assert len(events_of(load_json(compact_many))) == len(events_of(load_json(compact_one)))


def test_a_repaired_byte_early_on_keeps_workers_off_the_file(tmp_path, ranges_only):
    """After an invalid UTF-8 byte is repaired the text read differs from the
    file's bytes: chunks then go to the workers as text, not as file places."""
    data = pretty_trace(3000).replace(b'"k3"', b'"k\xff3"', 1)
    trace = tmp_path / "repaired.json"
    trace.write_bytes(data)
    assert outputs(tmp_path, trace, 2) == outputs(tmp_path, trace, 1)
    assert ranges_only == [True] * 6


def test_a_repaired_byte_far_in_is_read_here_from_its_chunk_on(tmp_path, ranges_only):
    """The windows see no invalid UTF-8 in the chunks they cut: the worker
    given the chunk refuses it, and this process reads on from there,
    repairing the byte as the ordinary reading does."""
    data = pretty_trace(3000)
    bad = data.index(b'"k3"', len(data) // 2)
    trace = tmp_path / "repaired.json"
    trace.write_bytes(data[:bad] + b'"k\xff3"' + data[bad + 4:])
    many = outputs(tmp_path, trace, 2)
    assert many == outputs(tmp_path, trace, 1)
    assert ranges_only == [True] * 6
    assert [event["name"] for event in events_of(json.loads(many["compact.json"])) if "\ufffd" in event["name"]] == ["k\ufffd3"]


HEAP_CHURN = """
import re, resource, sys
from streamtrace.commands.inspectindex import InspectVisitor
from streamtrace.engine.indexworkers import ChunkIndexer
from streamtrace.resources import fix_heap_thresholds
data = open(sys.argv[1], "rb").read()
at = data.index(b"{", data.index(b'"traceEvents"') + 14)
chunks = []
for cut in re.finditer(rb"\\},\\n\\{", data):
    if cut.start() + 1 - at >= 1 << 20:
        chunks.append(data[at:cut.start() + 1])
        at = cut.end() - 1
if sys.argv[2] == "fixed":
    fix_heap_thresholds()
index = ChunkIndexer(InspectVisitor(None), None, False)
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for chunk in chunks:
        assert index(chunk) is not None
        index.visitor.take_part()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()  # the first round may grow the heap
print(len(chunks), faults())
"""


@pytest.mark.skipif(resources._malloc() is None, reason="glibc's malloc controls are not there")
def test_a_workers_heap_keeps_its_pages_from_chunk_to_chunk(tmp_path):
    """Indexing chunk after chunk as a pass-1 worker does, in a fresh
    interpreter: with glibc's own sliding thresholds the heap is trimmed
    after each chunk and faults in again at the next; with the worker's
    fixed thresholds the pages stay (a few faults in all)."""
    write_traces(SynthConfig(ranks=1, pp_stages=1, target_bytes=12 << 20), tmp_path, compress="none", merged=False)
    trace = str(tmp_path / "rank0_trace.json")
    counts = {}
    for mode in ("sliding", "fixed"):
        done = subprocess.run([sys.executable, "-c", HEAP_CHURN, trace, mode], capture_output=True, text=True, check=True)
        chunks, counts[mode] = map(int, done.stdout.split())
    assert chunks >= 8
    assert counts["fixed"] < chunks * 20 < counts["sliding"], counts
