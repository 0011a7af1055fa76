"""The page's ops section (``analyze --html --ops``), from the ops tables
of each input (no I/O): the top ops by GPU time with their share, and a
roofline scatter of the performance-model sheets' rows against the GPU's
roofs when a spec is known.

:func:`page_part` keeps, per input, the few numbers the figures draw (they
travel in the run's summary); :func:`ops_figures` draws them.
"""
from __future__ import annotations

import math
import re

import numpy as np

from .opsroofline import COLUMNS
from .opstables import Table
from .reportfigures import Figure, _short

TOP_OPS = 15
INPUTS_DRAWN = 4  # inputs with an ops section on the page (the CSVs have every input's)
SPEC_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")


def _column(table: Table, name: str) -> list[object]:
    at = table.header[-1].index(name)
    return [row[at] for row in table.rows]


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def page_part(tables: dict[str, Table], spec: dict | None, how: str) -> dict:
    """What the page draws of one input: its top ops (ops_summary's name,
    direct kernel time in ms and share), its sheet rows as roofline points
    (FLOPS/Byte_first, and GFLOPS_first over the mean kernel time, TFLOP/s)
    and the spec (or the words saying there is none)."""
    part: dict = {"spec": None if spec is None else {"name": spec.get("name", "(unnamed)"),
                                                     "mem_bw_gbps": spec["mem_bw_gbps"],
                                                     "max_achievable_tflops": spec["max_achievable_tflops"]},
                  "how": how, "top_ops": [], "points": []}
    summary = tables.get("ops_summary")
    if summary is not None:
        names, times, shares = (_column(summary, c) for c in ("name", "total_direct_kernel_time_ms", "Percentage (%)"))
        part["top_ops"] = [{"name": n, "ms": t, "share": s} for n, t, s in list(zip(names, times, shares))[:TOP_OPS]]
    for stem, table in tables.items():
        if COLUMNS[0] not in table.header[-1]:
            continue
        columns = zip(*(_column(table, c) for c in ("name", "FLOPS/Byte_first", "GFLOPS_first", "Kernel Time (µs)_mean",
                                                    "Compute Spec", COLUMNS[2])))
        for name, intensity, gflops, mean_us, compute, pct in columns:
            if _positive(intensity) and _positive(gflops) and _positive(mean_us):
                part["points"].append({"sheet": stem, "name": name, "intensity": intensity,
                                       "tflops": gflops / mean_us * 1e3, "compute": compute, "pct": pct})
    return part


def ops_figures(summary: dict) -> list[Figure]:
    """The ops section: two figures per input (the first :data:`INPUTS_DRAWN`)."""
    parts = summary.get("ops") or {}
    out: list[Figure] = []
    for n, (label, part) in enumerate(sorted(parts.items(), key=lambda item: _label_order(item[0]))[:INPUTS_DRAWN]):
        out += [top_ops(label, part, n), roofline_scatter(label, part, n)]
    if len(parts) > INPUTS_DRAWN:
        out[-1].caption += f" The page draws the first {INPUTS_DRAWN} of {len(parts)} inputs; DIR/ops/ has them all."
    return out


def _label_order(label: str) -> tuple:
    """rank2 before rank10; other labels after the ranks, by name."""
    match = re.fullmatch(r"rank(\d+)", label)
    return (0, int(match.group(1)), "") if match else (1, 0, label)


