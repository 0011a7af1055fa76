"""scripts/pass1_stages.py: the chunks it times are the workers' chunks, in
order and whole, and every command's stages are timed without a refusal."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pass1_stages
import pytest
from conftest import ROOT

from streamtrace.engine import indexworkers
from streamtrace.io import reader
from streamtrace.synth import SynthConfig, write_traces


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("stages")
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=2, steps=2, graph_kernels=8), directory,
                 compress="none")
    return directory / "merged_trace.json"


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(reader, "TAIL_WINDOW", 16 << 10)


def test_the_chunks_are_the_first_events_in_order(trace, small_chunks):
    texts = pass1_stages.first_chunks(str(trace), 6)
    assert len(texts) == 6
    events = orjson.loads(b"[" + b",".join(texts) + b"]")
    assert events == json.loads(trace.read_text())["traceEvents"][:len(events)]
    assert len(events) > 6 * 20


@pytest.mark.parametrize("command", sorted(pass1_stages.INDEXES))
def test_every_command_has_its_stages_timed(trace, small_chunks, command):
    texts = pass1_stages.first_chunks(str(trace), 4)
    spent = pass1_stages.time_stages(texts, command)
    expected = {"fold", "read test", "decode", "visit", "part"}
    spools = pass1_stages.INDEXES[command][1]
    expected |= {"spool"} if spools else set()
    expected |= {"secret screen"} if command == "inspect" or spools else set()  # (a copy is screened too)
    assert set(spent) == expected
    assert all(seconds > 0 for seconds in spent.values())


def test_a_trace_too_small_for_chunks_is_refused_in_one_line(tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}))
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "pass1_stages.py"), str(small)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "too small" in run.stderr
