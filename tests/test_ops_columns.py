"""The ops tables' column arithmetic against the plain per-op arithmetic it
replaces (TraceLens's numbers come from the latter's order of operations)."""
from __future__ import annotations

import numpy as np
import pytest
from test_ops import _kernel, _launch

from streamtrace.algo import optree


@pytest.mark.parametrize("seed", range(6))
def test_busy_of_many_groups_at_once_is_each_groups_busy_of(seed: int) -> None:
    """Unions of intervals per group (touching, nested, tied starts, one group of hundreds beyond the
    column-wise rounds, empty groups) summed as busy_of sums each group, to the last bit."""
    rng = np.random.default_rng(seed)
    count = 40
    group = rng.integers(0, count - 5, 3000)
    group[:500] = 7  # (a group of many merged intervals)
    if seed % 2:
        starts = rng.integers(0, 20_000, len(group)).astype(np.float64)
        ends = starts + rng.integers(0, 30, len(group))
    else:
        starts = 1.7e12 + rng.random(len(group)) * 1e4
        ends = starts + rng.random(len(group)) * rng.choice([0.01, 3.0, 40.0], len(group))
    got = optree.busy_groups(group, starts, ends, count)
    for k in range(count):
        mine = np.flatnonzero(group == k)
        expected = optree.busy_of(starts[mine].tolist(), ends[mine].tolist()) if len(mine) else 0.0
        assert got[k] == expected


@pytest.mark.parametrize("seed", range(4))
def test_busy_of_groups_whose_ends_never_go_down(seed: int) -> None:
    """Groups of back-to-back or nested-free intervals (ends rising with the starts: their own reach),
    alone and beside groups whose ends go down: each group's busy_of, to the last bit."""
    rng = np.random.default_rng(seed)
    count = 30
    group = np.sort(rng.integers(0, count, 2000))
    starts = 1.7e12 + np.cumsum(rng.random(len(group)) * 3.0)
    ends = starts + rng.random(len(group)) * rng.choice([0.5, 5.0], len(group))
    ends = np.maximum.accumulate(ends)  # (never going down, overlaps and touching included)
    if seed % 2:  # (some groups with an end going down too)
        uneven = np.isin(group, [3, 11, 29])
        ends[uneven] = starts[uneven] + rng.random(int(uneven.sum())) * 20.0
    got = optree.busy_groups(group, starts, ends, count)
    for k in range(count):
        mine = np.flatnonzero(group == k)
        expected = optree.busy_of(starts[mine].tolist(), ends[mine].tolist()) if len(mine) else 0.0
        assert got[k] == expected


@pytest.mark.parametrize("high", [5, 1 << 40])
def test_distinct_rows_are_numpys_unique_rows(high: int) -> None:
    """One integer per row (or numpy's row sort where the digits overflow): the same rows, first places
    and row numbers as np.unique(axis=0)."""
    from streamtrace.algo.opstables import _distinct_rows

    rng = np.random.default_rng(high)
    columns = [rng.integers(-3, high, 500), rng.integers(0, 7, 500), rng.integers(-(1 << 30), 1 << 30, 500) % 11]
    expected = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    got = _distinct_rows(columns)
    for mine, theirs in zip(got, expected):
        assert np.array_equal(mine, theirs.reshape(mine.shape))


@pytest.mark.parametrize("trace", ["b200_eager.json.gz", "nccl_rank0.json.gz", "sglang_decode_qwen3.json.gz"])
def test_tree_walks_at_once_are_the_walks_one_event_at_a_time(trace: str) -> None:
    """On real op trees: the links below ops as pairs are the ancestors walk's (a call's links counted
    at each op above it, in call then link order), and the cpu op above many calls at once is each
    call's own walk up."""
    from conftest import TRACES

    from streamtrace.algo.opstables import OpTree, ancestors
    from streamtrace.commands.analyses.ops import read_input

    facts = read_input(str(TRACES / trace))[0]
    tree = OpTree(facts)
    hosts = np.arange(len(facts.h_ts))
    ops = hosts[hosts % 3 != 1]
    expected: dict[int, list[int]] = {}
    for run in np.unique(facts.link_run).tolist():
        for h in ancestors(tree.parent, run):
            if h % 3 != 1:
                expected.setdefault(h, []).extend(facts.link_gpu[facts.link_run == run].tolist())
    op, gpu = tree.link_pairs(ops)
    got: dict[int, list[int]] = {}
    for h, g in zip(op.tolist(), gpu.tolist()):
        got.setdefault(h, []).append(g)
    assert got == expected
    assert sum(map(len, got.values())) > len(facts.link_gpu)  # (links counted at several ops each)
    above = tree.cpu_ops_above(hosts)
    assert above.tolist() == [tree.cpu_op_above(h) for h in hosts.tolist()]
    assert (above != -1).sum() > len(hosts) // 2


