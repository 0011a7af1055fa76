"""analyze's collective tables against TraceLens's own (tests/reference/tracelens, written by
scripts/tracelens_reference.py from the cases of tests/tracelens_cases.py): every table, column and
row, on generated runs and real traces, from rank files, merged files and several pass-1 processes."""
from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from tracelens_cases import CASES, HEATMAP, REFERENCE, SYNTH, case_files

import streamtrace
from streamtrace.algo import collectivereport, collectivetables
from streamtrace.algo import collectives as algo
from streamtrace.commands.analyses import index as analyze_index
from streamtrace.commands.analyze import analyze

SORTED_BY = {  # TraceLens sorts these tables on one column with numpy's quicksort: ties come in any order
    "nccl_summary_long": "dur_sum", "nccl_summary_implicit_sync": "Total comm latency (ms)",
    "nccl_summary_all2allv": "Total wall_time (ms)", "nccl_all2allv": "total data communicated (MB)",
    "straggler_summary": "total_wait_time_us",
}


def cell(text: str) -> object:
    """A CSV cell as a value: a number if it reads as one, None if empty."""
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def same(ours: object, theirs: object) -> bool:
    if isinstance(ours, float) and isinstance(theirs, float):
        return ours == theirs or math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=1e-9)
    return ours == theirs


def read(path: Path) -> tuple[list[str], list[list]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0] if rows else []), [[cell(text) for text in row] for row in rows[1:]]


def blocks(name: str, columns: list[str], rows: list[list]) -> list[list[list]]:
    """The rows, those with equal sort keys together (their order is numpy's accident)."""
    if name not in SORTED_BY:
        return [[row] for row in rows]
    at = columns.index(SORTED_BY[name])
    grouped: list[list[list]] = []
    for row in rows:
        if grouped and grouped[-1][0][at] == row[at]:
            grouped[-1].append(row)
        else:
            grouped.append([row])
    return [sorted(block, key=repr) for block in grouped]


