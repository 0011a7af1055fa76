"""analyze --ops: how each input is read for the ops tables (bad fields
taken as TraceLens would take them, never a traceback)."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import annotated_attention_trace
import pytest
from conftest import ROOT, TRACES

import streamtrace
from streamtrace.commands.analyses import ops
from streamtrace.commands.analyses.ops import ops_tables
from streamtrace.engine import indexworkers, parseproc


def test_a_category_or_metadata_name_that_is_a_list_is_no_category(tmp_path) -> None:
    """TraceLens compares ``cat`` with its category names: a list is none of them."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
               "args": {"correlation": 1}},
              {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 1},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100, "dur": 5,
               "args": {"correlation": 1, "stream": 7}},
              {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 100, "bp": "e"},
              {"ph": "X", "cat": ["kernel"], "name": "odd", "pid": 0, "tid": 7, "ts": 200, "dur": 5, "args": {}},
              {"ph": "M", "name": ["thread_name"], "pid": 1, "tid": 1, "args": {"name": "x"}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tables, _ = ops_tables(str(path))
    kernels = tables["kernel_summary"].decode().strip().split("\n")
    assert kernels[1:] == ["GEMM,aten::mm,k,7,5,1,5.0,5,5,100.0,100.0"]  # the listed category's event is no kernel


def test_an_input_read_again_for_the_step_cut_keeps_its_ops_tables(tmp_path) -> None:
    """An input whose own step names differ from the run's is analyzed again
    (HTA cuts by every input's names); its ops tables are those of its first task."""
    one, two = tmp_path / "one", tmp_path / "two"
    for work, steps in ((one, "1"), (two, "2")):
        subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(work), "--ranks", "2", "--pp-stages", "1",
                        "--steps", steps, "--graph-kernels", "4", "--eager-kernels", "4", "--no-merged", "--compress",
                        "none", "-q"], check=True)
    alone = tmp_path / "alone"
    streamtrace.analyze([str(one / "rank0_trace.json")], str(alone), ops=True, only="temporal")
    both = tmp_path / "both"
    summary = streamtrace.analyze([str(one / "rank0_trace.json"), str(two / "rank1_trace.json")], str(both),
                                  ops=True, only="temporal")
    assert summary["ranks"] == [0, 1]
    assert sorted(path.name for path in (both / "ops").iterdir()) == ["rank0", "rank1"]
    for table in (alone / "ops" / "rank0").iterdir():
        assert (both / "ops" / "rank0" / table.name).read_bytes() == table.read_bytes()


def _tables_of_pass_1(trace: str, out, jobs: int) -> dict[str, bytes]:
    streamtrace.analyze([trace], str(out), ops=True, only="temporal", jobs=jobs)
    folder = next((out / "ops").iterdir())
    return {path.name[:-4]: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("jobs", [1, 2])
def test_pass_1_collects_the_tables_a_reading_of_their_own_gives(tmp_path, monkeypatch, jobs: int) -> None:
    """Collected in analyze's pass 1, in parts of 8 KiB chunks (workers with -j 2), whose names, places,
    signatures, odd ids and UIDs are renumbered as parts are joined: the tables of one serial reading,
    including where a chunk is refused (an id beyond 64 bits) and this process reads on from it."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 8 << 10)
    work = tmp_path / "synth"
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(work), "--ranks", "1", "--pp-stages", "1",
                    "--steps", "1", "--graph-kernels", "4", "--eager-kernels", "4", "--no-merged", "--compress",
                    "none", "-q"], check=True)
    document = json.loads((work / "rank0_trace.json").read_text())
    events = document["traceEvents"]
    ops_at = [n for n, event in enumerate(events) if event.get("cat") == "cpu_op"]
    events[ops_at[len(ops_at) // 2]]["args"]["External id"] = "x1"  # (an id that is no integer: numbered above them)
    events[ops_at[len(ops_at) // 3]]["args"]["Sequence number"] = 1 << 70
    trace = tmp_path / "odd.json"
    trace.write_text(json.dumps(document))
    expected, _ = ops_tables(str(trace))
    assert {"ops_summary", "ops_unique_args", "kernel_summary"} <= set(expected)

    def read_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("a one-rank input read a second time for the ops tables")

    monkeypatch.setattr(ops, "read_input", read_again)
    assert _tables_of_pass_1(str(trace), tmp_path / "out", jobs) == expected


def test_traces_on_stdin_give_their_tables(tmp_path) -> None:
    """Pass 1 is the one reading of a trace, so stdin serves: a rank's, and one of several ranks."""
    trace = TRACES / "mi250_minitoy.json.gz"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", "-", "-o", str(tmp_path / "out"), "--ops",
                          "-q"], input=gzip.decompress(trace.read_bytes()), capture_output=True)
    assert run.returncode == 0, run.stderr
    expected, _ = ops_tables(str(trace))
    folder = next((tmp_path / "out" / "ops").iterdir())
    assert {path.name[:-4]: path.read_bytes() for path in folder.iterdir()} == expected
    work = tmp_path / "synth"
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(work), "--ranks", "2", "--pp-stages", "1",
                    "--steps", "1", "--graph-kernels", "4", "--eager-kernels", "4", "--compress", "none", "-q"],
                   check=True)
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", "-", "-o", str(tmp_path / "merged"), "--ops",
                          "-q"], input=(work / "merged_trace.json").read_bytes(), capture_output=True)
    assert run.returncode == 0, run.stderr
    for rank in (0, 1):
        expected, _ = ops_tables(str(work / f"rank{rank}_trace.json"))
        folder = tmp_path / "merged" / "ops" / f"rank{rank}"
        assert {path.name[:-4]: path.read_bytes() for path in folder.iterdir()} == expected


@pytest.mark.parametrize("jobs", [1, 2])
def test_annotations_collected_in_pass_1_parts_give_tracelens_attention_rows(tmp_path, monkeypatch, jobs: int) -> None:
    """vLLM's attention reads the annotation enclosing it: collected in pass 1 in parts of 2 KiB chunks
    (workers with -j 2), whose names are renumbered as parts are joined, the sheet is TraceLens's."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 2 << 10)
    trace = annotated_attention_trace.write(str(tmp_path / "annotated.json"))
    tables = _tables_of_pass_1(trace, tmp_path / "out", jobs)
    reference = ROOT / "tests" / "reference" / "tracelens_perf" / "annotated_attention"
    for stem in ("InferenceAttention_fwd", "unified_perf_summary"):
        assert tables[stem] == gzip.decompress((reference / f"{stem}.csv.gz").read_bytes())
