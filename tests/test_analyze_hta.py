"""``streamtrace analyze`` against Holistic Trace Analysis 0.5.0, table by table.

Inputs: the 8 real DLRM ranks, every single shared trace (each in a directory
of its own, as HTA reads directories), generated pipeline-parallel runs, and a
generated merged K-rank file (its tables must equal HTA's on the per-rank
files). HTA runs once per input (module-scoped cache).

Where HTA raises, there is nothing to compare: ``HTA_STOPS`` names each such
(input, table) with the exception HTA raises, ``test_hta_stops_only_where_known``
fails if HTA raises anywhere else or stops raising, and
``test_inputs_hta_stops_on_give_tables`` runs the CLI on those inputs.
"""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REAL_TRACES, TRACES, load_json
from hta_oracle import COLUMNS, PARTIAL_COLUMNS, TABLES, assert_tables_equal, hta_run, table_differences

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # HTA, the oracle, loads every trace into pandas: CI runs it, the quick loop does not

HAS_ANALYZE = hasattr(streamtrace, "analyze")
NO_ANALYZE = "streamtrace.analyze does not exist on this branch yet (the command lands separately)"
DLRM = TRACES / "dlrm_8ranks"
PP_RUN = SynthConfig(ranks=4, pp_stages=2, steps=3)
HIP_RUN = SynthConfig(ranks=2, pp_stages=2, steps=3, schedule="zb", hip=True, seed=3)
# more than 32,767 events, every correlation id below 32,768: HTA 0.5.0 keeps the ids as int16 (see
# hta_oracle._wide_correlation: pandas 3 stops there, hence pyproject's pandas<3)
INT16_IDS_RUN = SynthConfig(ranks=1, pp_stages=1, steps=14)

NO_STEPS = (ValueError, "available profiler steps=[]")  # get_potential_stragglers without ProfilerStep spans
ONE_RANK = ((ValueError, "Encountered all NA values"),  # std across one rank's kernels is NaN everywhere (pandas 3)
            (TypeError, "cannot unpack non-iterable float"))  # the same NaN, met one step later under pandas 2
NO_NCCL_KERNEL = (ValueError, "argmax of an empty sequence")  # only names starting "ncclKernel" are candidates

# (input, table) -> (exception type, text in its message): every place HTA 0.5.0 raises on these inputs.
HTA_STOPS = {
    ("cupti_profiler.json.gz", "temporal_breakdown"): (IndexError, "out-of-bounds"),  # no event has a stream
    ("cupti_profiler.json.gz", "idle_time_breakdown"): (ValueError, "No objects to concatenate"),
    ("kineto_small.json", "temporal_breakdown"): (AssertionError, ""),  # rounding makes sub-us kernels' dur -1
    **{(name, "stragglers"): NO_STEPS for name in ("b200_eager.json.gz", "cupti_profiler.json.gz", "kineto_small.json",
                                                    "mi210_gpu_only.json.gz", "sglang_decode_qwen3.json.gz",
                                                    "vllm_decode_graph_replay_mi300.json.gz")},
    **{(name, "stragglers"): ONE_RANK for name in ("nccl_rank0.json.gz", "sampled_rank-0.json.gz", "sampled_rank-1.json.gz")},
    ("mi250_minitoy.json.gz", "stragglers"): NO_NCCL_KERNEL,
    **{(name, "stragglers"): NO_NCCL_KERNEL for name in ("synth_pp", "synth_pp_merged", "synth_hip", "synth_int16_ids")},
}


@dataclass(frozen=True)
class Case:
    """One comparison: what analyze reads, the directory of rank files HTA reads, and the options of both."""

    name: str
    source: Path | tuple[Path, ...]
    hta_dir: Path
    options: tuple = ()  # (name, value) pairs, the same for analyze and hta_run

    @property
    def sources(self) -> list[str]:
        return [str(path) for path in (self.source if isinstance(self.source, tuple) else (self.source,))]

    @property
    def kwargs(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self.options}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """Synth runs written once: the run directory and a directory holding only its rank files (for HTA)."""
    dirs = {}
    for label, config in (("synth_pp", PP_RUN), ("synth_hip", HIP_RUN), ("synth_int16_ids", INT16_IDS_RUN)):
        run = tmp_path_factory.mktemp(label)
        write_traces(config, run)
        ranks = run / "ranks"
        ranks.mkdir()
        for rank_file in sorted(run.glob("rank*_trace.json.gz")):
            (ranks / rank_file.name).symlink_to(rank_file)
        dirs[label] = run
    return dirs


@pytest.fixture(scope="module")
def singles(tmp_path_factory) -> dict[str, Path]:
    """Each single shared trace alone in a directory, since HTA reads every trace file of a directory."""
    dirs = {}
    for trace in REAL_TRACES:
        directory = tmp_path_factory.mktemp(trace.name.split(".")[0])
        (directory / trace.name).symlink_to(trace)
        dirs[trace.name] = directory
    return dirs


