"""Rank rules, (rank, correlation) links and op enclosure as pure functions, no I/O."""
from __future__ import annotations

import json
from array import array
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtrace.commands.split as split_module
from streamtrace.algo.enclosure import ANNOTATION, CPU_OP, NO_OP, Enclosure
from streamtrace.algo.links import NO_LAUNCH, IdTable, Links, ambiguous_collisions, build_tables, link
from streamtrace.algo.rankmap import AMBIGUOUS, UNKNOWN, PidEvidence, RankResolution, pair_by_time, resolve_ranks
from streamtrace.commands.mergedindex import Resolved
from streamtrace.commands.split import event_ranks, with_rank
from streamtrace.errors import TraceError
from streamtrace.io.configfiles import load_rank_map

NO_ID = -(1 << 63)


# ---------------------------------------------------------------- rank rules


def test_args_rank_decides_first():
    pids = [PidEvidence(7, arg_ranks={3}, name_ranks={5}, first_work=0)]
    result = resolve_ranks(pids, rank_map={7: 9}, file_rank=1)
    assert (result.ranks, result.rules) == ([3], ["args.rank"])


def test_process_name_decides_when_no_args_rank():
    pids = [PidEvidence(7, name_ranks={5}, first_work=0), PidEvidence(8, name_ranks={6})]
    result = resolve_ranks(pids, rank_map={7: 9}, file_rank=1)
    assert (result.ranks, result.rules) == ([5, 6], ["process_name", "process_name"])


def test_rank_map_decides_what_names_leave_open():
    pids = [PidEvidence(7, first_work=0), PidEvidence("GPU 1", first_work=1), PidEvidence(9)]
    result = resolve_ranks(pids, rank_map={7: 2, "GPU 1": 4})
    assert result.ranks == [2, 4, UNKNOWN]
    assert result.rules[:2] == ["rank-map", "rank-map"]


def test_distributed_info_rank_names_a_single_rank_file():
    pids = [PidEvidence(4037, first_work=0), PidEvidence(0, first_work=1), PidEvidence("Spans")]
    pairings = pair_by_time({1: [(10, 5.0)]}, {10: [(0, 4.0)]})
    result = resolve_ranks(pids, pairings=pairings, file_rank=3)
    assert result.ranks == [3, 3, 3]
    assert set(result.rules) == {"distributedInfo.rank"}


def test_single_group_without_distributed_info_stays_unknown():
    pids = [PidEvidence(4037, first_work=0), PidEvidence(0, first_work=1)]
    pairings = pair_by_time({1: [(10, 5.0)]}, {10: [(0, 4.0)]})
    assert resolve_ranks(pids, pairings=pairings).ranks == [UNKNOWN, UNKNOWN]


def test_an_ambiguous_pid_is_reported_not_guessed():
    pids = [PidEvidence(0, name_ranks={0, 1}, first_work=0), PidEvidence(100, name_ranks={0})]
    result = resolve_ranks(pids, file_rank=0)
    assert result.ranks == [AMBIGUOUS, 0]
    assert result.ambiguous == {0: [0, 1]}
    assert result.rules[0] == "ambiguous (process_name)"


def test_several_args_ranks_on_fully_ranked_events_are_per_event_not_ambiguous():
    ranked = PidEvidence("Spans", arg_ranks={0, 1})
    mixed = PidEvidence("Spans2", arg_ranks={0, 1}, unranked=True)
    result = resolve_ranks([ranked, mixed])
    assert result.rules == ["args.rank (per event)", "ambiguous (args.rank)"]
    assert result.ambiguous == {1: [0, 1]}


# ---------------------------------------------------------------- inference


def _lockstep_ranks(ranks: int, events: int, skew: float):
    """K ranks reusing ids 0..events-1; rank r launches id i at i*10 + r*skew, its GPU runs it 3 us later."""
    samples = {}
    launches: dict[int, list] = {}
    for rank in range(ranks):
        cpu, gpu = 2 * rank, 2 * rank + 1
        samples[gpu] = [(i, i * 10.0 + rank * skew + 3.0) for i in range(events)]
        for i in range(events):
            launches.setdefault(i, []).append((cpu, i * 10.0 + rank * skew))
    return samples, launches


def test_inference_pairs_by_time_consistency():
    samples, launches = _lockstep_ranks(4, 50, skew=4.0)
    pairings = pair_by_time(samples, launches)
    assert {gpu: p.cpu for gpu, p in pairings.items()} == {1: 0, 3: 2, 5: 4, 7: 6}
    assert all(p.inconsistent == 0 and p.consistent == 50 for p in pairings.values())


