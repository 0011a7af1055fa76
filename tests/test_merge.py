"""``merge``: SPEC 5 conventions on hand-built ranks, real ranks, generated PP runs."""
from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import TRACES, events_of, load_json

from streamtrace import cli, merge
from streamtrace.algo.mergeplan import RankFacts, fresh_pids, pp_order, time_offsets_ns
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

BASE = 1_700_000_000_000_000_000
SLICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset"}


def kernel(name: str, ts: float, dur: float, stream: int, correlation: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": correlation, "device": 0}}


def note(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {}}


def launch(ts: float, correlation: int) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": ts, "dur": 0.5,
             "args": {"correlation": correlation}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": 10, "tid": 11, "ts": ts}]


def finish(ts: float, stream: int, correlation: int) -> dict:
    return {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": 0, "tid": stream, "ts": ts, "bp": "e"}


def rank_file(directory: Path, rank: int, events: list[dict], *, base: int | None, group=(0, 4)) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 8,
                              "pg_config": [{"pg_name": "torchtitan_real_pp", "pg_desc": "pp", "ranks": list(group)}]}
    path = directory / f"rank{rank}_trace.json"
    path.write_text(json.dumps(doc))
    return path


def metadata(pid: int, tid: int, kind: str, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def stage0() -> list[dict]:
    return [metadata(0, 0, "process_name", "GPU 0"), metadata(10, 0, "process_name", "python"),
            {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 5}},
            metadata(10, 11, "thread_name", "main"),
            metadata(3, 0, "process_name", "GPU 3"), metadata(3, 0, "thread_name", "stream 7"),  # no events, named
            {"ph": "M", "name": "process_labels", "pid": 5, "tid": 0, "args": {"labels": "GPU 5"}},  # nor a name
            *launch(0.2, 4), kernel("ncclDevKernel_AllGather", 0.5, 1.0, 9, 4), note("PP:0UNSHARD", 0.5, 1.0, 9),
            *launch(1.0, 5), kernel("gemm", 2.0, 4.0, 7, 5), finish(2.0, 7, 5), note("PP:0F0", 2.0, 4.0, 7),
            *launch(7.0, 6), kernel("ncclDevKernel_SendRecv", 8.0, 2.0, 8, 6), finish(8.0, 8, 6),
            note("PP:0SEND_F0", 8.0, 2.0, 8)]


def stage1() -> list[dict]:
    return [metadata(0, 0, "process_name", "GPU 0"),
            *launch(6.0, 5), kernel("ncclDevKernel_SendRecv", 7.0, 4.0, 8, 5), finish(7.0, 8, 5),
            note("PP:1RECV_F0", 7.0, 4.0, 8),
            *launch(11.0, 6), kernel("gemm", 12.0, 3.0, 7, 6), finish(12.0, 7, 6), note("PP:1F0", 12.0, 3.0, 7),
            note("PP:1RECV_F1", 20.0, 1.0, 8)]  # its send fell outside the capture window


@pytest.fixture
def two_ranks(tmp_path) -> tuple[Path, Path, Path]:
    second = rank_file(tmp_path, 4, stage1(), base=BASE + 1000)
    first = rank_file(tmp_path, 0, stage0(), base=BASE)
    return tmp_path, second, first


def by_pid_names(events: list[dict]) -> dict:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
            and e["args"]["name"].startswith("PP rank") and "global rank" in e["args"]["name"]}


def thread_names(events: list[dict]) -> dict:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e["name"] == "thread_name"}


