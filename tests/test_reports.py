"""What a user sees: short human reports by default, the full JSON on request,
and the facts ``inspect`` reports (devices, GPU busy time, top kernels)
checked against plain computations over the loaded real traces."""
from __future__ import annotations

import gzip
import io
import itertools
import json
import math
import os
import random
import re
import stat
import statistics
import subprocess
import sys
from array import array
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from conftest import REAL_TRACES, TRACES, all_but_first_slow, events_of, large_ones_slow, load_json
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace import cli
from streamtrace.algo.busy import BusyTime
from streamtrace.algo.corrset import CorrelationSet
from streamtrace.cli import report
from streamtrace.engine import parseproc
from streamtrace.io import progress
from streamtrace.synth import SynthConfig, write_traces

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


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES), ids=lambda p: p.name)
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


@pytest.mark.slow
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


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES + sorted(DLRM.iterdir())[:1]), ids=lambda p: p.name)
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
    hint, = [line for line in lines if line.startswith("hint")]
    assert "shared across ranks" in hint and hint.endswith("run streamtrace relink to make them unique")  # ranks told apart
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 40)), max_size=300), st.integers(1, 8),
       st.lists(st.integers(1, 50), min_size=1))
def test_busy_time_is_the_same_whether_slices_come_one_by_one_or_in_runs(raw, window, runs):
    """A split pass hands a GPU's slices over in runs (one per part): the figures must not depend on it."""
    one, joined = BusyTime(window=window), BusyTime(window=window)
    for start, length in raw:
        one.add(float(start), float(start + length))
    done = 0
    for size in itertools.cycle(runs):
        if done >= len(raw):
            break
        piece = raw[done:done + size]
        joined.extend(array("d", [float(start) for start, _ in piece]), array("d", [float(s + n) for s, n in piece]))
        done += size
    assert (one.total(), one.late, one.slices, one.first, one.last) == \
        (joined.total(), joined.late, joined.slices, joined.first, joined.last)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 3000) | st.just(1 << 40)), st.lists(st.integers(-5, 3000) | st.just(1 << 40)),
       st.lists(st.integers(-10, 4000)))
def test_correlation_sets_join_from_exports(first, second, probes):
    joined, part = CorrelationSet(), CorrelationSet()
    for value in first:
        joined.add(value)
    for value in second:
        part.add(value)
    joined.update_exported(part.export())
    assert joined.contains_each(np.array(probes + first + second, dtype=np.int64)).tolist() == \
        [value in set(first) | set(second) for value in probes + first + second]


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
    monkeypatch.setattr(progress, "BAR_INTERVAL", 0.0)
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


# --- Words that read right -------------------------------------------------------------------------------------

NOUNS = ("stream", "lane", "rank", "GPU slice", "event", "runtime call", "graph launch", "input", "rank file", "PP stage",
         "step")
COUNTED = re.compile(r"(?<![\w.])(\d[\d,]*) (" + "|".join(re.escape(noun) for noun in NOUNS) + r")(es|s)?\b")


def assert_reads_right(text: str) -> None:
    """The report's words agree with its numbers, and no row shows an empty or meaningless value."""
    for number, noun, plural in COUNTED.findall(text):
        assert (number != "1") == bool(plural), f"{number} {noun}{plural or ''} in:\n{text}"
    for wrong in (r"\d{4,} SEND->RECV", r"\d{4,} compute dependencies", r"\.0 GPU events each", r"\d x (,|$)",
                  r"pid ''", r"0\.000 ms of 0\.000 ms", r"offsets up to 0\.0 us", r"\(none, "):
        assert not re.search(wrong, text, re.MULTILINE), f"{wrong!r} in:\n{text}"


def hand_built(tmp_path: Path) -> Path:
    """One GPU with an empty name, a kernel on the empty-named pid lasting 0 us, one stream, one launch, a token."""
    path = tmp_path / "edge.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": ""}], "distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 5, "dur": 2,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": "", "tid": 7, "ts": 10, "dur": 0,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 1, "dur": 20,
         "args": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"}}]}))
    return path


def test_edge_cases_read_right(tmp_path, capsys):
    """Plurals of one, an empty device name and pid, a GPU whose slices last 0 us, a plain JSON input."""
    trace = hand_built(tmp_path)
    lines, _ = run_cli(capsys, "inspect", str(trace))
    text = "\n".join(lines)
    assert_reads_right(text)
    assert "(uncompressed, " in text and "1 x (no name)" in text and "pid (empty) GPU 1 event (1 stream)" in text
    assert "rank 0: no GPU time (its slices last 0 us)" in text and "1 runtime call, 0 graph launches" in text
    lines, _ = run_cli(capsys, "compact", str(trace), "-o", str(tmp_path / "out.json"))
    assert "1 GPU slice from 1 stream into 1 lane" in "\n".join(lines)


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES), ids=lambda p: p.name)
def test_real_traces_read_right(trace, tmp_path, capsys):
    for argv in (["inspect", str(trace)], ["compact", str(trace), "-o", str(tmp_path / "c.json.gz")]):
        lines, _ = run_cli(capsys, *argv)
        assert_reads_right("\n".join(lines))


