"""The report page's lead on collectives: who arrives last, who waits for whom, how long (no I/O).

Read from the collective tables of the summary (TraceLens's ``nccl_implicit_sync`` and
``straggler_summary``; ``collective_bandwidth`` and ``straggler_causes`` beyond TraceLens), with
TraceLens's wait: at each matched collective, the latest start of its kernel over its ranks minus a
rank's own start.  The rank a collective waits for is the one starting last (the lowest such rank on
ties, as ``collective_bandwidth`` names it); what it costs the others is the sum of their waits there.
Every figure is bounded whatever the number of ranks and collectives: the heat map shows the
collectives with the most wait, the bars the ranks waited for most, the table the late ranks that cost
the most; each caption says when it is cut.
"""
from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .reportfigures import CALLED_OUT, Figure, RankOrder, _rank_axis

HEATMAP_COLLECTIVES = 100  # columns of the wait heat map: the collectives with the most wait summed over ranks
SLOWEST = 20  # collectives in the latency figure
WHY_ROWS = 32  # late ranks in the why-table
WAIT_COLUMN = re.compile(r"rank_(\d+)_wait_time$")
WAITED_COLORS = ("#e45756", "#f58518", "#eeca3b")  # the ranks waited for most, then the rest in grey
OTHERS_COLOR = "#bab0ac"
NO_RANK = -1
ONE_RANK = "who waits for whom needs the other ranks' traces too"  # (said of one rank's collectives)
NO_WAIT = "no rank waits for another: every rank starts each matched collective at the same time"


@dataclass
class Waits:
    """The matched collectives (nccl_implicit_sync's rows, read once) and their ranks' waits, as arrays: no row
    is held."""

    labels: list[str]  # one per row, unique: collective id and name
    ranks: list[int]  # the ranks of the wait columns
    wait: np.ndarray  # (rows, ranks) us; NaN where the rank is not in the collective
    last: np.ndarray  # per row the rank starting last (NO_RANK without waits)
    lost: np.ndarray  # per row the wait summed over its ranks: what the others lose waiting for the last
    latency: np.ndarray  # per row its comm_latency, us

    @classmethod
    def of(cls, rows: Iterable[dict]) -> Waits:
        ranks: list[int] = []
        columns: list[str] = []
        cells, latency, labels = array("d"), array("d"), []
        seen: set[str] = set()
        for count, row in enumerate(rows):
            if not count:
                ranks = sorted(int(found.group(1)) for found in map(WAIT_COLUMN.match, row) if found)
                columns = [f"rank_{rank}_wait_time" for rank in ranks]
            cells.extend([math.nan if row.get(name) is None else row[name] for name in columns])
            latency.append(row["comm_latency"])
            labels.append(_unique_label(row, seen))
        wait = np.frombuffer(cells, dtype=np.float64).reshape(len(labels), len(ranks))
        last = np.full(len(labels), NO_RANK, dtype=np.int64)
        for at, values in enumerate(wait):
            present = np.flatnonzero(~np.isnan(values))
            if len(present):
                last[at] = ranks[present[np.argmin(values[present])]]  # (argmin: the first, so the lowest rank)
        return cls(labels, ranks, wait, last, np.nansum(wait, axis=1) if len(ranks) else np.zeros(len(labels)),
                   np.frombuffer(latency, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.labels)

    def cost(self) -> dict[int, float]:
        """Per rank waited for: the others' wait summed over the collectives it starts last at (us), most first."""
        costs: dict[int, float] = {}
        for rank, lost in zip(self.last.tolist(), self.lost.tolist()):
            if rank != NO_RANK and lost > 0:
                costs[rank] = costs.get(rank, 0.0) + lost
        return dict(sorted(costs.items(), key=lambda item: (-item[1], item[0])))

    def times_last(self) -> dict[int, int]:
        """Per rank, the collectives at which others wait for it."""
        counts: dict[int, int] = {}
        for rank, lost in zip(self.last.tolist(), self.lost.tolist()):
            if lost > 0:
                counts[rank] = counts.get(rank, 0) + 1
        return counts


def _unique_label(row: dict, seen: set[str]) -> str:
    """``<collective_id> <name>``; a repeated id (groups sharing a name, not their ranks) gets its ranks."""
    label = f"{row['collective_id']} {row.get('Collective name') or ''}".strip()
    if label in seen:
        label += f" {row.get('Process Group Ranks')}"
    while label in seen:
        label += "'"
    seen.add(label)
    return label


def page(summary: dict) -> tuple[str, list[Figure]]:
    """The page's lead sentence on collectives and its figures (none when the inputs hold no collective)."""
    tables = summary["tables"]
    if "nccl_long" not in tables:
        return "", []
    rows = tables.get("nccl_implicit_sync")
    figure = Figure("collective-waits", "Who waits for whom at collectives", "")
    if rows is None:
        figure.missing = ("more matched collectives than the summary carries: nccl_implicit_sync is in -o DIR's CSV "
                          "only, not drawn")
        return "", [figure]
    waits = Waits.of(rows)  # (rows: a list, or the table read back from its file; read twice)
    if len(waits.ranks) == 1:
        figure.missing = f"the collectives are one rank's (rank {waits.ranks[0]}): {ONE_RANK}"
    elif not waits.ranks:
        figure.missing = ("no collective is matched across ranks (an all-reduce, reduce-scatter, all-gather or "
                          "all_to_all, by TraceLens's order within a process group), so no rank waits for another")
    if figure.missing:
        return "", [figure]
    order = RankOrder.of(summary.get("rank_info") or [], summary["ranks"])
    heat = wait_map(waits, order)
    heat.callout = " ".join(note[0].upper() + note[1:] + "." for note in summary.get("notes") or ()
                            if note.startswith("collectives: "))  # (what the matching could not vouch for)
    return lead(tables, waits), [heat, wait_bars(waits, order), slowest(tables, rows, waits), why_table(tables, waits)]


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f} ms" if us >= 100 else f"{us:,.1f} us"


