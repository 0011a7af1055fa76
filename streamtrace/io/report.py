"""The report pages (analyze's, diff's): one self-contained HTML file each.

plotly.js (from the ``plotly`` package, the ``report`` extra) is inlined
once; each figure's data sits in one JSON block, its number arrays as
plotly's typed-array form (base64 of little-endian float32/float64), which
keeps a 1,024-rank page small; nothing is fetched from any host.
"""
from __future__ import annotations

import base64
import html
import os
from datetime import datetime, timezone

import numpy as np
import orjson

from ..algo import collectivefigures
from ..algo.opsfigures import ops_figures
from ..algo.reportfigures import Figure, figures
from ..errors import TraceError

EXTRA_HINT = "--html needs plotly (the report extra): pip install 'streamtrace[report]'"
LISTED_INPUTS = 6

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 0 24px 48px; color: #222; }
h1 { font-size: 22px; margin: 20px 0 6px; } h2 { font-size: 17px; margin: 28px 0 4px; }
table.facts { border-collapse: collapse; margin: 8px 0; } table.facts td { padding: 2px 14px 2px 0; vertical-align: top; }
table.facts td:first-child { color: #666; white-space: nowrap; }
code { font: 12px ui-monospace, monospace; background: #f4f4f4; padding: 1px 4px; word-break: break-all; }
p.caption { color: #555; margin: 2px 0 6px; } p.callout { background: #fff4e5; border-left: 4px solid #f58518;
            padding: 6px 10px; margin: 6px 0; } p.missing { color: #8a4b00; font-style: italic; }
div.figure { width: 100%; }
p.lead { font-size: 16px; background: #fdecea; border-left: 4px solid #e45756; padding: 8px 12px; margin: 10px 0; }
table.data { border-collapse: collapse; margin: 6px 0 12px; } table.data th, table.data td { padding: 3px 10px;
             border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; } table.data th { background: #f4f4f4; }
"""

SCRIPT = """
(function () {
  var figures = JSON.parse(document.getElementById("figure-data").textContent);
  var template = JSON.parse(document.getElementById("figure-template").textContent);
  figures.forEach(function (figure) {
    var layout = Object.assign({template: template, margin: {t: 10, r: 20, b: 50, l: 60}, height: figure.height,
                                legend: {orientation: "h", y: 1.08}}, figure.layout);
    Plotly.newPlot("fig-" + figure.key, figure.traces, layout, {responsive: true, displaylogo: false});
  });
  document.body.setAttribute("data-rendered", String(figures.length));
})();
"""


def plotly_js() -> str:
    """plotly.js, minified, from the plotly package."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise TraceError(EXTRA_HINT) from None
    return get_plotlyjs()


def require_plotly() -> None:
    """Refuse ``--html`` before any work when the report extra is missing."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise TraceError(EXTRA_HINT) from None


def _template() -> dict:
    import plotly.io

    return plotly.io.templates["plotly_white"].to_plotly_json()


def _typed(value: object) -> object:
    """numpy arrays as plotly's typed-array specs (NaN stays NaN: a gap)."""
    if isinstance(value, np.ndarray):
        dtype = "f4" if value.dtype == np.float32 else "f8"
        data = np.ascontiguousarray(value, dtype="<" + dtype)
        spec = {"dtype": dtype, "bdata": base64.b64encode(data.tobytes()).decode("ascii")}
        if data.ndim > 1:
            spec["shape"] = ",".join(map(str, data.shape))
        return spec
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return value


def _json_block(element_id: str, value: object) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode().replace("<", "\\u003c")  # no </script> in it
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _height(figure: Figure, ranks: int) -> int:
    if figure.height:
        return figure.height
    if figure.key in ("step-duration", "step-idle", "utilization"):
        return int(min(900, max(260, 120 + 6 * ranks)))
    if figure.key == "kernels":
        return 120 + 22 * sum(len(trace["y"]) for trace in figure.traces)
    return 360


def _ranges(values: list[int]) -> str:
    """0-7,9 style."""
    parts: list[str] = []
    for value in sorted(values):
        if parts and parts[-1][1] == value - 1:
            parts[-1] = (parts[-1][0], value)  # type: ignore[assignment]
        else:
            parts.append((value, value))  # type: ignore[arg-type]
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)  # type: ignore[misc]


def _facts(summary: dict, inputs: list[str], command: str | None) -> list[tuple[str, str]]:
    tables = summary["tables"]
    shown = ", ".join(os.path.basename(path.rstrip("/")) or path for path in inputs[:LISTED_INPUTS])
    if len(inputs) > LISTED_INPUTS:
        shown += f" and {len(inputs) - LISTED_INPUTS:,} more"
    folders = sorted({os.path.dirname(path) for path in inputs})
    where = f" (in {folders[0]})" if len(folders) == 1 and folders[0] else ""
    steps = [row["step"] for row in tables["profiler_steps"]]
    busy = sum(row["busy(us)"] for row in tables["gpu_time"])
    return [
        ("inputs", f"{len(inputs):,}: {shown}{where}"),
        ("devices", ", ".join(summary.get("devices") or ()) or "not stated in the inputs"),
        ("ranks", f"{len(summary['ranks']):,} ({_ranges(summary['ranks'])})"),
        ("steps", f"{len(steps)} profiler step{'s' * (len(steps) != 1)} ({_ranges(steps)})" if steps else "no profiler steps"),
        ("GPU busy time", f"{busy / 1e6:,.3f} s over all ranks (kernels, copies and sets; overlaps counted once)"),
        ("made by", command or "streamtrace.analyze(...)"),
    ]


def _table(figure: Figure) -> str:
    header, *rows = figure.table
    cells = ["<tr>" + "".join(f"<th>{html.escape(cell)}</th>" for cell in header) + "</tr>"]
    cells += ["<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows]
    return f'<table class="data" id="table-{figure.key}">{"".join(cells)}</table>'


def render(summary: dict, inputs: list[str], command: str | None = None) -> bytes:
    """The page for an analyze summary (its ``tables``)."""
    lead, collective = collectivefigures.page(summary)
    shown = [*collective, *figures(summary), *ops_figures(summary)]
    ranks = len(summary["ranks"])
    return page("streamtrace analyze", f"{ranks:,} ranks", _facts(summary, inputs, command), shown,
                {figure.key: _height(figure, ranks) for figure in shown}, lead=lead)


def page(heading: str, subject: str, facts: list[tuple[str, str]], shown: list[Figure], heights: dict[str, int],
         lead: str = "") -> bytes:
    """A report page: ``heading``, the ``lead`` paragraph if any, the facts table (the one labelled
    "made by" as code), then each figure (``heights``: its height in pixels by key) with its title,
    caption, call-out, data table or what it misses."""
    javascript = plotly_js()
    drawn = [{"key": figure.key, "traces": _typed(figure.traces), "layout": _typed(figure.layout),
              "height": heights[figure.key]} for figure in shown if not figure.missing and not figure.table]
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(heading)}: {html.escape(subject)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(heading)}</h1><p class=\"caption\">Made {made}. Figures are interactive: hover for values, "
             "drag to zoom, double-click to reset.</p>"]
    if lead:
        parts.append(f'<p class="lead" id="lead-collectives">{html.escape(lead)}</p>')
    parts.append('<table class="facts">')
    for label, text in facts:
        value = f"<code>{html.escape(text)}</code>" if label == "made by" else html.escape(text)
        parts.append(f"<tr><td>{html.escape(label)}</td><td>{value}</td></tr>")
    parts.append("</table>")
    for figure in shown:
        parts.append(f'<h2>{html.escape(figure.title)}</h2><p class="caption">{html.escape(figure.caption)}</p>')
        if figure.callout:
            parts.append(f'<p class="callout" id="callout-{figure.key}">{html.escape(figure.callout)}</p>')
        if figure.missing:
            parts.append(f'<p class="missing" id="missing-{figure.key}">{html.escape(figure.missing)}.</p>')
        elif figure.table:
            parts.append(_table(figure))
        else:
            parts.append(f'<div class="figure" id="fig-{figure.key}"></div>')
    parts += [_json_block("figure-data", drawn), _json_block("figure-template", _template()),
              f"<script>{javascript}</script>", f"<script>{SCRIPT}</script>", "</body></html>"]
    return "\n".join(parts).encode()