def test_graph_launch_mean_is_a_plain_number():
    summary = streamtrace.inspect(TRACES / "vllm_decode_graph_replay_mi300.json.gz")
    assert summary["graph_launches"]["count"] > 0
    for mean, shown in ((421.0, "(421 GPU events each)"), (420.5, "(420.5 GPU events each)")):
        text = report.human_report("inspect", {**summary, "graph_launches": {**summary["graph_launches"],
                                                                               "gpu_events_per_launch_mean": mean}})
        assert shown in text


def test_generated_merges_read_right(tmp_path, capsys):
    """Thousands of arrows with separators; ranks on one clock say so; one rank per file agrees with 'rank'."""
    from streamtrace.synth import SynthConfig, write_traces

    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1, base_skew_ns=0), tmp_path / "run", compress="gz")
    lines, _ = run_cli(capsys, "merge", str(tmp_path / "run"), "-o", str(tmp_path / "m.json.gz"))
    text = "\n".join(lines)
    assert_reads_right(text)
    assert "no rank shifted" in text
    lines, _ = run_cli(capsys, "split", str(tmp_path / "m.json.gz"), "-o", str(tmp_path / "per_rank"))
    assert_reads_right("\n".join(lines))
    lines, _ = run_cli(capsys, "synth", str(tmp_path / "one"), "--ranks", "1", "--pp-stages", "1", "--steps", "1",
                       "--graph-kernels", "2", "--compress", "zstd")
    assert_reads_right("\n".join(lines))
    assert "1 rank file (1 PP stage" in "\n".join(lines) and (tmp_path / "one" / "rank0_trace.json.zst").exists()
    summary = streamtrace.merge(str(tmp_path / "run"), tmp_path / "again.json.gz")
    many = {"pp_send_recv_pairs": 4456, "pp_compute_dependency_pairs": 12000, "pp_unshard_compute_pairs": 0}
    assert "4,456 SEND->RECV, 12,000 compute dependencies" in report.human_report("merge", {**summary, **many})


def test_real_merge_reads_right(tmp_path, capsys):
    lines, _ = run_cli(capsys, "merge", *[str(path) for path in sorted(DLRM.iterdir())[:2]], "-o", str(tmp_path / "m.json.gz"))
    text = "\n".join(lines)
    assert_reads_right(text)
    assert re.search(r"offsets up to [\d,.]+ ms|no rank shifted", text)


def help_of(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return capsys.readouterr().out


def test_help_texts_say_what_the_commands_do(capsys):
    redact_help = help_of("redact", capsys)
    assert "see 'streamtrace redact --help'" not in redact_help and "see 'streamtrace redact --help'" in help_of("compact", capsys)
    assert ".json.gz beside" not in redact_help and "<name>_redacted.json[.gz|.zst] beside the input" in redact_help
    for command in ("synth", "convert", "compact", "merge", "relink", "split", "slice", "redact"):
        choices = re.search(r"--compress \{([a-z,]+)\}", help_of(command, capsys)).group(1)
        assert set(choices.split(",")) == {"none", "gzip", "zstd"}, command
    merge_help = help_of("merge", capsys)
    assert "worker" in merge_help and "distributedInfo.rank" in merge_help
    slice_help = help_of("slice", capsys)
    assert "chrome://tracing" not in slice_help and "perfetto" in slice_help.lower()
    assert re.search(r"-q, --quiet\s+no progress on stderr \(the report is still", help_of("inspect", capsys))


def test_redact_of_plain_json_writes_plain_json_beside_it(tmp_path, capsys):
    trace = hand_built(tmp_path)
    lines, _ = run_cli(capsys, "redact", str(trace))
    assert json.loads((tmp_path / "edge_redacted.json").read_bytes())["traceEvents"]
    assert lines[0].startswith("copied") and lines[0].endswith("edge_redacted.json (uncompressed)"), lines
    assert "dropped" not in lines[1]  # redact drops nothing: convert's --drop-cat is not one of its options


def test_each_step_refuses_a_file_name_for_its_directory(tmp_path, capsys):
    status = cli.main(["slice", str(TRACES / "sampled_rank-0.json.gz"), "--each-step", "-o", str(tmp_path / "steps.json.gz"), "-q"])
    err = capsys.readouterr().err
    assert status == 1 and "names a file" in err and "steps/" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "steps.json.gz").exists()


