"""The diff report's figures, from a diff summary and its joined tables (no I/O).

Each is a :class:`~.reportfigures.Figure` as the analyze page draws them:
the step-time shift per rank (``step_time_per_rank``), both runs' time per
rank side by side (``temporal_breakdown``), the operators and kernels whose
duration moved most in the compared rank and iteration (``trace_diff``)
and the kernels that moved most over all ranks (``kernel_breakdown``).
"""
from __future__ import annotations

import math

import numpy as np

from .reportfigures import NAME_CHARS, TYPE_COLORS, Figure

RUNS = ("Control", "Test")
PARTS = (("compute_time(us)", "computation", TYPE_COLORS["COMPUTATION"]),
         ("non_compute_time(us)", "communication and memory", TYPE_COLORS["COMMUNICATION"]),
         ("idle_time(us)", "idle", TYPE_COLORS["idle"]))
GREW, SHRANK = "#e45756", "#54a24b"  # longer in the test run, shorter
TOP_CHANGES = 20
CALLED_OUT = 3


def figures(summary: dict) -> list[Figure]:
    """Every figure of the diff page, in page order."""
    tables = summary["tables"]
    return [step_shift(tables["step_time_per_rank"]), rank_bars(tables["temporal_breakdown"]),
            top_changes(summary["trace_diff"], summary["control"], summary["test"]),
            kernel_changes(tables["kernel_breakdown"])]


def change(row: dict, column: str) -> float:
    """How much a joined row's ``column`` moved: its difference, or all of it where one run lacks the row."""
    if row["present"] == "both":
        return row[f"{column}__diff"] or 0
    return (row[f"{column}__Test"] or 0) - (row[f"{column}__Control"] or 0)


def _signed_ms(value_us: float) -> str:
    return f"{value_us / 1e3:+,.3f} ms"


def _colors(values: np.ndarray) -> list[str]:
    return [GREW if value > 0 else SHRANK for value in values.tolist()]


def step_shift(rows: list[dict]) -> Figure:
    figure = Figure("step-shift", "Step-time shift per rank",
                    "Per rank, its mean profiler step in the test run minus the control run (ms; each step's longest "
                    "ProfilerStep span, as step_time_per_rank.csv): red bars are ranks whose steps got longer, green "
                    "shorter. A rank in one run only has no bar.")
    both = [row for row in rows if row["present"] == "both"]
    if not both:
        figure.missing = "no rank has profiler steps in both runs"
        return figure
    labels = [str(row["rank"]) for row in rows]
    shift = np.array([row["mean_step(us)__diff"] * 1e-3 if row["present"] == "both" else math.nan for row in rows])
    figure.traces = [{"type": "bar", "name": "test − control", "x": labels, "y": shift,
                      "marker": {"color": _colors(np.nan_to_num(shift))},
                      "customdata": [[_ms(row["mean_step(us)__Control"]), _ms(row["mean_step(us)__Test"]),
                                      "" if row["mean_step(us)__pct"] is None else f"{row['mean_step(us)__pct']:+.1f}%"]
                                     for row in rows],
                      "hovertemplate": "rank %{x}<br>%{customdata[0]} → %{customdata[1]} ms (%{customdata[2]})"
                                       "<extra></extra>"}]
    figure.layout = {"xaxis": {"title": {"text": "rank"}, "type": "category"},
                     "yaxis": {"title": {"text": "ms, test − control"}, "zeroline": True}}
    moved = sorted((row for row in both if row["mean_step(us)__diff"]), key=lambda row: -abs(row["mean_step(us)__diff"]))
    if moved:
        figure.callout = "Moved most: " + ", ".join(
            f"rank {row['rank']} {_signed_ms(row['mean_step(us)__diff'])}"
            + ("" if row["mean_step(us)__pct"] is None else f" ({row['mean_step(us)__pct']:+.1f}%)")
            for row in moved[:CALLED_OUT]) + "."
    alone = [f"ranks {', '.join(str(row['rank']) for row in rows if row['present'] == run)} only in the {run} run"
             for run in ("control", "test") if any(row["present"] == run for row in rows)]
    if alone:
        said = "; ".join(alone)
        figure.callout = " ".join(filter(None, [figure.callout, said[0].upper() + said[1:] + "."]))
    return figure


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value / 1e3:,.3f}"