CASE_NAMES = ["dlrm_8ranks", "dlrm_8ranks_last_step", "dlrm_ranks_2_5", *(p.name for p in REAL_TRACES),
              "synth_pp", "synth_pp_merged", "synth_hip", "synth_int16_ids"]


def make_case(name: str, generated: dict[str, Path], singles: dict[str, Path]) -> Case:
    if name == "dlrm_8ranks":
        return Case(name, DLRM, DLRM)
    if name == "dlrm_8ranks_last_step":
        return Case(name, DLRM, DLRM, (("include_last_step", True),))
    if name == "dlrm_ranks_2_5":
        return Case(name, DLRM, DLRM, (("ranks", (2, 3, 4, 5)),))
    if name in singles:
        return Case(name, TRACES / name, singles[name])
    if name == "synth_pp_merged":
        run = generated["synth_pp"]
        return Case(name, run / "merged_trace.json.gz", run / "ranks")
    run = generated[name]
    return Case(name, tuple(sorted((run / "ranks").iterdir())), run / "ranks")


_HTA_RESULTS: dict[tuple, tuple[dict, dict]] = {}
_OUR_TABLES: dict[str, dict] = {}


def hta_result(case: Case) -> tuple[dict, dict]:
    """HTA's (tables, errors) for the case's rank directory and options, computed once per module run."""
    key = (case.hta_dir, case.options)
    if key not in _HTA_RESULTS:
        _HTA_RESULTS[key] = hta_run(case.hta_dir, **case.kwargs)
    return _HTA_RESULTS[key]


def our_tables(case: Case) -> dict:
    if case.name not in _OUR_TABLES:
        _OUR_TABLES[case.name] = streamtrace.analyze(case.sources, **case.kwargs)["tables"]
    return _OUR_TABLES[case.name]


@pytest.fixture(scope="module", params=CASE_NAMES)
def case(request, generated, singles) -> Case:
    return make_case(request.param, generated, singles)


def test_the_int16_case_has_what_makes_hta_need_pandas_below_3(generated):
    """synth_int16_ids keeps HTA's int16 path covered: over 32,767 events, every correlation id fits int16."""
    document = load_json(generated["synth_int16_ids"] / "rank0_trace.json.gz")
    ids = [event["args"]["correlation"] for event in document["traceEvents"]
           if isinstance(event.get("args"), dict) and isinstance(event["args"].get("correlation"), int)]
    assert len(document["traceEvents"]) > 32_767 and 0 < max(ids) <= 32_767


def stopped_as(error: BaseException | None, stop: tuple) -> bool:
    """Did HTA raise as ``stop`` says: (exception type, text in its message), or one of several such pairs
    (where the pandas version decides which of them HTA meets first)?"""
    alternatives = stop if isinstance(stop[0], tuple) else (stop,)
    return any(isinstance(error, kind) and text in str(error) for kind, text in alternatives)


def test_hta_stops_only_where_known(case):
    """HTA raises exactly where HTA_STOPS says, with the exception it names: no more, no fewer."""
    _, raised = hta_result(case)
    expected = {table: stop for (name, table), stop in HTA_STOPS.items() if name == case.name}
    assert set(raised) == set(expected), f"HTA raised on {sorted(raised)} ({raised}), expected {sorted(expected)}"
    for table, stop in expected.items():
        assert stopped_as(raised[table], stop), (table, raised[table])


@pytest.mark.skipif(not HAS_ANALYZE, reason=NO_ANALYZE)
@pytest.mark.parametrize("table", TABLES)
def test_analyze_matches_hta(case, table):
    """Our table equals HTA's: same columns and rows, times within max(1 us, 0.01 %), percentages within 0.01."""
    hta, errors = hta_result(case)
    if table in errors:
        pytest.skip(f"HTA raises on this table ({errors[table]!r}): test_inputs_hta_stops_on_give_tables covers it")
    assert_tables_equal(our_tables(case), hta, tables=[table])


def stop_inputs() -> list[str]:
    """Inputs HTA stops on in a table other than stragglers (which need several ranks and NCCL kernels)."""
    return sorted({name for (name, table) in HTA_STOPS if table != "stragglers"} | {"synth_pp"})


@pytest.mark.parametrize("name", stop_inputs())
def test_inputs_hta_stops_on_give_tables(name, generated, singles, tmp_path):
    """HTA really raises on these inputs; ``streamtrace analyze`` exits 0 and writes every table there."""
    case = make_case(name, generated, singles)
    _, errors = hta_result(case)
    for (input_name, table), stop in HTA_STOPS.items():
        if input_name == name:
            assert stopped_as(errors.get(table), stop), (table, errors.get(table))
    if not HAS_ANALYZE:
        pytest.skip(NO_ANALYZE)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", *case.sources, "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    for table in TABLES:
        with open(out / f"{table}.csv", newline="") as handle:
            header = next(csv.reader(handle))
        assert header == list(COLUMNS[table]) if table in COLUMNS else set(PARTIAL_COLUMNS[table]) <= set(header), (table, header)