def test_hand_built_pp_merge_follows_spec_5(two_ranks):
    directory, second, first = two_ranks
    out = directory / "merged.json"
    summary = merge([second, first], out)  # given in the wrong order on purpose
    events = events_of(load_json(out))

    assert summary["pp_order"] == "pp process group"
    assert [(r["pp_rank"], r["global_rank"]) for r in summary["pp_ranks"]] == [(0, 0), (1, 4)]
    assert summary["time_offsets_us"] == {"4": 1.0, "0": 0.0}
    # fresh pids from 1 in PP order, CPU processes first, processes with metadata only next, the GPU last;
    # one process_name per pid, the input's name kept as a suffix: pid 3 has no events but a name, and keeps it;
    # pid 5 has neither (its labels alone would need a name made up): it is left out
    assert by_pid_names(events) == {1: "PP rank 0 (global rank 0) | process 10 | python",
                                    2: "PP rank 0 (global rank 0) | process 3 | GPU 3",
                                    3: "PP rank 0 (global rank 0) | GPU | GPU 0",
                                    4: "PP rank 1 (global rank 4) | process 10", 5: "PP rank 1 (global rank 4) | GPU | GPU 0"}
    names_per_pid = Counter(e["pid"] for e in events if e.get("name") == "process_name")
    assert set(names_per_pid.values()) == {1} and set(names_per_pid) == {1, 2, 3, 4, 5}
    assert not any(e.get("args", {}).get("labels") == "GPU 5" for e in events)
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    assert sort_index == {1: 0, 2: 1, 3: 2, 4: 1000, 5: 1001}  # the input's own sort index was dropped
    names = thread_names(events)
    assert names[(1, 11)] == "PP rank 0 | main" and names[(2, 0)] == "PP rank 0 | stream 7"
    # rank 4 moved by exactly 1 us; correlation and flow ids unique per rank, raw kept
    rank4_gemm = next(e for e in events if e.get("name") == "gemm" and e["pid"] == 5)
    assert Decimal(str(rank4_gemm["ts"])) == Decimal("13.0")
    assert rank4_gemm["args"]["correlation_raw"] == 6 and rank4_gemm["args"]["correlation"] == 5 * 10**9 + 6
    flows = [e for e in events if e.get("cat") == "ac2g"]
    assert {e["id"] for e in flows if e["pid"] in (1, 3)} == {10**9 + 4, 10**9 + 5, 10**9 + 6}
    assert {e["id"] for e in flows if e["pid"] in (4, 5)} == {5 * 10**9 + 5, 5 * 10**9 + 6}

    arrows = defaultdict(list)
    for e in events:
        if e.get("cat", "").startswith("pp_"):
            arrows[(e["cat"], e["id"])].append(e)
    pairs = {cat_id[0]: [] for cat_id in arrows}
    for (cat, _), (start, end) in arrows.items():
        pairs[cat].append((start, end))
    (send, recv), = pairs["pp_send_recv"]
    assert send["name"] == "0SEND_F0 -> 1RECV_F0" and (send["pid"], recv["pid"]) == (3, 5)
    assert recv["ts"] > send["ts"] == 8.0  # strictly forward although RECV started at the same time
    assert names[(send["pid"], send["tid"])] == "PP rank 0 | NCCL other annotations"
    assert names[(recv["pid"], recv["tid"])] == "PP rank 1 | NCCL other annotations"
    assert send["args"]["source_pp_rank"] == 0 and recv["args"]["destination_pp_rank"] == 1
    assert {s["name"] for s, _ in pairs["pp_compute_dependency"]} == {"0F0 -> 0SEND_F0", "1RECV_F0 -> 1F0"}
    for start, end in pairs["pp_compute_dependency"]:
        assert names[(end["pid"], end["tid"])].endswith("annotations") and end["ph"] == "f" and start["ph"] == "s"
    (unshard, compute), = pairs["pp_unshard_dependency"]
    assert unshard["name"] == "0UNSHARD -> 0F0" and compute["ts"] == 2.0
    assert names[(unshard["pid"], unshard["tid"])] == "PP rank 0 | NCCL all-gather annotations"
    assert names[(compute["pid"], compute["tid"])] == "PP rank 0 | Compute annotations"
    assert summary["pp_unshard_compute_pairs"] == 1 and summary["pp_unshard_compute_unmatched"] == 0
    assert summary["pp_send_recv_pairs"] == 1 and summary["pp_send_recv_unmatched"] == 1  # the orphan RECV_F1
    assert summary["pp_compute_dependency_pairs"] == 2 and summary["pp_compute_dependency_unmatched"] == 1
    assert summary["per_rank_compaction"]["4"]["measured_slices"] == 2
    ids = [e["id"] for e in events if e.get("cat", "").startswith("pp_")]
    assert min(ids) > max(e["id"] for e in flows)


