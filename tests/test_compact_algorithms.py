"""Pure compaction algorithms against obviously-correct oracles."""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.algo import lanes as lanes_module
from streamtrace.algo.lanes import (
    NO_MATCH,
    NONE,
    Clusters,
    coalesce,
    first_overlap,
    label_runs,
    nearest_in_runs,
    pack_lanes,
    partition,
    start_order,
    starting_in_runs,
)
from streamtrace.algo.pparrows import ArrowMaker, Block, Span, find_blocks, local_arrows
from streamtrace.algo.rules import DEFAULT_RULES_TOML, parse_rules
from streamtrace.errors import TraceError
from streamtrace.io.configfiles import load_rules

# Times are small integers (ties, equal starts and ends, touching spans) or
# doubles with many decimals; durations include zero.
times = st.one_of(st.integers(0, 30).map(float), st.floats(0, 1e4, allow_nan=False, allow_infinity=False))
durations = st.one_of(st.just(0.0), st.integers(1, 8).map(float), st.floats(0, 50, allow_nan=False, allow_infinity=False))
spans = st.lists(st.tuples(times, durations), max_size=60)
chunk_sizes = st.sampled_from([1, 2, 3, 7, 1 << 15])  # every chunk boundary case, and one chunk
intervals = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10)), min_size=1, max_size=60)


@contextmanager
def chunks_of(size: int, peel_lanes: int | None = None):
    """Run the chunked sweeps ``size`` items at a time (and peel at most ``peel_lanes`` lanes a chunk)."""
    saved = lanes_module.CHUNK, lanes_module.QUERY_BLOCK, lanes_module.PEEL_LANES
    lanes_module.CHUNK, lanes_module.QUERY_BLOCK = size, 2 * size
    lanes_module.PEEL_LANES = peel_lanes or saved[2]
    try:
        yield
    finally:
        lanes_module.CHUNK, lanes_module.QUERY_BLOCK, lanes_module.PEEL_LANES = saved