def rank_bars(rows: list[dict]) -> Figure:
    figure = Figure("ranks", "Both runs per rank, side by side",
                    "Per rank, the control run's bar then the test run's: the time its GPU computed, communicated or "
                    "copied (non-compute) and sat idle between its first and last kernel (ms; HTA's "
                    "temporal_breakdown, as temporal_breakdown.csv has it for each run).")
    if not rows:
        figure.missing = "no rank has GPU kernels in either run"
        return figure
    ranks = sorted(row["rank"] for row in rows)
    by_rank = {row["rank"]: row for row in rows}
    x = [[str(rank) for rank in ranks for _ in RUNS], [run for _ in ranks for run in RUNS]]
    for column, name, color in PARTS:
        values = np.array([_or_nan(by_rank[rank][f"{column}__{run}"]) * 1e-3 for rank in ranks for run in RUNS])
        figure.traces.append({"type": "bar", "name": name, "x": x, "y": values, "marker": {"color": color},
                              "hovertemplate": "rank %{x}<br>%{y:,.3f} ms<extra>" + name + "</extra>"})
    figure.layout = {"barmode": "stack", "xaxis": {"title": {"text": "rank · run"}, "type": "multicategory"},
                     "yaxis": {"title": {"text": "ms"}}}
    return figure


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def _change_bars(figure: Figure, names: list[str], moved_us: list[float], hover: list[str]) -> Figure:
    """Horizontal bars of how much each name moved (ms), the largest at the top."""
    values = np.array(moved_us) * 1e-3
    labels = [_short(name) for name in names]
    figure.traces = [{"type": "bar", "orientation": "h", "name": "test − control", "x": values, "y": labels,
                      "marker": {"color": _colors(values)}, "customdata": [[name, text] for name, text in zip(names, hover)],
                      "hovertemplate": "%{customdata[0]}<br>%{x:+,.3f} ms<br>%{customdata[1]}<extra></extra>"}]
    figure.layout = {"xaxis": {"title": {"text": "ms, test − control"}, "zeroline": True},
                     "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": labels[::-1],
                               "automargin": True}}
    return figure


def top_changes(rows: list[dict], control: dict, test: dict) -> Figure:
    figure = Figure("top-changes", "Top changes: operators and kernels",
                    f"The {TOP_CHANGES} operator and kernel names whose total duration moved most between control rank "
                    f"{control['rank']} iteration {control['iteration']} and test rank {test['rank']} iteration "
                    f"{test['iteration']} (ms, test − control; HTA's compare_traces, as trace_diff.csv): red grew, "
                    "green shrank; hover for the counts.")
    moved = sorted((row for row in rows if row["diff_duration"]), key=lambda row: -abs(row["diff_duration"]))[:TOP_CHANGES]
    if not moved:
        figure.missing = "no operator or kernel duration moved"
        return figure
    return _change_bars(figure, [row["name"] for row in moved], [row["diff_duration"] for row in moved],
                        [f"count {row['Control_counts']:,} → {row['Test_counts']:,}" for row in moved])


def listed(numbers: list[int], limit: int = 8) -> str:
    """Numbers in words: the first ``limit``, then the last and how many."""
    shown = ", ".join(map(str, numbers[:limit]))
    return shown + (f" ... {numbers[-1]} ({len(numbers)})" if len(numbers) > limit else "")


def moved_by_name(rows: list[dict]) -> list[tuple[str, float, list[int]]]:
    """``kernel_breakdown``'s joined rows by kernel: how much its ``sum (us)`` moved over
    all ranks, and the ranks where it moved that way; the largest first, those that did not move left out."""
    moved: dict[str, float] = {}
    per_rank: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        amount = change(row, "sum (us)")
        moved[row["name"]] = moved.get(row["name"], 0.0) + amount
        per_rank.setdefault(row["name"], []).append((row["rank"], amount))
    found = [(name, total, sorted({rank for rank, amount in per_rank[name] if amount * total > 0}))
             for name, total in moved.items() if total]
    return sorted(found, key=lambda item: -abs(item[1]))


def where_moved(moved: float, ranks: list[int]) -> str:
    return f"{'longer' if moved > 0 else 'shorter'} on ranks {listed(ranks)}"


def kernel_changes(rows: list[dict]) -> Figure:
    figure = Figure("kernel-changes", "Kernels that moved most, all ranks",
                    f"The {TOP_CHANGES} kernels whose GPU time summed over all ranks and the whole trace moved most "
                    "(ms, test − control; HTA's kernel_breakdown, as kernel_breakdown.csv has it per rank, a kernel "
                    "one run lacks counting whole): red grew, green shrank; hover for the ranks.")
    moved = moved_by_name(rows)[:TOP_CHANGES]
    if not moved:
        figure.missing = "no kernel's GPU time moved"
        return figure
    collectives = moved_by_name([row for row in rows if row["kernel_type"] == "COMMUNICATION"])[:CALLED_OUT]
    if collectives:
        figure.callout = "Collectives that moved most (a collective waiting for a late rank takes longer): " + \
            "; ".join(f"{name[:NAME_CHARS]} {_signed_ms(total)} ({where_moved(total, ranks)})"
                      for name, total, ranks in collectives) + "."
    return _change_bars(figure, [name for name, _, _ in moved], [total for _, total, _ in moved],
                        [where_moved(total, ranks) for _, total, ranks in moved])


def facts(summary: dict, command: str | None) -> list[tuple[str, str]]:
    """The page's header: each run as read, what changed, the notes, what made it."""
    rows = [(side, f"{summary[side]['file']} · rank {summary[side]['rank']} of {len(summary[side]['ranks']):,} · "
                   f"iteration {summary[side]['iteration']}") for side in ("control", "test")]
    rows.append(("operators and kernels", ", ".join(f"{count:,} {name}" for name, count in summary["changes"].items())
                 + f" (device {summary['device']})"))
    rows += [("note", note) for note in summary["notes"]]
    rows.append(("made by", command or "streamtrace.diff(...)"))
    return rows
