"""Outputs are atomic and guarded; the two-pass engine patches, drops, appends."""
from __future__ import annotations

import gzip
import io
import json
import os

import orjson
import pytest

import streamtrace
from streamtrace.engine.passes import emit_pass, index_pass
from streamtrace.engine.plan import EmitPlan
from streamtrace.errors import TraceError
from streamtrace.io import reader as reader_module
from streamtrace.io.sink import OutputTarget
from streamtrace.io.source import InputSource
from streamtrace.io.writer import TraceWriter

SMALL = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2.0}, {"ph": "i", "cat": "python_function", "name": "p", "ts": 3.0}], "traceName": "t"}'


def write(tmp_path, name: str, data: bytes = SMALL):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def leftovers(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".part"))


def test_existing_output_is_refused_without_overwrite(tmp_path):
    src = write(tmp_path, "in.json")
    out = write(tmp_path, "out.json", b"keep me")
    with pytest.raises(TraceError, match="--overwrite"):
        streamtrace.convert(src, out)
    assert out.read_bytes() == b"keep me"
    streamtrace.convert(src, out, overwrite=True)
    assert json.loads(out.read_bytes())["traceName"] == "t"


def test_writing_onto_the_input_is_refused_even_with_overwrite(tmp_path):
    src = write(tmp_path, "in.json")
    with pytest.raises(TraceError, match="onto the input"):
        streamtrace.convert(src, src, overwrite=True)
    assert src.read_bytes() == SMALL


def test_failed_conversion_leaves_nothing(tmp_path):
    src = write(tmp_path, "in.json", SMALL[:-40])
    with pytest.raises(TraceError):
        streamtrace.convert(src, tmp_path / "out.json.gz")
    assert sorted(os.listdir(tmp_path)) == ["in.json"]


def test_unwritable_directory_is_refused_up_front(tmp_path):
    src = write(tmp_path, "in.json")
    with pytest.raises(TraceError, match="does not exist"):
        streamtrace.convert(src, tmp_path / "missing" / "out.json")


def test_disk_full_leaves_no_partial_file(tmp_path, monkeypatch):
    src = write(tmp_path, "in.json")

    def full(self, line):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TraceWriter, "event", full)
    with pytest.raises(TraceError, match="disk full"):
        streamtrace.convert(src, tmp_path / "out.json")
    assert sorted(os.listdir(tmp_path)) == ["in.json"]


@pytest.mark.parametrize("name, flag, magic", [
    ("o.json.gz", None, b"\x1f\x8b"), ("o.json.zst", None, b"\x28\xb5\x2f\xfd"),
    ("o.json", None, b"{"), ("o.json", "gzip", b"\x1f\x8b"), ("o.json", "zstd", b"\x28\xb5\x2f\xfd"),
])
def test_compression_from_suffix_or_flag(tmp_path, name, flag, magic):
    """The suffix names the compression, or the flag does where the name names none (a flag that contradicts
    a .gz or .zst name is refused: test_destinations)."""
    out = tmp_path / name
    streamtrace.convert(write(tmp_path, "in.json"), out, compress=flag)
    assert out.read_bytes().startswith(magic)
    assert streamtrace.inspect(out)["events"] == 2


def test_gzip_level_flag_is_applied(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "ts": i * 1.25, "dur": 1.0} for i in range(5000)]
    src = write(tmp_path, "in.json", json.dumps({"traceEvents": events}).encode())
    fast, best = tmp_path / "fast.json.gz", tmp_path / "best.json.gz"
    streamtrace.convert(src, fast, level=1)
    streamtrace.convert(src, best, level=9)
    assert best.stat().st_size < fast.stat().st_size
    assert json.loads(gzip.decompress(best.read_bytes()))["traceEvents"] == events


class CountKernels:
    def __init__(self) -> None:
        self.kernel_indexes: list[int] = []
        self.seen = 0

    def visit(self, event: dict) -> None:
        if event.get("cat") == "kernel":
            self.kernel_indexes.append(self.seen)
        self.seen += 1


class MoveKernelsPlan(EmitPlan):
    """Patch kernels onto tid 99, drop python_function, append one event."""

    def __init__(self, kernel_indexes: list[int]) -> None:
        self.kernels = set(kernel_indexes)

    def patch(self, index: int, line: bytes) -> bytes | None:
        if index in self.kernels:
            event = orjson.loads(line)
            event["tid"] = 99
            return orjson.dumps(event)
        if b'"python_function"' in line:
            return None
        return line

    def appended(self):
        return [orjson.dumps({"ph": "M", "name": "thread_name", "pid": 0, "tid": 99, "args": {"name": "lane"}})]


@pytest.mark.parametrize("data", [SMALL, SMALL.replace(b'"ts": 1.5', b'"ts": 1.5, "big": 18446744073709551616')],
                         ids=["fast", "reread-exact"])
def test_two_pass_engine_patches_drops_and_appends(tmp_path, data, monkeypatch):
    monkeypatch.setattr(reader_module, "PARSE_CHUNK", 16)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    out = tmp_path / "out.json"
    with InputSource(io.BytesIO(data), spool_dir=str(spool_dir)) as source:
        result = index_pass(source, CountKernels, keep_events=True, spool_dir=str(spool_dir))
        assert result.visitor.kernel_indexes == [0]
        written = emit_pass(result, MoveKernelsPlan(result.visitor.kernel_indexes), OutputTarget(out))
    assert written == 2
    assert os.listdir(spool_dir) == []
    doc = json.loads(out.read_bytes())
    assert doc["traceEvents"][0]["tid"] == 99 and doc["traceEvents"][0]["ts"] == 1.5
    assert doc["traceEvents"][1]["name"] == "thread_name"
    assert list(doc) == ["schemaVersion", "traceEvents", "traceName"]


