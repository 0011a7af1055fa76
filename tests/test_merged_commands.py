"""relink, split and attribute on generated merged traces (against the generator's
ground truth), on real traces concatenated, and on hand-built edge cases."""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace import cli
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

SMALL = dict(pp_stages=2, microbatches=2, steps=1, eager_kernels=2, graph_kernels=6, graph_streams=4,
             python_noise=1)
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@pytest.fixture(scope="module", params=[(2, "rank-arg"), (8, "process-name"), (8, "rank-arg"),
                                        pytest.param((16, "rank-arg"), marks=pytest.mark.slow), (2, "none")],
                ids=lambda p: f"K{p[0]}-{p[1]}")
def generated(request, tmp_path_factory):
    ranks, style = request.param
    directory = tmp_path_factory.mktemp(f"k{ranks}{style}")
    truth = write_traces(SynthConfig(ranks=ranks, **SMALL), directory, compress="none", merged_style=style)
    rank_events = [events_of(load_json(directory / rank["file"])) for rank in truth["ranks"]]
    return directory, truth, rank_events


def truth_links(directory: Path, rank: int) -> list[tuple[int, int, int]]:
    with open(directory / f"truth_links_rank{rank}.csv", newline="") as handle:
        return [tuple(map(int, row)) for row in list(csv.reader(handle))[1:]]


def enclosing(events: list[dict], launch: dict) -> tuple[str, str]:
    """Innermost cpu_op and outermost cpu_op/user_annotation around a launch, by brute force.

    Ops with the same span nest in file order (Kineto writes the caller first).
    """
    start, end = launch["ts"], launch["ts"] + launch["dur"]
    around = [(e["ts"], -e["dur"], position, e) for position, e in enumerate(events)
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
              and (e["pid"], e["tid"]) == (launch["pid"], launch["tid"]) and e["ts"] <= start
              and end <= e["ts"] + e["dur"]]
    cpu_ops = [op for op in around if op[3]["cat"] == "cpu_op"]
    inner = max(cpu_ops, key=lambda op: op[:3])[3]["name"] if cpu_ops else ""
    outer = min(around, key=lambda op: op[:3])[3]["name"] if around else ""
    return inner, outer


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_attribute_names_the_true_launch_of_every_gpu_event(generated, tmp_path):
    directory, truth, rank_events = generated
    out = tmp_path / "kernels.csv"
    summary = streamtrace.attribute(directory / truth["merged"]["file"], out)
    rows = read_csv(out)
    assert list(rows[0]) == ["rank", "pid", "tid", "ts", "dur", "cat", "name", "correlation", "launch_name",
                             "launch_pid", "launch_tid", "launch_ts", "cpu_op", "root_op"]
    assert len(rows) == summary["gpu_events"] == sum(rank["gpu_events"] for rank in truth["ranks"])
    assert summary["orphans"] == 0 and summary["ranks"] == list(range(truth["world_size"]))
    for rank in truth["ranks"]:
        events = rank_events[rank["rank"]]
        mine = [row for row in rows if row["rank"] == str(rank["rank"])]
        links = truth_links(directory, rank["rank"])
        assert len(mine) == len(links)
        for row, (gpu_index, launch_index, correlation) in zip(mine, links):
            gpu, launch = events[gpu_index], events[launch_index]
            assert (float(row["ts"]), row["name"], int(row["correlation"])) == (gpu["ts"], gpu["name"], correlation)
            assert int(row["launch_pid"]) == launch["pid"] == rank["cpu_pid"]  # never another rank's launch
            assert (int(row["launch_tid"]), float(row["launch_ts"]), row["launch_name"]) == (
                launch["tid"], launch["ts"], launch["name"])
            assert (row["cpu_op"], row["root_op"]) == enclosing(events, launch)
    graphs = summary["graph_launches"]["by_rank"]
    assert {entry["min"] for entry in graphs.values()} == {SMALL["graph_kernels"]} == {
        entry["max"] for entry in graphs.values()}