def annotated(name: str, stream: int, ts: float, dur: float = 1.0, label: str | None = None,
              cat: str = "kernel") -> dict:
    """A GPU slice carrying a per-kernel annotation in ``args.name``, as torchtitan's captures have."""
    args = {"stream": stream} if label is None else {"stream": stream, "name": label}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def stage_of_torchtitan_shape(stage: int, shift: float) -> list[dict]:
    """One PP stage as torchtitan's compactor tests build it: UNSHARD on two
    all-gather streams, F spread over parallel compute streams and a memcpy,
    an unannotated kernel between, a SEND (stage 0) or RECV (stage 1) with an
    ac2g flow end on it."""
    compute = f"PP:{stage}F0"
    send_recv = [annotated("ncclDevKernel_SendRecv", 1, 10, 4, "PP:0SEND_F0")] if stage == 0 else \
        [annotated("ncclDevKernel_SendRecv", 1, 8, 5, "PP:1RECV_F0")]
    return [annotated("ncclDevKernel_AllGather", 6, 1, 4, f"PP:{stage}UNSHARD"),
            annotated("ncclDevKernel_AllGather", 7, 2, 2, f"PP:{stage}UNSHARD"),
            annotated("gemm", 2, 4 + shift, 1, compute), annotated("gemm", 3, 4.5 + shift, 4, compute),
            annotated("gemm", 5, 6 + shift), annotated("gemm", 2, 8 + shift, 1, compute),
            annotated("Memcpy DtoD", 4, 3.5 + shift, 2, compute, cat="gpu_memcpy"),
            *send_recv, {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 1,
                         "ts": send_recv[0]["ts"]}]


def test_torchtitan_merge_conventions_hold(tmp_path):
    """What torchtitan's own merge test checks: each rank's CPU process sorts
    above its GPU (here a process known only by a thread name), arrows sit on
    annotation tracks and land inside the block they name, UNSHARD arrows leave
    the first two all-gather tracks and meet one point of the main compute
    track, ids stay integers, rank 4 moves by its 1 us of base time."""
    threads_only = metadata(100, 100, "thread_name", "thread 100 (python) 100")
    files = [rank_file(tmp_path, 4, stage_of_torchtitan_shape(1, 10), base=1_001_000),
             rank_file(tmp_path, 0, [threads_only, *stage_of_torchtitan_shape(0, 0)], base=1_000_000)]
    summary = merge(files, tmp_path / "merged.json")
    events = events_of(load_json(tmp_path / "merged.json"))
    names = thread_names(events)
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    cpu_pid, = (pid for (pid, _), name in names.items() if name == "PP rank 0 | thread 100 (python) 100")
    kernel_of = {e["args"]["name"]: e for e in events if e.get("cat") == "kernel" and "name" in e["args"]}
    assert sort_index[cpu_pid] < sort_index[kernel_of["PP:0F0"]["pid"]]
    assert (kernel_of["PP:0SEND_F0"]["ts"], kernel_of["PP:1RECV_F0"]["ts"]) == (10, 9)
    assert "PP rank 0 | NCCL other" in names.values() and "PP rank 1 | NCCL other" in names.values()
    assert summary["time_alignment"] == "baseTimeNanoseconds" and summary["time_offsets_us"] == {"0": 0.0, "4": 1.0}
    ac2g = [e for e in events if e.get("cat") == "ac2g"]
    assert len({e["id"] for e in ac2g}) == 2 and all(type(e["id"]) is int for e in ac2g)

    spans = [e for e in events if e.get("cat") == "gpu_user_annotation"]

    def inside_its_block(end: dict, side: str) -> bool:
        args = end["args"]
        op = args[f"{side}_operation"]
        label = f"PP:{args[f'{side}_stage']}{op}" + ("" if op == "UNSHARD" else str(args["microbatch"]))
        return any((s["pid"], s["tid"], s["name"]) == (end["pid"], end["tid"], label)
                   and s["ts"] <= end["ts"] <= s["ts"] + s["dur"] for s in spans)

    arrows = defaultdict(list)
    for e in events:
        if e.get("cat", "").startswith("pp_"):
            arrows[e["cat"]].append(e)
            assert type(e["id"]) is int and inside_its_block(e, "source" if e["ph"] == "s" else "destination")
    send, recv = arrows["pp_send_recv"]
    assert (send["ph"], recv["ph"], send["id"]) == ("s", "f", recv["id"]) and send["ts"] < recv["ts"]
    assert send["tid"] != kernel_of["PP:0SEND_F0"]["tid"]  # on the annotation track, not the kernel's lane
    assert {e["name"] for e in arrows["pp_compute_dependency"]} == {"0F0 -> 0SEND_F0", "1RECV_F0 -> 1F0"}
    compute_ends = [e for e in arrows["pp_compute_dependency"]
                    if e["args"]["source_operation" if e["ph"] == "s" else "destination_operation"] == "F"]
    assert len(compute_ends) == 2
    assert all(names[(e["pid"], e["tid"])].endswith("| Compute 1 annotations") for e in compute_ends)
    unshard = arrows["pp_unshard_dependency"]
    assert {e["name"] for e in unshard} == {"0UNSHARD -> 0F0", "1UNSHARD -> 1F0"}
    assert {names[(e["pid"], e["tid"])].rsplit(" | ", 1)[1] for e in unshard if e["ph"] == "s"} == \
        {"NCCL all-gather 1 annotations", "NCCL all-gather 2 annotations"}
    for name in ("0UNSHARD -> 0F0", "1UNSHARD -> 1F0"):
        ends = [e for e in unshard if e["name"] == name and e["ph"] == "f"]
        assert len(ends) == 2 and len({(e["pid"], e["tid"], e["ts"]) for e in ends}) == 1
        assert names[(ends[0]["pid"], ends[0]["tid"])].endswith("| Compute 1 annotations")
    assert [summary[key] for key in ("pp_send_recv_pairs", "pp_send_recv_unmatched", "pp_compute_dependency_pairs",
                                     "pp_compute_dependency_unmatched", "pp_unshard_compute_pairs",
                                     "pp_unshard_compute_unmatched")] == [1, 0, 2, 0, 4, 0]