def test_spool_removed_when_pass_one_fails(tmp_path):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    with InputSource(io.BytesIO(SMALL[:-30]), spool_dir=str(spool_dir)) as source:
        with pytest.raises(TraceError):
            index_pass(source, CountKernels, keep_events=True, spool_dir=str(spool_dir))
    assert os.listdir(spool_dir) == []


def test_parked_arrays_leave_memory_and_come_back_equal(tmp_path):
    from array import array
    from types import SimpleNamespace

    from streamtrace.io.spool import parked

    owner = SimpleNamespace(actions=bytearray(b"\x00\x01\x02" * 1000), ids=array("h", [-1, 7, 32767]),
                            starts=array("d", [0.5, 1e300, -2.25]), empty=array("q"), kept=[1, 2])
    expected = {name: getattr(owner, name)[:] for name in ("actions", "ids", "starts", "empty")}
    with parked(owner, ("actions", "ids", "starts", "empty"), str(tmp_path)):
        assert (owner.actions, owner.ids, owner.starts, owner.empty) == (None, None, None, None)
        assert owner.kept == [1, 2]
    for name, value in expected.items():
        assert getattr(owner, name) == value and type(getattr(owner, name)) is type(value)
    assert list(tmp_path.iterdir()) == []


def test_parked_numpy_columns_come_back_equal_and_cut_to_their_views(tmp_path):
    from types import SimpleNamespace

    import numpy as np

    from streamtrace.io.spool import parked

    base = np.arange(10, dtype=np.int32)
    owner = SimpleNamespace(lane=base[:4], start=np.array([0.5, 1e300, -2.25]), none=np.empty(0, np.int16))
    with parked(owner, ("lane", "start", "none"), str(tmp_path)):
        assert (owner.lane, owner.start, owner.none) == (None, None, None)
    assert owner.lane.tolist() == [0, 1, 2, 3] and owner.lane.dtype == np.int32 and owner.lane.base is None
    assert owner.start.tolist() == [0.5, 1e300, -2.25] and owner.start.dtype == np.float64
    assert len(owner.none) == 0 and owner.none.dtype == np.int16
    assert list(tmp_path.iterdir()) == []


def test_spool_segments_cover_every_line_once_in_order(tmp_path):
    """Frames from pass-1 workers and lines streamed here, mixed: the
    segments, each read alone, give back exactly the lines in order."""
    import zstandard

    from streamtrace.io.spool import EventSpool

    lines = [b'{"n":%d,"pad":"%s"}' % (n, b"x" * (n % 50)) for n in range(1000)]
    frames = zstandard.ZstdCompressor(level=1)
    with EventSpool(str(tmp_path)) as spool:
        for start in range(0, 1000, 100):
            batch = lines[start:start + 100]
            if start % 300 == 200:
                spool.add_text(b"\n".join(batch[:40]), 40)
                spool.add_text(b"\n".join(batch[40:]), 60)
            else:
                spool.add_frame(frames.compress(b"\n".join(batch) + b"\n"), len(batch))
        segments = spool.segments()
        assert [first for _, _, first, _ in segments] == list(range(0, 1000, 100))
        assert [line for start, end, _, _ in segments for line in spool.read_segment(start, end)] == lines
        assert [line for block in spool.read_blocks() for line in block] == lines
    with EventSpool(str(tmp_path)) as spool:  # a reread starts again: what was framed before is forgotten
        spool.add_frame(frames.compress(lines[0] + b"\n"), 1)
        spool.add_frame(frames.compress(lines[1] + b"\n"), 1)
        spool.reset()
        spool.add_text(lines[2], 1)
        assert spool.segments() is None
        assert list(spool.read_blocks()) == [[lines[2]]]


def test_spool_without_counts_or_frames_has_no_segments(tmp_path, monkeypatch):
    import zstandard

    from streamtrace.io import spool as spool_module
    from streamtrace.io.spool import EventSpool

    with EventSpool(str(tmp_path)) as streamed:
        streamed.add_text(b'{"a":1}\n{"a":2}', 2)
        assert streamed.segments() is None  # one run: nothing to share out
    with EventSpool(str(tmp_path)) as uncounted:
        uncounted.add_frame(b"", 0)
        uncounted.add_text(b'{"a":1}')
        uncounted.add_frame(b"", 0)
        assert uncounted.segments() is None
    frames = zstandard.ZstdCompressor(level=1)
    for limit, expected in ((1 << 30, 3), (4000, None)):  # a run streamed here may be too big to read whole
        monkeypatch.setattr(spool_module, "MAX_SEGMENT", limit)
        with EventSpool(str(tmp_path)) as spool:
            spool.add_frame(frames.compress(b'{"a":1}\n'), 1)
            spool.add_text(b'{"s":"' + os.urandom(5000).hex().encode() + b'"}', 1)
            spool.add_frame(frames.compress(b'{"a":2}\n'), 1)
            found = spool.segments()
            assert (None if found is None else len(found)) == expected