@pytest.mark.parametrize("trace", ["b200_eager.json.gz", "nccl_rank0.json.gz", "sglang_decode_qwen3.json.gz"])
def test_unified_walk_tests_at_once_are_the_tests_one_op_at_a_time(trace: str) -> None:
    """Which ops own a modelled op below them and which launch directly, found for every op at once, are
    TraceLens's walks from each op (``_has_descendant_cpu_op_with_own_perf_model``, ``_is_leaf_cpu_op``)."""
    from conftest import TRACES

    from streamtrace.algo.opstables import CPU_OP, OpTree
    from streamtrace.algo.unifiedperf import _Unified
    from streamtrace.commands.analyses.ops import read_input

    facts = read_input(str(TRACES / trace))[0]
    walk = _Unified(OpTree(facts), facts.signature_values, None)
    walk._prepare()
    ops = np.flatnonzero(walk.tree.in_tree & (facts.h_kind == CPU_OP) & ~walk._risky).tolist()
    owns = [walk._owns_model_below(h) for h in ops]
    launches = [walk._launches_directly(h) for h in ops]
    assert walk._owns[ops].tolist() == owns and walk._launches[ops].tolist() == launches
    assert 0 < sum(owns) < len(ops) and 0 < sum(launches) < len(ops)


def test_categories_at_once_are_each_ops_category() -> None:
    from conftest import TRACES

    from streamtrace.algo.opstables import OpTree
    from streamtrace.commands.analyses.ops import read_input

    facts = read_input(str(TRACES / "nccl_rank0.json.gz"))[0]
    hosts = list(range(len(facts.h_ts)))
    one_by_one = OpTree(facts)
    expected = [one_by_one.category(h) for h in hosts]
    assert OpTree(facts).categories(hosts) == expected  # (a fresh tree: nothing cached)
    assert len(set(expected)) > 2


def _nested_ops(rng: np.random.Generator) -> list[dict]:
    """Random ops nested on two threads with interleaved roots (some with models, a backward wrapper),
    launches under some, their kernels later on one stream."""
    names = ["aten::mm", "aten::add", "aten::linear", "outer", "autograd::engine::evaluate_function: MmBackward0",
             "aten::sum", "aten::copy_"]
    events: list[dict] = []
    corr = iter(range(1, 10_000))

    def op(tid: int, ts: float, span: float, depth: int) -> None:
        events.append({"ph": "X", "cat": "cpu_op", "name": str(rng.choice(names)), "pid": 1, "tid": tid, "ts": ts,
                       "dur": span, "args": {"Input Dims": [[8, 4], [4, 8]], "Input type": ["float", "float"],
                                             "Sequence number": int(rng.integers(0, 3))}})
        at = ts + 1
        while at + 4 < ts + span and depth < 3:
            width = float(rng.integers(2, max(3, int(span / 2))))
            if rng.random() < 0.6 and at + width < ts + span:
                op(tid, at, width, depth + 1)
            elif rng.random() < 0.7:
                link = next(corr)
                events.extend([*_launch(link, at, tid=tid), *_kernel(link, 100_000 + at, 2, f"k{rng.integers(0, 3)}")])
            at += width + 1

    for root in range(12):
        op(1 + root % 2, root * 50.0 + (root % 2) * 20, 60.0, 0)
    return events


@pytest.mark.parametrize("seed", range(8))
def test_unified_ops_found_by_levels_are_tracelens_walks(seed: int, tmp_path) -> None:
    """The ops with a unified row, found a tree level at a time, are TraceLens's depth-first walk's, in its
    order (roots of two threads interleaved, modelled ops, launchers, a backward wrapper)."""
    import json

    from streamtrace.algo.opstables import OpTree
    from streamtrace.algo.unifiedperf import _Unified
    from streamtrace.commands.analyses.ops import read_input

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _nested_ops(np.random.default_rng(seed))}))
    facts = read_input(str(path))[0]
    walk = _Unified(OpTree(facts), facts.signature_values, None)
    walk._prepare()
    found, walked = walk._collect_by_levels(), walk._walk()
    assert found is not None and found.tolist() == walked.tolist() and len(walked)


@pytest.mark.parametrize("trace", ["b200_eager.json.gz", "nccl_rank0.json.gz", "mi250_minitoy.json.gz"])
def test_unified_ops_found_by_levels_on_real_traces(trace: str) -> None:
    from conftest import TRACES

    from streamtrace.algo.opstables import OpTree
    from streamtrace.algo.unifiedperf import _Unified
    from streamtrace.commands.analyses.ops import read_input

    facts = read_input(str(TRACES / trace))[0]
    walk = _Unified(OpTree(facts), facts.signature_values, None)
    walk._prepare()
    found = walk._collect_by_levels()
    assert found is not None and found.tolist() == walk._walk().tolist() and len(found) > 10