def test_an_unknown_option_after_a_command_shows_that_commands_usage(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["inspect", "trace.json", "--bogus"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith("usage: streamtrace inspect") and "unrecognized arguments: --bogus" in err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("on_terminal", [True, False])
def test_a_secret_warning_is_seen_once(on_terminal, tmp_path, capsys, monkeypatch):
    """On a terminal the report has the warning: not again on stderr; redirected, stderr has it once."""
    trace = hand_built(tmp_path)
    shown = Terminal() if on_terminal else io.StringIO()
    monkeypatch.setattr("sys.stdout", shown)
    assert cli.main(["inspect", str(trace), "-q"]) == 0
    err = capsys.readouterr().err
    assert shown.getvalue().count("holds 1 secret") == 1 and err.count("holds 1 secret") == (0 if on_terminal else 1)


# --- Progress ------------------------------------------------------------------------------------------------

def test_progress_rates_and_sizes_are_right(monkeypatch):
    """A later pass starts its rate afresh from its own first update (no
    4867000000k events/s), and sizes are in the unit that fits (no 0.00 of 0.04 GB)."""
    clock = iter([0.0, 1.0, 1.0, 2.0])  # made, pass 1, pass 2 begins, a second later
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    shown = io.StringIO()
    meter = progress.Progress(42_000_000, enabled=True, stream=shown)
    meter.update("pass 1", 2_100_000, 10_000)
    meter.update("pass 2", None, 4867, 1_723_446)
    meter.update("pass 2", None, 9000, 1_723_446)
    first, second = shown.getvalue().strip("\r ").split("\r")
    assert first.startswith("pass 1: 2.1 of 42.0 MB (5%), 10,000 events, 2.1 MB/s, 10k events/s, 19 s left")
    assert second.startswith("pass 2: 1% of 1,723,446 events, 4,133 events/s, ")  # 9000 - 4867 events in 1 s


def test_progress_lines_in_a_log(monkeypatch):
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    shown = io.StringIO()
    meter = progress.Progress(3_400_000_000, enabled="lines", stream=shown)
    meter.update("pass 1", 1_200_000_000, 410_000)
    meter.count("ranks indexed", 2, 2)
    meter.done()
    assert shown.getvalue().splitlines()[0].startswith("streamtrace: pass 1: 1.20 of 3.40 GB (35%), ")
    assert shown.getvalue().endswith("streamtrace: ranks indexed: 2/2\n")  # lines stay: no carriage return
    quiet = io.StringIO()
    progress.Progress(10, enabled=False, stream=quiet).update("pass 1", 5, 5)
    assert quiet.getvalue() == ""


PERIODIC = """
import sys
from streamtrace.io import progress
progress.LINE_INTERVAL = 0.02  # the test's clock: 10 s in use
from streamtrace.cli import main
sys.exit(main(sys.argv[1:]))
"""
LINE = re.compile(r"^streamtrace: (pass [12]): (?:([\d.]+) of ([\d.]+) MB \((\d+)%\), [\d,]+ events, [\d.]+ [kMG]B/s, [\d,.]+[kM]? events/s"
                  r"|(\d+)% of ([\d,]+) events, [\d,.]+[kM]? events/s)(?:, [\w ]+ left)?; ranks (indexed|written): \d/2$")


@pytest.mark.parametrize("jobs", all_but_first_slow(["1", "2"]))
def test_the_command_line_writes_a_progress_line_periodically_to_a_pipe(jobs, tmp_path):
    """stderr to a pipe: lines (no bar), bytes then events with percent and rate, each rank's inside, up to 2/2."""
    from streamtrace.synth import SynthConfig, write_traces

    write_traces(SynthConfig(ranks=2, pp_stages=2, target_bytes=12_000_000), tmp_path / "run", compress="gz", merged=False)
    run = subprocess.run([sys.executable, "-c", PERIODIC, "merge", str(tmp_path / "run"), "-o", str(tmp_path / "m.json.gz"),
                          "-j", jobs], capture_output=True, text=True, timeout=600, cwd=Path(streamtrace.__file__).parent.parent)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert "\r" not in run.stderr and lines[-1] == "streamtrace: ranks written: 2/2", run.stderr
    progress_lines = [LINE.match(line) for line in lines if " ranks indexed: 2/2" not in line and "written: 2/2" != line[-18:]]
    parsed = [match for match in progress_lines if match]
    assert len(parsed) >= 3, run.stderr
    assert {match.group(1) for match in parsed} == {"pass 1", "pass 2"}, run.stderr
    percents = [int(match.group(4)) for match in parsed if match.group(1) == "pass 1"]
    assert percents == sorted(percents) and 0 < percents[-1] <= 100
    assert any(0 < int(match.group(4)) < 100 for match in parsed if match.group(1) == "pass 1"), run.stderr  # within the ranks


# --- the run's shape ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("shape")
    write_traces(SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=3, graph_kernels=8, graph_streams=4),
                 directory, compress="none")
    return directory


@pytest.mark.parametrize("trace", ["merged_trace.json", "rank1_trace.json"])
def test_inspect_gives_each_ranks_gpu_busy_time_and_steps(trace, four_ranks):
    """Per rank, the union of its GPU slices and its ProfilerStep spans, against plain sums over the loaded events."""
    events = events_of(load_json(four_ranks / trace))
    summary = streamtrace.inspect(four_ranks / trace)
    rank_of = {entry["pid"]: entry["rank"] for entry in summary["pids"]}
    slices, steps = defaultdict(list), defaultdict(dict)
    for e in events:
        if e.get("ph") != "X":
            continue
        rank = rank_of.get(e["pid"])
        if e.get("cat") in GPU_CATS:
            slices[rank].append((e["ts"], e["ts"] + e["dur"]))
        match = re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name")))
        if match and e.get("cat") in ("user_annotation", "cpu_op"):
            start, end = steps[rank].get(int(match.group(1)), (math.inf, -math.inf))
            steps[rank][int(match.group(1))] = (min(start, e["ts"]), max(end, e["ts"] + e["dur"]))
    shape = {entry["rank"]: entry for entry in summary["by_rank"]}
    assert set(shape) == set(rank_of.values()) and len(slices) == (4 if trace.startswith("merged") else 1)
    for rank, intervals in slices.items():
        busy = shape[rank]["gpu_busy"]
        assert busy["busy_us"] == pytest.approx(plain_union(intervals), abs=1e-3)
        assert busy["span_us"] == pytest.approx(max(end for _, end in intervals) - min(s for s, _ in intervals), abs=1e-3)
    for rank, spans in steps.items():
        durations = [end - start for _, (start, end) in sorted(spans.items(), key=lambda item: item[1][0])]
        assert shape[rank]["steps"] == {"count": 3, "first": 0, "last": 2, "first_us": pytest.approx(durations[0], abs=1e-3),
                                        "last_us": pytest.approx(durations[-1], abs=1e-3),
                                        "median_us": pytest.approx(statistics.median(durations), abs=1e-3)}


def test_time_span_says_when_the_run_was(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1_500_000.25, "dur": 2_000_000}]
    base = int(datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc).timestamp()) * 10**9
    for document, expected in (({"traceEvents": events, "baseTimeNanoseconds": base}, "2025-03-04T05:06:08.500000+00:00"),
                               ({"traceEvents": [{**events[0], "ts": 1.7e15}]}, "2023-11-14T22:13:20.000000+00:00"),
                               ({"traceEvents": events}, None)):
        (tmp_path / "t.json").write_text(json.dumps(document))
        span = streamtrace.inspect(tmp_path / "t.json")["time_span_us"]
        assert span.get("start_utc") == expected and span["duration"] == 2_000_000
    assert span["clock"] == "relative (no baseTimeNanoseconds)"


