"""What a user sees: short human reports by default, the full JSON on request,
and the facts ``inspect`` reports (devices, GPU busy time, top kernels)
checked against plain computations over the loaded real traces."""
from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import stat
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REAL_TRACES, TRACES, events_of, load_json
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace import cli
from streamtrace.algo.busy import BusyTime
from streamtrace.cli import report
from streamtrace.engine import parseproc
from streamtrace.io import progress

KERNEL_CATS = {"kernel", "Kernel"}
GPU_CATS = KERNEL_CATS | {"gpu_memcpy", "gpu_memset"}
TIMING = ("wall_seconds", "peak_rss_mb", "pass1_seconds", "plan_seconds", "pass2_seconds")
DLRM = TRACES / "dlrm_8ranks"


def run_cli(capsys, *argv: str) -> tuple[list[str], str]:
    """Run the command line in this process: (stdout lines, stderr)."""
    assert cli.main([*argv, "-q"] if argv[0] != "synth" else list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


def without_timing(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key not in TIMING}


@pytest.fixture(scope="module")
def naive_merge(tmp_path_factory) -> Path:
    """Two real ranks concatenated into one file, as naive tools merge them."""
    documents = [load_json(TRACES / f"sampled_rank-{rank}.json.gz") for rank in (0, 1)]
    merged = dict(documents[0])
    merged["traceEvents"] = documents[0]["traceEvents"] + documents[1]["traceEvents"]
    path = tmp_path_factory.mktemp("naive") / "naive_merged.json"
    path.write_text(json.dumps(merged))
    return path


def assert_short_report(lines: list[str]) -> None:
    assert 3 <= len(lines) <= 15, "\n".join(lines)
    assert not any(line.lstrip().startswith(("{", "}", '"')) for line in lines)  # no JSON


@pytest.mark.parametrize("trace", REAL_TRACES, ids=lambda p: p.name)
def test_single_trace_commands_report_in_at_most_15_lines(trace, tmp_path, capsys):
    for argv in (["inspect", str(trace)], ["compact", str(trace), "-o", str(tmp_path / "c.json")],
                 ["convert", str(trace), str(tmp_path / "v.json.gz"), "--drop-cat", "python_function"]):
        lines, _ = run_cli(capsys, *argv)
        assert_short_report(lines)


def test_merged_trace_commands_report_in_at_most_15_lines(naive_merge, tmp_path, capsys):
    for argv in (["inspect", str(naive_merge)], ["relink", str(naive_merge), "-o", str(tmp_path / "r.json")],
                 ["split", str(naive_merge), "-o", str(tmp_path / "ranks")],
                 ["attribute", str(naive_merge), "-o", str(tmp_path / "a.csv")]):
        lines, _ = run_cli(capsys, *argv)
        assert_short_report(lines)


def test_eight_rank_merges_report_in_at_most_15_lines(tmp_path, capsys):
    lines, err = run_cli(capsys, "merge", str(DLRM), "-o", str(tmp_path / "dlrm.json.gz"))
    assert_short_report(lines)
    assert lines[0].split()[:3] == ["merged", "8", "ranks"] and err == ""  # absolute time: no warning
    streamtrace.synth.write_traces(streamtrace.synth.SynthConfig(ranks=8, pp_stages=4, microbatches=2, steps=1,
                                                                 graph_kernels=4, eager_kernels=2),
                                   tmp_path / "pp", compress="none", merged=False)
    lines, _ = run_cli(capsys, "merge", str(tmp_path / "pp"), "-o", str(tmp_path / "pp.json"))
    assert_short_report(lines)
    assert any(line.startswith("PP arrows") for line in lines)


def test_json_and_summary_file_give_the_library_dict(naive_merge, tmp_path, capsys):
    trace = TRACES / "b200_eager.json.gz"
    library = streamtrace.inspect(trace)
    lines, _ = run_cli(capsys, "inspect", str(trace), "--json", "--summary", str(tmp_path / "inspect.json"))
    printed = json.loads("\n".join(lines))
    assert without_timing(printed) == without_timing(library)
    assert json.loads((tmp_path / "inspect.json").read_bytes()) == printed
    library = streamtrace.merge(DLRM, tmp_path / "lib.json.gz")
    lines, _ = run_cli(capsys, "merge", str(DLRM), "-o", str(tmp_path / "cli.json.gz"), "--json")
    printed = json.loads("\n".join(lines))
    assert without_timing({**printed, "output": None}) == without_timing({**library, "output": None})
    lines, err = run_cli(capsys, "relink", str(naive_merge), "-o", "-", "--summary", str(tmp_path / "relink.json"))
    assert json.loads("\n".join(lines))["traceEvents"]  # the trace on stdout, the report on stderr
    assert err.startswith("relinked") and json.loads((tmp_path / "relink.json").read_bytes())["output"] == "<stdout>"


def test_warnings_show_once_with_their_count_and_new_commands_plug_in(monkeypatch):
    monkeypatch.setitem(report.VIEWS, "slice", lambda summary: [("sliced", f"{summary['events']} events")])
    text = report.human_report("slice", {"events": 3, "warnings": ["odd ts", "odd ts", "odd ts", "no base"],
                                      "hints": ["run streamtrace relink"]})
    assert text.splitlines() == ["sliced   3 events", "warning  odd ts (3 times)", "warning  no base",
                                 "hint     run streamtrace relink"]


def test_relative_times_without_base_warn_once_for_all_files(tmp_path, capsys):
    for rank in range(3):
        events = [{"ph": "X", "cat": "cpu_op", "name": "step", "pid": 10 + rank, "tid": 1, "ts": 5.0, "dur": 1.0}]
        (tmp_path / f"rank{rank}_trace.json").write_text(json.dumps({"traceEvents": events}))
    lines, _ = run_cli(capsys, "merge", str(tmp_path), "-o", str(tmp_path / "out.json"))
    warnings = [line for line in lines if line.startswith("warning")]
    assert len(warnings) == 1 and "3 of 3 files have neither baseTimeNanoseconds nor absolute" in warnings[0]


def plain_union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


@pytest.mark.parametrize("trace", REAL_TRACES + sorted(DLRM.iterdir())[:1], ids=lambda p: p.name)
def test_inspect_devices_busy_time_and_top_kernels_match_plain_sums(trace):
    document = load_json(trace)
    events = events_of(document)
    summary = streamtrace.inspect(trace)
    listed = document.get("deviceProperties", []) if isinstance(document, dict) else []
    assert summary["devices"]["count"] == len(listed)
    assert sum(summary["devices"]["names"].values()) == len(listed)
    slices = defaultdict(list)
    kernels = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X" and isinstance(e.get("dur"), (int, float)) \
                and e["dur"] >= 0:
            slices[str(e["pid"])].append((e["ts"], e["ts"] + e["dur"]))
            if e["cat"] in KERNEL_CATS:
                kernels[e["name"]][0] += 1
                kernels[e["name"]][1] += e["dur"]
    assert set(summary["gpu_busy"]) == set(slices)
    for pid, busy in summary["gpu_busy"].items():
        assert busy["slices_out_of_order"] == 0  # the reorder window is enough for real traces
        assert busy["busy_us"] == pytest.approx(plain_union(slices[pid]), abs=1e-3)
        assert busy["slices"] == len(slices[pid])
    top = sorted(kernels.items(), key=lambda item: (-item[1][1], item[0]))[:10]
    assert [(k["name"], k["count"]) for k in summary["top_kernels"]] == [(name, n) for name, (n, _) in top]
    assert [k["total_us"] for k in summary["top_kernels"]] == pytest.approx([t for _, (_, t) in top], abs=1e-3)
    with_events = {e.get("pid") for e in events if e.get("ph") != "M"}
    assert {p["pid"] for p in summary["pids"]} == with_events  # no placeholder processes


def test_b200_names_its_eight_gpus():
    assert streamtrace.inspect(TRACES / "b200_eager.json.gz")["devices"] == {"count": 8,
                                                                            "names": {"NVIDIA B200": 8}}


def test_ids_shared_by_ranks_in_one_file_hint_at_relink(naive_merge, capsys):
    assert any("run streamtrace relink" in hint for hint in streamtrace.inspect(naive_merge)["hints"])
    lines, _ = run_cli(capsys, "inspect", str(naive_merge))
    assert [line for line in lines if line.startswith("hint")][0].endswith("makes the ids unique")
    assert streamtrace.inspect(TRACES / "sampled_rank-0.json.gz")["hints"] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 40)), max_size=200), st.integers(1, 16),
       st.randoms(use_true_random=False))