def test_default_output_name_and_refusals(two_ranks, tmp_path):
    directory, second, first = two_ranks
    summary = merge(directory)
    assert summary["output"] == str(directory / "pp_traces_merged_compacted.json.gz")
    with pytest.raises(TraceError, match="exists"):
        merge(directory)
    twin = directory / "copy"
    twin.mkdir()
    (twin / "rank_zero.json").write_bytes(first.read_bytes())
    with pytest.raises(TraceError, match=r"global rank 0 appears twice: .*rank0_trace.json and .*rank_zero.json"):
        merge([first, second, twin / "rank_zero.json"], tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
    with pytest.raises(TraceError, match="at least two"):
        merge([first], tmp_path / "out.json")


def test_relative_times_without_base_warn_once_with_the_count_of_files(tmp_path):
    rank_file(tmp_path, 0, stage0(), base=BASE)
    rank_file(tmp_path, 4, stage1(), base=None)  # ts of a few us: relative, and no base to place them
    summary = merge(tmp_path, tmp_path / "out.json", ranks="0-4")
    assert summary["time_offsets_us"]["4"] == 0.0
    assert len(summary["warnings"]) == 1 and summary["warnings"][0].startswith("1 of 2 files have neither")


def test_absolute_timestamps_need_no_offset_and_join_based_ranks_on_their_clock():
    epoch_us = 1_694_128_201_426_602  # DLRM's first ts: epoch microseconds, no base
    absolute = RankFacts("a", 1, None, None, [0], {0}, 1, first_ts=epoch_us)
    based = RankFacts("b", 0, BASE, None, [0], {0}, 1, first_ts=5_000_000.0)
    assert time_offsets_ns([absolute, absolute]) == ([0, 0], None, [], "absolute timestamps")
    offsets, common, warnings, alignment = time_offsets_ns([absolute, based])
    # the based rank's absolute time is BASE + ts: the absolute rank moves onto that clock by -BASE
    assert (offsets, common, warnings) == ([-BASE, 0], BASE, [])
    assert alignment == "baseTimeNanoseconds and absolute timestamps"


@pytest.mark.slow
def test_real_dlrm_directory_merges_by_content_on_absolute_time(tmp_path):
    directory = TRACES / "dlrm_8ranks"
    out = tmp_path / "merged.json.gz"
    summary = merge(directory, out, compact=False)
    assert [entry["global_rank"] for entry in summary["pp_ranks"]] == list(range(8))
    assert {entry["rank_from"] for entry in summary["pp_ranks"]} == {"distributedInfo.rank"}
    assert summary["warnings"] == [] and summary["time_alignment"] == "absolute timestamps"
    assert set(summary["time_offsets_us"].values()) == {0.0}
    events = events_of(load_json(out))
    inputs = [events_of(load_json(path)) for path in sorted(directory.iterdir())]
    kernel_times = sorted(e["ts"] for rank in inputs for e in rank if e.get("cat") == "kernel")
    assert sorted(e["ts"] for e in events if e.get("cat") == "kernel") == kernel_times  # not shifted
    busy = {e["pid"] for e in events if e.get("ph") != "M"}
    named = Counter(e["pid"] for e in events if e.get("name") == "process_name")
    assert len({pid for pid in busy if isinstance(pid, int)}) == 16  # each rank: its CPU process and GPU 0
    assert set(named.values()) == {1}
    # every process and thread an input names keeps its name, renamed, events or not (Kineto names every GPU
    # of the machine; tools find tracks by these names)
    for rank, trace in enumerate(inputs):
        declared = [e for e in trace if e.get("ph") == "M" and isinstance(e.get("pid"), int)]
        assert len({e["pid"] for e in declared}) == 9  # its CPU process and the machine's 8 GPUs
        gpu = {e["pid"] for e in trace if e.get("cat") == "kernel"}
        merged_processes = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name"
                                  and e["args"]["name"].startswith(f"rank {rank} | "))
        assert merged_processes == sorted(f"rank {rank} | " + ("GPU" if e["pid"] in gpu else f"process {e['pid']}")
                                          + f" | {e['args']['name']}" for e in declared if e["name"] == "process_name")
        merged_threads = sorted(e["args"]["name"] for e in events if e.get("name") == "thread_name"
                                and e["args"]["name"].startswith(f"rank {rank} | "))
        assert merged_threads == sorted(f"rank {rank} | {e['args']['name']}" for e in declared
                                        if e["name"] == "thread_name")


