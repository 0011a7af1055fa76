"""analyze's own figures (the text report, gpu_time, the page's figures): one number for one thing.

HTA's tables keep HTA's whole-microsecond rounding (tests/test_analyze_hta.py); what analyze says in its
report is checked here against independent readings of the same file: plain code over ``json.load`` and
``inspect``'s GPU busy time.
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

DLRM = TRACES / "dlrm_8ranks"
VLLM = TRACES / "vllm_decode_graph_replay_mi300.json.gz"  # nanosecond times: HTA's rounding moves idle 0.2% -> 4.3%


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtrace", *args], capture_output=True, text=True)


def union_length(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -float("inf")
    for start, end in sorted(spans):
        if start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@pytest.fixture(scope="module")
def generated_rank(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gpu_time")
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=2, steps=3, graph_kernels=8, graph_streams=4,
                             eager_kernels=4, python_noise=1), directory, compress="gz", merged=False)
    return directory / "rank0_trace.json.gz"


@pytest.mark.parametrize("which", ["vllm", "generated", "b200"])
def test_report_gives_the_exact_gpu_time_inspect_gives(which, generated_rank):
    """Busy time and span from the trace's own (nanosecond) times: the union of the kernels, copies and
    sets, computed here from json.load, equal to inspect's to the microsecond (b200: a cpu_op carrying
    args.stream, which HTA counts as a kernel, is no GPU time); the text says it, and says what HTA's
    rounding makes of the idle share in its tables."""
    path = {"vllm": VLLM, "generated": generated_rank, "b200": TRACES / "b200_eager.json.gz"}[which]
    events = [e for e in events_of(load_json(path)) if "dur" in e and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events]
    span = max(end for _, end in spans) - min(start for start, _ in spans)
    busy = union_length(spans)
    summary = streamtrace.analyze(path, jobs=1, include_last_step=True)
    (row,) = summary["tables"]["gpu_time"]
    assert row["busy(us)"] == pytest.approx(busy, abs=1e-3) and row["kernel_time(us)"] == pytest.approx(span, abs=1e-3)
    assert row["idle_time_pctg"] == round(100 * (span - busy) / span, 2)
    inspected = json.loads(cli("inspect", str(path), "--json").stdout)
    (rank,) = inspected["by_rank"]
    assert (rank["gpu_busy"]["busy_us"], rank["gpu_busy"]["span_us"]) == (round(row["busy(us)"], 3),
                                                                         round(row["kernel_time(us)"], 3))
    (hta_row,) = summary["tables"]["temporal_breakdown"]
    assert abs(hta_row["idle_time_pctg"] - row["idle_time_pctg"]) > 0.5  # HTA's rounding moves it that far here
    text = cli("analyze", str(path), "--include-last-step", "-j", "1").stdout
    line = next(line for line in text.splitlines() if line.startswith("rank 0"))
    assert f"GPU busy {busy / 1e3:,.3f} ms of {span / 1e3:,.3f} ms: idle {100 * (span - busy) / span:.1f}%" in line
    assert f"HTA's whole-microsecond rounding, in its tables: idle {hta_row['idle_time_pctg']:.1f}%" in line


def test_integer_times_need_no_word_on_rounding():
    """DLRM's times are whole microseconds: gpu_time is HTA's temporal breakdown, and the report says nothing of rounding."""
    summary = streamtrace.analyze(DLRM, jobs=1)
    for exact, hta in zip(summary["tables"]["gpu_time"], summary["tables"]["temporal_breakdown"]):
        assert not exact["hta_rounds"]
        assert [exact[key] for key in ("idle_time(us)", "kernel_time(us)", "idle_time_pctg")] == \
               [hta[key] for key in ("idle_time(us)", "kernel_time(us)", "idle_time_pctg")]
    assert "rounding" not in cli("analyze", str(DLRM), "-j", "1").stdout


@pytest.fixture(scope="module")
def dlrm_figures() -> tuple[dict, dict]:
    from streamtrace.algo.reportfigures import figures

    summary = streamtrace.analyze(DLRM, jobs=1)
    return summary, {figure.key: figure for figure in figures(summary)}


def test_why_the_gpu_idles_never_adds_streams_up(dlrm_figures):
    """HTA's idle table is per stream: the page draws one bar per (rank, stream), each its rows, none taller
    than its rank's GPU span (rank 1's streams idle 33.7 ms together in its 18.7 ms span)."""
    summary, shown = dlrm_figures
    tables = summary["tables"]
    span = {row["rank"]: row["kernel_time(us)"] for row in tables["temporal_breakdown"]}
    rows = tables["idle_time_breakdown"]
    streams = {(row["rank"], row["stream"]) for row in rows}
    heights: dict[str, float] = {}
    for trace in shown["idle"].traces:
        assert len(trace["x"]) == len(streams)
        for label, value in zip(trace["x"], trace["y"].tolist()):
            if value == value:  # (NaN: no such category on that stream)
                heights[label] = heights.get(label, 0.0) + value
    for label, height in heights.items():
        rank, stream = int(label.split()[0]), int(label.split()[-1])
        assert height == pytest.approx(sum(row["idle_time"] for row in rows if (row["rank"], row["stream"]) == (rank, stream))
                                       * 1e-3)
        assert height <= span[rank] * 1e-3
    assert "do not add up" in shown["idle"].caption


def test_the_page_leads_with_the_ranks_that_arrive_last(dlrm_figures):
    """Ranks 1, 3 and 4 have the longest steps because they wait in NCCL for ranks 2, 6 and 7, whose
    communication kernels start last: the words name those first and call no rank slow by step time."""
    summary, shown = dlrm_figures
    words = shown["step-duration"].callout
    late = sorted({row["rank"] for row in summary["tables"]["stragglers"] if row["potential_straggler"]})
    assert late == [2, 7]
    first = words.split(". ")[0]
    assert all(f"rank {rank}" in first for rank in (7, 2, 6)) and "rank 1" not in first
    assert words.index("rank 7") < words.index("rank 1")
    assert "slow" not in words.lower()
    assert "holds them up" not in shown["step-idle"].caption and "busy" in shown["step-idle"].caption
    text = cli("analyze", str(DLRM), "-j", "1").stdout
    assert "late ranks     2, 7" in text and text.index("late ranks") < text.index("longest steps")
    assert "slowest" not in text


def write_events(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_partial_and_empty_inputs_are_said(tmp_path):
    """A truncated rank read with --salvage, an input without events, one with CPU events only, a rank
    without GPU work: each says what it is, in the report and in the summary's notes (exit 0)."""
    raw = gzip.decompress((DLRM / sorted(p.name for p in DLRM.iterdir())[0]).read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[:len(raw) * 3 // 4])
    summary = streamtrace.analyze(cut, jobs=1, salvage=True)
    assert summary["read"]["truncated_salvaged"]
    assert any("truncated" in note and "--salvage" in note for note in summary["notes"])
    run = cli("analyze", str(cut), "--salvage", "-j", "1")
    assert run.returncode == 0 and "truncated" in run.stdout

    empty = write_events(tmp_path / "empty.json", [])
    run = cli("analyze", str(empty), "-j", "1")
    assert run.returncode == 0 and "empty.json: no events: no rank to analyze" in run.stdout

    cpu = write_events(tmp_path / "cpu.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                                                "ts": 10 + 5 * n, "dur": 3} for n in range(4)])
    assert any("4 CPU events and no GPU work" in note for note in streamtrace.analyze(cpu, jobs=1)["notes"])

    launches = write_events(tmp_path / "launches.json", [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10 + 5 * n, "dur": 3,
         "args": {"correlation": n}} for n in range(4)])
    run = cli("analyze", str(launches), "-j", "1")
    assert "rank 0  no GPU work" in run.stdout and "n/a" not in run.stdout


def test_short_kernels_show_in_units_that_show_them(tmp_path):
    """A kernel of 20 ns beside one of 1.5 ms: its total reads 0.020 us (not 0.0 ms, nor the -1 us HTA's
    rounding gives it in kernel_breakdown), as inspect counts it."""
    events = [{"ph": "X", "cat": "kernel", "name": "long", "pid": 2, "tid": 7, "ts": 10.0, "dur": 1500.0,
               "args": {"stream": 7, "correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "short", "pid": 2, "tid": 7, "ts": 1600.5, "dur": 0.02,
               "args": {"stream": 7, "correlation": 2}}]
    text = cli("analyze", str(write_events(tmp_path / "short.json", events)), "-j", "1").stdout
    assert "1.500 ms 1x long" in text and "0.020 us 1x short" in text and "0.0 ms" not in text


def test_step_gpu_figures_take_the_trace_own_times(generated_rank):
    """step_times' GPU busy time per step: the union of the kernels launched in the step (the last
    ProfilerStep span, in file order, holding the launch), from the trace's nanosecond times."""
    events = events_of(load_json(generated_rank))
    spans = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
             if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    kernels: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        args = e.get("args")
        if "dur" in e and isinstance(args, dict) and args.get("stream") is not None and args.get("correlation") in launched:
            at = launched[args["correlation"]]
            steps = [number for start, end, number in spans if start <= at < end]
            if steps:
                kernels.setdefault(steps[-1], []).append((e["ts"], e["ts"] + e["dur"]))
    summary = streamtrace.analyze(generated_rank, jobs=1, include_last_step=True)
    busy = {row["step"]: row["gpu_busy(us)"] for row in summary["tables"]["step_times"]}
    assert busy and set(busy) == set(kernels)
    for step, spans_of_step in kernels.items():
        assert busy[step] == pytest.approx(union_length(spans_of_step), abs=1e-3), step