def test_top_n_kernels_with_full_names_and_several_inputs_each_inspected(four_ranks, capsys):
    traces = [str(four_ranks / "rank0_trace.json"), str(four_ranks / "rank1_trace.json")]
    lines, _ = run_cli(capsys, "inspect", *traces, "--top", "4", "--json")
    summaries = json.loads("\n".join(lines))
    assert [summary["input"] for summary in summaries] == traces
    for summary in summaries:
        assert len(summary["top_kernels"]) == 4 and [entry["rank"] for entry in summary["by_rank"]] == [summary["ranks"][0]]
    assert max(len(kernel["name"]) for kernel in summaries[0]["top_kernels"]) > report.NAME_WIDTH  # never cut in --json
    lines, _ = run_cli(capsys, "inspect", *traces)
    assert [line.split()[1] for line in lines if line.startswith("input")] == traces
    assert sum(1 for line in lines if line.startswith("per rank")) == 2
    assert sum(1 for line in lines if "x " in line and ("top kernels" in line or line.startswith(" "))) == 6  # 3 each
    assert cli.main(["inspect", *traces, "--summary", str(four_ranks / "s.json")]) == 1
    assert "--summary takes one trace" in capsys.readouterr().err and not (four_ranks / "s.json").exists()


def test_took_is_the_last_row_after_redaction_and_warnings(tmp_path, capsys):
    lines, _ = run_cli(capsys, "compact", str(TRACES / "kineto_small.json"), "-o", str(tmp_path / "c.json"), "--redact")
    labels = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert labels[-1] == "took" and labels.index("redacted") < labels.index("took") and labels.count("took") == 1, lines