def test_directory_without_rank_files_lists_them_and_suggests_a_glob(tmp_path):
    for name in ("a.json", "notes.txt"):
        (tmp_path / name).write_text('{"traceEvents": []}')
    with pytest.raises(TraceError) as caught:
        merge(tmp_path, tmp_path / "out.json")
    message = str(caught.value)
    assert "seen: a.json, notes.txt" in message and f"'{tmp_path}/*.json*'" in message
    assert "\n" not in message


def test_an_input_that_already_merges_ranks_is_refused(tmp_path):
    documents = [load_json(TRACES / f"sampled_rank-{rank}.json.gz") for rank in (0, 1)]
    naive = dict(documents[0])
    naive["traceEvents"] = documents[0]["traceEvents"] + documents[1]["traceEvents"]
    (tmp_path / "naive.json").write_text(json.dumps(naive))
    with pytest.raises(TraceError, match=r"naive.json: holds several ranks \(0, 1\).*split") as caught:
        merge([tmp_path / "naive.json", TRACES / "sampled_rank-1.json.gz"], tmp_path / "out.json")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out.json").exists()


def test_no_compact_and_global_rank_order(tmp_path):
    rank_file(tmp_path, 0, stage0(), base=BASE, group=(9, 10))  # PP groups that do not hold the ranks
    rank_file(tmp_path, 4, stage1(), base=BASE, group=(9, 10))
    summary = merge(tmp_path, tmp_path / "out.json", compact=False)
    assert summary["pp_order"].startswith("global rank order")
    assert summary["per_rank_compaction"] == {"0": None, "4": None}
    events = events_of(load_json(tmp_path / "out.json"))
    streams = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "kernel"}
    assert streams == {(3, 7), (3, 8), (3, 9), (5, 7), (5, 8)}  # streams kept (the GPU after the named process 3)
    assert summary["pp_send_recv_pairs"] == 1


def test_pure_decisions():
    facts = [RankFacts("b", 4, BASE + 2000, [0, 4], [0, 10, "x"], {0}, 7),
             RankFacts("a", 0, BASE, [0, 4], [0, 10], {0}, 9)]
    assert pp_order(facts)[0] == [1, 0]
    assert time_offsets_ns(facts)[:2] == ([2000, 0], BASE)
    assert fresh_pids([facts[1], facts[0]]) == [{10: 1, 0: 2}, {10: 3, 0: 4}]
    facts[1].pids, facts[1].metadata_only = [0, 3, 10], {3}  # GPU last, metadata only before it
    assert fresh_pids([facts[1]]) == [{10: 1, 3: 2, 0: 3}]


MERGED_PROCESS = re.compile(r"^(?:PP rank \d+ \(global rank (\d+)\)|rank (\d+)) \| (?:GPU|process )")


def rank_of_pid(events: list[dict]) -> dict:
    """Merged pid -> global rank, from the process names the merge adds."""
    ranks = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            match = MERGED_PROCESS.match(e["args"]["name"])
            if match:
                ranks[e["pid"]] = int(match.group(1) or match.group(2))
    return ranks