def test_inference_numbers_groups_by_first_work_and_spreads_known_ranks():
    samples, launches = _lockstep_ranks(3, 20, skew=5.0)
    pids = [PidEvidence(f"cpu{r // 2}" if r % 2 == 0 else f"gpu{r // 2}", first_work=100 - r) for r in range(6)]
    pids[4].name_ranks = {7}  # rank 2's CPU pid is named: its GPU pid inherits rank 7
    result = resolve_ranks(pids, pairings=pair_by_time(samples, launches))
    assert result.ranks == [1, 1, 0, 0, 7, 7]  # rank 1's pids did work first (smaller first_work)
    assert result.rules[5] == "inferred" and result.rules[4] == "process_name"


def test_inference_tie_leaves_the_gpu_pid_unknown():
    samples = {1: [(5, 10.0)]}
    launches = {5: [(0, 9.0), (2, 8.0)]}
    pairing = pair_by_time(samples, launches)[1]
    assert pairing.cpu is None and pairing.tied_with is not None
    result = resolve_ranks([PidEvidence("a", first_work=0), PidEvidence("g", first_work=1),
                            PidEvidence("b", first_work=2)], pairings={1: pairing})
    assert result.rules[1] == "unknown (inference tie)"


# ---------------------------------------------------------------- links


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=200), st.integers(0, 10**12), st.booleans())
def test_id_table_agrees_with_a_dict(ids, offset, sparse):
    values = array("q", ((i * 997 if sparse else i) + offset for i in ids))
    table = IdTable(values, array("i", range(len(values))))
    reference: dict[int, int] = {}
    for ordinal, value in enumerate(values):
        reference.setdefault(value, ordinal)
    for probe in set(values) | {offset - 1, offset + 5000, max(values, default=0) + 1}:
        assert table.get(probe) == reference.get(probe, NO_LAUNCH)
    assert table.duplicates == len(values) - len(reference)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), max_size=120),
       st.lists(st.tuples(st.integers(-1, 5), st.integers(-1, 45)), max_size=200))
def test_each_gpu_event_gets_its_own_ranks_first_launch(launches, gpus):
    tables = build_tables(array("i", (r for r, _ in launches)), array("q", (c for _, c in launches)))
    gpu_ids = array("q", (NO_ID if c < 0 else c for _, c in gpus))
    result = link(tables, array("i", (r for r, _ in gpus)), gpu_ids, NO_ID)
    first = {}
    for ordinal, key in enumerate(launches):
        first.setdefault(key, ordinal)
    expected = [first.get((r, c), NO_LAUNCH) if c >= 0 else NO_LAUNCH for r, c in gpus]
    assert list(result.launch_of_gpu) == expected
    assert result.orphans == expected.count(NO_LAUNCH)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([AMBIGUOUS, UNKNOWN, 0, 1, 2]), st.integers(0, 30)), max_size=80),
       st.lists(st.tuples(st.sampled_from([AMBIGUOUS, UNKNOWN, 0, 1, 2, 3]), st.integers(-1, 35)), max_size=150),
       st.booleans())
def test_links_follow_the_rules_event_by_event(launches, gpus, sparse):
    """Own bucket's first launch of the id, else the ambiguous pid's; an
    ambiguous pid's event: the first bucket (in the tables' order) holding
    the id; checked one event at a time against plain dicts, with dense
    and sparse id tables."""
    scale = 10**9 if sparse else 1
    tables = build_tables(array("i", (r for r, _ in launches)), array("q", (c * scale for _, c in launches)))
    first: dict[int, dict[int, int]] = {}
    for ordinal, (bucket, correlation) in enumerate(launches):
        first.setdefault(bucket, {}).setdefault(correlation * scale, ordinal)
    expected = []
    for bucket, correlation in gpus:
        correlation *= scale
        if correlation < 0:
            found = NO_LAUNCH
        elif bucket == AMBIGUOUS:
            found = next((ids[correlation] for ids in first.values() if correlation in ids), NO_LAUNCH)
        else:
            found = first.get(bucket, {}).get(correlation, first.get(AMBIGUOUS, {}).get(correlation, NO_LAUNCH))
        expected.append(found)
    result = link(tables, array("i", (r for r, _ in gpus)),
                  array("q", (NO_ID if c < 0 else c * scale for _, c in gpus)), NO_ID)
    assert list(result.launch_of_gpu) == expected
    assert result.orphans == expected.count(NO_LAUNCH)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([AMBIGUOUS, UNKNOWN, 0, 1, 5]), st.booleans()), min_size=1, max_size=40),
       st.lists(st.integers(-1, 39), max_size=120), st.lists(st.sampled_from([AMBIGUOUS, UNKNOWN, 0, 2, 7]), max_size=10))
