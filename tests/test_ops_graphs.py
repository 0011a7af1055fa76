"""CUDA/HIP graph replays in the ops report: the tables keep TraceLens's
attribution (the op around the replay) and the notes say plainly that the
trace cannot tell which ops launched the replayed kernels, how many there
are and where they were counted."""
from __future__ import annotations

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


def test_capture_in_the_trace_is_said_and_replay_kept_as_tracelens(tmp_path) -> None:
    """A capture (two ops whose launches run no kernel) and its replay (three kernels under one
    correlation, inside CUDAGraph::replay): ops_summary gives the kernels to CUDAGraph::replay."""
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
    assert "it holds 1 graph capture, but no link from a replayed kernel" in note and "(3 to CUDAGraph::replay)" in note
    summary = [line.split(",")[:2] for line in tables["ops_summary"].decode().split("\n")[1:] if line]
    assert summary == [["CUDAGraph::replay", "6"], ["aten::relu", "2"]]  # the captured ops get none of it


def test_no_graph_no_note() -> None:
    _, notes = ops_tables(str(TRACES / "kineto_small.json"))
    assert _graph_note(notes) == []