# ---- the harness itself, on a trace small enough to work out by hand ----

STEP_ORIGIN = 1000  # every ts below is offset by this; HTA aligns the earliest event to 0


def hand_built_trace() -> dict:
    """Rank 0, two profiler steps (HTA keeps the first), kernels on streams 7 and 8 with known overlaps.

    Launches (cuda_runtime, dur 5) at 10, 20, 30, 75 are before the last step's start (100), the one at
    110 is not, so its kernel is dropped. The memcpy's float times make HTA round every ts up and every
    end down: [60.4, 69.6] becomes [61, 69].
    """
    def at(ts):
        return STEP_ORIGIN + ts

    def launch(name, ts, correlation):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": at(ts), "dur": 5,
                "args": {"correlation": correlation}}

    def gpu(name, cat, stream, ts, dur, correlation):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": at(ts), "dur": dur,
                "args": {"stream": stream, "correlation": correlation, "device": 0}}

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": at(0), "dur": 100},
        launch("cudaLaunchKernel", 10, 1),
        launch("cudaLaunchKernel", 20, 2),
        launch("cudaMemcpyAsync", 30, 3),
        launch("cudaLaunchKernel", 75, 4),
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": at(100), "dur": 100},
        launch("cudaLaunchKernel", 110, 5),
        gpu("gemm_kernel", "kernel", 7, 20, 30, 1),
        gpu("ncclDevKernel_AllReduce", "kernel", 8, 40, 40, 2),
        gpu("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 7, 60.4, 9.2, 3),
        gpu("gemm_kernel", "kernel", 7, 90, 20, 4),
        gpu("gemm_kernel", "kernel", 7, 120, 10, 5),
        {"ph": "i", "cat": "", "name": "Record Window End", "pid": "", "tid": "", "ts": at(300), "s": "g"},
    ]
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}


def expected_by_hand() -> dict[str, list[dict]]:
    """The tables worked out on paper from hand_built_trace (kept kernels, after rounding):

    stream 7: gemm [20,50] (launch 10), memcpy [61,69] (launch 30), gemm [90,110] (launch 75);
    stream 8: nccl [40,80] (launch 20).
    union [20,80]+[90,110] = 80 of a 90 us span: idle 10; compute 30+20 = 50; non-compute 30.
    sweep: COMP 20-40, 90-110 = 40; COMP+COMM 40-50 = 10; COMM 50-61, 69-80 = 22; COMM+MEM 61-69 = 8.
    overlap: 10 of the 40 us of communication = 25 %.
    stream 7 gaps: 61-50 = 11 (launch 30 < 50: kernel wait), 90-69 = 21 (launch 75 > 69: host wait).
    launch delay = kernel start - launch end: 20-15, 40-25, 61-35, 90-80.
    """
    return {
        "temporal_breakdown": [{"rank": 0, "idle_time(us)": 10, "compute_time(us)": 50, "non_compute_time(us)": 30,
                                "kernel_time(us)": 90, "idle_time_pctg": 11.11, "compute_time_pctg": 55.56,
                                "non_compute_time_pctg": 33.33}],
        "kernel_type_breakdown": [
            {"kernel_type": "COMPUTATION", "sum": 40, "percentage": 50.0},
            {"kernel_type": "COMMUNICATION", "sum": 22, "percentage": 27.5},
            {"kernel_type": "COMPUTATION overlapping COMMUNICATION", "sum": 10, "percentage": 12.5},
            {"kernel_type": "COMMUNICATION overlapping MEMORY", "sum": 8, "percentage": 10.0},
        ],
        "kernel_breakdown": [
            {"name": "ncclDevKernel_AllReduce", "sum (us)": 40, "max (us)": 40, "min (us)": 40, "stddev": 0.0,
             "mean (us)": 40, "kernel_type": "COMMUNICATION", "rank": 0},
            {"name": "gemm_kernel", "sum (us)": 50, "max (us)": 30, "min (us)": 20, "stddev": math.sqrt(50),
             "mean (us)": 25, "kernel_type": "COMPUTATION", "rank": 0},
            {"name": "Memcpy HtoD (Pinned -> Device)", "sum (us)": 8, "max (us)": 8, "min (us)": 8, "stddev": 0.0,
             "mean (us)": 8, "kernel_type": "MEMORY", "rank": 0},
        ],
        "comm_comp_overlap": [{"rank": 0, "comp_comm_overlap_pctg": 25.0}],
        "idle_time_breakdown": [
            {"rank": 0, "stream": 7, "idle_category": "host_wait", "idle_time": 21, "idle_time_ratio": 0.66},
            {"rank": 0, "stream": 7, "idle_category": "kernel_wait", "idle_time": 11, "idle_time_ratio": 0.34},
            {"rank": 0, "stream": 7, "idle_category": "other", "idle_time": 0, "idle_time_ratio": 0.0},
            {"rank": 0, "stream": 8, "idle_category": "other", "idle_time": 0, "idle_time_ratio": math.nan},
        ],
        "kernel_launch_stats": [
            {"rank": 0, "correlation": 1, "cpu_duration": 5, "gpu_duration": 30, "launch_delay": 5},
            {"rank": 0, "correlation": 2, "cpu_duration": 5, "gpu_duration": 40, "launch_delay": 15},
            {"rank": 0, "correlation": 3, "cpu_duration": 5, "gpu_duration": 8, "launch_delay": 26},
            {"rank": 0, "correlation": 4, "cpu_duration": 5, "gpu_duration": 20, "launch_delay": 10},
        ],
        "profiler_steps": [{"step": 1}],
        "step_times": [{"rank": 0, "step": 1, "start(us)": 0, "duration(us)": 100}],
    }