def test_relink_makes_ids_rank_unique_and_flows_correct(generated, tmp_path):
    directory, truth, _ = generated
    out = tmp_path / "relinked.json"
    summary = streamtrace.relink(directory / truth["merged"]["file"], out)
    events = events_of(json.loads(out.read_bytes()))
    assert len(events) == truth["merged"]["events"] == summary["events_written"]
    multiplier = summary["id_multiplier"]
    for rank in truth["ranks"]:
        offset = rank["merged_offset"]
        for gpu_index, launch_index, correlation in truth_links(directory, rank["rank"]):
            gpu, launch = events[offset + gpu_index], events[offset + launch_index]
            new_id = (rank["rank"] + 1) * multiplier + correlation
            assert gpu["args"]["correlation"] == launch["args"]["correlation"] == new_id < 2**53
            assert gpu["args"]["correlation_raw"] == launch["args"]["correlation_raw"] == correlation
            flow = events[offset + gpu_index + 1]
            assert (flow["ph"], flow["id"], flow["pid"], flow["tid"], flow["ts"]) == (
                "f", new_id, gpu["pid"], gpu["tid"], gpu["ts"])
    assert summary["ac2g_flows_written"] == summary["ac2g_flows_replaced"] == sum(
        rank["flow_starts"] + rank["flow_finishes"] for rank in truth["ranks"])
    assert summary["correlation_collisions"]["ids_shared_across_ranks"] > 0
    again = streamtrace.inspect(out)
    assert again["correlation_collisions"] == {"ids_shared_across_pids": 0, "ids_shared_across_ranks": 0}


def test_relink_leaves_ids_that_are_rank_unique_already(generated, tmp_path, capsys):
    directory, truth, _ = generated
    once, twice = tmp_path / "once.json", tmp_path / "twice.json"
    first = streamtrace.relink(directory / truth["merged"]["file"], once)
    assert first["ids_already_rank_unique"] is False and first["ids_rewritten"] > 0
    summary = streamtrace.relink(once, twice)
    assert summary["ids_already_rank_unique"] is True and summary["ids_rewritten"] == 0
    assert summary["id_multiplier"] == first["id_multiplier"]
    assert load_json(twice)["traceEvents"] == load_json(once)["traceEvents"]  # its flows rebuilt in place, alike
    assert summary["ac2g_flows_replaced"] == summary["ac2g_flows_written"] == first["ac2g_flows_written"]
    assert cli.main(["relink", str(once), "-o", str(tmp_path / "report.json"), "-q"]) == 0
    report = capsys.readouterr().out
    assert "ids already rank-unique (kept as they are)" in report and "dropped" not in report


def test_relink_of_a_streamtrace_merge_keeps_its_ids_and_reads_global_ranks(tmp_path):
    truth = write_traces(SynthConfig(ranks=4, **SMALL), tmp_path / "run", compress="none", merged=False)
    assert len({rank["pp_rank"] for rank in truth["ranks"]}) == 2  # two ranks per PP rank: names say both
    merged = tmp_path / "merged.json"
    streamtrace.merge(tmp_path / "run", merged)
    summary = streamtrace.relink(merged, tmp_path / "relinked.json")
    assert summary["ranks"] == [0, 1, 2, 3]
    names = {e["pid"]: e["args"]["name"] for e in events_of(load_json(merged)) if e.get("name") == "process_name"}
    for row in summary["rank_map"]:
        assert f"(global rank {row['rank']})" in names[row["pid"]] and row["rule"] == "process_name"
    assert summary["ids_already_rank_unique"] is True and summary["ids_rewritten"] == 0
    before = [e.get("args", {}).get("correlation") for e in events_of(load_json(merged)) if e.get("cat") != "ac2g"]
    after = [e.get("args", {}).get("correlation") for e in events_of(load_json(tmp_path / "relinked.json"))
             if e.get("cat") != "ac2g"]
    assert before == after and any(before)


