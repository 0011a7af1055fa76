"""HTA 0.5.0's ``TraceDiff`` (``compare_traces``, ``ops_diff``) over typed arrays (pure).

HTA loads both traces, gives each event an iteration and compares the
per-name counts and total durations of one rank and iteration.  Here one
trace's rows come a block at a time (numpy arrays in event order); what is
kept between blocks is bounded by the distinct names and by the launches of
the chosen iteration, never by the events.  docs/diff.md states the rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .analysis import StepOf

LABELS = ("Control", "Test")  # HTA's default labels, the prefixes of its columns
DEVICES = ("cpu", "gpu", "all")
CHANGES = ("added", "deleted", "increased", "decreased", "unchanged")
NO_ID = -1  # HTA's default stream and correlation


def diff_columns(labels: tuple[str, str] = LABELS) -> tuple[str, ...]:
    """``trace_diff.csv``'s header: the name, then HTA's columns in its order."""
    control, test = labels
    return ("name", f"{control}_counts", f"{control}_total_duration", f"{test}_counts", f"{test}_total_duration",
            "diff_counts", "diff_duration", "counts_change_categories")


def shorten_name(name: str) -> str:
    """HTA's ``shorten_name``: a name without its argument lists, template
    arguments and return type (memory copies and sets keep theirs)."""
    if name.startswith(("Memcpy", "Memset", "dma")) or ("<" not in name and "(" not in name):
        return name
    kept: list[str] = []
    for char in name.replace("->", ""):
        opening = {">": "<", ")": "("}.get(char)
        if opening is None:
            kept.append(char)
            continue
        while kept and kept[-1] != opening:  # drop back to the bracket this one closes
            kept.pop()
        if kept:
            kept.pop()
    return "".join(kept).split(" ")[-1]


def gpu_side(stream: np.ndarray, corr: np.ndarray, name: np.ndarray, sync_ids: np.ndarray) -> np.ndarray:
    """The rows HTA's GPU kernel filter takes (a stream and a correlation id,
    or a device synchronisation by name); the other rows with an id are the
    CPU side it links them to."""
    return (((stream >= 0) & (corr >= 0)) | np.isin(name, sync_ids)) & (corr != NO_ID)


@dataclass
class Selection:
    """Which rows of one trace HTA's ``extract_ops`` keeps: the chosen
    iterations (``step_of`` gives a CPU row's), the device type."""

    step_of: StepOf
    iterations: np.ndarray
    device: str
    sync_ids: np.ndarray
    first_row_is_first_event: bool  # HTA never links a kernel to the trace's event 0
    launches: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # ids launched in the iterations

    def note_launches(self, start: int, ts: np.ndarray, stream: np.ndarray, corr: np.ndarray, name: np.ndarray) -> None:
        """First sweep, blocks in event order (``start``: the block's first row
        number): a kernel takes the iteration of the last CPU row with its id,
        so each id's last CPU row so far decides whether it is a launch of the
        chosen iterations."""
        cpu = np.flatnonzero((corr != NO_ID) & ~gpu_side(stream, corr, name, self.sync_ids))
        if not len(cpu):
            return
        ids, from_end = np.unique(corr[cpu][::-1], return_index=True)
        last = cpu[len(cpu) - 1 - from_end]
        inside = (stream[last] < 0) & np.isin(self.step_of(ts[last]), self.iterations)
        if start == 0 and self.first_row_is_first_event:
            inside &= last != 0
        self.launches = np.union1d(np.setdiff1d(self.launches, ids[~inside], assume_unique=True), ids[inside])

    def rows(self, ts: np.ndarray, stream: np.ndarray, corr: np.ndarray, name: np.ndarray) -> np.ndarray:
        """Second sweep: the rows kept.  CPU rows (a negative stream) by the
        step spans holding their start, rows on a stream by their launch; the
        device type then takes stream -1 (cpu) or the others (gpu)."""
        kept = (stream < 0) & np.isin(self.step_of(ts), self.iterations)
        kept |= (stream > 0) & gpu_side(stream, corr, name, self.sync_ids) & np.isin(corr, self.launches)
        if self.device == "cpu":
            kept &= stream == NO_ID
        elif self.device == "gpu":
            kept &= stream != NO_ID
        return kept


class NameTotals:
    """Count and total duration per name id (HTA's ``get_ops_summary``)."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, np.int64)
        self.durations = np.zeros(0, np.float64)

    def add(self, name: np.ndarray, dur: np.ndarray) -> None:
        size = max(len(self.counts), int(name.max()) + 1 if len(name) else 0)
        self.counts = np.bincount(name, minlength=size) + np.pad(self.counts, (0, size - len(self.counts)))
        self.durations = np.bincount(name, weights=dur, minlength=size) + np.pad(self.durations,
                                                                                  (0, size - len(self.durations)))

    def by_name(self, names: list[str], short: bool) -> dict[str, tuple[int, float]]:
        """Name (HTA's short name with ``short``) -> (count, total duration),
        sorted by name as HTA's groupby sorts."""
        totals: dict[str, tuple[int, float]] = {}
        for at in np.flatnonzero(self.counts).tolist():
            key = shorten_name(names[at]) if short else names[at]
            count, duration = totals.get(key, (0, 0.0))
            totals[key] = (count + int(self.counts[at]), duration + float(self.durations[at]))
        return dict(sorted(totals.items()))


def compare(control: dict[str, tuple[int, float]], test: dict[str, tuple[int, float]],
            labels: tuple[str, str] = LABELS) -> list[dict]:
    """HTA's ``compare_traces`` rows: the control's names in order, then the
    names only the test has (pandas' outer join of the two sorted frames)."""
    columns = diff_columns(labels)
    rows = []
    for name in [*control, *(name for name in test if name not in control)]:
        (control_count, control_duration), (test_count, test_duration) = (side.get(name, (0, 0.0))
                                                                          for side in (control, test))
        diff_counts = test_count - control_count
        values = (name, control_count, number(control_duration), test_count, number(test_duration), diff_counts,
                  number(test_duration - control_duration), "+" if diff_counts > 0 else "-" if diff_counts < 0 else "=")
        rows.append(dict(zip(columns, values)))
    return rows


def ops_diff(rows: list[dict], labels: tuple[str, str] = LABELS) -> dict[str, list[str]]:
    """HTA's ``ops_diff`` over ``compare`` rows: each change's names, in row order."""
    control, test = (f"{label}_counts" for label in labels)
    tests = {
        "added": lambda row: row[control] == 0 and row[test] > 0,
        "deleted": lambda row: row[control] > 0 and row[test] == 0,
        "increased": lambda row: row[control] > 0 and row["diff_counts"] > 0,
        "decreased": lambda row: row[test] > 0 and row["diff_counts"] < 0,
        "unchanged": lambda row: row[test] > 0 and row["diff_counts"] == 0,
    }
    return {change: [row["name"] for row in rows if test_of(row)] for change, test_of in tests.items()}


def number(value: float) -> int | float:
    """A duration as HTA's whole microseconds print: an int when it is whole."""
    return int(value) if float(value).is_integer() else float(value)


def join_tables(control: list[dict], test: list[dict], keys: tuple[str, ...], columns: tuple[str, ...],
                labels: tuple[str, str] = LABELS) -> tuple[list[str], list[dict]]:
    """Two runs' rows of one table side by side, as TraceLens compares its
    reports; returns the header and the rows.  Joined on ``keys``; per other
    column ``<column>__<label>`` for each run, then for a column holding
    numbers ``<column>__diff`` (test - control) and ``<column>__pct``
    (100 x diff / control; empty where the control's is 0 or a run lacks the
    row); ``present`` says where the row is: ``both``, ``control`` or ``test``.
    Rows: the control's in its order, then those only the test has, in its order."""
    values = [column for column in columns if column not in keys]
    numeric = {column for column in values if any(_is_number(row.get(column)) for row in (*control, *test))}
    header = [*keys, "present"]
    for column in values:
        header += [f"{column}__{label}" for label in labels]
        header += [f"{column}__diff", f"{column}__pct"] if column in numeric else []
    tests = {_key(row, keys): row for row in test}
    controls = {_key(row, keys) for row in control}
    pairs = [(row, tests.get(_key(row, keys))) for row in control]
    pairs += [(None, row) for key, row in tests.items() if key not in controls]
    joined = []
    for mine, theirs in pairs:
        row = dict(zip(keys, _key(mine if mine is not None else theirs, keys)))
        row["present"] = "both" if mine is not None and theirs is not None else "control" if mine is not None else "test"
        for column in values:
            pair = [None if side is None else side.get(column) for side in (mine, theirs)]
            row.update({f"{column}__{label}": value for label, value in zip(labels, pair)})
            if column in numeric:
                difference = pair[1] - pair[0] if all(map(_is_number, pair)) else None  # type: ignore[operator]
                row[f"{column}__diff"] = _tidy(difference)
                row[f"{column}__pct"] = None if difference is None or not pair[0] else _tidy(100 * difference / pair[0])
        joined.append(row)
    return header, joined


def _key(row: dict, keys: tuple[str, ...]) -> tuple:
    return tuple(row.get(key) for key in keys)


def _tidy(value: float | None) -> float | None:
    """A difference of two decimals without the binary noise (13.81 - 13.63 is 0.18, not 0.17999999999999972)."""
    return value if value is None or isinstance(value, int) else round(value, 9)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # (NaN is no number)