def test_busy_time_equals_the_plain_union_when_order_is_within_the_window(raw, window, rng: random.Random):
    intervals = sorted((float(start), float(start + length)) for start, length in raw)
    shuffled = []
    for chunk in range(0, len(intervals), window):  # out of order, but never by more than the window
        block = intervals[chunk:chunk + window]
        rng.shuffle(block)
        shuffled.extend(block)
    busy = BusyTime(window=window)
    for start, end in shuffled:
        busy.add(start, end)
    assert busy.total() == pytest.approx(plain_union(intervals)) and busy.late == 0


def test_busy_time_counts_slices_later_than_the_window():
    busy = BusyTime(window=1)
    for start, end in ((10.0, 20.0), (30.0, 40.0), (50.0, 60.0), (0.0, 5.0)):
        busy.add(start, end)
    assert busy.total() == 35.0 and busy.late == 1  # disjoint, so still exact; but flagged


def cut_before_gpu_events(tmp_path: Path) -> Path:
    """b200_eager cut off where its GPU events begin (the profiler writes them last)."""
    text = gzip.decompress((TRACES / "b200_eager.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    first_gpu_event = re.search(rb'\{[^{]*"cat": ?"(kernel|gpu_memcpy|gpu_memset)"', text).start()
    cut.write_bytes(text[:first_gpu_event])
    return cut


def test_salvage_says_when_the_kept_part_has_no_gpu_events(tmp_path, capsys):
    cut = cut_before_gpu_events(tmp_path)
    summary = streamtrace.inspect(cut, salvage=True)
    assert summary["truncated_salvaged"] and summary["gpu_streams"] == {}
    assert "holds no GPU events: the profiler writes them last" in summary["warnings"][0]
    lines, _ = run_cli(capsys, "compact", str(cut), "--salvage", "-o", str(tmp_path / "out.json"))
    assert any(line.startswith("warning") and "writes GPU events last" in line for line in lines)
    assert streamtrace.inspect(TRACES / "b200_eager.json.gz")["warnings"] == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_drop_cat_names_categories_that_matched_nothing(jobs, tmp_path, monkeypatch):
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # -j 2: the child drops and counts
    trace = TRACES / "b200_eager.json.gz"
    summary = streamtrace.convert(trace, tmp_path / "out.json", drop_categories=["python_function", "python_fuction"],
                                  jobs=jobs)
    expected = sum(1 for e in events_of(load_json(trace)) if e.get("cat") == "python_function")
    assert summary["dropped_by_category"] == {"python_fuction": 0, "python_function": expected}
    assert summary["warnings"] == ["--drop-cat python_fuction: no event has this category"]


def test_pass_two_progress_shows_percent_and_time_left(monkeypatch):
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    shown = io.StringIO()
    meter = progress.Progress(None, enabled=True, stream=shown)
    meter.update("pass 2", None, 250, 1000)
    assert "pass 2: 25% of 1,000 events" in shown.getvalue() and " s left" in shown.getvalue()
    assert progress._duration(3725) == "1 h 2 min" and progress._duration(65) == "1 min 5 s"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_permissions_of_a_plain_open(umask, tmp_path):
    previous = os.umask(umask)
    try:
        streamtrace.convert(TRACES / "kineto_small.json", tmp_path / "out.json")
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "out.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o666 & ~umask


def test_synth_command_writes_a_run_and_documents_every_option(tmp_path, capsys):
    lines, _ = run_cli(capsys, "synth", str(tmp_path / "run"), "--ranks", "4", "--pp-stages", "2", "--steps", "1",
                       "--graph-kernels", "4", "--eager-kernels", "1", "--compress", "none")
    assert_short_report(lines)
    truth = json.loads((tmp_path / "run" / "truth.json").read_bytes())
    for rank in truth["ranks"]:
        assert len(events_of(load_json(tmp_path / "run" / rank["file"]))) == rank["events"]
    assert (tmp_path / "run" / "merged_trace.json").exists()
    parser = cli.build_parser()
    synth = parser._subparsers._group_actions[0].choices["synth"]
    options = [action for action in synth._actions if action.option_strings and action.dest != "help"]
    assert len(options) >= 18 and all(action.help for action in options)
    assert cli.main(["synth", str(tmp_path / "bad"), "--ranks", "3", "--pp-stages", "2"]) == 1
    assert "ranks must be a positive multiple of pp_stages" in capsys.readouterr().err
