"""Pure compaction algorithms against obviously-correct oracles."""
from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.algo import lanes as lanes_module
from streamtrace.algo.lanes import (
    coalesce,
    coalesce_in_start_order,
    first_overlap,
    label_runs,
    merge_runs,
    nearest_in_run,
    pack_lanes,
    sorted_runs,
)
from streamtrace.algo.pparrows import ArrowMaker, Block, Span, find_blocks, local_arrows
from streamtrace.algo.rules import DEFAULT_RULES_TOML, parse_rules
from streamtrace.errors import TraceError
from streamtrace.io.configfiles import load_rules

intervals = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10)), min_size=1, max_size=60)
with_zero_length = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3)), min_size=1, max_size=40)


def max_depth(spans: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (touching ones do not overlap): the
    lower bound on lanes, which greedy packing must reach."""
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def order_by_start(starts: array, ends: array, streams: list[int] | None = None) -> array:
    """The packing order, built the way compact builds it (per-stream runs, merged)."""
    streams = streams if streams is not None else [0] * len(starts)
    return merge_runs(*sorted_runs(starts, ends, streams, max(streams) + 1), starts, ends)


@pytest.mark.parametrize("limit", [0, 10**6], ids=["k-way merge", "in-memory sort"])
@settings(max_examples=200, deadline=None)
@given(raw=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=50))
def test_merged_runs_equal_a_plain_sort(limit, raw):
    lanes_module.IN_MEMORY_SORT_LIMIT, saved = limit, lanes_module.IN_MEMORY_SORT_LIMIT
    try:
        check_merged_runs(raw)
    finally:
        lanes_module.IN_MEMORY_SORT_LIMIT = saved


def check_merged_runs(raw):
    starts = array("d", [float(s) for s, _, _ in raw])
    ends = array("d", [float(s + d) for s, d, _ in raw])
    streams = [k for _, _, k in raw]
    expected = sorted(range(len(raw)), key=lambda i: (starts[i], ends[i], i))
    assert list(order_by_start(starts, ends, streams)) == expected
    perm, offsets = sorted_runs(starts, ends, streams, 4)
    for key in range(4):
        members = list(perm[offsets[key]:offsets[key + 1]])
        assert members == [i for i in expected if streams[i] == key]


def pack(raw: list[tuple[int, int]]) -> tuple[array, array, array, array, int]:
    """Pack (start, duration) pairs; returns starts, ends, order, lanes, lane count."""
    starts = array("d", [float(s) for s, _ in raw])
    ends = array("d", [float(s + d) for s, d in raw])
    order = order_by_start(starts, ends)
    lanes = array("i", [0] * len(raw))
    return starts, ends, order, lanes, pack_lanes(order, starts, ends, lanes)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_packing_uses_the_minimum_number_of_lanes_and_never_overlaps(raw):
    starts, ends, order, lanes, used = pack(raw)
    assert used == max_depth(list(zip(starts, ends)))
    for lane in range(used):
        members = sorted((starts[i], ends[i]) for i in range(len(raw)) if lanes[i] == lane)
        assert all(a[1] <= b[0] for a, b in zip(members, members[1:]))
    assert first_overlap(order, starts, ends, lanes) is None


@settings(max_examples=100, deadline=None)
@given(with_zero_length)
def test_zero_length_slices_never_make_a_lane_overlap(raw):
    starts, ends, order, lanes, _ = pack(raw)
    assert first_overlap(order, starts, ends, lanes) is None


def test_overlap_check_catches_a_bad_assignment():
    starts, ends = array("d", [0, 1]), array("d", [2, 3])
    order = order_by_start(starts, ends)
    assert first_overlap(order, starts, ends, array("i", [0, 0])) == 1


def test_lowest_free_lane_is_reused():
    starts, ends = array("d", [0, 0, 5, 7]), array("d", [10, 4, 7, 8])
    lanes = array("i", [0] * 4)
    pack_lanes(order_by_start(starts, ends), starts, ends, lanes)
    assert list(lanes) == [1, 0, 0, 0]


def test_nearest_slice_prefers_containment_then_nearer_edge():
    starts, ends = array("d", [0, 10, 20]), array("d", [5, 15, 25])
    perm = array("i", [0, 1, 2])
    assert nearest_in_run(perm, starts, 0, 3, starts, ends, 12) == 1
    assert nearest_in_run(perm, starts, 0, 3, starts, ends, 7) == 0
    assert nearest_in_run(perm, starts, 0, 3, starts, ends, 9) == 1
    assert nearest_in_run(perm, starts, 0, 3, starts, ends, 99) == 2


def test_coalesce_merges_overlapping_and_touching_same_key_only():
    starts, ends = array("d", [0, 3, 5, 20, 1]), array("d", [4, 5, 6, 21, 2])
    keys = [7, 7, 7, 7, 8]
    order = sorted(range(5), key=starts.__getitem__)
    assert list(coalesce(order, keys, starts, ends)) == [(0, [1, 2], 0.0, 6.0)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6), st.integers(0, 2)), min_size=1, max_size=40))
def test_coalesce_sweep_equals_grouping_by_key(raw):
    starts = array("d", [float(s) for s, _, _ in raw])
    ends = array("d", [float(s + d) for s, d, _ in raw])
    keys = [k for _, _, k in raw]
    expected = []
    for key in set(keys):
        members = sorted((i for i in range(len(raw)) if keys[i] == key), key=lambda i: (starts[i], i))
        cluster = [members[0]]
        for item in members[1:] + [None]:
            if item is not None and starts[item] <= max(ends[m] for m in cluster):
                cluster.append(item)
                continue
            if len(cluster) > 1:
                kept = min(cluster)
                expected.append((kept, sorted(set(cluster) - {kept}), min(starts[m] for m in cluster),
                                 max(ends[m] for m in cluster)))
            cluster = [item]
    in_start_order = sorted(range(len(raw)), key=lambda i: (starts[i], i))
    for clusters in (coalesce(in_start_order, keys, starts, ends),
                     coalesce_in_start_order(in_start_order, keys, starts, ends)):
        got = [(kept, sorted(removed), start, end) for kept, removed, start, end in clusters]
        assert sorted(got) == sorted(expected)


def test_label_runs_break_on_unlabelled_and_per_lane():
    starts = array("d", [0, 1, 2, 3, 4, 0])
    ends = array("d", [1, 2, 3, 4, 5, 1])
    lanes = [1, 1, 1, 1, 1, 2]
    labels = [0, 0, 1, -1, 1, 0]
    runs = label_runs(range(6), lanes, labels, starts, ends)
    got = sorted(zip(runs.lane, runs.label, runs.start, runs.end))
    assert got == [(1, 0, 0.0, 2.0), (1, 1, 2.0, 3.0), (1, 1, 4.0, 5.0), (2, 0, 0.0, 1.0)]


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
