"""The collective report's memory bounded whatever the number of collectives: the values behind its medians
and pandas' pairwise sums (a number per collective, per rank for straggler_summary's waits) go to disk beyond
a budget and are read back a window at a time, exactly: the tables are the bytes of the run in memory."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_collectives_scale import csv_bytes
from tracelens_cases import case_files

import streamtrace
from streamtrace.algo import collectives as algo
from streamtrace.algo import groupagg
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


@pytest.mark.slow
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
