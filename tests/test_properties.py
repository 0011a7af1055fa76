"""Property tests: random valid multi-rank traces through every trace-rewriting command.

A command plugs in as one :class:`Adapter` (how to run it on per-rank event
lists, and which invariants it promises).  ``merge`` and ``relink`` are
listed already and are skipped until their library functions exist.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compact import SLICE_CATS, check_invariants

import streamtrace

pytestmark = pytest.mark.slow  # random multi-rank traces through every command (fuzzing)

KINDS = [("kernel", "gemm_bf16"), ("kernel", "ncclDevKernel_AllGather_RING_LL"),
         ("kernel", "ncclDevKernel_ReduceScatter_Sum"), ("Kernel", "elementwise_add"),
         ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)"), ("gpu_memset", "Memset (Device)")]
KERNEL_LABELS = [None, None, "PP:0F0", "PP:0B0", "layers.0"]
ANNOTATION_NAMES = ["PP:0F0", "PP:0B0", "PP:0SEND_F0", "PP:0RECV_B0", "PP:0UNSHARD", "nccl:all_gather"]
times = st.integers(0, 300_000).map(lambda ns: ns / 1000)
durations = st.integers(0, 40_000).map(lambda ns: ns / 1000)
BASE_TIME_NS = 1767189312000000000
CPU_PID_BASE = 1000


def cpu_pid(rank: int) -> int:
    return CPU_PID_BASE + rank


def meta(name: str, pid: int, tid: int, value: object, key: str = "name") -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {key: value}}


@st.composite
def rank_events(draw, rank: int) -> list[dict]:
    """One rank's events: launches (eager and graph replays over random
    streams, overlapping freely), ac2g flows (some dangling), GPU annotations
    and per-kernel labels.  Correlation ids restart at 1 in every rank, as in
    real merged files."""
    gpu, cpu = rank, cpu_pid(rank)
    streams = draw(st.lists(st.integers(1, 60), min_size=1, max_size=6, unique=True))
    events = [meta("process_name", gpu, 0, f"RANK {rank} - GPU 0"), meta("process_name", cpu, 0, f"RANK {rank} - CPU")]
    events += [meta("thread_name", gpu, stream, f"stream {stream}") for stream in streams]
    for correlation in range(1, draw(st.integers(1, 8)) + 1):
        graph = draw(st.booleans())
        launch = draw(times)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch" if graph else "cudaLaunchKernel",
                       "pid": cpu, "tid": cpu, "ts": launch, "dur": 1.0, "args": {"correlation": correlation}})
        events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": cpu, "tid": cpu,
                       "ts": launch})
        for _ in range(draw(st.integers(1, 5)) if graph else 1):
            cat, name = draw(st.sampled_from(KINDS))
            stream = draw(st.sampled_from(streams))
            start = launch + 1 + draw(durations)
            args = {"stream": stream, "correlation": correlation, "device": gpu}
            label = draw(st.sampled_from(KERNEL_LABELS))
            if label:
                args["name"] = label
            events.append({"ph": "X", "cat": cat, "name": name, "pid": gpu, "tid": stream, "ts": start,
                           "dur": draw(durations), "args": args})
            flow = draw(st.sampled_from(["matched", "matched", "dangling", "none"]))
            if flow != "none":
                events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": gpu,
                               "tid": stream, "ts": start if flow == "matched" else start + 0.0005, "bp": "e"})
    for _ in range(draw(st.integers(0, 4))):
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": draw(st.sampled_from(ANNOTATION_NAMES)),
                       "pid": gpu, "tid": draw(st.sampled_from(streams)), "ts": draw(times), "dur": draw(durations),
                       "args": {}})
    return draw(st.permutations(events))


def traces(min_ranks: int = 1, max_ranks: int = 3) -> st.SearchStrategy[list[list[dict]]]:
    return st.integers(min_ranks, max_ranks).flatmap(lambda k: st.tuples(*(rank_events(r) for r in range(k))))


def write_rank_file(path: Path, rank: int, events: list[dict], world: int) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": BASE_TIME_NS, "traceEvents": events,
                                "distributedInfo": {"rank": rank, "world_size": world}}))
    return path


def write_merged_file(path: Path, ranks: list[list[dict]]) -> Path:
    """All ranks in one file, as merging tools write them (pids distinct, ids colliding)."""
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE_TIME_NS,
                                "traceEvents": [event for events in ranks for event in events]}))
    return path


def load(path: Path) -> list[dict]:
    with open(path, "rb") as handle:
        return json.load(handle)["traceEvents"]  # json.load: the output must be plain valid JSON


@dataclass(frozen=True)
class Adapter:
    """One command under the property tests.

    ``run(workdir, ranks)`` returns the output events and the summary.
    ``compacts``: slices are repacked into lanes (lanes never overlap, ac2g
    endpoints land on slice lanes).  ``rank_of_pid`` (output pid -> rank) is
    set for commands that promise no correlation or flow id shared across ranks.
    """

    name: str
    run: Callable[[Path, list[list[dict]]], tuple[list[dict], dict]]
    compacts: bool
    min_ranks: int = 1
    rank_of_pid: Callable[[list[dict]], dict] | None = None


def run_compact(workdir: Path, ranks: list[list[dict]]) -> tuple[list[dict], dict]:
    source = write_merged_file(workdir / "merged.json", ranks)
    summary = streamtrace.compact(source, workdir / "out.json", overwrite=True)
    return load(workdir / "out.json"), summary


def run_merge(workdir: Path, ranks: list[list[dict]]) -> tuple[list[dict], dict]:
    files = [write_rank_file(workdir / f"rank{r}_trace.json", r, events, len(ranks)) for r, events in enumerate(ranks)]
    summary = streamtrace.merge(files, workdir / "out.json", overwrite=True)
    return load(workdir / "out.json"), summary


def run_relink(workdir: Path, ranks: list[list[dict]]) -> tuple[list[dict], dict]:
    source = write_merged_file(workdir / "merged.json", ranks)
    summary = streamtrace.relink(source, workdir / "out.json", overwrite=True)
    return load(workdir / "out.json"), summary


def ranks_from_process_names(events: list[dict]) -> dict:
    """Output pid -> global rank, from process_name metadata (``RANK 3 ...`` or ``(global rank 3)``)."""
    found = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            match = re.search(r"(?:global rank|RANK) (\d+)", str(event.get("args", {}).get("name")))
            if match:
                found[event["pid"]] = int(match.group(1))
    return found


ADAPTERS = [
    Adapter("compact", run_compact, compacts=True),
    Adapter("merge", run_merge, compacts=True, min_ranks=2, rank_of_pid=ranks_from_process_names),
    Adapter("relink", run_relink, compacts=False, rank_of_pid=ranks_from_process_names),
]


def slice_identity(event: dict) -> tuple:
    """A measured slice minus what commands may change: placement (and the stream it came from, which
    compaction adds) and (rank-unique) correlation ids."""
    args = {k: v for k, v in event.get("args", {}).items()
            if k not in ("stream", "original_stream", "correlation", "correlation_raw")}
    return (event.get("name"), event.get("cat"), event.get("ts"), event.get("dur"), json.dumps(args, sort_keys=True))


def check_lanes(out: list[dict]) -> None:
    """Lanes never overlap, and every ac2g endpoint on a GPU pid sits on a lane holding slices."""
    lanes = defaultdict(list)
    for event in out:
        if event.get("cat") in SLICE_CATS and event.get("ph") == "X":
            lanes[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    gpu_pids = {pid for pid, _ in lanes}
    for event in out:
        if event.get("cat") == "ac2g" and event.get("ph") == "f" and event.get("pid") in gpu_pids:
            assert (event["pid"], event["tid"]) in lanes, event


def check_ids_per_rank(out: list[dict], rank_of_pid: dict) -> None:
    """No correlation id and no ac2g flow id is used by two ranks."""
    owners: dict[tuple, set] = defaultdict(set)
    for event in out:
        rank = rank_of_pid.get(event.get("pid"))
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if "correlation" in args:
            owners[("correlation", args["correlation"])].add(rank)
        if event.get("cat") == "ac2g":
            owners[("flow", event.get("id"))].add(rank)
    shared = {key: ranks for key, ranks in owners.items() if len(ranks) > 1}
    assert not shared


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda adapter: adapter.name)
def test_random_traces_keep_every_promise(adapter, tmp_path):
    if not hasattr(streamtrace, adapter.name):
        pytest.skip(f"streamtrace.{adapter.name} is not on this branch yet")

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
    @given(ranks=traces(adapter.min_ranks))
    def check(ranks):
        out, summary = adapter.run(tmp_path, [list(events) for events in ranks])
        source = [event for events in ranks for event in events]
        before = sorted(slice_identity(e) for e in source if e.get("cat") in SLICE_CATS)
        after = sorted(slice_identity(e) for e in out if e.get("cat") in SLICE_CATS and e.get("ph") == "X")
        assert after == before
        if adapter.name == "compact":
            check_invariants(source, out, summary)
        if adapter.compacts:
            check_lanes(out)
        if adapter.rank_of_pid is not None:
            check_ids_per_rank(out, adapter.rank_of_pid(out))

    check()