def test_split_gives_back_each_rank_file(generated, tmp_path):
    directory, truth, rank_events = generated
    summary = streamtrace.split(directory / truth["merged"]["file"], tmp_path / "out", max_open=3)
    assert summary["ranks"] == list(range(truth["world_size"]))
    assert summary["spool_readings"] == -(-truth["world_size"] // 3)
    for rank in truth["ranks"]:
        document = load_json(tmp_path / "out" / f"rank{rank['rank']}_trace.json.gz")
        assert document["distributedInfo"]["rank"] == rank["rank"]
        got = document["traceEvents"]
        want = rank_events[rank["rank"]]
        assert len(got) == len(want)
        for mine, theirs in zip(got, want):
            assert without_merge_fields(mine, rank) == without_merge_fields(theirs, rank)


def without_merge_fields(event: dict, rank: dict) -> dict:
    """Merging added args.rank, renamed processes ("RANK 3 - GPU") and renumbered the GPU pid
    (device index -> global rank, and so its sort index)."""
    event = dict(event)
    if event.get("name") in ("process_name", "process_sort_index"):
        event["args"] = "(changed by merging)"
    if isinstance(event.get("args"), dict):
        event["args"] = {k: v for k, v in event["args"].items() if k != "rank"}
        if not event["args"]:
            del event["args"]
    if event.get("pid") in (rank["gpu_pid"], rank["merged_gpu_pid"]):
        event["pid"] = "gpu"
    return event


@pytest.mark.slow
def test_concatenated_real_ranks_attribute_like_each_rank_alone(tmp_path):
    documents = [load_json(TRACES / f"sampled_rank-{rank}.json.gz") for rank in (0, 1)]
    merged = dict(documents[0])
    merged["traceEvents"] = documents[0]["traceEvents"] + documents[1]["traceEvents"]
    path = tmp_path / "concatenated.json"
    path.write_text(json.dumps(merged))
    summary = streamtrace.attribute(path, tmp_path / "merged.csv")
    assert summary["correlation_collisions"]["ids_shared_across_ranks"] > 0
    assert {row["rule"] for row in summary["rank_map"] if row["rank"] is not None} == {"inferred"}
    alone = []
    for rank in (0, 1):
        streamtrace.attribute(TRACES / f"sampled_rank-{rank}.json.gz", tmp_path / f"rank{rank}.csv")
        rows = read_csv(tmp_path / f"rank{rank}.csv")
        events = documents[rank]["traceEvents"]
        launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
        for row in rows:
            launch = launches[int(row["correlation"])]
            assert (row["rank"], row["launch_name"], int(row["launch_ts"])) == (str(rank), launch["name"], launch["ts"])
            assert (row["cpu_op"], row["root_op"]) == enclosing(events, launch)
        alone.extend(rows)
    assert read_csv(tmp_path / "merged.csv") == alone


def _ambiguous_trace(path: Path, *, collide: bool) -> None:
    """GPU pid 0 named by rank 0 and rank 1 (files with colliding pids concatenated)."""
    events = []
    for rank, cpu in ((0, 10), (1, 11)):
        correlation = 5 if collide else 5 + rank
        events += [
            {"ph": "M", "name": "process_name", "pid": cpu, "tid": 0, "args": {"name": f"RANK {rank} - CPU"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": f"RANK {rank} - GPU"}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": cpu, "tid": 1, "ts": 100.0, "dur": 50.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu, "tid": 1, "ts": 110.0,
             "dur": 5.0, "args": {"correlation": correlation}},
            {"ph": "X", "cat": "kernel", "name": f"k{rank}", "pid": 0, "tid": 7, "ts": 120.0 + rank, "dur": 3.0,
             "args": {"correlation": correlation, "stream": 7}},
        ]
    path.write_text(json.dumps({"traceEvents": events}))


def test_ambiguous_pid_with_colliding_ids_stops_the_linking_commands(tmp_path):
    trace = tmp_path / "ambiguous.json"
    _ambiguous_trace(trace, collide=True)
    for command in (lambda: streamtrace.relink(trace, tmp_path / "out.json"),
                    lambda: streamtrace.attribute(trace, tmp_path / "out.csv")):
        with pytest.raises(TraceError, match=r"pid 0 holds events of ranks \[0, 1\].*collide"):
            command()
    assert sorted(os.listdir(tmp_path)) == ["ambiguous.json"]


def test_ambiguous_pid_without_collisions_links_through_its_launches(tmp_path):
    trace = tmp_path / "ambiguous.json"
    _ambiguous_trace(trace, collide=False)
    summary = streamtrace.attribute(trace, tmp_path / "out.csv")
    assert summary["ambiguous_pids"] == [{"pid": 0, "ranks": [0, 1]}]
    rows = read_csv(tmp_path / "out.csv")
    assert [(row["rank"], row["name"], row["launch_pid"], row["cpu_op"]) for row in rows] == [
        ("0", "k0", "10", "aten::mm"), ("1", "k1", "11", "aten::mm")]


def test_rank_map_places_pids_nothing_else_names(tmp_path):
    trace = tmp_path / "plain.json"
    _ambiguous_trace(trace, collide=False)
    document = json.loads(trace.read_text())
    document["traceEvents"] = [e for e in document["traceEvents"] if e["ph"] != "M"]
    trace.write_text(json.dumps(document))
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"10": 4, "11": 6, "0": 4}))
    summary = streamtrace.attribute(trace, tmp_path / "out.csv", rank_map=str(mapping))
    rules = {row["pid"]: (row["rank"], row["rule"]) for row in summary["rank_map"]}
    assert rules == {10: (4, "rank-map"), 11: (6, "rank-map"), 0: (4, "rank-map")}
    assert [row["rank"] for row in read_csv(tmp_path / "out.csv")] == ["4", "4"]