def lead(tables: dict, waits: Waits) -> str:
    """Who the others wait for, how often and what it costs them; the latest and the most waiting ranks."""
    costs, counts = waits.cost(), waits.times_last()
    total = float(waits.lost.sum())
    matched = len(waits)
    if not costs:
        return f"At the {matched:,} matched collectives, {NO_WAIT}."
    named = list(costs)[:CALLED_OUT]
    first = named[0]
    words = [f"Rank {first} arrives last at {counts[first]:,} of {matched:,} matched collectives, and the other ranks "
             f"lose {_ms(costs[first])} waiting for it there ({_share(costs[first], total)} of the {_ms(total)} all "
             "ranks wait at collectives)."]
    if len(named) > 1:
        words.append("Then " + ", ".join(f"rank {rank} (last at {counts[rank]:,}, {_ms(costs[rank])} of waiting)"
                                         for rank in named[1:]) + ".")
    stragglers = tables.get("straggler_summary") or []
    if len(stragglers) > 1:
        latest = stragglers[:CALLED_OUT]  # (TraceLens's order: least total wait first)
        longest = sorted(stragglers, key=lambda row: (-row["total_wait_time_us"], row["rank"]))[:CALLED_OUT]
        words.append("Least total wait (they arrive latest): " + ", ".join(
            f"rank {row['rank']} ({_ms(row['total_wait_time_us'])})" for row in latest) + "; most: " + ", ".join(
            f"rank {row['rank']} ({_ms(row['total_wait_time_us'])})" for row in longest) + ".")
    causes = {row["rank"]: row["why"] for row in tables.get("straggler_causes") or [] if row.get("why")}
    if causes.get(first):
        words.append(f"Why: {causes[first].split(': ', 1)[-1]}.")
    return " ".join(words)


def _share(part: float, total: float) -> str:
    return f"{100 * part / total:.0f}%" if total > 0 else "all"


