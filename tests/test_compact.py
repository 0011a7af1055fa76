"""compact end to end: SPEC 4 conventions on hand-built traces, invariants on
real and generated traces, and an in-memory oracle."""
from __future__ import annotations

import gzip
import json
import pickle
import sys
from collections import defaultdict

import orjson
import pytest
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace.algo import lanes as lanes_module
from streamtrace.commands import compactindex, compactplan
from streamtrace.errors import TraceError
from streamtrace.io.configfiles import load_rules
from streamtrace.synth import SynthConfig, write_traces

SLICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset"}


def kernel(name, ts, dur, tid, *, pid=0, cat="kernel", label=None, **args):
    args = {"stream": tid, "correlation": args.pop("correlation", 1), **args}
    if label is not None:
        args["name"] = label
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def note(name, ts, dur, tid, *, pid=0, **args):
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def thread_meta(pid, tid, name, index):
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": index}}]


def run(tmp_path, events, *, trailer=None, **kwargs):
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"traceEvents": events, **(trailer or {})}))
    summary = streamtrace.compact(src, tmp_path / "out.json", **kwargs)
    doc = json.loads((tmp_path / "out.json").read_text())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    sort = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "thread_sort_index"}
    return summary, doc["traceEvents"], names, sort


def lane_of(events, names, name):
    event = next(e for e in events if e.get("name") == name and e.get("cat") in SLICE_CATS)
    return names[(event["pid"], event["tid"])]


def test_lane_names_suffix_only_when_a_group_has_several_lanes(tmp_path):
    events = [kernel("gemm_a", 0, 10, 7), kernel("gemm_b", 5, 10, 8), kernel("gemm_c", 20, 1, 9),
              kernel("ncclDevKernel_AllGather_RING", 0, 3, 20), kernel("Memcpy HtoD", 1, 1, 7, cat="gpu_memcpy")]
    summary, out, names, _ = run(tmp_path, events)
    assert lane_of(out, names, "gemm_a") == "Compute 1"
    assert lane_of(out, names, "gemm_b") == "Compute 2"
    assert lane_of(out, names, "gemm_c") == "Compute 1"
    assert lane_of(out, names, "ncclDevKernel_AllGather_RING") == "NCCL all-gather"
    assert lane_of(out, names, "Memcpy HtoD") == "GPU memcpy"
    assert summary["lanes_by_group"] == {"compute": 2, "memcpy": 1, "nccl_all_gather": 1}
    assert summary["original_streams"] == 4 and summary["compacted_lanes"] == 4
    for event in out:
        if event.get("cat") in SLICE_CATS:
            assert event["tid"] == event["args"]["stream"] and event["tid"] >= 1000 + 20


def test_old_stream_metadata_dropped_and_lanes_sorted_with_tracks_above(tmp_path):
    events = thread_meta(0, 7, "stream 7", 7) + thread_meta(0, 8, "stream 8", 8) + thread_meta(0, 99, "keep", 1) + [
        kernel("gemm_a", 0, 10, 7), kernel("gemm_b", 5, 10, 8), note("PP:0F0", 0, 10, 7)]
    summary, out, names, sort = run(tmp_path, events)
    assert "stream 7" not in names.values() and "stream 8" not in names.values()
    assert names[(0, 99)] == "keep"
    by_name = {name: key for key, name in names.items()}
    assert sort[by_name["Compute 1 annotations"]] + 1 == sort[by_name["Compute 1"]]
    assert sort[by_name["Compute 1"]] < sort[by_name["Compute 2"]]
    assert "Compute 2 annotations" not in by_name
    moved = next(e for e in out if e.get("name") == "PP:0F0")
    assert names[(0, moved["tid"])] == "Compute 1 annotations"