def test_attribute_group_by_op_sums_gpu_time(tmp_path):
    trace = TRACES / "sampled_rank-0.json.gz"
    streamtrace.attribute(trace, tmp_path / "rows.csv")
    streamtrace.attribute(trace, tmp_path / "groups.csv", group_by="op")
    rows, groups = read_csv(tmp_path / "rows.csv"), read_csv(tmp_path / "groups.csv")
    assert list(groups[0]) == ["rank", "cpu_op", "gpu_events", "gpu_time_us"]
    mm = [row for row in rows if row["cpu_op"] == "aten::mm"]
    group = next(g for g in groups if g["cpu_op"] == "aten::mm")
    assert int(group["gpu_events"]) == len(mm)
    assert float(group["gpu_time_us"]) == pytest.approx(sum(float(row["dur"]) for row in mm))
    assert sum(int(g["gpu_events"]) for g in groups) == len(rows)


@pytest.mark.parametrize("jobs", [1, 2])
def test_attribute_cells_of_odd_values_read_back_as_the_trace_states_them(tmp_path, monkeypatch, jobs):
    """Own cells that need quoting, hold a line break or start with NUL, numbers
    as the trace writes them (exponents, big integers, a float launch time)
    and launch cells, in rows and in --group-by, against a plain oracle; the
    chunks small enough that workers read projections (and the rest as dicts)."""
    from streamtrace.engine import indexworkers, parseproc
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 2 << 10)
    names = ['plain', 'say "hi", then\nbye', "\u0000first", "tab\tend", "caf\u00e9"]
    events = [{"ph": "X", "cat": "cpu_op", "name": 'op, "quoted"', "pid": "host, 1", "tid": 7, "ts": 0, "dur": 1e9}]
    for n in range(300):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": "host, 1", "tid": 7,
                       "ts": 1000.5 + n if n % 2 else 1000 + n, "dur": 1, "args": {"correlation": n}})
        events.append({"ph": "X", "cat": "kernel", "name": names[n % len(names)],
                       "pid": "\u0000gpu" if n % 7 == 0 else 0, "tid": 7,
                       "ts": (1 << 60) + n if n % 3 == 0 else 2.5e-7 * n, "dur": 1.25 + n,
                       "args": {"correlation": n}})
    trace = tmp_path / "odd.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    streamtrace.attribute(trace, tmp_path / "rows.csv", jobs=jobs)
    streamtrace.attribute(trace, tmp_path / "groups.csv", group_by="op", jobs=jobs)
    shown = "\u2400"  # NUL as a symbol: Python 3.10's csv module refuses NUL
    rows = list(csv.DictReader(io.StringIO((tmp_path / "rows.csv").read_text("utf-8").replace("\0", shown),
                                           newline="")))
    launches = {event["args"]["correlation"]: event for event in events if event["cat"] == "cuda_runtime"}
    kernels = [event for event in events if event["cat"] == "kernel"]
    assert len(rows) == len(kernels)
    for row, kernel in zip(rows, kernels):
        launch = launches[kernel["args"]["correlation"]]
        assert (row["pid"], row["tid"], row["dur"], row["name"], row["correlation"]) == \
            (str(kernel["pid"]).replace("\0", shown), "7", str(kernel["dur"]), kernel["name"].replace("\0", shown),
             str(kernel["args"]["correlation"]))
        ts = kernel["ts"]
        assert row["ts"] == str(ts) if isinstance(ts, int) else float(row["ts"]) == ts
        assert (row["launch_pid"], row["launch_ts"], row["cpu_op"]) == ("host, 1", str(launch["ts"]), 'op, "quoted"')
    with open(tmp_path / "groups.csv", newline="", encoding="utf-8") as handle:
        groups = list(csv.DictReader(handle))
    assert [(group["cpu_op"], int(group["gpu_events"])) for group in groups] == [('op, "quoted"', 300)]
    assert float(groups[0]["gpu_time_us"]) == pytest.approx(sum(kernel["dur"] for kernel in kernels))


