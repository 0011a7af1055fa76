"""The analyze report's figures, from the summary's tables (no I/O).

Each figure is a :class:`Figure`: plotly traces and layout as plain dicts
(numbers as numpy arrays, which the page encodes as typed arrays), a title,
a one-sentence caption, and the words that call out what it shows.  A
figure whose table is empty (no GPU work, no profiler steps) is one with
``missing`` set to the reason, and no traces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

TYPE_COLORS = {"COMPUTATION": "#4c78a8", "COMMUNICATION": "#f58518", "MEMORY": "#54a24b", "idle": "#bab0ac"}
IDLE_COLORS = {"host_wait": "#e45756", "kernel_wait": "#72b7b2", "other": "#bab0ac"}
TOP_KERNELS = 20
CALLED_OUT = 3  # ranks and steps named above the heat maps
STREAM_BARS = 256  # idle bars drawn, one per stream (a page of thousands of labelled bars does not open)
NAME_CHARS = 70  # kernel names on the axis; the full name is in the hover text


@dataclass
class Figure:
    key: str  # the element id is fig-<key>
    title: str
    caption: str
    traces: list = field(default_factory=list)
    layout: dict = field(default_factory=dict)
    callout: str = ""
    missing: str = ""
    height: int = 0  # pixels; 0: the page's default for the figure
    table: list[list[str]] = field(default_factory=list)  # a table instead of a plot: the header row, then rows


@dataclass
class RankOrder:
    """Ranks in the figures' order: by PP stage when known, then by rank; their axis labels."""

    ranks: list[int]
    labels: list[str]
    position: dict[int, int]

    @classmethod
    def of(cls, rank_info: list[dict], ranks: list[int]) -> RankOrder:
        stages = {row["rank"]: row["pp_stage"] for row in rank_info}
        ordered = sorted(ranks, key=lambda rank: (stages.get(rank) is None, stages.get(rank) or 0, rank))
        several = len({stage for stage in stages.values() if stage is not None}) > 1  # else no stage to tell apart
        labels = [f"{rank} · PP{stages[rank]}" if several and stages.get(rank) is not None else f"{rank}" for rank in ordered]
        return cls(ordered, labels, {rank: at for at, rank in enumerate(ordered)})

    def column(self, rows: list[dict], key: str, scale: float = 1.0) -> np.ndarray:
        """One value per rank (summed over its rows), NaN where it has none."""
        out = np.full(len(self.ranks), math.nan)
        for row in rows:
            at = self.position.get(row["rank"])
            if at is not None and row[key] is not None:
                out[at] = (0.0 if math.isnan(out[at]) else out[at]) + row[key] * scale
        return out


def figures(summary: dict) -> list[Figure]:
    """Every figure of the page, in page order."""
    tables = summary["tables"]
    order = RankOrder.of(summary.get("rank_info") or [], summary["ranks"])
    return [breakdown(tables, order), *step_maps(tables, order), utilization_map(tables, order), top_kernels(tables),
            overlap(tables, order), idle_breakdown(tables, order)]


def _rank_axis(order: RankOrder, downwards: bool = False) -> dict:
    """The rank axis, in the figures' order (``downwards``: the first rank at the top, for heat maps)."""
    axis = {"title": {"text": "rank"}, "type": "category", "categoryorder": "array", "categoryarray": order.labels}
    return {**axis, "autorange": "reversed"} if downwards else axis


GLANCE_COLUMNS = {"COMPUTATION": "compute_time(us)", "COMMUNICATION": "communication(us)", "MEMORY": "memory(us)"}
ROUNDING_POINTS = 0.5  # HTA's rounding moving a rank's share by more than this is said (page and text report)


