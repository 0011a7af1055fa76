"""``slice`` against a plain in-memory oracle over ``json.load`` of small generated traces.

The oracle restates the selection rules from the issue, independently of the
streaming code: steps from ``ProfilerStep#N`` spans per rank (an event is in
a step when its start is in the span), GPU events with the step of their
launch found by (rank, correlation), windows by overlap, flows kept only
when a start and an end of the same flow are both kept (or as they are when
the input itself lacks one of them), metadata of the pids that keep an event
and of the pids that have no other event (unless pids, ranks, categories or
names drop them).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import REAL_TRACES, ROOT, TRACES, all_but_first_slow, large_ones_slow, load_json

import streamtrace
from streamtrace.algo.steps import parse_int_list
from streamtrace.commands import slicing
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

GPU = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME = {"cuda_runtime", "cuda_driver"}
UNIT = {"us": 1.0, "ms": 1e3, "s": 1e6}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    """A single-rank trace and a merged 8-rank one, 8 steps each."""
    directory = tmp_path_factory.mktemp("slice")
    write_traces(SynthConfig(ranks=1, pp_stages=1, microbatches=2, steps=8, graph_kernels=8, graph_streams=4),
                 directory / "one", compress="none", merged=False)
    write_traces(SynthConfig(ranks=8, pp_stages=2, microbatches=2, steps=8, graph_kernels=8, graph_streams=4),
                 directory / "k8", compress="none")
    return {"single": directory / "one" / "rank0_trace.json", "merged": directory / "k8" / "merged_trace.json"}


# --- the oracle ---------------------------------------------------------------------------------


def rank_of(event: dict, file_rank: int | None) -> int | None:
    args = event.get("args")
    if isinstance(args, dict) and isinstance(args.get("rank"), int):
        return args["rank"]
    return file_rank


def time_of(text: str, first: float) -> float:
    relative = text.startswith("+")
    number = re.fullmatch(r"([0-9.]+)(us|ms|s)?", text.lstrip("+"))
    value = float(number.group(1)) * UNIT[number.group(2) or "us"]
    return first + value if relative else value


def oracle(document: dict, *, steps=None, window=None, ranks=None, pids=None, drop_cat=(), drop_name=None,
           every_step: bool = False):
    """The kept events in input order (and, with ``every_step``, per step number)."""
    events = document["traceEvents"]
    info = document.get("distributedInfo")
    file_rank = info.get("rank") if isinstance(info, dict) else None
    spans: dict[int | None, list[tuple[float, float, int]]] = {}
    for event in events:
        match = re.fullmatch(r"ProfilerStep#(\d+)", str(event.get("name")))
        if match and event.get("cat") in ("user_annotation", "cpu_op") and event.get("ph") == "X":
            spans.setdefault(rank_of(event, file_rank), []).append(
                (event["ts"], event["ts"] + event["dur"], int(match.group(1))))

    def step_at(rank, ts):
        for start, end, number in spans.get(rank, []):
            if start <= ts < end or ts == start:
                return number
        return None

    launches = {}
    for event in events:
        if event.get("cat") in RUNTIME and "correlation" in event.get("args", {}):
            launches.setdefault((rank_of(event, file_rank), event["args"]["correlation"]), event)

    def step_of(event):
        rank = rank_of(event, file_rank)
        if event.get("cat") in GPU and event.get("ph") == "X":
            launch = launches.get((rank, event.get("args", {}).get("correlation")))
            if launch is not None:
                return step_at(rank, launch["ts"])
        return step_at(rank, event["ts"]) if "ts" in event else None

    first = min(event["ts"] for event in events if event.get("ph") != "M" and "ts" in event)
    low = high = None
    if window is not None:
        start, end = window.split(":")
        low = time_of(start, first) if start else -math.inf
        high = time_of(end, first) if end else math.inf

    def passes(event, timed=True):
        rank = rank_of(event, file_rank)
        if event.get("cat") in drop_cat or (drop_name and re.search(drop_name, str(event.get("name")))):
            return False
        if pids is not None and str(event.get("pid")) not in pids:
            return False
        if ranks is not None and rank not in ranks:
            return False
        if window is not None and timed:
            ts = event.get("ts")
            if ts is None or not (ts + event.get("dur", 0) >= low and ts <= high):
                return False
        return True

    place = {}  # event position -> step number (steps mode)
    for position, event in enumerate(events):
        if event.get("ph") not in ("M", "s", "t", "f"):
            place[position] = step_of(event)
    flows: dict[tuple, list[int]] = {}
    for position, event in enumerate(events):
        if event.get("ph") in ("s", "t", "f"):
            rank = rank_of(event, file_rank) if event.get("cat") == "ac2g" else None
            flows.setdefault((rank, event.get("cat"), event.get("id")), []).append(position)
    for (rank, cat, flow_id), members in flows.items():
        starts = [events[p] for p in members if events[p]["ph"] == "s"]
        launch = launches.get((rank, flow_id)) if cat == "ac2g" else None
        if launch is not None:  # an ac2g start sits on its launch
            group_step = step_at(rank, launch["ts"])
        elif starts:
            group_step = step_at(rank_of(starts[0], file_rank), starts[0]["ts"])
        else:  # the input lacks the start: the flow goes with its other members
            member_steps = [step_at(rank_of(events[p], file_rank), events[p]["ts"]) for p in members]
            group_step = max((step for step in member_steps if step is not None), default=None)
        for position in members:
            place[position] = group_step

    def selected(position):
        event = events[position]
        if not passes(event):
            return False
        return steps is None or place[position] in steps

    keep = {position for position, event in enumerate(events)
            if event.get("ph") not in ("M", "s", "t", "f") and selected(position)}
    for members in flows.values():
        passing = [p for p in members if selected(p)]
        whole_in_input = {events[p]["ph"] == "s" for p in members} == {True, False}
        if not whole_in_input or (any(events[p]["ph"] == "s" for p in passing)
                                  and any(events[p]["ph"] != "s" for p in passing)):
            keep.update(passing)
    kept_pids = {str(events[p].get("pid")) for p in keep}
    busy_pids = {str(event.get("pid")) for event in events if event.get("ph") != "M"}
    keep.update(p for p, event in enumerate(events) if event.get("ph") == "M" and (
        str(event.get("pid")) in kept_pids or (str(event.get("pid")) not in busy_pids and passes(event, timed=False))))
    return [events[p] for p in sorted(keep)]


def output_events(path: Path) -> list[bytes]:
    """The event lines of a slice output, as written."""
    text = path.read_bytes()
    body = text[text.index(b'"traceEvents": [\n') + 17:text.rindex(b"\n]")]
    return [line.rstrip(b",") for line in body.split(b"\n")] if body else []


def assert_same(output: Path, expected: list[dict], document: dict) -> None:
    """Same events as the oracle, in input order, one a line (each in the
    input's own text or re-encoded, so compared as values); same top-level keys."""
    assert [orjson.loads(line) for line in output_events(output)] == expected
    written = json.loads(output.read_bytes())
    assert list(written) == list(document)
    assert {k: v for k, v in written.items() if k != "traceEvents"} == {
        k: v for k, v in document.items() if k != "traceEvents"}


def flow_sides(events: list[dict]) -> dict[tuple, set[str]]:
    keys: dict[tuple, set[str]] = {}
    for event in events:
        if event.get("ph") in ("s", "t", "f"):
            rank = event.get("args", {}).get("rank") if event.get("cat") == "ac2g" else None
            keys.setdefault((rank, event.get("cat"), event.get("id")), set()).add(
                "start" if event["ph"] == "s" else "end")
    return keys


def dangling(events: list[dict], source: list[dict]) -> int:
    """Flows the slice cut: a start without an end or the reverse, where ``source`` has both."""
    whole = {key for key, sides in flow_sides(source).items() if sides == {"start", "end"}}
    return sum(1 for key, sides in flow_sides(events).items() if sides != {"start", "end"} and key in whole)


SLICED_KINDS = all_but_first_slow(["single", "merged"])  # one rank, and ranks merged in one file

SELECTIONS = [
    {"steps": "3,5-6"},
    {"steps": "0"},
    {"window": "+1ms:+3.5ms"},
    {"window": ":+0.8ms"},
    {"ranks": "0-1,6"},
    {"steps": "2-3", "ranks": "3", "drop_cat": ["python_function"]},
    {"window": "+2ms:", "drop_name": "^nccl", "pids": "100003,0"},
]


def oracle_options(options: dict) -> dict:
    out = dict(options)
    if "steps" in out:
        out["steps"] = {int(n) for part in out["steps"].split(",")
                        for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
    if "ranks" in out:
        out["ranks"] = {int(n) for part in out["ranks"].split(",")
                        for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
    if "pids" in out:
        out["pids"] = set(out["pids"].split(","))
    return out


def library_options(options: dict) -> dict:
    out = dict(options)
    if "drop_cat" in out:
        out["drop_categories"] = out.pop("drop_cat")
    return out


@pytest.mark.parametrize("kind", SLICED_KINDS)
@pytest.mark.parametrize("options", SELECTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_selection_matches_the_oracle(kind, options, traces, tmp_path):
    if kind == "single" and "ranks" in options and "steps" not in options:
        options = {**options, "ranks": "0"}
    document = load_json(traces[kind])
    out = tmp_path / "out.json"
    expected = oracle(document, **oracle_options(options))
    if all(event["ph"] == "M" for event in expected):  # nothing selected: refused, nothing written
        with pytest.raises(TraceError, match="the selection keeps none of the"):
            streamtrace.slice_trace(traces[kind], out, **library_options(options))
        assert not out.exists()
        return
    summary = streamtrace.slice_trace(traces[kind], out, **library_options(options))
    assert_same(out, expected, document)
    assert summary["events_written"] == len(expected)
    assert summary["events_read"] == len(document["traceEvents"])
    assert summary["events_written"] + sum(summary["events_dropped"].values()) == summary["events_read"]
    assert dangling(expected, document["traceEvents"]) == 0


@pytest.mark.parametrize("kind", all_but_first_slow(["single", "merged"]))
def test_lagging_gpu_work_stays_with_the_step_that_launched_it(kind, traces, tmp_path):
    document = load_json(traces[kind])
    events = document["traceEvents"]
    step_end = {}
    for event in events:
        if str(event.get("name")).startswith("ProfilerStep#") and event.get("cat") == "user_annotation":
            step_end[(event.get("args", {}).get("rank"), int(event["name"].split("#")[1]))] = (
                event["ts"], event["ts"] + event["dur"])
    launches = {(e.get("args", {}).get("rank"), e["args"]["correlation"]): e for e in events
                if e.get("cat") in RUNTIME and "correlation" in e.get("args", {})}
    lagging = []
    for event in events:
        if event.get("cat") in GPU:
            rank = event["args"].get("rank")
            launch = launches[(rank, event["args"]["correlation"])]
            for (step_rank, number), (start, end) in step_end.items():
                if step_rank == rank and start <= launch["ts"] < end and event["ts"] >= end:
                    lagging.append((number, event))
    assert lagging, "the generated trace has no GPU work running after its step: the test would prove nothing"
    number, event = lagging[len(lagging) // 2]
    line = orjson.dumps(event)
    streamtrace.slice_trace(traces[kind], tmp_path / "own.json", steps={number})
    streamtrace.slice_trace(traces[kind], tmp_path / "next.json", steps={number + 1})
    assert line in output_events(tmp_path / "own.json")
    assert line not in output_events(tmp_path / "next.json")


def test_each_step_writes_no_file_for_a_step_the_chosen_ranks_do_not_have(tmp_path):
    """Step 3 exists on rank 1 only: --each-step --ranks 0 writes steps 1 and 2,
    each as the oracle keeps it, and says why there is no step 3 (an empty
    step3 file would look like a step that did nothing)."""
    events = []
    for rank, numbers in ((0, (1, 2)), (1, (1, 2, 3))):
        cpu, gpu, on_rank = 100 + rank, rank, {"rank": rank}
        events += [{"ph": "M", "name": "process_name", "pid": cpu, "tid": 0, "args": {"name": "python", **on_rank}},
                   {"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": "GPU", **on_rank}}]
        for number in numbers:
            start = 100.0 * number
            events += [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": cpu, "tid": 1,
                 "ts": start, "dur": 50.0, "args": on_rank},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu, "tid": 1, "ts": start + 5,
                 "dur": 2.0, "args": {"correlation": number, **on_rank}},
                {"ph": "X", "cat": "kernel", "name": "k", "pid": gpu, "tid": 7, "ts": start + 10, "dur": 5.0,
                 "args": {"correlation": number, "stream": 7, **on_rank}}]
    document = {"traceEvents": events}
    source = tmp_path / "merged.json"
    source.write_text(json.dumps(document))
    summary = streamtrace.slice_trace(source, tmp_path / "steps", each_step=True, ranks="0")
    assert sorted(os.listdir(tmp_path / "steps")) == sorted(summary["files"]) == ["step1.json.gz", "step2.json.gz"]
    assert summary["steps_selected"] == [1, 2]
    for number in (1, 2):
        assert load_json(tmp_path / "steps" / f"step{number}.json.gz")["traceEvents"] == \
            oracle(document, steps={number}, ranks={0})
    assert [warning for warning in summary["warnings"] if "step 3" in warning and "no file" in warning]


@pytest.mark.parametrize("open_files", [None, 3])
@pytest.mark.parametrize("kind", SLICED_KINDS)
def test_each_step_files_add_up(kind, open_files, traces, tmp_path, monkeypatch):
    if open_files is not None:  # several readings of the spool, a group of files each
        monkeypatch.setattr(slicing, "max_open_writers", lambda requested: open_files)
    document = load_json(traces[kind])
    summary = streamtrace.slice_trace(traces[kind], tmp_path / "steps", each_step=True)
    assert sorted(summary["files"]) == sorted(f"step{n}.json.gz" for n in range(8))
    metadata_total = 0
    stepped = oracle(document, steps=set(range(8)))
    for number in range(8):
        path = tmp_path / "steps" / f"step{number}.json.gz"
        expected = oracle(document, steps={number})
        written = load_json(path)
        assert written["traceEvents"] == expected
        assert list(written) == list(document)
        assert dangling(written["traceEvents"], document["traceEvents"]) == 0
        metadata_total += sum(1 for event in expected if event["ph"] == "M")
    in_steps = [event for event in stepped if event["ph"] != "M"]
    stepped_metadata = sum(1 for event in stepped if event["ph"] == "M")
    assert summary["events_written"] == len(in_steps) + metadata_total
    assert metadata_total == 8 * stepped_metadata  # every pid has events in every step: its metadata in every file


@pytest.mark.parametrize("kind", SLICED_KINDS)
def test_max_mb_takes_the_longest_run_that_fits(kind, traces, tmp_path):
    document = load_json(traces[kind])

    def exact_size(numbers: set[int]) -> int:
        out = tmp_path / "probe.json"
        streamtrace.slice_trace(traces[kind], out, steps=numbers, overwrite=True)
        assert output_events(out) == [orjson.dumps(e) for e in oracle(document, steps=numbers)]
        return out.stat().st_size

    three, four = exact_size({0, 1, 2}), exact_size({0, 1, 2, 3})
    limit_mb = (three + (four - three) // 2) / 1e6
    out = tmp_path / "fit.json"
    summary = streamtrace.slice_trace(traces[kind], out, max_mb=limit_mb)
    assert summary["steps_selected"] == [0, 1, 2]
    assert out.stat().st_size <= limit_mb * 1e6
    assert output_events(out) == [orjson.dumps(e) for e in oracle(document, steps={0, 1, 2})]
    summary = streamtrace.slice_trace(traces[kind], out, max_mb=(four - 1) / 1e6, overwrite=True)
    assert summary["steps_selected"] == [0, 1, 2]  # one byte short of four steps: the estimate never undercounts
    assert streamtrace.slice_trace(traces[kind], out, max_mb=(four + 5000) / 1e6, overwrite=True)[
        "steps_selected"] == [0, 1, 2, 3]  # nor overcounts by more than a few metadata lines
    summary = streamtrace.slice_trace(traces[kind], out, max_mb=limit_mb, steps="4-7", overwrite=True)
    assert summary["steps_selected"][0] == 4 and len(summary["steps_selected"]) in (2, 3)
    with pytest.raises(TraceError, match="alone needs"):
        streamtrace.slice_trace(traces[kind], tmp_path / "tiny.json", max_mb=0.01)
    assert not (tmp_path / "tiny.json").exists()


def test_flow_halves_cut_by_a_window_are_dropped_and_counted(traces, tmp_path):
    document = load_json(traces["merged"])
    summary = streamtrace.slice_trace(traces["merged"], tmp_path / "w.json", window="+1ms:+1.2ms")
    expected = oracle(document, window="+1ms:+1.2ms")
    assert_same(tmp_path / "w.json", expected, document)
    assert summary["flow_events_dropped_without_partner"] > 0
    assert summary["events_dropped"]["flow_half_without_partner"] == summary["flow_events_dropped_without_partner"]
    assert summary["flow_events_kept"] == sum(1 for e in expected if e["ph"] in ("s", "t", "f"))


def test_steps_found_per_rank(traces, tmp_path):
    summary = streamtrace.slice_trace(traces["merged"], tmp_path / "s.json",
                                      steps="1")
    assert summary["steps_found"] == {str(rank): "0-7" for rank in range(8)}
    assert summary["steps_selected"] == [1]


@pytest.mark.parametrize("bad, words", [
    ({"steps": "x"}, "--steps: cannot read"),
    ({"window": "5"}, "has no ':'"),
    ({"window": "1h:2h"}, "--window: cannot read"),
    ({"drop_name": "("}, "not a regular expression"),
    ({"steps": "99"}, "none of the steps"),
    ({"max_mb": 0}, "positive"),
])
def test_bad_selections_are_refused_in_one_line(bad, words, traces, tmp_path):
    with pytest.raises(TraceError, match=words):
        streamtrace.slice_trace(traces["single"], tmp_path / "out.json", **bad)
    assert not (tmp_path / "out.json").exists()


def test_a_trace_without_steps_is_refused_for_step_selections(tmp_path):
    trace = tmp_path / "plain.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}))
    with pytest.raises(TraceError, match="no ProfilerStep"):
        streamtrace.slice_trace(trace, tmp_path / "out.json", steps="1")


def names_steps(path: Path) -> bool:
    raw = path.read_bytes()
    return b"ProfilerStep#" in (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


STEPPED_REAL = [path for path in REAL_TRACES + sorted((TRACES / "dlrm_8ranks").glob("*.json.gz")) if names_steps(path)]


@pytest.mark.parametrize("trace", large_ones_slow(STEPPED_REAL), ids=lambda p: p.name)
def test_one_step_of_a_real_trace_round_trips_through_inspect_and_compact(trace, tmp_path):
    document = load_json(trace)
    found = streamtrace.slice_trace(trace, tmp_path / "all.json", steps=None, window=":")["steps_found"]
    numbers = sorted({n for ranges in found.values() for n in parse_int_list(ranges, "steps")})
    assert numbers, "the trace names ProfilerStep# but no span was found"
    number = numbers[len(numbers) // 2]
    out = tmp_path / "step.json"
    streamtrace.slice_trace(trace, out, steps={number})
    expected = oracle(document, steps={number})
    assert_same(out, expected, document)
    assert dangling(expected, document["traceEvents"]) == 0
    written = load_json(out)
    inspected = streamtrace.inspect(out)
    assert inspected["events"] == len(written["traceEvents"]) > 0
    streamtrace.compact(out, tmp_path / "compacted.json.gz")


def test_cli_prints_the_summary_and_refuses_in_one_line(traces, tmp_path):
    run = [sys.executable, "-m", "streamtrace", "slice", str(traces["single"]), "-q", "--json"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*run, "-o", str(tmp_path / "s.json.gz"), "--steps", "2-3", "--drop-cat", "python_function"],
                          capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["steps_selected"] == [2, 3] and summary["output"] == str(tmp_path / "s.json.gz")
    assert load_json(tmp_path / "s.json.gz")["traceEvents"] == oracle(
        load_json(traces["single"]), steps={2, 3}, drop_cat=("python_function",))
    refused = subprocess.run([*run, "-o", str(tmp_path / "t.json"), "--window", "later"], capture_output=True,
                             text=True, env=environment, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.startswith("streamtrace: error: --window: 'later' has no ':'") and refused.stderr.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


DLRM0 = sorted((TRACES / "dlrm_8ranks").glob("worker0_*.json.gz"))[0]


@pytest.mark.parametrize("options, words", [
    ({"window": "1000:2000"}, None),  # absolute times on a trace whose clock is epoch microseconds
    ({"window": "+1s:+2s"}, None),  # past the end
    ({"ranks": "9"}, None),
    ({"window": "+10ms:+1ms"}, "--window: its start (+10000 us) is after its end (+1000 us)"),
])
def test_a_selection_that_keeps_nothing_is_refused_saying_what_the_trace_has(options, words, tmp_path):
    document = load_json(DLRM0)
    timed = [e for e in document["traceEvents"] if e.get("ph") != "M"]
    first, last = min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0) for e in timed)
    out = tmp_path / "out.json"
    with pytest.raises(TraceError) as refused:
        streamtrace.slice_trace(DLRM0, out, **options)
    message = str(refused.value)
    assert not out.exists() and not list(tmp_path.iterdir())
    if words is not None:
        assert message.startswith(words)
        return
    assert message.startswith(f"the selection keeps none of the {len(document['traceEvents']):,} events")
    assert f"(absolute {first}:{last} us)" in message and "has ranks 0, steps 10" in message
    assert f"spans +0:+{(last - first) / 1000:.6g}ms" in message


def test_a_backward_window_is_refused_before_reading(tmp_path):
    with pytest.raises(TraceError, match=r"--window: its start \(5 us\) is after its end \(1 us\)"):
        streamtrace.slice_trace(tmp_path / "no-such-trace.json", tmp_path / "out.json", window="5:1")


def test_cli_refuses_an_empty_selection_of_a_merged_trace_in_one_line(traces, tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "streamtrace", "slice", str(traces["merged"]), "-o", str(out),
                           "--ranks", "9"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and not out.exists()
    assert done.stderr.count("\n") == 1 and "has ranks 0-7, steps 0-7" in done.stderr


def input_flow_counts(events: list[dict]) -> tuple[int, int]:
    """(flow events of flows with a start and an end, flow events of flows lacking one), independently."""
    sides = flow_sides(events)
    whole = unpaired = 0
    for event in events:
        if event.get("ph") in ("s", "t", "f"):
            rank = event.get("args", {}).get("rank") if event.get("cat") == "ac2g" else None
            if sides[(rank, event.get("cat"), event.get("id"))] == {"start", "end"}:
                whole += 1
            else:
                unpaired += 1
    return whole, unpaired


@pytest.mark.parametrize("trace", large_ones_slow([TRACES / "nccl_rank0.json.gz", TRACES / "b200_eager.json.gz", DLRM0]),
                         ids=lambda p: p.name)
def test_no_selection_and_a_max_mb_the_trace_fits_keep_it_whole(trace, tmp_path):
    document = load_json(trace)
    whole, unpaired = input_flow_counts(document["traceEvents"])
    assert unpaired, "the trace has no flow lacking a half: the test would prove nothing"
    for options in ({}, {"max_mb": 500}):
        out = tmp_path / "out.json"
        summary = streamtrace.slice_trace(trace, out, overwrite=True, **options)
        assert_same(out, document["traceEvents"], document)
        assert summary["events_written"] == summary["events_read"] and summary["events_dropped"] == {}
        assert summary["flow_events_unpaired_in_input"] == unpaired
        assert summary["flow_events_dropped_without_partner"] == 0
        assert summary["steps_selected"] is None
        assert summary["whole_trace_fits"] is (True if options else None)


def test_flows_the_selection_cut_are_counted_apart_from_those_the_input_lacked(tmp_path):
    trace = TRACES / "nccl_rank0.json.gz"
    document = load_json(trace)
    events = document["traceEvents"]
    timed = [e["ts"] for e in events if e.get("ph") != "M"]
    window = f"{(min(timed) + max(timed)) / 2}:"  # the second half: cuts flows that cross the middle
    summary = streamtrace.slice_trace(trace, tmp_path / "half.json", window=window)
    expected = oracle(document, window=window)
    assert_same(tmp_path / "half.json", expected, document)
    _, unpaired_kept = input_flow_counts(expected)
    assert summary["flow_events_unpaired_in_input"] == unpaired_kept > 0
    in_window = [e for e in events if e.get("ph") in ("s", "t", "f") and e["ts"] >= float(window[:-1])]
    kept = [e for e in expected if e.get("ph") in ("s", "t", "f")]
    assert summary["flow_events_dropped_without_partner"] == len(in_window) - len(kept) > 0


def test_max_mb_on_a_trace_that_fits_and_has_no_steps_keeps_it_whole(tmp_path):
    trace = TRACES / "sglang_decode_qwen3.json.gz"
    summary = streamtrace.slice_trace(trace, tmp_path / "out.json", max_mb=100)
    assert summary["events_written"] == summary["events_read"] and summary["whole_trace_fits"] is True
    with pytest.raises(TraceError, match="no ProfilerStep"):  # not whole: it needs steps to cut
        streamtrace.slice_trace(trace, tmp_path / "small.json", max_mb=0.01)