@pytest.mark.slow
def test_cli_commands_print_summaries_and_one_line_errors(tmp_path):
    cli = [sys.executable, "-m", "streamtrace"]
    trace = TRACES / "sampled_rank-1.json.gz"
    result = subprocess.run([*cli, "attribute", str(trace), "-q", "--json"], capture_output=True, timeout=120)
    assert result.returncode == 0
    rows = list(csv.DictReader(io.StringIO(result.stdout.decode())))
    assert len(rows) == json.loads(result.stderr)["rows"] == sum(
        1 for e in events_of(load_json(trace)) if e.get("cat") in GPU_CATS)
    result = subprocess.run([*cli, "split", str(trace), "-o", str(tmp_path / "d"), "-q", "--json"], capture_output=True,
                            timeout=120)
    assert result.returncode == 0 and json.loads(result.stdout)["ranks"] == [1]
    again = subprocess.run([*cli, "split", str(trace), "-o", str(tmp_path / "d"), "-q"], capture_output=True,
                           timeout=120)
    assert again.returncode == 1 and b"--overwrite" in again.stderr and again.stderr.count(b"\n") == 1
    ambiguous = tmp_path / "ambiguous.json"
    _ambiguous_trace(ambiguous, collide=True)
    failed = subprocess.run([*cli, "relink", str(ambiguous), "-q"], capture_output=True, timeout=120)
    assert failed.returncode == 1 and failed.stderr.count(b"\n") == 1 and b"Traceback" not in failed.stderr
    assert sorted(os.listdir(tmp_path)) == ["ambiguous.json", "d"]
    relinked = subprocess.run([*cli, "relink", str(trace), "-o", "-", "-q", "--json"], capture_output=True, timeout=120)
    assert relinked.returncode == 0
    assert len(json.loads(relinked.stdout)["traceEvents"]) == json.loads(relinked.stderr)["events_written"]
    with gzip.open(tmp_path / "d" / "rank1_trace.json.gz") as handle:
        assert b'"rank": 1' in handle.read()