def test_annotations_move_to_the_lane_of_the_nearest_slice_of_their_stream(tmp_path):
    events = [kernel("a", 0, 10, 7), kernel("b", 5, 10, 8), kernel("c", 30, 5, 8),
              note("inside_b", 6, 2, 8), note("after_c", 40, 1, 8), note("before_a", -5, 1, 7)]
    summary, out, names, _ = run(tmp_path, events)
    track = {e["name"]: names[(e["pid"], e["tid"])] for e in out if e.get("cat") == "gpu_user_annotation"}
    assert track == {"inside_b": "Compute 2 annotations", "after_c": "Compute 1 annotations",
                     "before_a": "Compute 1 annotations"}
    assert summary["gpu_annotations_mapped"] == 3


@pytest.mark.parametrize("chunk", [lanes_module.CHUNK, 1], ids=["one chunk", "chunks of one"])
def test_identical_overlapping_annotations_coalesce_into_their_union(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(lanes_module, "CHUNK", chunk)
    events = [kernel("ncclDevKernel_AllGather_a", 0, 10, 20), kernel("ncclDevKernel_AllGather_b", 12, 4, 21),
              note("nccl:all_gather", 9, 3, 20, **{"External id": 1}),
              note("nccl:all_gather", 11, 5, 21, **{"External id": 1}),
              note("nccl:all_gather", 13, 1, 21, **{"External id": 2}),
              note("nccl:all_gather", 30, 1, 21, **{"External id": 1})]
    summary, out, names, _ = run(tmp_path, events)
    kept = sorted((e["args"]["External id"], e["ts"], e["dur"]) for e in out if e.get("cat") == "gpu_user_annotation")
    assert kept == [(1, 9, 7), (1, 30, 1), (2, 13, 1)]
    assert summary["gpu_annotations_coalesced"] == 1
    assert summary["gpu_annotations_retained"] == 3


def test_per_kernel_annotations_become_spans_on_the_lane_track(tmp_path):
    labels = ["PP:0F0", "PP:0F0", "PP:0B0", None, "PP:0B0"]
    events = [kernel(f"k{i}", 10 + 2 * i, 1, 30 + i, label=label) for i, label in enumerate(labels)]
    summary, out, names, _ = run(tmp_path, events)
    spans = sorted((e["name"], e["ts"], e["dur"]) for e in out if e.get("cat") == "gpu_user_annotation")
    assert spans == [("PP:0B0", 14.0, 1.0), ("PP:0B0", 18.0, 1.0), ("PP:0F0", 10.0, 3.0)]
    span_tracks = {names[(e["pid"], e["tid"])] for e in out if e.get("cat") == "gpu_user_annotation"}
    assert span_tracks == {"Compute annotations"}
    assert [e["args"].get("name") for e in out if e.get("cat") == "kernel"] == labels
    assert (summary["kernel_annotations_converted"], summary["kernel_annotation_blocks"]) == (4, 3)


@pytest.mark.parametrize("chunk", [lanes_module.CHUNK, 2], ids=["one chunk", "chunks of two"])
def test_new_lines_are_the_new_events_as_the_writer_writes_them(monkeypatch, chunk):
    """Compact writes the per-kernel spans as text made a chunk at a time;
    each line is the bytes orjson writes for the event (times of every
    form orjson spells differently from Python, a string pid, labels that
    need escapes)."""
    from streamtrace.io.eventtext import dumps_event
    monkeypatch.setattr(compactplan, "CHUNK", chunk)
    index = compactindex.CompactIndex(load_rules(None))
    times = [(0.0, 1.0), (1.0, 2.5e-05), (1e16, 3.0), (1e16 + 4, 0.1), (1767189312000000.1, 1e-07), (5.0, 0.0)]
    for n, (ts, dur) in enumerate(times):
        for pid in (0, "GPU 1"):
            index.visit(kernel(f"k{n}", ts, dur, 7, pid=pid, label='PP:"0F0"\n' if n % 2 else "é ü"))
    compaction = compactplan.plan_compaction(index, [])
    expected = [dumps_event(event) for event in compaction.new_events()]
    assert len(compaction.kernel_runs) >= len(times) and list(compaction.new_lines()) == expected
    assert all(orjson.loads(line) == event for line, event in zip(expected, compaction.new_events()))


def test_identity_hashes_at_once_equal_the_hash_of_each():
    """Annotations in Kineto's key set are hashed without a call each; any
    other key set, or args orjson cannot write as they are, take the call."""
    kineto = [note("nccl:all_gather", n, 1, 7, **{"External id": n % 2, "b": [1, {"z": 1, "a": None}]}) for n in range(4)]
    other = {**kineto[0], "id": 3}
    big = note("nccl:all_gather", 0, 1, 7, big=1 << 70)
    for events in (kineto, kineto + [other], kineto + [big], [big], []):
        assert compactindex._identity_hashes(events) == list(map(compactindex._identity_hash, events))
    assert len(set(compactindex._identity_hashes(kineto))) == 2


def flow(ph, fid, pid, tid, ts):
    event = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    if ph == "f":
        event["bp"] = "e"
    return event


def test_flow_endpoints_follow_their_slice_and_dangling_ones_are_counted(tmp_path):
    events = [kernel("a", 0, 10, 7), kernel("b", 5, 10, 8), flow("s", 1, 100, 100, -1), flow("f", 1, 0, 8, 5),
              flow("f", 2, 0, 8, 40), flow("s", 3, 100, 100, -2), flow("f", 3, 0, 7, 0)]
    summary, out, names, _ = run(tmp_path, events)
    ends = {e["id"]: e for e in out if e.get("cat") == "ac2g" and e["ph"] == "f"}
    assert names[(0, ends[1]["tid"])] == "Compute 2" and names[(0, ends[3]["tid"])] == "Compute 1"
    assert names[(0, ends[2]["tid"])] == "Compute 2"
    assert [e["tid"] for e in out if e.get("cat") == "ac2g" and e["ph"] == "s"] == [100, 100]
    assert (summary["gpu_flow_endpoints_mapped"], summary["gpu_flow_endpoints_unmatched"]) == (2, 1)
    with pytest.raises(TraceError, match="matches no slice start"):
        streamtrace.compact(tmp_path / "t.json", tmp_path / "strict.json", strict=True)
    assert not (tmp_path / "strict.json").exists()


PP_TRAILER = {"distributedInfo": {"rank": 4, "world_size": 8, "pg_config": [
    {"pg_name": "torchtitan_real_pp", "pg_desc": "mesh_pp", "ranks": [0, 4]}]}}


def test_rank_local_pp_arrows_and_counts(tmp_path):
    events = [kernel("ncclDevKernel_SendRecv", 0, 2, 40), note("PP:1RECV_F0", 0, 2, 40),
              kernel("gemm", 3, 4, 7), note("PP:1F0", 3, 4, 7),
              kernel("ncclDevKernel_SendRecv", 8, 1, 40), note("PP:1SEND_F0", 8, 1, 40),
              kernel("ncclDevKernel_AllGather", -3, 2, 50), note("PP:1UNSHARD", -3, 2, 50),
              note("PP:1SEND_F5", 30, 1, 40)]
    summary, out, names, _ = run(tmp_path, events, trailer=PP_TRAILER)
    flows = [e for e in out if e.get("cat", "").startswith("pp_")]
    pairs = defaultdict(dict)
    for event in flows:
        pairs[event["id"]][event["ph"]] = event
    got = {(p["s"]["name"], names[(0, p["s"]["tid"])], names[(0, p["f"]["tid"])]) for p in pairs.values()}
    assert got == {("1RECV_F0 -> 1F0", "NCCL other annotations", "Compute annotations"),
                   ("1F0 -> 1SEND_F0", "Compute annotations", "NCCL other annotations"),
                   ("1UNSHARD -> 1F0", "NCCL all-gather annotations", "Compute annotations")}
    for pair in pairs.values():
        assert pair["f"]["ts"] >= pair["s"]["ts"] and pair["f"]["bp"] == "e"
        assert pair["s"]["args"]["source_pp_rank"] == 1
    assert summary["pp_rank"] == 1
    assert (summary["pp_compute_dependency_pairs"], summary["pp_compute_dependency_unmatched"]) == (2, 1)
    assert (summary["pp_unshard_compute_pairs"], summary["pp_unshard_compute_unmatched"]) == (1, 0)
    off, out, _, _ = run(tmp_path, events, trailer=PP_TRAILER, pp_flows=False, overwrite=True)
    assert "pp_rank" not in off and not any(e.get("cat", "").startswith("pp_") for e in out)


def test_default_output_name_and_refusal_to_overwrite(tmp_path):
    src = tmp_path / "rank0_trace.json.gz"
    src.write_bytes(gzip.compress(json.dumps({"traceEvents": [kernel("a", 0, 1, 7)]}).encode()))
    summary = streamtrace.compact(src)
    assert summary["output"] == str(tmp_path / "rank0_trace_compacted.json.gz")
    before = (tmp_path / "rank0_trace_compacted.json.gz").read_bytes()
    with pytest.raises(TraceError, match="--overwrite"):
        streamtrace.compact(src)
    assert (tmp_path / "rank0_trace_compacted.json.gz").read_bytes() == before
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps({"traceEvents": [kernel("a", 0, 1, 7)]}))
    assert streamtrace.compact(plain)["output"].endswith("t_compacted.json")