def breakdown(tables: dict, order: RankOrder) -> Figure:
    figure = Figure("breakdown", "Run at a glance",
                    "Per rank, the time its GPU ran kernels of each type (ms; the union of that type's kernels, so "
                    "types running at the same time each count) and the time no kernel ran on any of its streams "
                    "(GPU idle), from the trace's own times (gpu_time): a tall grey part is a rank that waits.")
    rows = tables["gpu_time"]
    for kind, column in GLANCE_COLUMNS.items():
        figure.traces.append({"type": "bar", "name": kind.lower(), "x": order.labels, "y": order.column(rows, column, 1e-3),
                              "marker": {"color": TYPE_COLORS[kind]}})
    figure.traces.append({"type": "bar", "name": "idle", "x": order.labels, "y": order.column(rows, "idle_time(us)", 1e-3),
                          "marker": {"color": TYPE_COLORS["idle"]}})
    figure.layout = {"barmode": "stack", "xaxis": _rank_axis(order), "yaxis": {"title": {"text": "ms"}}}
    figure.callout = rounding_words(tables)
    return _needs_rows(figure, [row for row in rows if row["kernel_time(us)"] or row["busy(us)"]], "no rank has GPU work")


def rounding_words(tables: dict) -> str:
    """The ranks whose idle share HTA's whole-microsecond rounding moves by more than half a point, in words."""
    hta = {row["rank"]: row["idle_time_pctg"] for row in tables["temporal_breakdown"]}
    moved = [(row["rank"], row["idle_time_pctg"], hta[row["rank"]]) for row in tables["gpu_time"]
             if row["rank"] in hta and abs(hta[row["rank"]] - row["idle_time_pctg"]) > ROUNDING_POINTS]
    if not moved:
        return ""
    shown = ", ".join(f"rank {rank} {exact:.1f}% here, {rounded:.1f}% there" for rank, exact, rounded in moved[:CALLED_OUT])
    more = f" and {len(moved) - CALLED_OUT:,} more ranks" if len(moved) > CALLED_OUT else ""
    return (f"HTA's tables (temporal_breakdown.csv) round every kernel to whole microseconds, which moves the idle "
            f"share: {shown}{more}. The figures here take the trace's own times, as inspect does.")


def _needs_rows(figure: Figure, rows: list | None, reason: str) -> Figure:
    if not rows:
        figure.traces, figure.missing = [], reason
    return figure