def test_split_failures_leave_no_files(tmp_path):
    trace = TRACES / "sampled_rank-1.json.gz"
    truncated = tmp_path / "truncated.json"
    with gzip.open(trace) as handle:
        truncated.write_bytes(handle.read()[:-5000])
    with pytest.raises(TraceError, match="truncated"):
        streamtrace.split(truncated, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old" / "rank1_trace.json.gz").mkdir(parents=True)
    with pytest.raises(TraceError, match="is a directory"):
        streamtrace.split(trace, tmp_path / "old", overwrite=True)
    assert os.listdir(tmp_path / "old") == ["rank1_trace.json.gz"]


def test_relink_decodes_lines_it_cannot_splice(tmp_path):
    """A GPU event whose args nest another "correlation" key takes the decode path."""
    events = []
    for rank, cpu in ((0, 10), (1, 11)):
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": cpu, "tid": 1, "ts": 110.0,
             "dur": 5.0, "args": {"correlation": 5, "rank": rank}},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": rank, "tid": 7, "ts": 120.5, "dur": 3.0,
             "args": {"correlation": 5, "rank": rank, "meta": {"correlation": 5}}},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": rank, "tid": 8, "ts": 121.5, "dur": 3.0,
             "args": {"correlation": 5, "rank": rank}},
        ]
    trace = tmp_path / "nested.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    summary = streamtrace.relink(trace, tmp_path / "out.json")
    assert summary["graph_launches"]["by_rank"] == {
        "0": {"launches": 1, "gpu_events": 2, "min": 2, "max": 2},
        "1": {"launches": 1, "gpu_events": 2, "min": 2, "max": 2}}
    out = events_of(json.loads((tmp_path / "out.json").read_bytes()))
    ids = [(e["ph"], e.get("id", e.get("args", {}).get("correlation"))) for e in out]
    first, second = 10**9 + 5, 2 * 10**9 + 5
    assert ids == [("X", first), ("s", first), ("X", first), ("f", first), ("X", first), ("f", first),
                   ("X", second), ("s", second), ("X", second), ("f", second), ("X", second), ("f", second)]
    assert out[2]["args"] == {"correlation": first, "rank": 0, "meta": {"correlation": 5}, "correlation_raw": 5}
    assert (out[3]["pid"], out[3]["tid"], out[3]["ts"], out[3]["bp"]) == (0, 7, 120.5, "e")


def test_relink_reads_kinetos_layout_from_its_own_text_to_the_same_events(tmp_path, monkeypatch):
    """Relink's pass 1 decodes only what its index reads, events spread over
    indented lines (spaces after colons) included, and pass 2 changes their
    own text: the same events come out as from the one-line layout."""
    monkeypatch.setattr("streamtrace.engine.indexworkers.CHUNK_BYTES", 16 << 10)  # many chunks
    fallbacks = []
    monkeypatch.setattr("streamtrace.engine.indexworkers.chunk_events", lambda text: fallbacks.append(text))
    outputs = {}
    for layout in ("lines", "kineto"):
        directory = tmp_path / layout
        truth = write_traces(SynthConfig(ranks=2, **SMALL, layout=layout), directory, compress="none")
        out = tmp_path / f"{layout}.json"
        summary = streamtrace.relink(directory / truth["merged"]["file"], out, jobs=1)
        outputs[layout] = (summary, out.read_bytes())
    assert not fallbacks
    kineto = outputs["kineto"][1]
    assert b"\n    " not in kineto
    relinked = [line for line in kineto.split(b"\n") if b'"correlation_raw":' in line]
    assert relinked and all(b'"cat": ' in line for line in relinked)  # changed in their own text, not re-encoded
    assert events_of(json.loads(kineto)) == events_of(json.loads(outputs["lines"][1]))
    assert outputs["kineto"][0]["ids_rewritten"] == outputs["lines"][0]["ids_rewritten"] > 0


@pytest.mark.parametrize("where", ["args", "process name"])
def test_a_rank_no_job_can_have_is_no_rank(tmp_path, where):
    """A rank past 32-bit arrays (2**40) is read as no rank at all, in every
    reading (it stopped relink and split with an OverflowError)."""
    huge = 1 << 40
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0.5, "dur": 1.0,
               "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0,
               "args": {"correlation": 1, **({"rank": huge} if where == "args" else {})}}]
    if where == "process name":
        events.insert(0, {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"rank {huge}"}})
    trace = tmp_path / "huge.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceError, match="no event has a rank"):
        streamtrace.split(trace, tmp_path / "ranks")
    summary = streamtrace.relink(trace, tmp_path / "out.json")
    assert summary["ids_rewritten"] == 0 and summary["ac2g_flows_written"] == 2