def test_trace_without_gpu_slices_passes_through(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2}]
    summary, out, _, _ = run(tmp_path, events)
    assert out == events and "notice" in summary


def test_stream_and_label_ids_widen_past_two_bytes():
    """Ids start in 2-byte arrays; the first id past their range widens every
    array of its kind, and the hot loop goes on appending to the new ones."""
    index = compactindex.CompactIndex(load_rules(None))
    count = (1 << 16) + 3
    moved = [0, 1 << 15, (1 << 16) - 1, 1 << 16, count - 1]  # streams that also get a flow, an annotation, metadata
    for n in range(count):
        index.visit(kernel("gemm", float(n), 0.5, n, label=f"label {n}"))
        if n in moved:
            index.visit({"ph": "f", "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": n, "ts": float(n), "id": n, "bp": "e"})
            index.visit(note(f"note {n}", float(n), 0.25, n))
            index.visit(thread_meta(0, n, f"stream {n}", n)[0])
    assert [index.slice_stream.typecode, index.flow_stream.typecode, index.note_stream.typecode,
            index.meta_stream.typecode, index.slice_label.typecode, index.note_name.typecode] == ["i"] * 6
    assert index.slice_stream.tolist() == list(range(count))
    assert [index.label_names[label] for label in index.slice_label] == [f"label {n}" for n in range(count)]
    assert index.flow_stream.tolist() == index.note_stream.tolist() == index.meta_stream.tolist() == moved
    assert [index.label_names[label] for label in index.note_name] == [f"note {n}" for n in moved]
    summary = compactplan.plan_compaction(index, []).summary
    assert (summary["measured_slices"], summary["original_streams"], summary["compacted_lanes"]) == (count, count, 1)
    assert summary["gpu_flow_endpoints_mapped"] == summary["gpu_annotations_mapped"] == len(moved)