def columns(raw: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (start + duration, as a double sum) of (start, duration) pairs."""
    return np.array([start for start, _ in raw], float), np.array([start + duration for start, duration in raw], float)


def sorted_order(starts, ends) -> list[int]:
    return sorted(range(len(starts)), key=lambda i: (starts[i], ends[i], i))


def max_depth(spans: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (touching ones do not overlap): the
    lower bound on lanes, which greedy packing must reach."""
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def lowest_free_lanes(order, starts, ends) -> tuple[list[int], int]:
    """Oracle: each slice in order takes the lowest lane whose last slice ended at or before its start."""
    last_ends: list[float] = []
    lanes = [0] * len(starts)
    for item in order:
        lane = next((lane for lane, end in enumerate(last_ends) if end <= starts[item]), len(last_ends))
        if lane == len(last_ends):
            last_ends.append(0.0)
        last_ends[lane] = ends[item]
        lanes[item] = lane
    return lanes, len(last_ends)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(raw=spans, keys=st.lists(st.integers(0, 3), min_size=60, max_size=60), chunk=chunk_sizes)
def test_start_order_and_partition_equal_plain_sorts(raw, keys, chunk):
    starts, ends = columns(raw)
    keys = np.array(keys[:len(raw)], np.int32)
    expected = sorted_order(starts, ends)
    with chunks_of(chunk):
        order = start_order(starts, ends)
        perm, offsets = partition(order, keys, 4)
        identity, identity_offsets = partition(None, keys, 4)
    assert order.tolist() == expected
    for key in range(4):
        assert perm[offsets[key]:offsets[key + 1]].tolist() == [i for i in expected if keys[i] == key]
        assert identity[identity_offsets[key]:identity_offsets[key + 1]].tolist() == \
            [i for i in range(len(raw)) if keys[i] == key]


@settings(max_examples=300, deadline=None)
@given(raw=spans, chunk=chunk_sizes, peel_lanes=st.sampled_from([1, 2, 16]))
def test_packing_gives_the_lowest_free_lane(raw, chunk, peel_lanes):
    starts, ends = columns(raw)
    order = start_order(starts, ends)
    lanes = np.zeros(len(raw), np.int32)
    with chunks_of(chunk, peel_lanes):
        used = pack_lanes(order, starts, ends, lanes)
        assert first_overlap(order, starts, ends, lanes) is None
    assert (lanes.tolist(), used) == lowest_free_lanes(sorted_order(starts, ends), starts, ends)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_packing_uses_the_minimum_number_of_lanes_and_never_overlaps(raw):
    starts, ends = columns([(float(s), float(d)) for s, d in raw])
    lanes = np.zeros(len(raw), np.int32)
    used = pack_lanes(start_order(starts, ends), starts, ends, lanes)
    assert used == max_depth(list(zip(starts.tolist(), ends.tolist())))
    for lane in range(used):
        members = sorted((starts[i], ends[i]) for i in range(len(raw)) if lanes[i] == lane)
        assert all(a[1] <= b[0] for a, b in zip(members, members[1:]))


def first_overlap_oracle(order, starts, ends, lanes) -> int | None:
    last_end: dict[int, float] = {}
    for item in order:
        if starts[item] < last_end.get(lanes[item], -math.inf):
            return item
        last_end[lanes[item]] = max(last_end.get(lanes[item], -math.inf), ends[item])
    return None


@settings(max_examples=300, deadline=None)
@given(raw=spans, lanes=st.lists(st.integers(0, 2), min_size=60, max_size=60), chunk=chunk_sizes)
def test_overlap_check_finds_the_first_overlap_of_any_assignment(raw, lanes, chunk):
    starts, ends = columns(raw)
    lanes = np.array(lanes[:len(raw)], np.int32)
    order = start_order(starts, ends)
    with chunks_of(chunk):
        found = first_overlap(order, starts, ends, lanes)
    assert found == first_overlap_oracle(order.tolist(), starts, ends, lanes)


def test_overlap_check_catches_a_bad_assignment():
    starts, ends = np.array([0.0, 1.0]), np.array([2.0, 3.0])
    assert first_overlap(start_order(starts, ends), starts, ends, np.array([0, 0], np.int32)) == 1


def test_lowest_free_lane_is_reused():
    starts, ends = np.array([0.0, 0.0, 5.0, 7.0]), np.array([10.0, 4.0, 7.0, 8.0])
    lanes = np.zeros(4, np.int32)
    pack_lanes(start_order(starts, ends), starts, ends, lanes)
    assert lanes.tolist() == [1, 0, 0, 0]


def stream_runs(starts, ends, streams: list[int], count: int) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Oracle runs (each stream's slices in (start, end, ordinal) order) and the same as (perm, offsets)."""
    runs = [[i for i in sorted_order(starts, ends) if streams[i] == stream] for stream in range(count)]
    offsets = np.cumsum([0] + [len(run) for run in runs])
    return runs, np.array([i for run in runs for i in run], np.int32), offsets


def nearest_oracle(run: list[int], starts, ends, ts: float) -> int:
    """The run's slice nearest to ts among those around its bisect_left place; the first of equals wins."""
    if not run:
        return NONE
    at = bisect_left([starts[i] for i in run], ts)
    best, best_distance = run[0], math.inf
    for position in range(max(at - 1, 0), min(at + 2, len(run))):
        item = run[position]
        distance = 0.0 if starts[item] <= ts <= ends[item] else min(abs(ts - starts[item]), abs(ts - ends[item]))
        if distance < best_distance:
            best, best_distance = item, distance
    return best


def starting_oracle(run: list[int], starts, ts: float) -> int:
    """The run's last slice starting exactly at ts."""
    if not run:
        return NONE
    at = bisect_right([starts[i] for i in run], ts)
    return run[at - 1] if at > 0 and starts[run[at - 1]] == ts else NO_MATCH


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(raw=spans, streams=st.lists(st.integers(0, 2), min_size=60, max_size=60),
       queries=st.lists(st.tuples(st.integers(0, 3), times), max_size=30), chunk=chunk_sizes)
def test_searches_in_runs_equal_bisects(raw, streams, queries, chunk):
    starts, ends = columns(raw)
    runs, perm, offsets = stream_runs(starts, ends, streams[:len(raw)], 4)  # stream 3 never holds slices
    query_runs = np.array([run for run, _ in queries], np.int32)
    # half the query times are slice starts, so that exact matches happen
    query_times = np.array([starts[n % len(raw)] if raw and n % 2 else ts for n, (_, ts) in enumerate(queries)], float)
    with chunks_of(chunk):
        nearest = nearest_in_runs(perm, offsets, starts, ends, query_runs, query_times)
        starting = starting_in_runs(perm, offsets, starts, query_runs, query_times)
    assert nearest.tolist() == [nearest_oracle(runs[run], starts, ends, ts) for run, ts in zip(query_runs, query_times)]
    assert starting.tolist() == [starting_oracle(runs[run], starts, ts) for run, ts in zip(query_runs, query_times)]


def test_nearest_slice_prefers_containment_then_nearer_edge():
    starts, ends = np.array([0.0, 10.0, 20.0]), np.array([5.0, 15.0, 25.0])
    perm, offsets = np.array([0, 1, 2], np.int32), np.array([0, 3])
    found = nearest_in_runs(perm, offsets, starts, ends, np.zeros(4, np.int32), np.array([12.0, 7.0, 9.0, 99.0]))
    assert found.tolist() == [1, 0, 1, 2]


def coalesce_oracle(items: list[int], keys: list[tuple], starts, ends) -> list[tuple]:
    """(kept, removed, start, end) of every cluster of two or more same-key spans that overlap or touch."""
    clusters = []
    for key in set(keys[i] for i in items):
        members = sorted((i for i in items if keys[i] == key), key=lambda i: (starts[i], i))
        cluster = [members[0]]
        for item in members[1:] + [None]:
            if item is not None and starts[item] <= max(ends[m] for m in cluster):
                cluster.append(item)
                continue
            if len(cluster) > 1:
                kept = min(cluster)
                clusters.append((kept, sorted(set(cluster) - {kept}), min(starts[m] for m in cluster),
                                 max(ends[m] for m in cluster)))
            cluster = [item]
    return sorted(clusters)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(raw=spans, tracks=st.lists(st.sampled_from([1000, 1001]), min_size=60, max_size=60),
       identities=st.lists(st.sampled_from([-(2**63), 7, 2**62]), min_size=60, max_size=60),
       chosen=st.lists(st.booleans(), min_size=60, max_size=60), chunk=chunk_sizes)
def test_coalescing_equals_grouping_by_key_then_sweeping(raw, tracks, identities, chosen, chunk):
    starts, ends = columns(raw)
    tracks, identities = np.array(tracks[:len(raw)], np.int32), np.array(identities[:len(raw)], np.int64)
    items = [i for i in range(len(raw)) if chosen[i]]
    with chunks_of(chunk):
        clusters = coalesce(np.array(items, np.int32), (tracks, identities), starts, ends)
    expected = coalesce_oracle(items, list(zip(tracks.tolist(), identities.tolist())), starts, ends)
    got = zip(clusters.kept.tolist(), clusters.start.tolist(), clusters.end.tolist())
    assert sorted(got) == [(kept, start, end) for kept, _, start, end in expected]
    assert sorted(clusters.removed.tolist()) == sorted(m for _, removed, _, _ in expected for m in removed)


def test_coalesce_merges_overlapping_and_touching_same_key_only():
    starts, ends = np.array([0.0, 3.0, 5.0, 20.0, 1.0]), np.array([4.0, 5.0, 6.0, 21.0, 2.0])
    clusters = coalesce(np.arange(5, dtype=np.int32), (np.array([7, 7, 7, 7, 8]),), starts, ends)
    assert (clusters.kept.tolist(), clusters.start.tolist(), clusters.end.tolist()) == ([0], [0.0], [6.0])
    assert sorted(clusters.removed.tolist()) == [1, 2]


def label_runs_oracle(order, lanes, labels, starts, ends) -> list[tuple]:
    """The sweep: a lane's run closes at its next slice with another label; runs still open follow."""
    open_runs: dict[int, list] = {}
    runs = []
    for item in order:
        lane, label = lanes[item], labels[item]
        current = open_runs.get(lane)
        if current is not None and current[0] == label:
            current[2] = max(current[2], ends[item])
            continue
        if current is not None:
            runs.append((lane, *open_runs.pop(lane)))
        if label >= 0:
            open_runs[lane] = [label, starts[item], ends[item]]
    return runs + [(lane, *current) for lane, current in open_runs.items()]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(raw=spans, lanes=st.lists(st.sampled_from([1000, 1001, 1005]), min_size=60, max_size=60),
       labels=st.lists(st.integers(-1, 2), min_size=60, max_size=60), chunk=chunk_sizes)
def test_label_runs_equal_the_sweep(raw, lanes, labels, chunk):
    starts, ends = columns(raw)
    lanes, labels = np.array(lanes[:len(raw)], np.int32), np.array(labels[:len(raw)], np.int16)
    order = start_order(starts, ends)
    with chunks_of(chunk):
        runs = label_runs(order, lanes, labels, starts, ends)
    assert list(runs.rows()) == label_runs_oracle(order.tolist(), lanes.tolist(), labels.tolist(), starts.tolist(),
                                                 ends.tolist())


def test_label_runs_break_on_unlabelled_and_per_lane():
    starts = np.array([0.0, 1, 2, 3, 4, 0])
    ends = np.array([1.0, 2, 3, 4, 5, 1])
    lanes = np.array([1, 1, 1, 1, 1, 2], np.int32)
    labels = np.array([0, 0, 1, -1, 1, 0], np.int32)
    runs = label_runs(start_order(starts, ends), lanes, labels, starts, ends)
    assert sorted(runs.rows()) == [(1, 0, 0.0, 2.0), (1, 1, 2.0, 3.0), (1, 1, 4.0, 5.0), (2, 0, 0.0, 1.0)]


def test_default_rules_match_spec_classification():
    rules = load_rules(None)
    cases = {
        ("kernel", "ncclDevKernel_AllGather_RING_LL"): "nccl_all_gather",
        ("kernel", "ncclKernel_ReduceScatter_Sum"): "nccl_reduce_scatter",
        ("Kernel", "ncclDevKernel_AllReduce_Sum_f32"): "nccl_all_reduce",
        ("kernel", "ncclDevKernel_SendRecv"): "nccl_other",
        ("kernel", "nccl_all_gather_underscored"): "nccl_other",
        ("kernel", "symmetric_memory_barrier_kernel"): "symmetric_memory_barrier",
        ("gpu_memcpy", "Memcpy HtoD (nccl)"): "memcpy",
        ("gpu_memset", "Memset"): "memset",
        ("kernel", "sm90_gemm"): "compute",
        ("kernel", None): "compute",
    }
    for (cat, name), group in cases.items():
        assert rules.names[rules.classify(cat, name)] == group
    assert rules.labels == ("Compute", "Symmetric-memory barrier", "NCCL all-gather", "NCCL reduce-scatter",
                            "NCCL all-reduce", "NCCL other", "GPU memcpy", "GPU memset")


def test_custom_rules_file(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text('default = "other"\n[groups]\nattention = "Attention"\nother = "Everything else"\n'
                    '[[rules]]\ngroup = "attention"\nname_contains = ["flash"]\n')
    rules = load_rules(str(path))
    assert rules.names[rules.classify("kernel", "FlashAttnFwd")] == "attention"
    assert rules.names[rules.classify("kernel", "gemm")] == "other"


@pytest.mark.parametrize("text, message", [
    ("[groups", "not valid TOML"),
    ('default = "x"\n', "needs a \\[groups\\]"),
    ('default = "nope"\n[groups]\na = "A"\n', "default names group 'nope'"),
    ('default = "a"\n[groups]\na = "A"\n[[rules]]\ngroup = "a"\nname = "x"\n', "allowed keys"),
])
def test_bad_rules_are_one_line_errors(text, message):
    with pytest.raises(TraceError, match=message):
        parse_rules(text, "r.toml")


def test_print_rules_text_parses_to_the_defaults():
    assert parse_rules(DEFAULT_RULES_TOML) == load_rules(None)


def _block(op, stage, mb, start, end, tid=1, pid=0):
    return Block(stage, op, mb, pid, tid, start, end)


def test_blocks_cluster_compute_only_on_the_first_compute_track():
    spans = [Span(0, 5, "PP:0F0", 0, 4), Span(0, 5, "PP:0F0", 3, 6), Span(0, 9, "PP:0F0", 0, 9),
             Span(0, 9, "PP:0SEND_F0", 7, 8), Span(0, 7, "PP:0UNSHARD", 0, 1), Span(0, 8, "PP:0UNSHARD", 0, 1),
             Span(0, 5, "PP:0F1", 10, 11), Span(0, 5, "Forward 2", 12, 13)]
    blocks = find_blocks(spans, compute_tracks={(0, 5)}, unshard_tracks={(0, 7)})
    labels = sorted(b.label for b in blocks)
    assert labels == ["0F0", "0F1", "0SEND_F0", "0UNSHARD", "F2"]
    f0 = next(b for b in blocks if b.label == "0F0")
    assert (f0.tid, f0.start, f0.end) == (5, 0, 6)


def test_local_arrows_recv_compute_send_and_unshard():
    blocks = [_block("RECV_F", 1, 0, 0, 2, tid=3), _block("F", 1, 0, 2, 5), _block("SEND_F", 1, 0, 5, 6, tid=3),
              _block("UNSHARD", 1, None, 0, 1, tid=4), _block("B", 1, 0, 8, 9), _block("RECV_B", 1, 0, 7, 8, tid=3),
              _block("SEND_B", 1, 1, 20, 21, tid=3)]
    maker = ArrowMaker({0: 1})
    local_arrows(blocks, maker)
    names = sorted({e["name"] for e in maker.events()})
    assert names == ["1F0 -> 1SEND_F0", "1RECV_B0 -> 1B0", "1RECV_F0 -> 1F0", "1UNSHARD -> 1F0"]
    assert maker.pairs == {"pp_compute_dependency": 3, "pp_unshard_dependency": 1}
    assert maker.unmatched["pp_compute_dependency"] == 1  # SEND_B1 has no B1
    starts = {e["id"]: e for e in maker.events() if e["ph"] == "s"}
    for finish in (e for e in maker.events() if e["ph"] == "f"):
        start = starts[finish["id"]]
        assert finish["ts"] >= start["ts"] and finish["bp"] == "e"
        assert finish["args"]["source_pp_rank"] == finish["args"]["destination_pp_rank"] == 1


def test_arrow_dropped_when_target_ends_before_source_starts():
    maker = ArrowMaker({0: 0})
    maker.connect(_block("F", 0, 0, 10, 12), _block("SEND_F", 0, 0, 0, 5), "pp_compute_dependency")
    assert maker.arrows == [] and maker.unmatched["pp_compute_dependency"] == 1


def test_strictly_forward_arrow_finishes_after_its_start():
    maker = ArrowMaker({0: 0, 1: 1})
    maker.connect(_block("SEND_F", 0, 0, 5, 6), _block("RECV_F", 1, 0, 5, 9, pid=1), "pp_send_recv",
                  strictly_forward=True)
    start, finish = maker.events()
    assert finish["ts"] > start["ts"] == 5


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(0, 500), st.tuples(st.floats(-1e6, 1e6), st.floats(0, 1e3)), max_size=40),
       st.lists(st.integers(-5, 505), max_size=60))
def test_retimed_annotations_answer_as_the_dict_of_unions_would(unions, asked):
    """Retimed holds coalescing's unions as arrays in ordinal order; looked
    up one at a time or as a mask, it answers as {kept: (start, duration)}."""
    from streamtrace.commands.compactplan import Retimed

    kept = np.array(list(unions), dtype=np.int32)
    starts = np.array([start for start, _ in unions.values()])
    clusters = Clusters(kept, starts, starts + np.array([length for _, length in unions.values()]), kept[:0])
    retimed = Retimed.of(clusters)
    expected = {n: (start, end - start) for n, start, end in zip(kept.tolist(), clusters.start.tolist(),
                                                                  clusters.end.tolist())}
    assert [retimed.get(n) for n in asked] == [expected.get(n) for n in asked]
    assert retimed.among(np.array(asked, dtype=np.int64)).tolist() == [n in expected for n in asked]
    hits = [n for n in asked if n in expected]
    assert list(zip(*(column.tolist() for column in retimed.times(np.array(hits, dtype=np.int64))))) \
        == [expected[n] for n in hits]
    assert len(retimed) == len(unions)