def assert_tables_match(out: Path, case: str) -> None:
    expected = sorted(path.name for path in (REFERENCE / case).glob("*.csv"))
    written = sorted(path.name for path in out.glob("*.csv") if path.stem in algo.TRACELENS_TABLES)
    assert written == expected
    for name in expected:
        columns, theirs = read(REFERENCE / case / name)
        our_columns, ours = read(out / name)
        assert our_columns == columns, name
        assert len(ours) == len(theirs), name
        stem = name[:-4]
        for our_block, their_block in zip(blocks(stem, columns, ours), blocks(stem, columns, theirs)):
            assert len(our_block) == len(their_block), (name, their_block[0])
            for our_row, their_row in zip(our_block, their_block):
                wrong = [(column, a, b) for column, a, b in zip(columns, our_row, their_row) if not same(a, b)]
                assert not wrong, (name, wrong[:5])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[Path]]:
    return {case: case_files(case, tmp_path_factory.mktemp(case)) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_rank_files_give_tracelens_tables(inputs, tmp_path, case):
    summary = analyze(inputs[case], tmp_path / "t", all2allv_heatmap=case in HEATMAP)
    assert_tables_match(tmp_path / "t", case)
    assert len(summary["tables"]["nccl_long"]) == sum(1 for _ in csv.reader(open(REFERENCE / case / "nccl_long.csv"))) - 1


@pytest.mark.parametrize("case", list(SYNTH))
def test_merged_file_gives_the_tables_of_its_rank_files(inputs, tmp_path, case):
    merged = inputs[case][0].parent / "merged_trace.json.gz"
    analyze(merged, tmp_path / "t", all2allv_heatmap=case in HEATMAP, jobs=2)
    assert_tables_match(tmp_path / "t", case)


def test_streamtrace_merge_output_gives_the_tables_of_its_rank_files(inputs, tmp_path):
    """merge moves each GPU slice to a display lane, keeping its stream in args.original_stream: the
    tables' stream column is the one the kernel ran on, as in the rank files."""
    merged = tmp_path / "merged.json"
    streamtrace.merge([str(path) for path in inputs["synth_fsdp4"]], str(merged))
    analyze(merged, tmp_path / "t", all2allv_heatmap="synth_fsdp4" in HEATMAP, jobs=2)
    assert_tables_match(tmp_path / "t", "synth_fsdp4")


def test_dict_reading_gives_the_same_tables(inputs, tmp_path, monkeypatch):
    """Chunks the projection refuses are read as dicts: the same kernels are collected."""
    monkeypatch.setattr(analyze_index, "projected_events", lambda text: None)
    analyze(inputs["synth_fsdp4"], tmp_path / "t", all2allv_heatmap=True)
    assert_tables_match(tmp_path / "t", "synth_fsdp4")


def test_slow_rank_arrives_last(inputs):
    """The generated straggler is TraceLens's straggler: it arrives last to most collectives, waits least."""
    for case in SYNTH:
        slow = SYNTH[case].slow_rank
        rows = analyze(inputs[case])["tables"]["straggler_summary"]
        assert rows[0]["rank"] == slow and rows[0]["total_wait_time_us"] == 0
        assert max(rows, key=lambda row: row["times_arrived_last"])["rank"] == slow


def test_no_collective_kernels_no_tables(tmp_path):
    summary = analyze(Path(__file__).parents[2] / "shared" / "traces" / "kineto_small.json", tmp_path / "t")
    assert not any(name in summary["tables"] for name in algo.TABLE_NAMES)
    assert not any((tmp_path / "t" / f"{name}.csv").exists() for name in algo.TABLE_NAMES)


def test_differing_args_are_left_out_with_a_note():
    """TraceLens stops on a collective whose kernels' args differ across ranks; the report leaves it out and says so."""
    def rank(n: int, nelems: int) -> algo.RankKernels:
        meta = ("0", "[0, 1]", "allreduce", 2, "Float", nelems, nelems, "[]", "[]", 7)
        return algo.RankKernels(n, np.array([10.0, 50.0]), np.array([5.0, 5.0]), np.array([0, 1], dtype=np.int32),
                                [meta, (*meta[:5], 64, 64, *meta[7:])])
    report = collectivereport.report([rank(0, 32), rank(1, 16)])
    assert report.tables["nccl_implicit_sync"].column("collective_id") == ["0_1"]
    assert "0_0" in report.notes[0]


def test_groups_sharing_a_name_are_told_apart():
    """Two groups named alike (TraceLens matches them together and stops): matched by their ranks."""
    def rank(n: int, members: str, start: float) -> algo.RankKernels:
        meta = ("1", members, "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)
        return algo.RankKernels(n, np.array([start]), np.array([4.0]), np.array([0], dtype=np.int32), [meta])
    report = collectivereport.report([rank(0, "[0, 1]", 10.0), rank(1, "[0, 1]", 12.0), rank(2, "[2, 3]", 30.0),
                          rank(3, "[2, 3]", 31.0)])
    table = report.tables["nccl_implicit_sync"]
    assert table.column("Process Group Ranks") == ["[0, 1]", "[2, 3]"]
    assert table.column("skew in start time") == [2.0, 1.0]


def test_split_sizes_and_group_ranks_readings():
    assert collectivetables.split_sizes("[1024, 2048]") == [1024, 2048] and collectivetables.split_sizes([3, 4]) == [3, 4]
    assert collectivetables.split_sizes("[]") == [] and collectivetables.split_sizes("n/a") is None and collectivetables.split_sizes(None) is None
    assert algo.pg_ranks("[0, 1, 2]") == [0, 1, 2] and algo.pg_ranks("0 1 x") == [0, 1] and algo.pg_ranks(None) == []


def test_real_trace_args_as_kineto_writes_them():
    """nccl_rank0's kernels as a plain reading finds them: the tables' nccl_long has each one, with its args."""
    with gzip.open(Path(__file__).parents[2] / "shared" / "traces" / "nccl_rank0.json.gz") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    rows = analyze(Path(__file__).parents[2] / "shared" / "traces" / "nccl_rank0.json.gz")["tables"]["nccl_long"]
    assert [(row["ts"], row["dur"], row["Collective name"], row["In msg nelems"]) for row in rows] == \
        [(e["ts"], e["dur"], e["args"]["Collective name"], e["args"]["In msg nelems"]) for e in kernels]


def kernels_by_json(paths: list[Path]) -> list[tuple[int, dict]]:
    """(rank, kernel event) of every NCCL kernel, read with json (an oracle independent of the pass)."""
    found = []
    for rank, path in enumerate(paths):
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
        found += [(rank, e) for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    return found


def test_bandwidth_table_in_si_units_with_nccl_tests_factors(inputs):
    """collective_bandwidth: the k-th all-reduce / all-gather / reduce-scatter of a group across ranks,
    its bytes, least duration, and bandwidths in 10^9 bytes/s with nccl-tests' factors."""
    width = {"Float": 4, "BFloat16": 2}
    factor = {"allreduce": lambda n: 2 * (n - 1) / n, "_allgather_base": lambda n: (n - 1) / n,
              "_reduce_scatter_base": lambda n: (n - 1) / n}
    groups: dict[tuple[str, int], list[dict]] = {}
    per_rank: dict[tuple[str, int], int] = {}
    kernels = kernels_by_json(inputs["synth_fsdp4"])
    for rank, kernel in sorted(kernels, key=lambda item: (item[0], item[1]["ts"])):
        args = kernel["args"]
        n = per_rank[(args["Process Group Name"], rank)] = per_rank.get((args["Process Group Name"], rank), -1) + 1
        groups.setdefault((args["Process Group Name"], n), []).append({**args, "ts": kernel["ts"], "dur": kernel["dur"],
                                                                      "rank": rank})
    expected = {}
    for (group, n), members in groups.items():
        args = members[0]
        if args["Collective name"] in factor:
            size = (args["Out msg nelems"] if "allgather" in args["Collective name"] else args["In msg nelems"]) * \
                width[args["dtype"]]
            latency = min(member["dur"] for member in members)
            algo = size / latency / 1e3
            expected[f"{group}_{n}"] = (size, latency, algo, algo * factor[args["Collective name"]](args["Group size"]),
                                        max(members, key=lambda member: member["ts"])["rank"])
    rows = analyze(inputs["synth_fsdp4"])["tables"]["collective_bandwidth"]
    got = {row["collective_id"]: (row["size (bytes)"], row["latency (us)"], row["algo bw (GB/s, 1e9)"],
                                  row["bus bw (GB/s, 1e9)"], row["last arrival rank"]) for row in rows}
    assert set(got) == set(expected) and len(expected) == 8  # 2 steps: 2 all-gathers, a reduce-scatter, an all-reduce
    for cid, values in expected.items():
        assert got[cid] == pytest.approx(values, rel=1e-12), cid
    assert {row["last arrival rank"] for row in rows} == {SYNTH["synth_fsdp4"].slow_rank}


def test_bandwidth_table_has_broadcasts():
    """TraceLens leaves broadcast out; the bandwidth table has them, with factor 1."""
    rows = analyze(Path(__file__).parents[2] / "shared" / "traces" / "nccl_rank0.json.gz")["tables"]["collective_bandwidth"]
    broadcasts = [row for row in rows if row["Collective name"] == "broadcast"]
    assert len(broadcasts) == 6 and {row["bus factor"] for row in broadcasts} == {1.0}
    assert all(row["bus bw (GB/s, 1e9)"] == row["algo bw (GB/s, 1e9)"] > 0 for row in broadcasts)


def test_missing_rank_and_uneven_sequences_are_noted(inputs):
    summary = analyze(inputs["synth_fsdp4"][:3])
    assert any("ranks the inputs do not hold (3)" in note for note in summary["notes"])
    assert summary["tables"]["collective_bandwidth"][0]["ranks missing"] == 1

    def rank(n: int, count: int) -> algo.RankKernels:
        meta = ("0", "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)
        return algo.RankKernels(n, np.arange(count, dtype=np.float64) * 10, np.ones(count), np.zeros(count, np.int32),
                                [meta])
    notes = collectivereport.report([rank(0, 3), rank(1, 2)]).notes
    assert any("group 0 has different numbers of kernels per rank (rank 0: 3, rank 1: 2)" in note for note in notes)


ODD_VALUES = (None, "", "x", -3, 0, 2.5, float("nan"), True, [1, "a"], "[1, 2", "[0, 1, ...]", "[2, 3]", 10**30)


@pytest.mark.parametrize("field", range(len(algo.META)))
def test_odd_args_give_tables_not_tracebacks(field):
    """Any JSON value in any collective arg (TraceLens fails on many): tables, never an exception."""
    base = ("0", "[0, 1]", "all_to_allv", 2, "BFloat16", 8, 8, "[4, 4]", "[4, 4]", 7)
    metas = [base, ("0", "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)]
    metas += [tuple(algo.hashable(value) if at == field else item for at, item in enumerate(meta))
              for value in ODD_VALUES for meta in metas[:2]]
    count = len(metas)
    ranks = [algo.RankKernels(rank, np.arange(count, dtype=np.float64) * 10 + rank, np.full(count, 2.0),
                              np.arange(count, dtype=np.int32), metas) for rank in (0, 1)]
    report = collectivereport.report(ranks, gpus_per_node=1, heatmap=True)
    assert len(report.tables["nccl_long"].rows) == 2 * count


def test_odd_args_in_a_trace(tmp_path):
    """Objects, lists and texts where numbers belong, read by the pass: the kernels are in nccl_long."""
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7, "dur": 3.5,
              "args": {"stream": 7, "correlation": 1, "Collective name": "allreduce", "Process Group Name": "0",
                       "Process Group Ranks": {"ranks": [0]}, "Group size": "one", "dtype": ["Float"],
                       "In msg nelems": 1.5, "Out msg nelems": "8", "In split size": {"a": 1}, "Out split size": []}}
    trace = {"traceEvents": [{**kernel, "ts": 10.25}, {**kernel, "ts": 20.5, "args": {**kernel["args"], "correlation": 2}}]}
    (tmp_path / "rank0.json").write_text(json.dumps(trace))
    rows = analyze(tmp_path / "rank0.json", tmp_path / "t")["tables"]["nccl_long"]
    assert [(row["ts"], row["Process Group Ranks"], row["In split size"]) for row in rows] == \
        [(10.25, "{'ranks': [0]}", "{'a': 1}"), (20.5, "{'ranks': [0]}", "{'a': 1}")]


def test_straggler_causes_name_the_slow_gpu(inputs):
    """The generated straggler runs every kernel slower: its speed score says so, the others' do not."""
    rows = analyze(inputs["synth_fsdp4"])["tables"]["straggler_causes"]
    slow = SYNTH["synth_fsdp4"].slow_rank
    by_rank = {row["rank"]: row for row in rows}
    assert by_rank[slow]["gpu_speed_score"] < 0.85 and "slower GPU" in by_rank[slow]["why"]
    assert all(row["gpu_speed_score"] > 0.9 for rank, row in by_rank.items() if rank != slow)
    assert all(row["work_ratio"] == 1.0 for row in rows)


def test_straggler_causes_more_work_and_idle():
    """A rank running twice the kernels at the same speed does more work; one idling 20 points more is host-bound."""
    stragglers = [{"rank": rank, "times_arrived_last": last, "pct_arrived_last": 50.0, "num_collectives": 4}
                  for rank, last in ((0, 0), (1, 2), (2, 2))]
    kernels = [{"name": "gemm", "kernel_type": "COMPUTATION", "rank": rank, "sum (us)": total, "mean (us)": 10.0}
               for rank, total in ((0, 100.0), (1, 200.0), (2, 100.0))]
    kernels.append({"name": "others", "kernel_type": "COMPUTATION", "rank": 2, "sum (us)": 5.0, "mean (us)": 1.0})
    temporal = [{"rank": rank, "idle_time_pctg": idle} for rank, idle in ((0, 10.0), (1, 10.0), (2, 30.0))]
    table = collectivereport.straggler_causes(stragglers, kernels, temporal)
    why = dict(zip(table.column("rank"), table.column("why")))
    assert table.column("gpu_speed_score") == [1.0, 1.0, 1.0] and table.column("work_ratio") == [1.0, 2.0, 1.0]
    assert why[0] == "" and "more work (2.00x" in why[1] and "host-bound" not in why[1]  # (rank 1 idles as rank 0)  # (rank 1 idles as rank 0)
    assert "host-bound (its GPU idles 30.0% of the time, the median rank's 10.0%)" in why[2] and "more work" not in why[2]


def test_report_names_who_arrives_last_on_dlrm():
    """The 8 real DLRM ranks: rank 7 arrives last (as lining up the k-th NCCL kernel of each rank shows),
    and its GPU idles more than the others'."""
    from streamtrace.cli.analyze import rows

    lines = dict(rows(analyze(Path(__file__).parents[2] / "shared" / "traces" / "dlrm_8ranks")))
    assert lines["collectives"].startswith("rank 7 arrives last at 5 of 8 collectives")
    assert lines["why"].startswith("host-bound")


def test_one_rank_is_not_called_the_one_the_others_wait_for():
    """One DLRM rank alone: no line says it arrives last or that "the other ranks" wait; the report says
    the other ranks' traces are needed (TraceLens's straggler_summary still has its one row)."""
    from streamtrace.cli.analyze import rows

    rank0 = sorted((Path(__file__).parents[2] / "shared" / "traces" / "dlrm_8ranks").glob("worker0_*"))[0]
    summary = analyze(rank0)
    lines = dict(rows(summary))
    assert len(summary["tables"]["straggler_summary"]) == 1
    assert lines["collectives"] == "8 collectives, all on rank 0: who waits for whom needs the other ranks' traces too"
    assert "why" not in lines and "matched" not in lines


def test_long_tables_stay_out_of_the_summary(inputs, tmp_path, monkeypatch):
    """A table longer than JSON_ROWS is in its CSV only (None in the summary), as the launch statistics."""
    from streamtrace.commands.analyses import collectives as command

    monkeypatch.setattr(command, "JSON_ROWS", 10)
    summary = analyze(inputs["synth_fsdp4"], tmp_path / "t", all2allv_heatmap=True)
    assert summary["tables"]["nccl_long"] is None and len(summary["tables"]["straggler_summary"]) == 4
    assert_tables_match(tmp_path / "t", "synth_fsdp4")


def test_ranks_come_from_the_files_not_their_order(inputs, tmp_path):
    """TraceLens takes file order for rank order; analyze reads each file's rank: the same tables either way."""
    analyze(list(reversed(inputs["synth_fsdp4"])), tmp_path / "t", all2allv_heatmap=True)
    assert_tables_match(tmp_path / "t", "synth_fsdp4")


def test_clocks_that_disagree_are_noted(inputs):
    """A collective that ends on one rank before it starts on another cannot happen on one clock: said, with
    the largest gap; the generated runs (whose ranks finish each collective together) have none."""
    def rank(n: int, start: float) -> algo.RankKernels:
        meta = ("0", "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)
        return algo.RankKernels(n, np.array([start, start + 100.0]), np.array([5.0, 5.0]), np.zeros(2, np.int32), [meta])
    notes = collectivereport.report([rank(0, 10.0), rank(1, 30.0)]).notes
    assert any("2 of 2 matched collectives end on one rank before they start on another (by up to 15.0 us, at 0_0"
               in note for note in notes)
    assert not collectivereport.report([rank(0, 10.0), rank(1, 12.0)]).notes
    for case in SYNTH:
        assert not [note for note in analyze(inputs[case])["notes"] if "clock" in note]