def test_resolved_counts_equal_plain_loops(launches, gpu_launches, pid_ranks):
    """The ranks, launch flags and graph-launch figures of a resolution,
    against plain loops over the GPU events and launches (unknown and
    ambiguous ranks count together as "unknown"; ranks stated by a pid's
    own rule count even without linked work)."""
    launch_of_gpu = [launch if launch < len(launches) else NO_LAUNCH for launch in gpu_launches]
    rules = ["args.rank", "process_name", "inferred"] * len(pid_ranks)
    resolved = Resolved(
        index=SimpleNamespace(launch_id=array("q", range(len(launches))),
                              launch_graph=bytearray(graph for _, graph in launches)),
        ranks=RankResolution(pid_ranks, rules[:len(pid_ranks)], {}, {}), launch_bucket=array("i", (r for r, _ in launches)),
        gpu_bucket=array("i", (launches[launch][0] if launch >= 0 else UNKNOWN for launch in launch_of_gpu)),
        links=Links(array("i", launch_of_gpu), launch_of_gpu.count(NO_LAUNCH), 0), collisions={}, clashes={})
    linked = [launch for launch in launch_of_gpu if launch != NO_LAUNCH]
    stated = {rank for rank, rule in zip(pid_ranks, rules) if rank >= 0 and rule != "inferred"}
    assert resolved.ranks_for_certain() == sorted(stated | {launches[launch][0] for launch in linked
                                                            if launches[launch][0] >= 0})
    assert list(resolved.launches_with_gpu_work()) == [int(ordinal in linked) for ordinal in range(len(launches))]
    by_rank: dict[str, list[int]] = {}
    for ordinal, (bucket, graph) in enumerate(launches):
        if graph:
            by_rank.setdefault(str(bucket) if bucket >= 0 else "unknown", []).append(linked.count(ordinal))
    expected = {key: {"launches": len(counts), "gpu_events": sum(counts), "min": min(counts), "max": max(counts)}
                for key, counts in by_rank.items()}
    summary = resolved.graph_summary()
    assert summary == {"count": sum(graph for _, graph in launches), "by_rank": expected}


def test_graph_launch_gets_only_its_own_ranks_kernels():
    ranks = 16
    tables = build_tables(array("i", range(ranks)), array("q", [42] * ranks))  # every rank: graph launch id 42
    gpu_rank = array("i", [r for r in range(ranks) for _ in range(64)])
    result = link(tables, gpu_rank, array("q", [42] * len(gpu_rank)), NO_ID)
    for rank in range(ranks):
        assert set(result.launch_of_gpu[rank * 64:(rank + 1) * 64]) == {rank}


def test_ambiguous_events_link_only_by_unique_ids():
    tables = build_tables(array("i", [0, 1, AMBIGUOUS]), array("q", [5, 5, 9]))
    assert ambiguous_collisions(tables, array("q", [9])) == []
    assert ambiguous_collisions(tables, array("q", [5])) == [5]
    result = link(tables, array("i", [AMBIGUOUS, 1, UNKNOWN]), array("q", [9, 9, 5]), NO_ID)
    assert list(result.launch_of_gpu) == [2, 2, NO_LAUNCH]  # rank 1's id 9 is the ambiguous pid's launch


# ---------------------------------------------------------------- enclosure


def _brute_force(launches, ops):
    inner, outer = [], []
    for thread, start, end in launches:
        around = [(o_start, o_end, name, kind, order) for order, (o_thread, o_start, o_end, name, kind)
                  in enumerate(ops) if o_thread == thread and o_start <= start and end <= o_end]
        cpu_ops = [op for op in around if op[3] == CPU_OP]
        inner.append(max(cpu_ops, key=lambda op: (op[0], -op[1], op[4]))[2] if cpu_ops else NO_OP)
        outer.append(min(around, key=lambda op: (op[0], -op[1], op[4]))[2] if around else NO_OP)
    return inner, outer


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(0, 6)), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(0, 60),
                          st.sampled_from([CPU_OP, ANNOTATION])), max_size=40))