def assert_ids_rank_correct(events: list[dict], multiplier: int) -> None:
    """No correlation or flow id shared by two ranks; each flow and each GPU
    event's correlation lead to a launch of its own rank."""
    owner = rank_of_pid(events)
    launches = {}
    for e in events:
        corr = e.get("args", {}).get("correlation") if isinstance(e.get("args"), dict) else None
        if corr is not None and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            assert corr // multiplier - 1 == owner[e["pid"]]
            launches[corr] = owner[e["pid"]]
    gpu_with_launch = 0
    for e in events:
        if e.get("cat") in SLICE_CATS:
            corr = e["args"]["correlation"]
            assert corr // multiplier - 1 == owner[e["pid"]]
            if corr in launches:
                assert launches[corr] == owner[e["pid"]]
                gpu_with_launch += 1
        if e.get("cat") == "ac2g":
            assert e["id"] // multiplier - 1 == owner[e["pid"]]
            if e["ph"] == "f":
                assert launches[e["id"]] == owner[e["pid"]]
    assert gpu_with_launch > 0


def test_real_sampled_ranks_merge_rank_correct(tmp_path):
    files = [TRACES / "sampled_rank-0.json.gz", TRACES / "sampled_rank-1.json.gz"]
    out = tmp_path / "merged.json.gz"
    summary = merge(files, out)
    events = events_of(load_json(out))
    assert summary["events_read"] == sum(len(events_of(load_json(f))) for f in files)
    assert summary["pp_order"].startswith("global rank order")
    assert_ids_rank_correct(events, summary["id_multiplier"])
    raw = [events_of(load_json(f)) for f in files]
    assert sum(1 for e in events if e.get("cat") in SLICE_CATS) == sum(
        1 for rank in raw for e in rank if e.get("cat") in SLICE_CATS)


@pytest.mark.parametrize("schedule", ["zb", "1f1b"])
def test_generated_pp_run_arrows_match_the_schedule(tmp_path, schedule):
    cfg = SynthConfig(ranks=8, pp_stages=4, microbatches=8, schedule=schedule, steps=1, graph_streams=24,
                      graph_kernels=24, eager_kernels=4, python_noise=1, base_skew_ns=1500)
    truth = write_traces(cfg, tmp_path, compress="gz", merged=False)
    out = tmp_path / "merged.json.gz"
    summary = merge(tmp_path, out, jobs=2)
    counts = defaultdict(int)
    for rank in truth["ranks"]:
        for op, n in rank["pp_action_counts"].items():
            counts[op] += n
    sends = counts["SEND_F"] + counts["SEND_B"]
    comms = sends + counts["RECV_F"] + counts["RECV_B"]
    assert summary["pp_send_recv_pairs"] == sends > 0
    assert summary["pp_compute_dependency_pairs"] == comms
    assert summary["pp_unshard_compute_pairs"] == counts["UNSHARD"]
    assert [summary[k] for k in summary if k.endswith("_unmatched")] == [0, 0, 0]
    assert summary["time_offsets_us"] == {str(r): r * 1.5 for r in range(8)}
    events = events_of(load_json(out))
    assert_ids_rank_correct(events, summary["id_multiplier"])
    owner = rank_of_pid(events)
    stage_of = {rank["rank"]: rank["pp_stage"] for rank in truth["ranks"]}
    group_of = {rank["rank"]: tuple(rank["pp_group"]) for rank in truth["ranks"]}
    pairs = defaultdict(dict)
    for e in events:
        if e.get("cat") == "pp_send_recv":
            pairs[e["id"]][e["ph"]] = e
    for pair in pairs.values():
        source, target = owner[pair["s"]["pid"]], owner[pair["f"]["pid"]]
        assert group_of[source] == group_of[target]  # never across data-parallel replicas
        assert abs(stage_of[source] - stage_of[target]) == 1
        assert pair["f"]["ts"] > pair["s"]["ts"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith("streamtrace-")]