def wait_map(waits: Waits, order: RankOrder) -> Figure:
    figure = Figure("collective-waits", "Who waits for whom: wait per rank and collective",
                    "Each cell is how long one rank waited at one matched collective for the last rank to arrive: the "
                    "latest start of the collective's kernel over its ranks minus this rank's start (TraceLens's wait, "
                    "nccl_implicit_sync's rank_<r>_wait_time, ms). The rank that arrives last has 0; an empty cell is a "
                    "rank outside the collective's group. Collectives (all-reduce, reduce-scatter, all-gather, "
                    "all_to_all) are matched across ranks by their order within a process group, as TraceLens matches "
                    "them; columns in the order they ran.")
    shown = np.sort(np.argsort(-waits.lost, kind="stable")[:HEATMAP_COLLECTIVES])
    if len(shown) < len(waits):
        figure.caption += (f" The {len(shown):,} of {len(waits):,} collectives with the most wait summed over "
                           "their ranks (nccl_implicit_sync has them all).")
    column = {rank: at for at, rank in enumerate(waits.ranks)}
    matrix = np.full((len(order.ranks), len(shown)), math.nan)
    for rank, at in order.position.items():
        if rank in column:
            matrix[at] = waits.wait[shown, column[rank]] / 1e3
    figure.traces = [{"type": "heatmap", "x": [waits.labels[at] for at in shown], "y": order.labels, "z": matrix,
                      "colorscale": "YlOrRd", "reversescale": True, "zmin": 0, "colorbar": {"title": {"text": "wait, ms"}},
                      "hovertemplate": "rank %{y}<br>%{x}<br>waits %{z:.3f} ms<extra></extra>"}]
    figure.layout = {"xaxis": {"title": {"text": "collective (id, name)"}, "type": "category", "automargin": True},
                     "yaxis": _rank_axis(order, downwards=True)}
    figure.height = int(min(900, max(300, 160 + 6 * len(order.ranks))))
    return figure


def wait_bars(waits: Waits, order: RankOrder) -> Figure:
    costs = waits.cost()
    waited = list(costs)[:len(WAITED_COLORS)]
    figure = Figure("collective-wait-ranks", "Who waits: wait per rank",
                    "Per rank, its wait summed over the matched collectives (straggler_summary's total_wait_time_us, "
                    "ms), split by the rank it waited for (the one starting last; the lowest on ties): a short bar is "
                    "a rank the others wait for, a tall one a rank that waits.")
    if len(costs) > len(waited):
        figure.caption += f" The {len(waited)} ranks waited for most are named; the rest are \"other ranks\"."
    column = {rank: at for at, rank in enumerate(waits.ranks)}
    rows = [column.get(rank) for rank in order.ranks]
    for name, picked, color in [*((f"waiting for rank {rank}", waits.last == rank, c) for rank, c in zip(waited, WAITED_COLORS)),
                                ("waiting for other ranks", ~np.isin(waits.last, waited), OTHERS_COLOR)]:
        per_rank = np.nansum(waits.wait[picked], axis=0) / 1e3
        if not per_rank.any():
            continue  # (collectives at which every rank starts together)
        figure.traces.append({"type": "bar", "name": name, "x": order.labels, "marker": {"color": color},
                              "y": np.array([math.nan if at is None else per_rank[at] for at in rows])})
    figure.layout = {"barmode": "stack", "yaxis": {"title": {"text": "ms"}}, "xaxis": _rank_axis(order)}
    if not figure.traces:
        figure.missing = NO_WAIT
    return figure