def _odd_lines_trace(path: Path) -> None:
    """Two ranks' launches and kernels, every few events spelled as pass 2's
    block rewrite must refuse or read exactly: keys spaced before the colon,
    tid before pid, string tids, quotes and keys inside names, pid and ts
    again in args, an escaped key, a correlation nested in args too, times
    written with a zero more than a decoded event would be."""
    oddities = [
        lambda e: e,
        lambda e: {**e, "name": 'say "pid":1, "ts":2'},
        lambda e: {key: e[key] for key in ("ph", "cat", "name", "tid", "pid", "ts", "dur", "args")},
        lambda e: {**e, "args": {**e["args"], "pid": 99, "ts": 1.5}},
        lambda e: {**e, "args": {**e["args"], "meta": {"correlation": 1}}},
        lambda e: {**e, "tid": "stream 7"},
    ]
    lines = []
    for n in range(240):
        rank, correlation = n % 2, 100 + n // 2
        launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10 + rank, "tid": 1,
                  "ts": 1000.0 + n, "dur": 0.5, "args": {"correlation": correlation, "rank": rank}}
        kernel = {"ph": "X", "cat": "kernel", "name": f"k{n % 5}", "pid": rank, "tid": 7, "ts": 1000.25 + n,
                  "dur": 0.5, "args": {"correlation": correlation, "rank": rank}}
        for event in (launch, kernel):
            text = json.dumps(oddities[(n // 12) % len(oddities)](event), separators=(",", ":")).encode()
            if n % 17 == 0:
                text = text.replace(b'"pid":', b'"pid" :', 1)
            if n % 29 == 0:
                text = text.replace(b'"correlation":', b'"correlation": ', 1)
            if n % 31 == 0:
                text = text.replace(b'"ts":', b'"t\\u0073":', 1)
            if n % 2 == 0:
                text = text.replace(b'.25,', b'.250,', 1)  # a ts decoding would spell otherwise
            lines.append(text)
        lines.append(b'{"ph":"s","id":%d,"pid":%d,"tid":1,"ts":%s,"cat":"ac2g","name":"ac2g"}'
                     % (correlation, 10 + rank, json.dumps(1000.0 + n).encode()))
    path.write_bytes(b'{"traceEvents":[\n' + b",\n".join(lines) + b"\n]}")


@pytest.mark.parametrize("block_bytes", [2048, 1 << 20])
def test_relink_rewrites_blocks_as_it_rewrites_lines(tmp_path, monkeypatch, block_bytes):
    """Pass 2 rewrites a block's ids and flows over all its lines at once:
    the same bytes as line by line, on generated ranks in both layouts and
    on lines spelled every way the block rewrite must refuse or read."""
    from streamtrace.commands.relink import RelinkPlan

    monkeypatch.setattr("streamtrace.io.spool.READ_BLOCK", block_bytes)
    inputs = [tmp_path / "odd.json"]
    _odd_lines_trace(inputs[0])
    for layout in ("lines", "kineto"):
        truth = write_traces(SynthConfig(ranks=2, **SMALL, layout=layout), tmp_path / layout, compress="none")
        inputs.append(tmp_path / layout / truth["merged"]["file"])
    blocks = []
    rewrite = RelinkPlan._rewritten_block

    def counted(plan: RelinkPlan, block: list[bytes], first: int) -> list[bytes] | None:
        rewritten = rewrite(plan, block, first)
        blocks.append(rewritten is not None)
        return rewritten

    monkeypatch.setattr(RelinkPlan, "_rewritten_block", counted)
    for trace in inputs:
        for jobs in (1, 2):
            streamtrace.relink(trace, tmp_path / "blocks.json", jobs=jobs, overwrite=True)
            with monkeypatch.context() as lines_only:
                lines_only.setattr(RelinkPlan, "_rewritten_block", lambda plan, block, first: None)
                streamtrace.relink(trace, tmp_path / "lines.json", jobs=jobs, overwrite=True)
            assert (tmp_path / "blocks.json").read_bytes() == (tmp_path / "lines.json").read_bytes(), (trace, jobs)
    assert True in blocks and (block_bytes > 4096 or False in blocks)