@pytest.mark.parametrize("chosen, missing", [({0, 1}, [2, 3, 4, 5, 6, 7]), ({0, 2}, [4, 6])])
def test_send_recv_whose_peer_stage_was_not_merged_say_so(chosen, missing, tmp_path, capsys):
    cfg = SynthConfig(ranks=8, pp_stages=4, microbatches=2, steps=1, graph_streams=4, graph_kernels=4,
                      eager_kernels=2, python_noise=0)
    truth = write_traces(cfg, tmp_path / "run", compress="none", merged=False)
    ranks = ",".join(map(str, sorted(chosen)))
    summary = merge(tmp_path / "run", tmp_path / "part.json", ranks=ranks)
    stages = {rank["rank"]: rank["pp_stage"] for rank in truth["ranks"] if rank["rank"] in chosen}
    counts = {rank["rank"]: rank["pp_action_counts"] for rank in truth["ranks"] if rank["rank"] in chosen}
    # sends and receives aimed at a stage none of the chosen ranks of their pipeline holds: peers absent
    groups = {rank["rank"]: tuple(rank["pp_group"]) for rank in truth["ranks"]}
    present = {(groups[rank], stage) for rank, stage in stages.items()}
    absent = sum(counts[rank].get(op, 0) for rank, stage in stages.items()
                 for op, peer in (("SEND_F", stage + 1), ("RECV_F", stage - 1), ("SEND_B", stage - 1),
                                  ("RECV_B", stage + 1)) if (groups[rank], peer) not in present)
    assert summary["pp_send_recv_peer_stage_absent"] == absent > 0
    assert summary["pp_send_recv_unmatched"] == 0
    assert summary["pp_ranks_not_merged"] == missing
    assert cli.main(["merge", str(tmp_path / "run"), "--ranks", ranks, "-o", str(tmp_path / "cli.json"), "-q"]) == 0
    report = capsys.readouterr().out
    assert f"{absent} SEND/RECV blocks have their peer stage on ranks not merged (global ranks " \
           f"{', '.join(map(str, missing))})" in report
    assert "capture window" not in report
    whole = merge(tmp_path / "run", tmp_path / "whole.json")
    assert whole["pp_send_recv_peer_stage_absent"] == 0 and whole["pp_ranks_not_merged"] == []


@pytest.mark.slow
def test_text_splices_equal_the_decoded_rewrite(tmp_path, monkeypatch):
    """Pass 2 splices numeric fields (pid, tid, shifted ts, ids) in the text,
    block by block; compaction's per-line patches and then decoding every
    line must give the same events, number text included."""
    from streamtrace.commands.mergeemit import MergePlan
    cfg = SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1, graph_streams=8, graph_kernels=8,
                      base_skew_ns=1_537)
    write_traces(cfg, tmp_path, compress="none", merged=False)
    decoded_lines, single_lines = [], []
    real_decoded, real_single = MergePlan._decoded, MergePlan._rewrite_line
    monkeypatch.setattr(MergePlan, "_decoded", lambda plan, line: decoded_lines.append(line) or real_decoded(plan, line))
    monkeypatch.setattr(MergePlan, "_rewrite_line", lambda plan, line: single_lines.append(line) or real_single(plan, line))
    monkeypatch.setattr("streamtrace.io.spool.READ_BLOCK", 4096)  # blocks of ~20 lines
    summary = merge(tmp_path, tmp_path / "text.json", jobs=1)  # the calls are counted in this process
    assert sorted(summary["time_offsets_us"].values()) == [0, 1.537]
    assert 0 < len(decoded_lines) < summary["events_written"] / 20  # metadata only: the rest is spliced
    assert len(single_lines) < summary["events_written"] / 5  # blocks with metadata; the rest block by block
    monkeypatch.setattr(MergePlan, "_rewrite_line", real_decoded)
    monkeypatch.setattr(MergePlan, "_rewrite_block", lambda *args: None)
    merge(tmp_path, tmp_path / "decoded.json", jobs=1)
    spliced, decoded = (events_of(json.loads((tmp_path / name).read_bytes(), parse_float=Decimal))
                        for name in ("text.json", "decoded.json"))
    assert len(spliced) == len(decoded) > 1000
    assert spliced == decoded


@pytest.mark.slow
def test_parallel_indexing_gives_the_same_file(tmp_path):
    cfg = SynthConfig(ranks=4, pp_stages=2, microbatches=4, steps=1, graph_streams=8, graph_kernels=8)
    write_traces(cfg, tmp_path, compress="gz", merged=False)
    one = merge(tmp_path, tmp_path / "one.json", jobs=1)
    two = merge(tmp_path, tmp_path / "two.json", jobs=2)
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "two.json").read_bytes()
    assert one["pp_send_recv_pairs"] == two["pp_send_recv_pairs"] > 0
