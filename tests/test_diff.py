"""``streamtrace diff``: HTA's TraceDiff rules on hand-built traces whose
answers are worked out by hand here, the order and changes of its rows, and
what bad input gives (one line, or a correct empty diff; nothing written).
tests/test_diff_hta.py compares the same traces and generated runs with HTA itself."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from badinputs.generate import BAD_INPUTS

import streamtrace
from streamtrace import cli
from streamtrace.algo import tracediff
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces


def x(name: str, ts: float, dur: float, cat: str = "cpu_op", **args) -> dict:
    """A complete event of pid 1 (args from the keywords)."""
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def edge_events(extra: int = 0) -> list[dict]:
    """Every rule of HTA's iteration and device choice once.  Steps 1 [10, 100), 2 [100, 200) and 3
    [150, 180) (listed later: it owns that time).  A fractional ts makes HTA round every start up and
    every end down."""
    events = [
        x("cudaLaunchKernel", 15, 2, "cuda_runtime", correlation=7),  # event 0 (in step 1): HTA links no kernel to it
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        x("ProfilerStep#1", 10, 90, "user_annotation"),
        x("ProfilerStep#2", 100, 100, "user_annotation"),
        x("ProfilerStep#3", 150, 30, "user_annotation"),
        x("ProfilerStep#1", 12, 50, "gpu_user_annotation", stream=7, correlation=-1),  # on a stream, unlinked
        x("aten::mm", 20.4, 5.3),  # 21 .. 25: 4 us
        x("k1", 33.5, 4.25, "kernel", stream=7, correlation=8),  # before its launch; 34 .. 37: 3 us
        x("cudaLaunchKernel", 30, 2, "cuda_runtime", correlation=8),
        x("cudaLaunchKernel", 40, 2, "cuda_runtime", correlation=9),
        x("cudaLaunchKernel", 120, 2, "cuda_runtime", correlation=9),  # the last CPU row of id 9: step 2
        x("k2", 125, 10, "kernel", stream=8, correlation=9),
        x("k_zero", 20, 3, "kernel", stream=7, correlation=7),  # launched by event 0: no iteration
        x("cudaMemsetAsync", 50, 1, "cuda_runtime", correlation=10),
        x("s0", 52, 3, "gpu_memset", stream=0, correlation=10),  # stream 0: HTA gives it no iteration
        x("neg", 60, 2, "cpu_op", stream=-2),  # a negative stream: iteration by time, but not "cpu"
        x("cudaEventSynchronize", 65, 1, "cuda_runtime", correlation=11),
        x("Event Sync", 70, 2, "cuda_sync", stream=-1, correlation=11),
        x("amd", 75, 2, "kernel", stream="0x1", correlation=12),  # int() refuses the stream: CPU
        {"ph": "X", "cat": "cpu_op", "name": "nots", "pid": 1, "tid": 1, "dur": 3},  # no ts: not read
        x("trace", 80, 5, "Trace"),  # category Trace: not read
        {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 1, "tid": 1, "ts": 81},  # no dur: not read
        x("cudaLaunchKernel", 30.2, 0.5, "cuda_runtime", correlation=13),  # 31 .. 30: -1 us
        x("tiny", 90.2, 0.5, "kernel", stream=7, correlation=13),
        x("py", 160.5, 3, "python_function"),
        x("aten::mm", 170, 4),
        x("void f<int>(float)", 171, 1),
        x("void f<long>(float)", 172, 1),
    ]
    for n in range(extra):  # the test run: more aten::mm and a new kernel in step 1
        events += [x("aten::mm", 21 + n, 1), x("cudaLaunchKernel", 22 + n, 1, "cuda_runtime", correlation=100 + n),
                   x("k_new", 300 + n, 2, "kernel", stream=9, correlation=100 + n)]
    return events


def write_trace(path: Path, events: list[dict], rank: int | None = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict = {"traceEvents": events}
    if rank is not None:
        document = {"distributedInfo": {"rank": rank}, **document}
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def edge_pair(tmp_path) -> tuple[Path, Path]:
    """Control and test directories of one rank file each (test: 3 more aten::mm and k_new launches)."""
    return (write_trace(tmp_path / "control" / "trace.json", edge_events()).parent,
            write_trace(tmp_path / "test" / "trace.json", edge_events(3)).parent)


def totals(summary: dict, side: str = "Control") -> dict[str, tuple]:
    return {row["name"]: (row[f"{side}_counts"], row[f"{side}_total_duration"]) for row in summary["trace_diff"]
            if row[f"{side}_counts"]}


def test_cpu_iteration_1_is_what_hta_rules_give_by_hand(edge_pair):
    summary = streamtrace.diff(*edge_pair, device="cpu")
    assert (summary["control"]["iteration"], summary["test"]["iteration"]) == (1, 1)  # the first of 1, 2, 3
    assert totals(summary) == {
        "ProfilerStep#1": (1, 90), "aten::mm": (1, 4), "cudaLaunchKernel": (4, 2 + 2 + 2 - 1),  # ids 7, 8, 9, 13
        "cudaMemsetAsync": (1, 1), "cudaEventSynchronize": (1, 1), "Event Sync": (1, 2), "amd": (1, 2),
    }
    assert totals(summary, "Test")["aten::mm"] == (4, 7)


def test_gpu_rows_take_their_launch_iteration(edge_pair):
    summary = streamtrace.diff(*edge_pair, device="gpu")
    # k1 (3 us), tiny (-1 us: HTA's rounding), neg (stream -2); not k_zero (event 0), s0 (stream 0), k2 (step 2),
    # nor the GPU copy of ProfilerStep#1 (no launch)
    assert totals(summary) == {"k1": (1, 3), "neg": (1, 2), "tiny": (1, -1)}
    assert totals(summary, "Test") == {"k1": (1, 3), "neg": (1, 2), "tiny": (1, -1), "k_new": (3, 6)}
    assert summary["ops_diff"] == {"added": ["k_new"], "deleted": [], "increased": [], "decreased": [],
                                   "unchanged": ["k1", "neg", "tiny"]}
    step_2 = streamtrace.diff(*edge_pair, device="gpu", control_iteration=2, test_iteration=2)
    assert totals(step_2) == {"k2": (1, 10)}  # id 9's last launch is in step 2


def test_overlapping_steps_the_later_one_owns_the_time(edge_pair):
    summary = streamtrace.diff(*edge_pair, device="cpu", control_iteration=3, test_iteration=2)
    assert totals(summary) == {"ProfilerStep#3": (1, 30), "py": (1, 2), "aten::mm": (1, 4),
                               "void f<int>(float)": (1, 1), "void f<long>(float)": (1, 1)}
    assert totals(summary, "Test") == {"ProfilerStep#2": (1, 100), "cudaLaunchKernel": (1, 2)}  # (py: 161 .. 163)


def test_rows_come_in_hta_order_with_its_columns_and_change_signs():
    control = {"b": (1, 2.0), "d": (2, 4.0), "e": (1, 1.0)}
    test = {"a": (1, 1.0), "d": (1, 4.5), "e": (3, 1.0)}
    rows = tracediff.compare(control, test)
    assert [row["name"] for row in rows] == ["b", "d", "e", "a"]  # the control's names, then the test's new ones
    assert list(rows[0]) == ["name", "Control_counts", "Control_total_duration", "Test_counts", "Test_total_duration",
                             "diff_counts", "diff_duration", "counts_change_categories"]
    assert [list(row.values())[1:] for row in rows] == [[1, 2, 0, 0, -1, -2, "-"], [2, 4, 1, 4.5, -1, 0.5, "-"],
                                                        [1, 1, 3, 1, 2, 0, "+"], [0, 0, 1, 1, 1, 1, "+"]]
    assert tracediff.ops_diff(rows) == {"added": ["a"], "deleted": ["b"], "increased": ["e"], "decreased": ["d"],
                                        "unchanged": []}


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int>, at::detail::Array<char*, 3> >"
     "(int, at::native::CUDAFunctor_add<int>, at::detail::Array<char*, 3>)", "at::native::vectorized_elementwise_kernel"),
    ("aten::mm", "aten::mm"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ("void f<int>(float)", "f"),
    ("std::vector<int> g(a->b)", "g"),
])
def test_short_names_drop_arguments_templates_and_return_types(name, short):
    assert tracediff.shorten_name(name) == short


def test_short_names_sum_the_names_they_join(edge_pair):
    summary = streamtrace.diff(*edge_pair, device="cpu", control_iteration=3, test_iteration=3, short_names=True)
    assert totals(summary)["f"] == (2, 2)
    assert "void f<int>(float)" in summary["ops_diff"]["unchanged"]  # ops_diff keeps full names, as HTA's


def test_csv_files_hold_the_rows_and_changes(edge_pair, tmp_path):
    summary = streamtrace.diff(*edge_pair, tmp_path / "out", device="gpu")
    with open(tmp_path / "out" / "trace_diff.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["name"] for row in rows] == [row["name"] for row in summary["trace_diff"]]
    assert rows[-1] == {"name": "k_new", "Control_counts": "0", "Control_total_duration": "0", "Test_counts": "3",
                        "Test_total_duration": "6", "diff_counts": "3", "diff_duration": "6",
                        "counts_change_categories": "+"}
    with open(tmp_path / "out" / "ops_diff.csv", newline="") as file:
        assert list(csv.reader(file)) == [["category", "name"], ["added", "k_new"], ["unchanged", "k1"],
                                          ["unchanged", "neg"], ["unchanged", "tiny"]]


def test_a_run_against_itself_is_all_unchanged_and_read_once(edge_pair):
    trace = edge_pair[0] / "trace.json"
    summary = streamtrace.diff(trace, trace)
    assert summary["changes"] == {"added": 0, "deleted": 0, "increased": 0, "decreased": 0,
                                  "unchanged": len(summary["trace_diff"])} and summary["trace_diff"]
    assert all(row["diff_duration"] == 0 for row in summary["trace_diff"])
    assert summary["control"]["read"]["pass1_seconds"] == summary["test"]["read"]["pass1_seconds"]
    two_steps = streamtrace.diff(trace, trace, device="gpu", control_iteration=1, test_iteration=2)
    assert two_steps["ops_diff"]["added"] == ["k2"]


def test_rank_files_default_to_the_first_rank(tmp_path):
    run = tmp_path / "run"
    for rank, extra in ((2, 0), (5, 2)):
        write_trace(run / f"rank{rank}_trace.json", edge_events(extra), rank)
    first = streamtrace.diff(run, run, device="cpu", test_rank=5)
    assert (first["control"]["rank"], first["test"]["rank"]) == (2, 5)
    assert first["ops_diff"]["increased"] == ["aten::mm", "cudaLaunchKernel"]
    with pytest.raises(TraceError, match=r"no rank 3 among the control traces \(ranks 2, 5\)"):
        streamtrace.diff(run, run, control_rank=3)


def test_a_directory_whose_trace_states_no_rank_is_rank_0(tmp_path):
    run = write_trace(tmp_path / "run" / "trace.json", edge_events(), rank=None).parent
    summary = streamtrace.diff(run, run)
    assert (summary["control"]["rank"], summary["test"]["rank"]) == (0, 0)
    with pytest.raises(TraceError, match="no trace file"):
        streamtrace.diff(run, tmp_path)


@pytest.mark.parametrize("events, message", [
    ([], "the test trace has no iteration to compare"),
    ([x("aten::mm", 1, 2)], "the test trace has no iteration to compare"),
    ([x("ProfilerStep", 1, 2, "user_annotation")], "the step name 'ProfilerStep' has no number"),
], ids=["empty", "no-steps", "step-without-number"])
def test_a_side_without_iterations_is_one_line_and_writes_nothing(edge_pair, tmp_path, events, message, capsys):
    bad = write_trace(tmp_path / "bad.json", events)
    out = tmp_path / "out"
    with pytest.raises(TraceError, match=message):
        streamtrace.diff(edge_pair[0], bad, out)
    assert not out.exists()
    assert cli.main(["diff", str(edge_pair[0]), str(bad), "-o", str(out), "-q"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and "bad.json" in error[0]
    assert not out.exists()


def test_an_iteration_the_trace_lacks_names_those_it_has(edge_pair, tmp_path):
    with pytest.raises(TraceError, match=r"no iteration 7 in the test trace \(its iterations: 1, 2, 3\)"):
        streamtrace.diff(*edge_pair, tmp_path / "out", test_iteration=7)
    assert not (tmp_path / "out").exists()


def test_a_rank_the_file_is_not_is_refused(edge_pair):
    with pytest.raises(TraceError, match="control trace is rank 0, not 4"):
        streamtrace.diff(*edge_pair, control_rank=4)


def test_destinations_are_checked_before_reading(edge_pair, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace_diff.csv").write_text("mine\n")
    with pytest.raises(TraceError, match="exists"):
        streamtrace.diff(*edge_pair, out, test_iteration=7)  # (the bad iteration would be found only after reading)
    assert (out / "trace_diff.csv").read_text() == "mine\n" and sorted(os.listdir(out)) == ["trace_diff.csv"]
    streamtrace.diff(*edge_pair, out, overwrite=True)
    assert (out / "trace_diff.csv").read_text().startswith("name,Control_counts")


def test_command_line_report_and_json(edge_pair, tmp_path, capsys):
    assert cli.main(["diff", *map(str, edge_pair), "--device", "gpu", "-o", str(tmp_path / "out"), "-q"]) == 0
    report = capsys.readouterr().out
    assert "1 added, 0 deleted, 0 increased, 0 decreased, 3 unchanged" in report
    assert "+6 us  k_new" in report and len(report.splitlines()) <= 15
    assert cli.main(["diff", *map(str, edge_pair), "--control-iteration", "2", "--json", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["control"]["iteration"] == 2 and summary["test"]["iteration"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda bad: bad.name)
def test_damaged_inputs_give_one_line_and_no_file(bad, edge_pair, tmp_path, capsys):
    """Every damaged input of the bad-input matrix as the test side: one line naming it, nothing written
    (none has a ProfilerStep, so those that read come to the refusal of a run without iterations)."""
    path = tmp_path / bad.filename
    path.write_bytes(bad.build())
    out = tmp_path / "out"
    capsys.readouterr()
    assert cli.main(["diff", str(edge_pair[0]), str(path), "-o", str(out), "-q"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"streamtrace: error: {path}")
    assert not out.exists()


def test_tables_join_on_their_key_with_tracelens_columns():
    control = [{"rank": 0, "time": 10, "share": 0.5, "late": False}, {"rank": 1, "time": 0, "share": 0.25, "late": True}]
    test = [{"rank": 1, "time": 4, "share": 0.75, "late": True}, {"rank": 2, "time": 8, "share": 1.0, "late": False}]
    header, rows = tracediff.join_tables(control, test, ("rank",), ("rank", "time", "share", "late"))
    assert header == ["rank", "present", "time__Control", "time__Test", "time__diff", "time__pct", "share__Control",
                      "share__Test", "share__diff", "share__pct", "late__Control", "late__Test"]
    assert [[row[column] for column in header] for row in rows] == [
        [0, "control", 10, None, None, None, 0.5, None, None, None, False, None],
        [1, "both", 0, 4, 4, None, 0.25, 0.75, 0.5, 200.0, True, True],  # (no percentage of a control's 0)
        [2, "test", None, 8, None, None, None, 1.0, None, None, None, False],
    ]


def kernel_run(path: Path, k1_dur: float, with_k2: bool, step: int = 100, rank: int = 0, k1: str = "k1") -> Path:
    """Two steps (analyze keeps the first, ``step`` us long): k1 launched in step 1, and k2 when asked."""
    events = [x("ProfilerStep#1", 0, step, "user_annotation"), x("ProfilerStep#2", step, 100, "user_annotation"),
              x("cudaLaunchKernel", 10, 2, "cuda_runtime", correlation=1),
              x(k1, 20, k1_dur, "kernel", stream=7, correlation=1)]
    if with_k2:
        events += [x("cudaLaunchKernel", 30, 2, "cuda_runtime", correlation=2), x("k2", 50, 4, "kernel", stream=7,
                                                                                 correlation=2)]
    return write_trace(path, events, rank)


def test_tables_side_by_side_on_a_hand_worked_pair(tmp_path, capsys):
    control, test = kernel_run(tmp_path / "a.json", 10, False), kernel_run(tmp_path / "b.json", 15, True, step=130)
    summary = streamtrace.diff(control, test, tmp_path / "out", tables=True)
    kernels = {row["name"]: row for row in summary["tables"]["kernel_breakdown"]}
    assert {name: (row["present"], row["sum (us)__Control"], row["sum (us)__Test"], row["sum (us)__diff"],
                   row["sum (us)__pct"]) for name, row in kernels.items()} == {
        "k1": ("both", 10, 15, 5, 50.0), "k2": ("test", None, 4, None, None)}
    steps = summary["tables"]["step_time_per_rank"]
    assert [(row["rank"], row["mean_step(us)__Control"], row["mean_step(us)__diff"], row["mean_step(us)__pct"])
            for row in steps] == [(0, 100, 30, 30.0)]
    (temporal,) = summary["tables"]["temporal_breakdown"]  # HTA's kernel time: first start to last end, 20 .. 30 | 54
    assert [temporal[f"kernel_time(us)__{suffix}"] for suffix in ("Control", "Test", "diff", "pct")] == [10, 34, 24, 240]
    assert [temporal[f"idle_time(us)__{suffix}"] for suffix in ("Control", "Test", "diff", "pct")] == [0, 15, 15, None]
    with open(tmp_path / "out" / "kernel_breakdown.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert (rows[0]["name"], rows[0]["sum (us)__pct"], rows[1]["present"], rows[1]["sum (us)__Control"]) == \
        ("k1", "50.0", "test", "")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["trace_diff.csv", "ops_diff.csv", "step_time_per_rank.csv",
                                                           *(f"{name}.csv" for name in (
                                                               "temporal_breakdown", "kernel_type_breakdown",
                                                               "kernel_breakdown", "comm_comp_overlap",
                                                               "idle_time_breakdown", "profiler_steps", "step_times",
                                                               "stragglers"))])
    assert cli.main(["diff", str(control), str(test), "--tables", "-q"]) == 0
    report = capsys.readouterr().out
    assert "step time  rank 0: 100 -> 130 us (+30.0%)" in report and "kernel     +5 us  k1 (rank 0)" in report


def test_the_collective_that_waited_longer_over_all_ranks(tmp_path, capsys):
    """A communication kernel's time summed over the ranks, and the ranks where it grew."""
    allreduce = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096u>)"
    for run, durations in (("control", (10, 10, 10)), ("test", (40, 12, 9))):
        for rank, duration in enumerate(durations):
            kernel_run(tmp_path / run / f"rank{rank}_trace.json", duration, False, rank=rank, k1=allreduce)
    assert cli.main(["diff", str(tmp_path / "control"), str(tmp_path / "test"), "--tables", "-q"]) == 0
    report = capsys.readouterr().out
    said = [line.split(None, 1)[1] for line in report.splitlines() if line.startswith("comms ")]
    assert said == [f"+31 us  {allreduce[:60]} (longer on ranks 0, 1)"]