def slowest(tables: dict, rows: Iterable[dict], waits: Waits) -> Figure:
    shown = min(SLOWEST, len(waits))
    which = f"The {shown:,} of {len(waits):,}" if shown < len(waits) else f"The {shown:,}"
    figure = Figure("collective-slowest", "Slowest collectives: latency and bus bandwidth",
                    f"{which} matched collectives with the longest latency: the least duration of their kernel "
                    "over their ranks (TraceLens's comm_latency: the transfer once every rank is there, without the "
                    "wait), us, bars; dots: the bus bandwidth nccl-tests would report for it (collective_bandwidth's "
                    "bus bw, 10^9 bytes/s, top axis). Hover for the size and the wait for the last rank.")
    picked = np.argsort(-waits.latency, kind="stable")[:shown].tolist()
    place = {at: n for n, at in enumerate(picked)}
    keys: list[tuple] = [()] * len(picked)  # each picked collective's (collective_id, Process Group Ranks)
    for at, row in enumerate(rows):
        if at in place:
            keys[place[at]] = (row["collective_id"], row["Process Group Ranks"])
    wanted = set(keys)
    bandwidth = {}
    for row in tables.get("collective_bandwidth") or []:
        key = (row["collective_id"], row["Process Group Ranks"])
        if key in wanted:
            bandwidth[key] = row  # (a key's last row)
    labels = [waits.labels[at] for at in picked]
    latency = waits.latency[picked]
    found = [bandwidth.get(key) or {} for key in keys]
    bus = np.array([_number(row.get("bus bw (GB/s, 1e9)")) for row in found])
    size = [row.get("size (bytes)") for row in found]
    hover = [f"{size[n]:,} bytes" if isinstance(size[n], int) else "size not in the trace's args" for n in range(len(picked))]
    hover = [f"{text}<br>rank {waits.last[at]} last; the first waits {np.nanmax(waits.wait[at]) / 1e3:.3f} ms"
             for text, at in zip(hover, picked)]
    figure.traces = [{"type": "bar", "orientation": "h", "name": "latency (us)", "x": latency, "y": labels,
                      "marker": {"color": "#4c78a8"}, "customdata": hover,
                      "hovertemplate": "%{y}<br>latency %{x:,.1f} us<br>%{customdata}<extra></extra>"}]
    if not np.isnan(bus).all():
        figure.traces.append({"type": "scatter", "mode": "markers", "name": "bus bw (GB/s, 1e9)", "x": bus, "y": labels,
                              "xaxis": "x2", "marker": {"color": "#f58518", "size": 10, "symbol": "diamond"},
                              "hovertemplate": "%{y}<br>bus %{x:,.1f} GB/s<extra></extra>"})
    else:
        figure.callout = ("No bandwidth: the trace's collective kernels carry no sizes (Kineto's Collective name, "
                          "In msg nelems and dtype args), so only latencies are shown.")
    figure.layout = {"xaxis": {"title": {"text": "latency, us"}},
                     "xaxis2": {"title": {"text": "bus bandwidth, GB/s (10^9 bytes/s)"}, "overlaying": "x", "side": "top",
                                "rangemode": "tozero", "showgrid": False},
                     "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": labels[::-1],
                               "automargin": True},
                     "legend": {"orientation": "h", "yref": "container", "y": 1, "yanchor": "top"}, "margin": {"t": 100}}
    figure.height = 180 + 22 * len(picked)
    return figure


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def why_table(tables: dict, waits: Waits) -> Figure:
    figure = Figure("collective-why", "Why the late ranks are late",
                    "Per rank the others wait for, most waiting caused first: the collectives it arrives last at, the "
                    "others' wait there, and straggler_causes' reading of HTA's tables over the same window: "
                    "gpu_speed_score (over the compute kernels every rank runs, the fastest rank's mean duration over "
                    "this rank's, weighted by its time: 1 is as fast as the fastest), work_ratio (its compute at the "
                    "median rank's speed, over the median rank's), its GPU idle share against the median rank's, and "
                    "one sentence: slower GPU, more work, host-bound, or no cause found.")
    causes = {row["rank"]: row for row in tables.get("straggler_causes") or []}
    costs, counts = waits.cost(), waits.times_last()
    if not costs:
        figure.missing = NO_WAIT
        return figure
    if len(costs) > WHY_ROWS:
        figure.caption += f" The {WHY_ROWS} of {len(costs):,} such ranks that cost the most (straggler_causes has every rank)."
    figure.table = [["rank", "arrives last at", "others wait for it", "GPU speed score", "work ratio", "GPU idle (median rank)",
                     "why"]]
    for rank in list(costs)[:WHY_ROWS]:
        row = causes.get(rank, {})
        idle = row.get("idle_time_pctg")
        figure.table.append([
            str(rank), f"{counts[rank]:,} of {len(waits):,}", _ms(costs[rank]), _fixed(row.get("gpu_speed_score")),
            _fixed(row.get("work_ratio")),
            "n/a" if idle is None else f"{idle:.1f}% ({_fixed(row.get('median_idle_time_pctg'), 1)}%)",
            (row.get("why") or "").split(": ", 1)[-1] or "not in straggler_causes (TraceLens counts another rank last)"])
    return figure


def _fixed(value: object, digits: int = 2) -> str:
    number = _number(value)
    return "n/a" if math.isnan(number) else f"{number:.{digits}f}"
