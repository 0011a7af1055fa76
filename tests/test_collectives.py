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

from streamtrace.algo import collectives as algo
from streamtrace.commands import analyze as analyze_module
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
    written = sorted(path.name for path in out.glob("*.csv") if path.stem in algo.TABLE_NAMES)
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


def test_dict_reading_gives_the_same_tables(inputs, tmp_path, monkeypatch):
    """Chunks the projection refuses are read as dicts: the same kernels are collected."""
    monkeypatch.setattr(analyze_module, "projected_events", lambda text: None)
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
    report = algo.report([rank(0, 32), rank(1, 16)])
    assert report.tables["nccl_implicit_sync"].column("collective_id") == ["0_1"]
    assert "0_0" in report.notes[0]


def test_groups_sharing_a_name_are_told_apart():
    """Two groups named alike (TraceLens matches them together and stops): matched by their ranks."""
    def rank(n: int, members: str, start: float) -> algo.RankKernels:
        meta = ("1", members, "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)
        return algo.RankKernels(n, np.array([start]), np.array([4.0]), np.array([0], dtype=np.int32), [meta])
    report = algo.report([rank(0, "[0, 1]", 10.0), rank(1, "[0, 1]", 12.0), rank(2, "[2, 3]", 30.0),
                          rank(3, "[2, 3]", 31.0)])
    table = report.tables["nccl_implicit_sync"]
    assert table.column("Process Group Ranks") == ["[0, 1]", "[2, 3]"]
    assert table.column("skew in start time") == [2.0, 1.0]


def test_split_sizes_and_group_ranks_readings():
    assert algo.split_sizes("[1024, 2048]") == [1024, 2048] and algo.split_sizes([3, 4]) == [3, 4]
    assert algo.split_sizes("[]") == [] and algo.split_sizes("n/a") is None and algo.split_sizes(None) is None
    assert algo.pg_ranks("[0, 1, 2]") == [0, 1, 2] and algo.pg_ranks("0 1 x") == [0, 1] and algo.pg_ranks(None) == []


def test_real_trace_args_as_kineto_writes_them():
    """nccl_rank0's kernels as a plain reading finds them: the tables' nccl_long has each one, with its args."""
    with gzip.open(Path(__file__).parents[2] / "shared" / "traces" / "nccl_rank0.json.gz") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    rows = analyze(Path(__file__).parents[2] / "shared" / "traces" / "nccl_rank0.json.gz")["tables"]["nccl_long"]
    assert [(row["ts"], row["dur"], row["Collective name"], row["In msg nelems"]) for row in rows] == \
        [(e["ts"], e["dur"], e["args"]["Collective name"], e["args"]["In msg nelems"]) for e in kernels]