def step_spans(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """One step_times row per (rank, step): the longest, where a trace has
    several ProfilerStep spans of a step (the CPU one and GPU annotations)."""
    out: dict[tuple[int, int], dict] = {}
    for row in rows:
        key = (row["rank"], row["step"])
        if key not in out or row["duration(us)"] > out[key]["duration(us)"]:
            out[key] = row
    return out


def _rank_step_matrix(spans: dict, key: str, order: RankOrder, steps: list[int], scale: float) -> np.ndarray:
    matrix = np.full((len(order.ranks), len(steps)), math.nan)
    column = {step: at for at, step in enumerate(steps)}
    for (rank, step), row in spans.items():
        at = order.position.get(rank)
        if at is not None and step in column:
            matrix[at, column[step]] = row[key] * scale
    return matrix


def step_maps(tables: dict, order: RankOrder) -> list[Figure]:
    steps = [row["step"] for row in tables["profiler_steps"]]
    rows = step_spans(tables["step_times"])
    duration = Figure("step-duration", "Stragglers: step duration",
                      "Each cell is one rank's duration of one profiler step (its longest ProfilerStep span, ms). A long "
                      "step is a slow rank, or one that waits in a collective for a rank that arrives late: step "
                      "duration alone does not tell them apart; a hotter column is a slow step.")
    idle = Figure("step-idle", "Stragglers: GPU idle per step",
                  "Each cell is the time one rank's GPU sat idle within the kernels a step launched (ms). A "
                  "collective waiting for a late rank keeps the GPU busy, so a rank that never idles may be waiting "
                  "in communication kernels, not holding the others up.")
    if not steps or not rows:
        reason = "no profiler steps (ProfilerStep#N annotations) in the input: per-step figures need them"
        return [_needs_rows(duration, [], reason), _needs_rows(idle, [], reason)]
    for figure, key in ((duration, "duration(us)"), (idle, "idle(us)")):
        matrix = _rank_step_matrix(rows, key, order, steps, 1e-3)
        figure.traces = [{"type": "heatmap", "x": [str(step) for step in steps], "y": order.labels, "z": matrix,
                          "colorscale": "YlOrRd", "reversescale": True, "colorbar": {"title": {"text": "ms"}},
                          "hovertemplate": "rank %{y}<br>step %{x}<br>%{z:.3f} ms<extra></extra>"}]
        figure.layout = {"xaxis": {"title": {"text": "profiler step"}, "type": "category"},
                         "yaxis": _rank_axis(order, downwards=True)}
    duration.callout = straggler_words(tables, list(rows.values()))
    return [duration, idle]


def straggler_words(tables: dict, rows: list[dict]) -> str:
    """First the ranks that arrive last at collectives (HTA's straggler metric: the start of the communication
    kernel whose duration varies most across ranks, per step) where the trace tells; then the longest mean
    step times and the longest steps, said to measure time, not which rank holds the others up."""
    starts: dict[int, list[float]] = {}
    for row in tables["stragglers"]:
        if row["normalized_start_time"] is not None:
            starts.setdefault(row["rank"], []).append(row["normalized_start_time"])
    words = []
    if len(starts) > 1:
        mean_start = {rank: float(np.mean(values)) for rank, values in starts.items()}
        last = sorted(mean_start, key=lambda rank: (-mean_start[rank], rank))[:CALLED_OUT]
        candidates = sorted({row["rank"] for row in tables["stragglers"] if row["potential_straggler"]})
        words.append("Ranks arriving last at collectives (the latest starts of the communication kernel whose "
                     "duration varies most across ranks): " + ", ".join(f"rank {rank}" for rank in last)
                     + f"; HTA's straggler candidates: ranks {', '.join(map(str, candidates))}. The other ranks "
                     "wait for them inside their collectives, which lengthens their own steps.")
    else:
        words.append("Which rank arrives last cannot be told here: HTA's straggler metric needs several ranks, "
                     "profiler steps and ncclKernel... communication kernels.")
    per_rank: dict[int, list[float]] = {}
    for row in rows:
        per_rank.setdefault(row["rank"], []).append(row["duration(us)"])
    means = {rank: float(np.mean(values)) for rank, values in per_rank.items()}
    median = float(np.median(list(means.values())))
    longest_mean = sorted(means, key=lambda rank: (-means[rank], rank))[:CALLED_OUT]
    words.append("Longest mean step time (a waiting rank's steps are long too): " + ", ".join(
        f"rank {rank} ({means[rank] / 1e3:,.2f} ms{_times(means[rank], median)})" for rank in longest_mean) + ".")
    longest = sorted(rows, key=lambda row: (-row["duration(us)"], row["rank"], row["step"]))[:CALLED_OUT]
    words.append("Longest steps: " + ", ".join(f"step {row['step']} on rank {row['rank']} "
                                               f"({row['duration(us)'] / 1e3:,.2f} ms)" for row in longest) + ".")
    return " ".join(words)


def _times(value: float, median: float) -> str:
    return f", {value / median:.2f}× the median rank" if median > 0 else ""


def utilization_map(tables: dict, order: RankOrder) -> Figure:
    figure = Figure("utilization", "Utilization over time",
                    "Each row is one rank, each column an equal slice of the run, the colour the fraction of it the "
                    "GPU was busy: dark vertical stripes are bubbles or stalls all ranks share, a dark row a rank "
                    "that idles, a shifted row a late rank.")
    rows = tables["utilization"]
    if not rows:
        return _needs_rows(figure, rows, "no GPU kernels in the input")
    bins = 1 + max(row["bin"] for row in rows)
    matrix = np.full((len(order.ranks), bins), math.nan, dtype=np.float32)
    middle = np.zeros(bins)
    for row in rows:
        matrix[order.position[row["rank"]], row["bin"]] = row["busy_fraction"]
        middle[row["bin"]] = (row["start(us)"] + row["end(us)"]) / 2e3
    figure.traces = [{"type": "heatmap", "x": middle, "y": order.labels, "z": matrix, "zmin": 0, "zmax": 1,
                      "colorscale": "Viridis", "colorbar": {"title": {"text": "busy"}, "tickformat": ".0%"},
                      "hovertemplate": "rank %{y}<br>%{x:.1f} ms<br>busy %{z:.1%}<extra></extra>"}]
    figure.layout = {"xaxis": {"title": {"text": "ms since the run's first event"}}, "yaxis": _rank_axis(order, downwards=True)}
    return figure


def top_kernels(tables: dict) -> Figure:
    figure = Figure("kernels", "Where GPU time goes: top kernels",
                    f"The {TOP_KERNELS} kernels with the most GPU time summed over all ranks (ms, the trace's own "
                    "times: kernel_totals), coloured by type; hover for the full name.")
    top = [row for row in tables["kernel_totals"] if row["kernel_type"] in TYPE_COLORS][:TOP_KERNELS]
    for kind in ("COMPUTATION", "COMMUNICATION", "MEMORY"):
        mine = [row for row in top if row["kernel_type"] == kind]
        if mine:
            figure.traces.append({
                "type": "bar", "orientation": "h", "name": kind.lower(), "marker": {"color": TYPE_COLORS[kind]},
                "x": np.array([row["sum (us)"] * 1e-3 for row in mine]), "y": [_short(row["name"]) for row in mine],
                "customdata": [row["name"] for row in mine], "hovertemplate": "%{customdata}<br>%{x:,.3f} ms<extra></extra>"})
    figure.layout = {"xaxis": {"title": {"text": "ms, all ranks"}},
                     "yaxis": {"type": "category", "categoryorder": "array",
                               "categoryarray": [_short(row["name"]) for row in reversed(top)], "automargin": True}}
    return _needs_rows(figure, top, "no GPU kernels in the input")


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def overlap(tables: dict, order: RankOrder) -> Figure:
    figure = Figure("overlap", "Communication hidden behind computation",
                    "Per rank, the share of its communication kernels' time during which computation ran too (HTA's "
                    "comm_comp_overlap from the trace's own times, gpu_time, %): low bars are exposed communication.")
    figure.traces = [{"type": "bar", "name": "overlap", "x": order.labels,
                      "y": order.column(tables["gpu_time"], "comp_comm_overlap_pctg"),
                      "marker": {"color": TYPE_COLORS["COMMUNICATION"]}}]
    figure.layout = {"xaxis": _rank_axis(order), "yaxis": {"title": {"text": "%"}, "range": [0, 100]}}
    return _needs_rows(figure, tables["gpu_time"], "no rank has GPU work")


def idle_breakdown(tables: dict, order: RankOrder) -> Figure:
    figure = Figure("idle", "Why the GPU idles",
                    "Per stream (each rank's streams side by side), the time between its own kernels by HTA's cause "
                    "(idle_time_breakdown, ms): waiting for the host to launch, short gaps between kernels, and the "
                    "rest. A rank's streams idle at the same time, so they do not add up to its GPU idle time (Run "
                    "at a glance).")
    rows = tables["idle_time_breakdown"]
    streams = sorted(dict.fromkeys((row["rank"], row["stream"]) for row in rows if row["rank"] in order.position),
                     key=lambda key: order.position[key[0]])  # (the table's stream order within a rank)
    if len(streams) > STREAM_BARS:
        figure.caption += (f" The first {STREAM_BARS} of {len(streams):,} streams, in the ranks' order "
                           "(idle_time_breakdown has them all).")
        streams = streams[:STREAM_BARS]
    at = {key: n for n, key in enumerate(streams)}
    labels = [f"{order.labels[order.position[rank]]} · stream {stream}" for rank, stream in streams]
    for kind, color in IDLE_COLORS.items():
        values = np.full(len(streams), math.nan)
        for row in rows:
            if row["idle_category"] == kind and (row["rank"], row["stream"]) in at:
                values[at[(row["rank"], row["stream"])]] = row["idle_time"] * 1e-3
        figure.traces.append({"type": "bar", "name": kind.replace("_", " "), "x": labels, "y": values,
                              "marker": {"color": color}})
    figure.layout = {"barmode": "stack", "yaxis": {"title": {"text": "ms"}},
                     "xaxis": {"title": {"text": "rank · stream"}, "type": "category", "categoryorder": "array",
                               "categoryarray": labels}}
    return _needs_rows(figure, rows, "no GPU kernels in the input")