@pytest.fixture(scope="module")
def hand_built(tmp_path_factory) -> tuple[dict, dict]:
    directory = tmp_path_factory.mktemp("hand_built")
    (directory / "rank0.json").write_text(json.dumps(hand_built_trace()))
    return hta_run(directory)


def test_oracle_reproduces_tables_worked_out_by_hand(hand_built):
    tables, errors = hand_built
    assert set(errors) == {"stragglers"}, errors  # one rank: HTA cannot rank stragglers
    assert_tables_equal(expected_by_hand(), tables, tables=list(expected_by_hand()))


@pytest.mark.parametrize("change, table, complaint", [
    (lambda t: t["temporal_breakdown"][0].update({"idle_time(us)": 11.5}), "temporal_breakdown", "idle_time(us)"),
    (lambda t: t["temporal_breakdown"][0].update({"idle_time_pctg": 11.13}), "temporal_breakdown", "idle_time_pctg"),
    (lambda t: t["comm_comp_overlap"][0].update({"comp_comm_overlap_pctg": math.nan}), "comm_comp_overlap", "pctg"),
    (lambda t: t["idle_time_breakdown"].pop(1), "idle_time_breakdown", "0 rows, HTA 1"),
    (lambda t: t["idle_time_breakdown"].reverse(), "idle_time_breakdown", "order"),
    (lambda t: t["kernel_type_breakdown"].reverse(), "kernel_type_breakdown", "descending"),
    (lambda t: t["kernel_breakdown"][1].update({"name": "gemm"}), "kernel_breakdown", "rows"),
    (lambda t: t["kernel_launch_stats"][2].update({"launch_delay": 28}), "kernel_launch_stats", "launch_delay"),
    (lambda t: t["step_times"][0].update({"duration(us)": 98}), "step_times", "none of HTA's"),
    (lambda t: t["step_times"][0].update({"step": 2}), "step_times", "(rank, step)"),
    (lambda t: t["kernel_breakdown"][0].pop("stddev"), "kernel_breakdown", "columns"),
    (lambda t: t.update(stragglers=[{"rank": 0, "step": 1, "potential_straggler": True}]), "stragglers", "ranks [0], HTA []"),
])
def test_comparison_catches(hand_built, change, table, complaint):
    """The comparison is not vacuous: each change beyond the tolerances is reported, within them it is not."""
    ours = expected_by_hand()
    change(ours)
    problems = table_differences(table, ours[table], hand_built[0].get(table, []))
    assert any(complaint in problem for problem in problems), problems


def test_comparison_tolerates():
    """Within max(1 us, 0.01 %) for times and 0.01 points for percentages; a 0-sum overlap row may be absent."""
    hta = expected_by_hand()
    ours = expected_by_hand()
    ours["temporal_breakdown"][0].update({"idle_time(us)": 10.9, "kernel_time(us)": 90.0, "compute_time_pctg": 55.55})
    ours["kernel_type_breakdown"].append({"kernel_type": "COMPUTATION overlapping MEMORY", "sum": 0, "percentage": 0.0})
    assert_tables_equal(ours, hta)
    long_run = dict(hta["temporal_breakdown"][0], **{"kernel_time(us)": 1_000_000.0})
    for ours_kernel_time, agrees in ((1_000_099.0, True), (1_000_101.0, False)):
        problems = table_differences("temporal_breakdown", [dict(long_run, **{"kernel_time(us)": ours_kernel_time})], [long_run])
        assert not problems if agrees else problems
