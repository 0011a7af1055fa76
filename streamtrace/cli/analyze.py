"""``streamtrace analyze``: options, runner and human report."""
from __future__ import annotations

import argparse
import math
import shlex

from .options import cluster_option, common_options, paragraphs, reading
from .report import Rows, listed, ms, report, view

# analyze's analyses (commands/analyses/registry.py; named here so that --help imports no command)
ANALYSIS_NAMES = ("temporal", "kernels", "idle", "launches", "steps", "stragglers", "utilization", "collectives")


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``analyze``'s options."""
    cmd = commands.add_parser(
        "analyze", help="where did the time go, which rank is slow: HTA's tables, streamed",
        description=paragraphs(
            "The tables of Holistic Trace Analysis (HTA 0.5.0), with its column names and rules, for every rank of "
            "the inputs: temporal_breakdown, kernel_type_breakdown, kernel_breakdown, comm_comp_overlap, "
            "idle_time_breakdown, kernel_launch_stats (every rank), profiler_steps, step_times (per rank and "
            "step), stragglers (HTA's candidates and each rank's lag per step), and utilization (each rank's GPU "
            "busy fraction per time bin, not HTA's). As HTA, the last profiler step is left out unless "
            "--include-last-step.",
            "Inputs are what 'merge' takes (rank files, globs, directories, archives, URLs) or one merged "
            "multi-rank file (ranks found as relink finds them). One task per input (-j, --dask). "
            "docs/analyze.md states each rule, and where it departs from HTA."),
        epilog="examples:\n  streamtrace analyze dlrm/\n  streamtrace analyze 'ranks/*.json.gz' -o tables/\n"
               "  streamtrace analyze merged.json.gz --json | jq .tables.temporal_breakdown\n"
               "  streamtrace analyze dlrm/ --html report.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("inputs", nargs="+", metavar="INPUT", help="rank traces, globs, directories, archives, URLs, "
                     "or a merged trace")
    cmd.add_argument("-o", "--output", metavar="DIR", help="write one CSV per table into DIR")
    cmd.add_argument("--html", metavar="FILE", help="also write a self-contained report page (figures per rank, step "
                     "and time; needs streamtrace[report])")
    cmd.add_argument("--include-last-step", action="store_true", help="keep the last profiler step (HTA leaves it out)")
    cmd.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-3,7")
    cmd.add_argument("--candidates", type=int, default=2, metavar="N", help="straggler candidates (HTA's "
                     "num_candidates, default 2)")
    cmd.add_argument("--only", metavar="NAME[,NAME]", help="run only these analyses (of " + ", ".join(ANALYSIS_NAMES)
                     + "; default: all)")
    cmd.add_argument("--skip", metavar="NAME[,NAME]", help="do not run these analyses: no table, no cost")
    cmd.add_argument("--ops", action="store_true", help="also TraceLens's perf-report tables (gpu_timeline, "
                     "ops_summary, kernel_summary, short kernels, ...) per input under DIR/ops/ (needs -o)")
    cmd.add_argument("--gpu-spec", metavar="FILE", help="with --ops: the GPU's peaks in TraceLens's arch JSON form "
                     "(mem_bw_gbps, max_achievable_tflops), for the sheets' roofline columns, instead of the "
                     "built-in spec of the GPU the trace's deviceProperties name")
    cmd.add_argument("--all2allv-heatmap", action="store_true", help="with collective kernels: also TraceLens's "
                     "nccl_all2allv_heatmap (bytes each rank sent each rank in all_to_allv)")
    cmd.add_argument("--align-clocks", action="store_true", help="with collective kernels: align the ranks' clocks "
                     "on collective ends for collective_matches and p2p_pairs (TraceLens's tables keep raw times)")
    cmd.add_argument("--overwrite", action="store_true", help="replace existing files it writes (CSVs, page, summary)")
    cluster_option(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.analyze import analyze
    from ..commands.mergerank import parse_rank_list
    from ..io import streamjson

    summary = analyze(args.inputs, args.output, include_last_step=args.include_last_step, num_candidates=args.candidates,
                      ranks=None if args.ranks is None else parse_rank_list(args.ranks), overwrite=args.overwrite,
                      dask=args.dask, html=args.html, command=shlex.join(["streamtrace", *args.argv]),
                      only=args.only, skip=args.skip, ops=args.ops, gpu_spec=args.gpu_spec,
                      all2allv_heatmap=args.all2allv_heatmap, align_clocks=args.align_clocks,
                      collective_rows="streamed" if args.json else False, **reading(args))
    try:
        report("analyze", summary, args)
    finally:
        streamjson.close(summary)  # (the long collective tables' files, read as the JSON was written)


TOP = 5


@view("analyze")
def rows(summary: dict) -> Rows:
    """Per rank its GPU time (the trace's own times, as inspect counts them; HTA's rounded share where it
    differs), the ranks that arrive last at collectives, the longest steps, the top kernels, the notes (of the
    analyses run: a table left out by --only/--skip gives no line)."""
    from ..commands.analyses.collectives import report_rows as collective_rows

    tables = {name: rows or [] for name, rows in summary["tables"].items()}
    rounded = {row["rank"]: row for row in tables.get("temporal_breakdown", ())}
    overlap = {row["rank"]: row["comp_comm_overlap_pctg"] for row in tables.get("comm_comp_overlap", ())}
    rows: Rows = [(f"rank {row['rank']}", _gpu_time(row, rounded.get(row["rank"]), overlap.get(row["rank"])))
                  for row in tables.get("gpu_time", ())]
    late = sorted({row["rank"] for row in tables.get("stragglers", ()) if row["potential_straggler"]})
    late_all = sorted({row["rank"] for row in tables.get("stragglers_nccl_all", ()) if row["potential_straggler"]})
    if late:
        rows.append(("late ranks", ", ".join(map(str, late)) + ": their communication kernels start last (HTA's "
                     "straggler candidates), the other ranks wait for them"))
    elif late_all:
        rows.append(("late ranks", ", ".join(map(str, late_all)) + ": their communication kernels start last (HTA's "
                     "straggler rule over ncclDevKernel... kernels too: stragglers_nccl_all; HTA's own sees none)"))
    lags = sorted((row for row in tables.get("stragglers", ()) if row["lag(us)"] > 0), key=lambda row: -row["lag(us)"])
    if lags:
        rows.append(("longest steps", ", ".join(f"rank {row['rank']} step {row['step']} +{ms(row['lag(us)'])}"
                                                for row in lags[:TOP])
                     + " (beyond the shortest rank's; a rank waiting in a collective for a late one takes long too)"))
    rows.extend(_last_step_rows(summary))
    for n, row in enumerate(tables.get("kernel_totals", [])[:TOP]):
        rows.append(("top kernels" if n == 0 else "", f"{ms(row['sum (us)'])} {row['count']:,}x {row['name'][:90]}"))
    rows.extend(collective_rows(summary))
    rows.extend(("note", note) for note in summary["notes"])
    if summary["output"]:
        rows.append(("output", listed(summary["output"], 3)))
    return rows


def _last_step_rows(summary: dict) -> Rows:
    """Which ranks' last profiler step the tables leave out (HTA's cut), so that no figure leaves it out unsaid."""
    left_out = summary.get("last_step_left_out") or []
    if not left_out:
        return []
    who = "every rank" if left_out == summary["ranks"] else \
        ("rank " if len(left_out) == 1 else "ranks ") + listed([str(rank) for rank in left_out], 8)
    return [("last step", f"left out on {who}, as HTA leaves it out (its events from the last ProfilerStep's start "
                          "on); --include-last-step keeps it")]


def _gpu_time(row: dict, rounded: dict | None, overlap: float | None) -> str:
    """``GPU busy 10.718 ms of 10.743 ms: idle 0.2%, ...``, and the shares HTA's rounding moves by more than
    half a point."""
    if not row["kernel_time(us)"] and not row["busy(us)"]:
        return "no GPU work (no kernel, copy or set on a stream)"
    shares = [("idle", "idle_time_pctg"), ("compute", "compute_time_pctg"), ("other GPU work", "non_compute_time_pctg")]
    text = (f"GPU busy {ms(row['busy(us)'])} of {ms(row['kernel_time(us)'])}: "
            + ", ".join(f"{label} {_share(row[key])}" for label, key in shares)
            + ("; no communication kernels" if _missing(row["comp_comm_overlap_pctg"])
               else f"; communication overlapped {_share(row['comp_comm_overlap_pctg'])}"))
    from ..algo.reportfigures import ROUNDING_POINTS

    hta = {key: (rounded or {}).get(key) for _, key in shares}
    hta["comp_comm_overlap_pctg"] = overlap
    moved = [f"{label} {_share(hta[key])}" for label, key in [*shares, ("overlap", "comp_comm_overlap_pctg")]
             if not _missing(hta[key]) and not _missing(row[key]) and abs(hta[key] - row[key]) > ROUNDING_POINTS]
    if moved:
        text += f" (HTA's whole-microsecond rounding, in its tables: {', '.join(moved)})"
    return text


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _share(value: object) -> str:
    return "n/a" if _missing(value) else f"{value:.1f}%"
