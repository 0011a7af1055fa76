"""HTA 0.5.0's ``TraceDiff`` run in-process: the oracle for ``streamtrace diff``.

``hta_diff`` returns HTA's ``compare_traces`` rows (the index as a ``name``
column, plain Python values) and its ``ops_diff`` for two directories of
rank files, with the same options ``streamtrace.diff`` takes.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from hta_oracle import _quiet, _rows

DEVICE_TYPES = {"cpu": "CPU", "gpu": "GPU", "all": "ALL"}


def hta_diff(control: Path, test: Path, *, device: str = "all", control_rank: int | None = None,
             test_rank: int | None = None, control_iteration: int | None = None, test_iteration: int | None = None,
             short_names: bool = False) -> tuple[list[dict], dict[str, list[str]]]:
    """HTA's rows and changes for two trace directories (its default labels, Control and Test)."""
    with _quiet():
        from hta.trace_diff import DeviceType, TraceDiff

        sides = [labeled_trace(label, str(path)) for label, path in (("Control", control), ("Test", test))]
        options = dict(control_rank=control_rank, test_rank=test_rank, control_iteration=control_iteration,
                       test_iteration=test_iteration, device_type=DeviceType[DEVICE_TYPES[device]])
        frame = TraceDiff.compare_traces(*sides, use_short_name=short_names, **options)
        changes = TraceDiff.ops_diff(*sides, **options)
    frame.index.name = "name"
    return _rows(frame.reset_index()), changes


@lru_cache(maxsize=16)
def labeled_trace(label: str, trace_dir: str):
    """HTA's ``LabeledTrace(label, trace_dir=...)``, parsed once per label (several comparisons read it).

    Its constructor's steps, with the files parsed in this process (``use_multiprocessing=False``): HTA
    would fork a pool from the test process, whose threads can leave a lock held in the fork; each file goes
    through the same parse function either way."""
    import pandas as pd
    from hta.common.trace import Trace
    from hta.trace_diff import LabeledTrace

    labeled = LabeledTrace.__new__(LabeledTrace)
    labeled.label = label
    labeled.t = Trace(trace_dir=trace_dir)
    labeled.t.parse_traces(use_multiprocessing=False)
    labeled.s_map = pd.Series(labeled.t.symbol_table.get_sym_id_map())
    labeled.s_tab = pd.Series(labeled.t.symbol_table.get_sym_table())
    labeled.iteration_df = labeled._extract_iterations()
    return labeled


def differences(ours: dict, hta_rows: list[dict], hta_changes: dict[str, list[str]]) -> list[str]:
    """Where a ``streamtrace.diff`` summary departs from HTA: rows in order, each value equal (counts and
    whole-microsecond durations exactly, fractional sums within 1e-9 relative), the changes' lists."""
    problems = []
    mine, theirs = [row["name"] for row in ours["trace_diff"]], [row["name"] for row in hta_rows]
    if mine != theirs:
        problems.append(f"names: {len(mine)} rows, HTA {len(theirs)}; first difference at "
                        f"{next((n for n, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))}")
    for our_row, hta_row in zip(ours["trace_diff"], hta_rows):
        if list(our_row) != list(hta_row):
            problems.append(f"columns {list(our_row)} != HTA's {list(hta_row)}")
            break
        for column, value in hta_row.items():
            if not _equal(our_row[column], value):
                problems.append(f"{hta_row['name'][:60]} {column}: {our_row[column]!r} vs HTA {value!r}")
    if ours["ops_diff"] != hta_changes:
        problems += [f"ops_diff {change}: {ours['ops_diff'].get(change)} vs HTA {names}"
                     for change, names in hta_changes.items() if ours["ops_diff"].get(change) != names]
    return problems


def _equal(ours: object, hta: object) -> bool:
    if isinstance(hta, str) or isinstance(ours, str):
        return ours == hta
    return ours == hta or abs(ours - hta) <= 1e-9 * max(abs(hta), 1.0)  # type: ignore[operator]
