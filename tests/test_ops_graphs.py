"""CUDA/HIP graph replays in the ops report: the tables keep TraceLens's
attribution (the op around the replay) and the notes say plainly that the
trace cannot tell which ops launched the replayed kernels, how many there
are and where they were counted."""
from __future__ import annotations

import csv
import io
import json

from conftest import TRACES, events_of, load_json

from streamtrace.commands.analyses.ops import ops_tables


def _graph_note(notes: list[str]) -> list[str]:
    return [note for note in notes if "graph replay" in note]


def test_real_replay_without_capture_is_said_with_its_kernels() -> None:
    """vllm's decode: one hipGraphLaunch, outside any cpu_op; its kernels counted from json.load here."""
    path = TRACES / "vllm_decode_graph_replay_mi300.json.gz"
    events = events_of(load_json(path))
    (launch,) = [event for event in events if event.get("name") == "hipGraphLaunch"]
    replayed = [event for event in events if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                and event.get("args", {}).get("correlation") == launch["args"]["correlation"]]
    _, notes = ops_tables(str(path))
    (note,) = _graph_note(notes)
    assert note.startswith(f"{len(replayed):,} GPU events ran in 1 graph replay (hipGraphLaunch)")
    assert "it holds no capture of those graphs" in note and f"({len(replayed):,} to hipGraphLaunch)" in note


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _kernel(name: str, corr: int, ts: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 2,
            "args": {"correlation": corr, "stream": 7}}


def test_capture_without_kernel_names_is_said_and_replay_kept_as_tracelens(tmp_path) -> None:
    """A CUDA capture (two ops whose launches run no kernel and name none) and its replay (three kernels
    under one correlation, inside CUDAGraph::replay): ops_summary gives the kernels to CUDAGraph::replay."""
    events = [
        _event("cudaStreamBeginCapture", 0, 1, "cuda_runtime", correlation=1),
        _event("aten::mm", 2, 5), _event("cudaLaunchKernel", 3, 1, "cuda_runtime", correlation=2),
        _event("aten::add", 8, 5), _event("cudaLaunchKernel", 9, 1, "cuda_runtime", correlation=3),
        _event("cudaStreamEndCapture", 14, 1, "cuda_runtime", correlation=4),
        _event("CUDAGraph::replay", 20, 10), _event("cudaGraphLaunch", 21, 5, "cuda_runtime", correlation=5),
        _kernel("gemm", 5, 30), _kernel("add", 5, 33), _kernel("add", 5, 36),
        _event("aten::relu", 40, 5), _event("cudaLaunchKernel", 41, 1, "cuda_runtime", correlation=6),
        _kernel("relu", 6, 50),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 6, "pid": 1, "tid": 1, "ts": 41},  # (a plain launch's flow)
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 6, "pid": 0, "tid": 7, "ts": 50, "bp": "e"},
    ]
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tables, notes = ops_tables(str(path))
    (note,) = _graph_note(notes)
    assert note.startswith("3 GPU events ran in 1 graph replay (cudaGraphLaunch)")
    assert "it holds 1 graph capture, but the captured launch calls do not name their kernels" in note
    assert "(3 to CUDAGraph::replay)" in note and "graph_replay_ops" not in tables
    summary = [line.split(",")[:2] for line in tables["ops_summary"].decode().split("\n")[1:] if line]
    assert summary == [["CUDAGraph::replay", "6"], ["aten::relu", "2"]]  # the captured ops get none of it


def test_no_graph_no_note() -> None:
    _, notes = ops_tables(str(TRACES / "kineto_small.json"))
    assert _graph_note(notes) == []


def _flow(corr: int, ts: float) -> list[dict]:
    return [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": ts},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": ts + 1, "bp": "e"}]


def _gpu(name: str, corr: int, ts: float, dur: float, stream: int, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream}}


def test_rocm_capture_gives_replayed_kernels_to_the_captured_ops(tmp_path) -> None:
    """ROCm names a launch's kernel (args.kernel): a replay running the captured kernels (reordered across
    two streams) is given back to the ops captured; a replay of kernels no capture launched is not; an End
    call before any Begin (the profile began inside a capture) closes nothing."""
    events = [
        _event("hipStreamEndCapture", -10, 1, "cuda_runtime", correlation=10),  # (profiling began inside a capture)
        _event("hipStreamBeginCapture", 0, 1, "cuda_runtime", correlation=1),
        _event("aten::mm", 2, 4, **{"Input Dims": [[8, 16], [16, 4]]}),
        _event("hipLaunchKernel", 3, 1, "cuda_runtime", correlation=2, kernel="gemm"),
        _event("aten::add", 7, 3, **{"Input Dims": [[8, 4], [8, 4]]}),
        _event("hipLaunchKernel", 8, 1, "cuda_runtime", correlation=3, kernel="add"),
        _event("aten::copy_", 11, 3), _event("hipMemcpyAsync", 12, 1, "cuda_runtime", correlation=4),
        _event("aten::add", 15, 3, **{"Input Dims": [[8, 4], [8, 4]]}),
        _event("hipLaunchKernel", 16, 1, "cuda_runtime", correlation=5, kernel="add"),
        _event("hipStreamEndCapture", 20, 1, "cuda_runtime", correlation=6),
        _event("CUDAGraph::replay", 30, 10), _event("hipGraphLaunch", 31, 5, "cuda_runtime", correlation=7),
        _gpu("gemm", 7, 40, 10, 1), _gpu("add", 7, 41, 3, 2), _gpu("Memcpy DtoD (Device -> Device)", 7, 50, 2, 1,
                                                                     "gpu_memcpy"),
        _gpu("add", 7, 52, 5, 1),
        _event("CUDAGraph::replay", 60, 10), _event("hipGraphLaunch", 61, 5, "cuda_runtime", correlation=8),
        _gpu("other", 8, 70, 4, 1),
        _event("aten::relu", 80, 5), _event("hipLaunchKernel", 81, 1, "cuda_runtime", correlation=9, kernel="relu"),
        _gpu("relu", 9, 90, 1, 1), *_flow(9, 81),
    ]
    path = tmp_path / "rocm_graph.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tables, notes = ops_tables(str(path))
    (note,) = _graph_note(notes)
    assert note.startswith("5 GPU events ran in 2 graph replays (hipGraphLaunch): 4 given back to the ops captured")
    assert "1 match no capture of the trace" in note and "(1 to CUDAGraph::replay)" in note
    rows = list(csv.reader(io.StringIO(tables["graph_replay_ops"].decode())))
    assert rows[0] == ["name", "Input Dims", "captured_ops", "replayed_gpu_events", "replayed_time_us", "Percentage (%)"]
    # the two adds (3 + 5 us) in order of the streams' kernels, the gemm 10 us, the copy 2 us; of 20 us replayed
    assert [row[2:5] for row in rows[1:]] == [["1", "1", "10.0"], ["2", "2", "8.0"], ["1", "1", "2.0"]]
    assert [row[:2] for row in rows[1:]] == [["aten::mm", "((8, 16), (16, 4))"], ["aten::add", "((8, 4), (8, 4))"],
                                             ["aten::copy_", ""]]
    assert [float(row[-1]) for row in rows[1:]] == [50.0, 40.0, 10.0]
    summary = [line.split(",")[:2] for line in tables["ops_summary"].decode().splitlines()[1:]]
    assert summary[0] == ["CUDAGraph::replay", "21"]  # as TraceLens has it: the unions [40, 57) and [70, 74)
