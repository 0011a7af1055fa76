"""The collective report's memory bounded whatever the number of collectives: the values behind its medians
and pandas' pairwise sums (a number per collective, per rank for straggler_summary's waits) go to disk beyond
a budget and are read back a window at a time, exactly: the tables are the bytes of the run in memory."""
from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from test_collectives_scale import csv_bytes
from tracelens_cases import case_files

import streamtrace
from streamtrace.algo import collectives as algo
from streamtrace.algo import collectivetables, groupagg
from streamtrace.commands.analyses import collectives as command
from streamtrace.commands.analyze import analyze
from streamtrace.io import collectivespill, valuespill


def test_windowed_sum_and_median_are_numpys_bit_for_bit(tmp_path):
    """Columns of floats (ties, NaN, negative zero, magnitudes 1e-3 to 1e7) written one value a piece,
    read 128 to 1,000 values at a time: numpy's pairwise sum and np.median over the whole column."""
    rng = np.random.default_rng(7)
    spill = valuespill.ValueSpill(str(tmp_path), budget=0)
    try:
        for trial in range(30):
            values = rng.standard_normal(int(rng.integers(1, 3_000))) * 10.0 ** rng.integers(-3, 8, 1)
            if trial % 3 == 0:
                values = np.round(values)
            if trial % 4 == 0:
                values[rng.integers(0, len(values), len(values) // 4)] = math.nan
            column = spill.column()
            for value in values.tolist():
                column.append(value)
            assert column.spilled and len(column) == len(values)
            window = int(rng.integers(128, 1_000))
            assert groupagg.windowed_sum(column, 0, len(column), window) == np.nan_to_num(values, nan=0.0).sum().item()
            present = values[~np.isnan(values)]
            expected = float(np.median(present)) if len(present) else math.nan
            found = groupagg.windowed_median(column, window)
            assert found == expected or (math.isnan(found) and math.isnan(expected)), (trial, found, expected)
    finally:
        spill.close()
    assert not list(tmp_path.iterdir())


def collective_csvs(directory: Path) -> dict[str, bytes]:
    """The collective report's CSVs (a merged file's kernel_launch_stats has its own correlation ids)."""
    return {name: text for name, text in csv_bytes(directory).items() if name[:-4] in algo.TABLE_NAMES}


def tiny_budgets(monkeypatch) -> list[int]:
    """Every spill of the report from its first byte (records, rows, kept values), none of the long tables'
    rows kept for the summary; returns where each write of the kept values to disk is counted."""
    spilled: list[int] = []
    flush = valuespill.ValueSpill.flush
    monkeypatch.setattr(valuespill.ValueSpill, "flush", lambda self: spilled.append(len(self._columns)) or flush(self))
    monkeypatch.setattr(valuespill, "VALUE_BYTES", 0)
    monkeypatch.setattr(collectivespill, "SPILL_BYTES", 0)
    monkeypatch.setattr(command, "JSON_ROWS", 2)
    return spilled


@pytest.mark.parametrize("case", ["synth_fsdp4", "dlrm_8ranks"])
def test_kept_values_on_disk_give_the_same_tables(tmp_path, monkeypatch, case):
    """4 generated ranks (one slow, all_to_allv) and the 8 DLRM ranks: with every budget at 0 the CSVs are the
    bytes of the run in memory, from rank files, with -j 2, and (generated) from the naive merged file and
    streamtrace merge's."""
    files = case_files(case, tmp_path / "in")
    analyze(files, tmp_path / "memory", all2allv_heatmap=True)
    expected = collective_csvs(tmp_path / "memory")
    assert {"nccl_summary_implicit_sync.csv", "straggler_summary.csv"} <= set(expected)
    spilled = tiny_budgets(monkeypatch)
    runs = {"files": (files, {}), "jobs": (files, {"jobs": 2})}
    if case.startswith("synth"):
        merged = tmp_path / "merged.json"
        streamtrace.merge([str(path) for path in files], str(merged))
        runs.update(naive=([files[0].parent / "merged_trace.json.gz"], {"jobs": 2}), merged=([merged], {"jobs": 2}))
    for name, (given, options) in runs.items():
        spool = tmp_path / f"spool_{name}"
        spool.mkdir()
        analyze(given, tmp_path / name, all2allv_heatmap=True, spool_dir=str(spool), **options)
        assert spilled, f"{name}: no kept value went to disk"
        assert not list(spool.iterdir()), name  # no temporary file left
        spilled.clear()
        assert collective_csvs(tmp_path / name) == expected, name


def _implicit_tables(count: int, column) -> tuple[list, list, int]:
    """nccl_summary_implicit_sync and straggler_summary over ``count`` all-reduces of 4 ranks (waits and
    durations varying), their rows let go as they come; and the peak traced while making them."""
    template = algo.RankKernels(0, np.zeros(1), np.ones(1), np.zeros(1, np.int32),
                                [("0", "[0, 1, 2, 3]", "allreduce", 4, "Float", 1 << 20, 1 << 20, "[]", "[]", 7)])
    found: list[algo.Collective] = []

    class First(algo.Consumer):
        def collective(self, collective: algo.Collective) -> None:
            found.append(collective)

    algo.walk(algo.match([algo.RankKernels(rank, template.ts, template.dur, template.meta, template.metas)
                          for rank in range(4)]), [First()])
    rng = np.random.default_rng(count)
    implicit = collectivetables.ImplicitSync(algo._Dropped(), None, False, column)
    starts, durations = rng.integers(0, 500, (count, 4)), rng.random((count, 4)) * 100 + 1
    tracemalloc.start()
    try:
        for place in range(count):
            rows = [[*row[:algo.TS], place * 1_000 + int(starts[place, at]), float(durations[place, at])]
                    for at, row in enumerate(found[0].rows)]
            implicit.collective(algo.Collective(found[0].key, rows, found[0].metas))
        tables = implicit.summary().rows, implicit.stragglers.table(implicit.wait_ranks()).rows
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (*tables, peak)


@pytest.mark.slow  # (tracemalloc)
def test_kept_values_hold_the_budget_whatever_the_number_of_collectives(tmp_path):
    """The medians' and pairwise sums' values (5 a collective) and straggler_summary's waits (4 a collective):
    with a 64 KiB budget, 10,000 all-reduces take no more memory than 1,000 (but 30 KB); in memory, 9,000
    x 9 x 8 bytes (650 KB) more.  The tables are those of the run in memory."""
    peaks = {}
    for count in (1_000, 10_000):
        in_memory = _implicit_tables(count, groupagg.MemoryColumn)
        spill = valuespill.ValueSpill(str(tmp_path), budget=64 << 10)
        try:
            on_disk = _implicit_tables(count, spill.column)
        finally:
            spill.close()
        assert on_disk[:2] == in_memory[:2]
        peaks[count] = in_memory[2], on_disk[2]
    assert peaks[10_000][0] - peaks[1_000][0] > 500e3, peaks  # (what the budget saves)
    assert peaks[10_000][1] - peaks[1_000][1] < 30e3, peaks

