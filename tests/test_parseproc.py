"""Pass 1 with parsing in a child process gives exactly what in-process pass 1 gives."""
from __future__ import annotations

import gzip
import os

import pytest
from conftest import REAL_TRACES, TRACES, large_ones_slow, load_json

from streamtrace import compact
from streamtrace.engine import parseproc
from streamtrace.engine.passes import index_pass
from streamtrace.errors import TraceError
from streamtrace.io.source import InputSource

IN_PROCESS, IN_CHILD = 1, 2  # jobs


class Record:
    """Keeps what the visitor saw, small enough for tiny traces."""

    def __init__(self) -> None:
        self.seen: list = []

    def visit(self, event: dict) -> None:
        self.seen.append((event.get("ph"), event.get("cat"), event.get("name"), event.get("ts")))


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """The child takes files of any size (16 MB and up otherwise)."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)


def pass_one(path, jobs: int, spool_dir) -> tuple[list, list[bytes], dict]:
    with InputSource(str(path)) as source:
        result = index_pass(source, Record, keep_events=True, jobs=jobs, spool_dir=str(spool_dir))
        lines = [line for block in result.spool.read_blocks() for line in block]
        result.spool.close()
    return result.visitor.seen, lines, result.stats.as_dict()


@pytest.mark.parametrize("path", large_ones_slow(REAL_TRACES), ids=lambda p: p.name)
def test_child_parse_matches_in_process(path, tmp_path):
    in_child = pass_one(path, IN_CHILD, tmp_path)
    assert in_child == pass_one(path, IN_PROCESS, tmp_path)
    assert len(in_child[1]) == in_child[2]["events"] > 0
    assert os.listdir(tmp_path) == []


def test_exact_mode_numbers_reach_the_visitor_exactly(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "i", "name": "a", "ts": 1.25, "args": {"id": 123456789012345678901234}},'
                     b' {"ph": "i", "name": "b", "ts": 1e400}]}')

    class Ids(Record):
        def visit(self, event: dict) -> None:
            self.seen.append((event.get("args", {}).get("id"), str(event["ts"])))

    with InputSource(str(path)) as source:
        result = index_pass(source, Ids, keep_events=True, jobs=IN_CHILD, spool_dir=str(tmp_path))
        result.spool.close()
    assert result.stats.exact_numbers
    assert result.visitor.seen == [(123456789012345678901234, "1.25"), (None, "1E+400")]


def test_child_failure_is_one_located_error_and_leaves_nothing(tmp_path):
    trace = TRACES / "kineto_small.json"
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(trace.read_bytes())[:-100])
    spool = tmp_path / "spool"
    spool.mkdir()
    with pytest.raises(TraceError) as failure:
        pass_one(cut, IN_CHILD, spool)
    assert str(cut) in str(failure.value) and "byte" in str(failure.value)
    assert os.listdir(spool) == []


def test_compact_through_the_child_equals_in_process(tmp_path):
    trace = TRACES / "b200_eager.json.gz"
    outputs = []
    for jobs in (IN_CHILD, IN_PROCESS):
        out = tmp_path / f"out{jobs}.json"
        summary = compact(str(trace), str(out), jobs=jobs)
        outputs.append((load_json(out), {k: v for k, v in summary.items() if "seconds" not in k and "rss" not in k
                                         and k != "output"}))
    assert outputs[0] == outputs[1]
    assert outputs[0][1]["measured_slices"] > 0