def test_the_ordinary_reading_gives_the_same_diff(edge_pair):
    """--salvage reads event by event (visit); the default indexes chunks of projected events in parts."""
    for device in tracediff.DEVICES:
        chunks, events = (streamtrace.diff(*edge_pair, device=device, salvage=salvage) for salvage in (False, True))
        assert chunks["trace_diff"] == events["trace_diff"] and chunks["ops_diff"] == events["ops_diff"]


@pytest.mark.slow
def test_worker_processes_give_the_same_diff(tmp_path):
    """A 17 MB rank read by two pass-1 workers (parts absorbed out of the workers' order) and by one process."""
    write_traces(SynthConfig(ranks=1, pp_stages=1, target_bytes=17_000_000), tmp_path, compress="none", merged=False)
    trace = tmp_path / "rank0_trace.json"
    summaries = [streamtrace.diff(trace, trace, device="all", control_iteration=1, test_iteration=5, jobs=jobs)
                 for jobs in (1, 2)]
    assert summaries[0]["trace_diff"] == summaries[1]["trace_diff"] and summaries[0]["trace_diff"]
    assert summaries[0]["ops_diff"] == summaries[1]["ops_diff"]


def test_tables_report_ranks_one_run_lacks_and_stays_short(tmp_path, capsys):
    for name, ranks in (("two", 2), ("four", 4)):
        write_traces(SynthConfig(ranks=ranks, pp_stages=2, microbatches=2, steps=2, graph_kernels=4, eager_kernels=2,
                                 seed=ranks), tmp_path / name, compress="none", merged=False)
    assert cli.main(["diff", str(tmp_path / "two"), str(tmp_path / "four"), "--tables", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert 3 <= len(lines) <= 15
    assert "step time  4 ranks; ranks 2, 3 only in the test run" in lines
    assert sum(line.startswith("step time  rank ") for line in lines) == 2  # ranks 0 and 1, in both runs