def test_enclosure_matches_brute_force_in_any_order(launch_specs, op_specs):
    launches = [(thread, float(start), float(start + dur)) for thread, start, dur in launch_specs]
    ops = [(thread, float(start), float(start + dur), name, kind)
           for name, (thread, start, dur, kind) in enumerate(op_specs)]
    enclosure = Enclosure(array("i", (t for t, _, _ in launches)), array("d", (s for _, s, _ in launches)),
                          array("d", (e for _, _, e in launches)), bytearray([1]) * len(launches))
    enclosure.offer(ops)
    inner, outer = _brute_force(launches, ops)
    assert list(enclosure.inner) == inner
    assert list(enclosure.outer) == outer


# ---------------------------------------------------------------- split helpers and the rank-map file


def test_unranked_events_follow_the_preceding_ranked_one():
    owners = array("i", [2, 0, 2, -2 - 1, 2, 1, 2])  # slot 2 has no rank; slots 0/1 are ranks 5/6
    assert list(event_ranks(owners, [5, 6, UNKNOWN])) == [-1, 5, 5, 1, 1, 6, 6]


@settings(max_examples=200, deadline=None)
@given(pid_ranks=st.lists(st.sampled_from([0, 1, 7, UNKNOWN, AMBIGUOUS]), max_size=4),
       picks=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=40), block=st.integers(1, 8))
def test_event_ranks_in_blocks_equal_a_plain_loop(pid_ranks, picks, block):
    """Ranks found a block at a time (the last known carried across blocks) equal the event-by-event rule."""
    owners = array("i", [-2 - value if own or not pid_ranks else value % len(pid_ranks) for own, value in picks])
    expected, last = [], -1
    for owner in owners:
        rank = -2 - owner if owner < 0 else pid_ranks[owner]
        last = rank if rank >= 0 else last
        expected.append(last)
    saved, split_module.EVENT_BLOCK = split_module.EVENT_BLOCK, block
    try:
        assert list(event_ranks(owners, pid_ranks)) == expected
    finally:
        split_module.EVENT_BLOCK = saved


def test_distributed_info_rank_is_set_in_the_hta_readable_form():
    members = [("schemaVersion", b"1"), ("distributedInfo", b'{"backend":"nccl","rank":0,"world_size":2}')]
    out = with_rank(members, 1, add=True)
    assert out[1] == ("distributedInfo", b'{"backend": "nccl", "rank": 1, "world_size": 2}')
    assert with_rank([("schemaVersion", b"1")], 3, add=True)[-1] == ("distributedInfo", b'{"rank": 3}')


def test_rank_map_file(tmp_path):
    good = tmp_path / "map.json"
    good.write_text(json.dumps({"4037": 0, "GPU 1": 1}))
    assert load_rank_map(good) == {"4037": 0, 4037: 0, "GPU 1": 1}
    for content in ("[1, 2]", '{"1": -1}', "nope"):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(TraceError, match="rank map"):
            load_rank_map(bad)


def test_lockstep_ranks_that_nothing_tells_apart_stay_unpaired():
    samples = {1: [(5, 10.0)], 3: [(5, 10.5)]}
    launches = {5: [(0, 9.0), (2, 9.2)]}
    assert {gpu: p.cpu for gpu, p in pair_by_time(samples, launches).items()} == {1: None, 3: None}


def test_id_splice_and_position_copy_on_compact_lines():
    from streamtrace.commands.relink import position_text, with_new_id

    line = b'{"ph":"X","pid":3,"tid":"s 1","ts":12.5,"name":"a\\"ts\\":1","args":{"correlation":7,"x":1}}'
    assert json.loads(with_new_id(line, 7, 1000000007))["args"] == {
        "correlation": 1000000007, "correlation_raw": 7, "x": 1}
    assert position_text(line) == b'"pid":3,"tid":"s 1","ts":12.5'
    last = b'{"pid":3,"tid":4,"ts":1,"args":{"correlation":7}}'
    assert json.loads(with_new_id(last, 7, 9))["args"] == {"correlation": 9, "correlation_raw": 7}
    assert with_new_id(last, 8, 9) is None  # not the id pass 1 saw: decode and fail validation
    nested = b'{"pid":3,"tid":4,"ts":1,"args":{"correlation":7,"inner":{"correlation":7,"ts":2}}}'
    assert with_new_id(nested, 7, 9) is None and position_text(nested) is None
