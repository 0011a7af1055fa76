"""analyze --ops: how each input is read for the ops tables (bad fields
taken as TraceLens would take them, never a traceback)."""
from __future__ import annotations

import json
import subprocess
import sys

import streamtrace
from streamtrace.commands.analyses.ops import ops_tables


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
