"""``streamtrace analyze``: options, runner and human report."""
from __future__ import annotations

import argparse
import shlex

from .options import cluster_option, common_options, paragraphs, reading
from .report import Rows, listed, report, view


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
            "Inputs with collective kernels also give TraceLens's multi-rank collective report (nccl_long, "
            "nccl_implicit_sync, their summaries, all_to_allv tables, straggler_summary: who arrives last, who "
            "waits) and collective_bandwidth and straggler_causes beside it.",
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
    cmd.add_argument("--overwrite", action="store_true", help="replace existing files it writes (CSVs, page, summary)")
    cmd.add_argument("--all2allv-heatmap", action="store_true", help="with collective kernels: also TraceLens's "
                     "nccl_all2allv_heatmap (bytes each rank sent each rank in all_to_allv)")
    cluster_option(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.analyze import analyze
    from ..commands.merge import parse_rank_list

    summary = analyze(args.inputs, args.output, include_last_step=args.include_last_step, num_candidates=args.candidates,
                      ranks=None if args.ranks is None else parse_rank_list(args.ranks), overwrite=args.overwrite,
                      dask=args.dask, html=args.html, command=shlex.join(["streamtrace", *args.argv]),
                      all2allv_heatmap=args.all2allv_heatmap, **reading(args))
    report("analyze", summary, args)


@view("analyze")
def rows(summary: dict) -> Rows:
    from ..commands.analyses.collectives import report_rows as collective_rows
    from ..commands.analyze import report_rows

    rows = report_rows(summary) + collective_rows(summary)
    if summary["output"]:
        rows.append(("output", listed(summary["output"], 3)))
    return rows