def test_the_plan_releases_what_pass_2_does_not_read():
    """After the plan the index holds what pass 2 reads, and still pickles (merge parks it)."""
    index = compactindex.CompactIndex(load_rules(None))
    for event in [kernel("gemm", 0.0, 2.0, 7), kernel("gemm", 1.0, 2.0, 8), note("n", 0.0, 1.0, 7)]:
        index.visit(event)
    compactplan.plan_compaction(index, [])
    assert not any(hasattr(index, name) for name in compactindex.PLAN_ONLY + compactindex.PASS_1_CLOSURES)
    assert pickle.loads(pickle.dumps(index)).slice_start.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="pass 2 reads slice_start"):
        index.release("slice_start")


def test_negative_duration_is_refused(tmp_path):
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"traceEvents": [kernel("a", 0, 1, 7), kernel("b", 3, -1, 7)]}))
    with pytest.raises(TraceError, match="negative dur") as info:
        streamtrace.compact(src, tmp_path / "o.json")
    assert info.value.event_index == 1
    assert not (tmp_path / "o.json").exists()


def check_invariants(source_events: list[dict], out_events: list[dict], summary: dict,
                     original_stream: bool = True) -> None:
    """SPEC 4 invariants (torchtitan's conventions), checked with plain lists: a
    slice changes only in tid and args.stream, and gains args.original_stream
    (the input's args.stream) unless that is turned off."""
    before = [e for e in source_events if e.get("cat") in SLICE_CATS and e.get("ph") == "X"]
    after = [e for e in out_events if e.get("cat") in SLICE_CATS and e.get("ph") == "X"]
    assert len(before) == len(after)
    for old, new in zip(before, after):
        expected = {**old, "tid": new["tid"]}
        if "stream" in old.get("args", {}):
            expected["args"] = {**old["args"], "stream": new["tid"]}
            if original_stream and summary.get("measured_slices"):
                expected["args"]["original_stream"] = old["args"]["stream"]
        assert new == expected
    assert summary.get("measured_slices", 0) == len(after)
    lanes = defaultdict(list)
    for event in after:
        assert event["tid"] == event["args"].get("stream", event["tid"])
        lanes[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    starts = defaultdict(set)
    for event in after:
        starts[(event["pid"], event["tid"])].add(event["ts"])
    gpu_pids = {e["pid"] for e in after}
    unmatched = 0
    for event in out_events:
        if event.get("cat") == "ac2g" and event.get("pid") in gpu_pids:
            if event["ts"] not in starts.get((event["pid"], event["tid"]), ()):
                unmatched += 1
    assert unmatched == summary.get("gpu_flow_endpoints_unmatched", 0)


def oracle_lanes(source_events: list[dict]) -> dict:
    """Lanes per (pid, group) = the most slices of that group in flight at once."""
    from streamtrace.io.configfiles import load_rules
    rules = load_rules(None)
    spans = defaultdict(list)
    for e in source_events:
        if e.get("cat") in SLICE_CATS and e.get("ph") == "X":
            spans[(e["pid"], rules.names[rules.classify(e["cat"], e.get("name"))])].append((e["ts"], e["ts"] + e["dur"]))
    depth = {}
    for key, items in spans.items():
        points = sorted([(s, 1) for s, _ in items] + [(e, -1) for _, e in items], key=lambda p: (p[0], p[1]))
        level = best = 0
        for _, step in points:
            level += step
            best = max(best, level)
        depth[key] = best
    return depth


def test_real_traces_keep_every_invariant(real_trace, tmp_path):
    out = tmp_path / "out.json"
    summary = streamtrace.compact(real_trace, out)
    source = events_of(load_json(real_trace))
    result = json.loads(out.read_bytes())
    check_invariants(source, events_of(result), summary)
    if summary["measured_slices"]:
        lanes = defaultdict(int)
        for tid_info in oracle_lanes(source).items():
            lanes[tid_info[0][1]] += tid_info[1]
        assert summary["lanes_by_group"] == dict(sorted(lanes.items()))


def test_real_trace_without_original_stream_changes_only_tid_and_stream(tmp_path):
    out = tmp_path / "out.json"
    summary = streamtrace.compact(TRACES / "b200_eager.json.gz", out, original_stream=False)
    check_invariants(events_of(load_json(TRACES / "b200_eager.json.gz")), events_of(load_json(out)), summary,
                     original_stream=False)
    assert b"original_stream" not in out.read_bytes()


def test_compacting_twice_keeps_the_first_original_stream(tmp_path):
    source = events_of(load_json(TRACES / "b200_eager.json.gz"))
    streams = [e["args"]["stream"] for e in source if e.get("cat") in SLICE_CATS and e.get("ph") == "X"]
    assert 7 in streams
    streamtrace.compact(TRACES / "b200_eager.json.gz", tmp_path / "once.json")
    streamtrace.compact(tmp_path / "once.json", tmp_path / "twice.json")
    lines = (tmp_path / "twice.json").read_bytes().splitlines()
    assert max(line.count(b'"original_stream"') for line in lines) == 1  # never a second key
    twice = [e for e in events_of(load_json(tmp_path / "twice.json")) if e.get("cat") in SLICE_CATS]
    assert [e["args"]["original_stream"] for e in twice] == streams


def test_kineto_small_dangling_endpoints_are_counted(tmp_path):
    from conftest import TRACES
    summary = streamtrace.compact(TRACES / "kineto_small.json", tmp_path / "o.json")
    assert summary["gpu_flow_endpoints_unmatched"] == 2


GENERATED = dict(ranks=2, pp_stages=2, microbatches=3, steps=2, graph_streams=32, graph_kernels=48, eager_kernels=4,
                 python_noise=1, schedule="zb")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gen")
    truth = write_traces(SynthConfig(**GENERATED), directory, compress="gz", merged=False)
    return directory, truth


@pytest.fixture(scope="module")
def generated_kineto(tmp_path_factory):
    """The same trace in Kineto's own layout (an event over indented lines, spaces after colons)."""
    directory = tmp_path_factory.mktemp("gen_kineto")
    truth = write_traces(SynthConfig(**GENERATED, layout="kineto"), directory, compress="gz", merged=False)
    return directory, truth


def test_kinetos_layout_is_compacted_from_its_own_text_to_the_same_events(generated, generated_kineto, tmp_path,
                                                                          monkeypatch):
    """Events spread over indented lines are spooled as their own text (no
    chunk falls back to parsing into dicts), and come out as the same events
    as the one-line layout gives, line breaks and indentation gone."""
    monkeypatch.setattr("streamtrace.engine.indexworkers.CHUNK_BYTES", 16 << 10)  # many chunks
    fallbacks = []
    monkeypatch.setattr("streamtrace.engine.indexworkers.chunk_events", lambda text: fallbacks.append(text))
    outputs = {}
    for name, (directory, truth) in (("lines", generated), ("kineto", generated_kineto)):
        src = directory / truth["ranks"][0]["file"]
        summary = streamtrace.compact(src, tmp_path / f"{name}.json", jobs=1)
        outputs[name] = (summary, (tmp_path / f"{name}.json").read_bytes())
    assert not fallbacks
    raw = gzip.decompress((generated_kineto[0] / generated_kineto[1]["ranks"][0]["file"]).read_bytes())
    assert b'\n    "ts": ' in raw  # the input is laid out as Kineto lays it out
    kineto = outputs["kineto"][1]
    assert b"\n    " not in kineto and b'"tid":' in kineto and b'"ph": "X"' in kineto  # moved lines keep their spacing
    assert events_of(json.loads(kineto)) == events_of(json.loads(outputs["lines"][1]))
    differ = {key for key in outputs["lines"][0] if outputs["lines"][0][key] != outputs["kineto"][0][key]}
    assert differ <= {"input", "read", "output", "wall_seconds", "pass1_seconds", "plan_seconds", "peak_rss_mb"}


def test_generated_pp_trace_matches_oracle_and_schedule(generated, tmp_path):
    directory, truth = generated
    for rank in truth["ranks"]:
        src = directory / rank["file"]
        out = tmp_path / f"c{rank['rank']}.json"
        summary = streamtrace.compact(src, out)
        source = events_of(load_json(src))
        result = events_of(json.loads(out.read_bytes()))
        check_invariants(source, result, summary)
        assert summary["original_streams"] >= 24
        per_group = defaultdict(int)
        for (_, group), depth in oracle_lanes(source).items():
            per_group[group] += depth
        assert summary["lanes_by_group"] == dict(sorted(per_group.items()))
        counts = rank["pp_action_counts"]
        comms = sum(counts.get(op, 0) for op in ("SEND_F", "RECV_F", "SEND_B", "RECV_B"))
        assert summary["pp_compute_dependency_pairs"] == comms
        assert summary["pp_compute_dependency_unmatched"] == 0
        assert summary["pp_unshard_compute_pairs"] == counts.get("UNSHARD", 0)
        assert summary["pp_rank"] == rank["pp_rank"]
        assert summary["cuda_graph_launches"] == rank["graph_launches"]
        assert set(summary["lanes_by_group"]) >= {"compute", "memcpy", "memset", "nccl_other"}


def test_exact_numbers_survive_compaction(tmp_path):
    src = tmp_path / "t.json"
    src.write_text('{"baseTimeNanoseconds": 1767189312000000123, "traceEvents": ['
                   '{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7, '
                   '"ts": 1365627949869.790, "dur": 2.500, "args": {"stream": 7, "Comms Id": 18446744073709551616}},'
                   '{"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 1365627949869.790, "bp": "e"}]}')
    summary = streamtrace.compact(src, tmp_path / "o.json")
    text = (tmp_path / "o.json").read_text()
    for literal in ("1365627949869.790", "2.500", "18446744073709551616", "1767189312000000123"):
        assert literal in text
    assert summary["read"]["exact_numbers"] and summary["gpu_flow_endpoints_mapped"] == 1


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("whole", [True, False])
def test_a_slice_that_changed_between_the_passes_is_named(tmp_path, monkeypatch, whole, jobs):
    """Pass 2 checks each slice's start against pass 1 and names the one that
    differs, in blocks moved whole and in blocks moved line by line, in this
    process and in pass-2 workers."""
    from streamtrace.commands.compactemit import CompactPlan
    write_traces(SynthConfig(ranks=1, pp_stages=1, microbatches=2, steps=1, graph_streams=4, graph_kernels=4),
                 tmp_path, compress="none", merged=False)
    real_init = CompactPlan.__init__
    changed = []

    def with_a_start_moved(plan, index, *args):
        changed.append(len(index.slice_start) // 2)
        index.slice_start[changed[0]] += 1.0  # as if the input changed under us between the passes
        real_init(plan, index, *args)

    real_check, callers = CompactPlan._check_slice, set()

    def check(plan, line, ordinal):
        callers.add(sys._getframe(1).f_code.co_name)
        real_check(plan, line, ordinal)

    monkeypatch.setattr(CompactPlan, "__init__", with_a_start_moved)
    monkeypatch.setattr(CompactPlan, "_check_slice", check)
    monkeypatch.setattr("streamtrace.io.spool.READ_BLOCK", 16384)  # the middle slice in a block without metadata
    if not whole:
        def line_by_line(plan, block, first):
            """As moved_block does for a block it cannot move whole: the cursor steps, the lines go one by one."""
            plan._bases(first, first + len(block))
            return None

        monkeypatch.setattr(CompactPlan, "moved_block", line_by_line)
    with pytest.raises(TraceError, match="differs between the passes") as info:
        streamtrace.compact(tmp_path / "rank0_trace.json", tmp_path / "out.json", jobs=jobs)
    assert f"GPU slice {changed[0]} differs" in str(info.value)
    if jobs == 1:  # workers' calls are seen in their own processes
        assert ("_check_slices" in callers) is whole
    assert not (tmp_path / "out.json").exists()


def test_stream_keys_of_other_events_stay_whatever_the_spacing(tmp_path, monkeypatch):
    """A block's slices have their args.stream swapped by one split of the
    whole block only when no other event holds a "stream" key: here a
    runtime event does, and a slice spells its key with a space before the
    colon (a key pattern blind to that space would count the runtime's key
    as the slice's)."""
    from streamtrace.commands.compactemit import CompactPlan
    lines = ['{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 0, "tid": 1, "ts": 0.5, '
             '"dur": 1, "args": {"stream":3}}',
             '{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1.5, "dur": 1, "args": {"stream" : 7}}',
             '{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 8, "ts": 3.0, "dur": 1, "args": {"stream": 8}}']
    lines += [f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": 1, "ts": {n}, "dur": 1}}'
              for n in range(4, 40)]  # the array's end, which the reading parses itself
    src = tmp_path / "t.json"
    src.write_text('{"traceEvents": [\n' + ",\n".join(lines) + "\n]}")
    monkeypatch.setattr("streamtrace.engine.indexworkers.CHUNK_BYTES", 1024)  # the first lines decoded as projections
    fallbacks = []
    monkeypatch.setattr("streamtrace.engine.indexworkers.chunk_events", lambda text: fallbacks.append(text))
    streamtrace.compact(src, tmp_path / "whole.json")
    assert not fallbacks and b'"cat": "kernel"' in (tmp_path / "whole.json").read_bytes()  # the input's own text
    out = load_json(tmp_path / "whole.json")["traceEvents"]
    assert [event["args"] for event in out if event.get("cat") == "cuda_runtime"] == [{"stream": 3}]
    kernels = [event for event in out if event.get("cat") == "kernel"]
    assert [(e["args"]["stream"], e["args"]["original_stream"]) for e in kernels] == [(e["tid"], n) for e, n in
                                                                                      zip(kernels, (7, 8))]
    monkeypatch.setattr(CompactPlan, "moved_block", lambda plan, block, first: None)
    streamtrace.compact(src, tmp_path / "by_line.json")
    assert (tmp_path / "whole.json").read_bytes() == (tmp_path / "by_line.json").read_bytes()


@pytest.mark.parametrize("original_stream", [True, False])
@pytest.mark.parametrize("layout", ["lines", "kineto"])
def test_blocks_moved_whole_equal_the_line_by_line_patches(generated, generated_kineto, tmp_path, monkeypatch,
                                                           original_stream, layout):
    """Compaction moves most blocks as one text; the same trace through the
    per-line patchers alone gives the same bytes (blocks are cut differently
    at each -j, so a line must come out the same whichever way it went),
    spaces after colons included."""
    from streamtrace.commands.compactemit import CompactPlan
    directory, truth = generated if layout == "lines" else generated_kineto
    src = directory / truth["ranks"][0]["file"]
    monkeypatch.setattr("streamtrace.io.spool.READ_BLOCK", 8192)  # many blocks
    real_moved, outcomes = CompactPlan.moved_block, []
    monkeypatch.setattr(CompactPlan, "moved_block",
                        lambda plan, block, first: outcomes.append(real_moved(plan, block, first)) or outcomes[-1])
    whole = streamtrace.compact(src, tmp_path / "whole.json", jobs=1,  # outcomes are counted in this process
                                original_stream=original_stream)
    moved = [outcome for outcome in outcomes if outcome is not None]
    assert len(moved) > 0.9 * len(outcomes) and any(outcome.keep is not None and 0 in outcome.keep for outcome in moved)
    monkeypatch.setattr(CompactPlan, "moved_block", lambda plan, block, first: None)
    by_line = streamtrace.compact(src, tmp_path / "by_line.json", jobs=1, original_stream=original_stream)
    assert whole == {**by_line, "wall_seconds": whole["wall_seconds"], "pass1_seconds": whole["pass1_seconds"],
                     "plan_seconds": whole["plan_seconds"], "peak_rss_mb": whole["peak_rss_mb"],
                     "output": whole["output"]}
    assert (tmp_path / "whole.json").read_bytes() == (tmp_path / "by_line.json").read_bytes()