def top_ops(label: str, part: dict, n: int) -> Figure:
    figure = Figure(f"ops-top-{n}", f"Which ops take the GPU time: {label}",
                    f"The {TOP_OPS} ops with the most GPU time of kernels they launched themselves (TraceLens's "
                    "ops_summary: total_direct_kernel_time_ms), with their share of all such time (Percentage (%)); "
                    "hover for the full name.")
    rows = part["top_ops"]
    if not rows:
        figure.missing = "no op launched a kernel (ops_summary is empty or not written)"
        return figure
    labels = [_short(row["name"]) for row in rows]
    figure.traces = [{"type": "bar", "orientation": "h", "name": "ops", "x": np.array([row["ms"] for row in rows]),
                      "y": labels, "customdata": [[row["name"], row["share"]] for row in rows],
                      "text": [f"{row['share']:.1f}%" for row in rows], "textposition": "outside",
                      "marker": {"color": SPEC_COLORS[0]},
                      "hovertemplate": "%{customdata[0]}<br>%{x:,.3f} ms, %{customdata[1]:.2f}%<extra></extra>"}]
    figure.layout = {"height": 120 + 24 * len(rows), "showlegend": False, "xaxis": {"title": {"text": "ms"}},
                     "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": labels[::-1],
                               "automargin": True}}
    return figure


def roofline_scatter(label: str, part: dict, n: int) -> Figure:
    spec = part["spec"]
    figure = Figure(f"ops-roofline-{n}", f"How far from the hardware: {label}",
                    "One point per row of the performance-model sheets (an op name with its shapes): its arithmetic "
                    "intensity (FLOPS/Byte_first) against the FLOP/s it reached (GFLOPS_first over its mean kernel "
                    "time), on log scales; the lines are the GPU's roofs, the memory bandwidth's slope and each "
                    "compute spec's peak. A point near a roof runs near what the GPU can do.")
    if spec is None:
        figure.missing = f"no GPU spec, so no roofs: {part['how']}; give --gpu-spec FILE"
        return figure
    figure.caption += f" GPU spec: {spec['name']}, {part['how']}."
    points = part["points"]
    if not points:
        figure.missing = "no sheet row has FLOPs, bytes and kernel time"
        return figure
    peaks = spec["max_achievable_tflops"]
    bandwidth = spec["mem_bw_gbps"] / 1e3  # TB/s: TFLOP/s per FLOP/byte
    computes = sorted({point["compute"] for point in points})
    intensities = [point["intensity"] for point in points]
    low, high = min(intensities) / 4, max(intensities) * 4
    drawn = sorted({peaks[c] for c in computes if c in peaks})
    if drawn:
        high = max(high, drawn[-1] / bandwidth * 4)
    for k, compute in enumerate(computes):
        mine = [point for point in points if point["compute"] == compute]
        color = SPEC_COLORS[k % len(SPEC_COLORS)]
        figure.traces.append({
            "type": "scatter", "mode": "markers", "name": compute or "(no compute spec)", "marker": {"color": color},
            "x": np.array([point["intensity"] for point in mine]), "y": np.array([point["tflops"] for point in mine]),
            "customdata": [[point["name"], point["sheet"], _pct(point["pct"])] for point in mine],
            "hovertemplate": "%{customdata[0]} (%{customdata[1]})<br>%{x:.3g} FLOP/byte, %{y:.3g} TFLOP/s"
                             "<br>%{customdata[2]} of roofline<extra></extra>"})
        if compute in peaks:
            ridge = peaks[compute] / bandwidth
            figure.traces.append({"type": "scatter", "mode": "lines", "name": f"{compute} peak {peaks[compute]:g} TFLOP/s",
                                  "x": np.array([ridge, high]), "y": np.array([peaks[compute]] * 2),
                                  "line": {"color": color, "dash": "dash"}, "hoverinfo": "name"})
    top = drawn[-1] if drawn else bandwidth * high
    figure.traces.append({"type": "scatter", "mode": "lines", "name": f"memory {spec['mem_bw_gbps']:g} GB/s",
                          "x": np.array([low, min(high, top / bandwidth)]),
                          "y": np.array([bandwidth * low, min(bandwidth * high, top)]),
                          "line": {"color": "#222"}, "hoverinfo": "name"})
    figure.layout = {"height": 460, "xaxis": {"type": "log", "title": {"text": "arithmetic intensity, FLOP/byte"}},
                     "yaxis": {"type": "log", "title": {"text": "achieved TFLOP/s"}}}
    return figure


def _pct(value: object) -> str:
    return f"{value:.1f}%" if _positive(value) else "no roofline"
