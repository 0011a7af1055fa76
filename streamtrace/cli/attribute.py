"""``streamtrace attribute``: options, runner and human report."""
from __future__ import annotations

import argparse

from .batch import is_batch, run_batch
from .options import RANK_MAP_HELP, RANK_RULES, cluster_option, common_options, paragraphs, rank_map_option, reading
from .report import Rows, linking_rows, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``attribute``'s options."""
    cmd = commands.add_parser(
        "attribute", help="CSV of every GPU event with its rank, launching call and enclosing CPU ops",
        description=paragraphs(
            "One row per GPU event (kernel, gpu_memcpy, gpu_memset), in input order, columns:",
            "  rank,pid,tid,ts,dur,cat,name,correlation,\n  launch_name,launch_pid,launch_tid,launch_ts,cpu_op,root_op",
            "pid..correlation are the GPU event's own values as in the input (tid = stream); launch_* describe "
            "its runtime call, linked by (rank, correlation) (all empty for an orphan, launched before the "
            "capture window); cpu_op is the innermost cpu_op enclosing the launch on the launching thread, "
            "root_op the outermost enclosing cpu_op or user_annotation (e.g. ProfilerStep#3).",
            "Ranks: " + RANK_RULES + ".",
            "--group-by op prints GPU time per (rank, cpu_op) instead: rank,cpu_op,gpu_events,gpu_time_us, "
            "largest first within each rank. Memory grows with GPU events and launches; CPU ops are spilled to "
            "a temporary file."),
        epilog="examples:\n  streamtrace attribute merged.json.gz -o kernels.csv\n"
               "  streamtrace attribute trace.json.gz --group-by op | head -20\n"
               "  streamtrace attribute merged.json.gz -o kernels.csv.gz --rank-map ranks.json\n\n"
               + RANK_MAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="+", metavar="TRACE",
                     help="trace file, '-' for stdin, or a URL; several, a directory or a glob: one task each, "
                          "their rows in one CSV")
    cmd.add_argument("-o", "--output", default="-",
                     help="CSV path ('.gz'/'.zst' compress it) or '-' for stdout (default; the summary then goes "
                          "to stderr)")
    cmd.add_argument("--group-by", choices=("op",), help="print GPU time per (rank, cpu op) instead of rows")
    rank_map_option(cmd)
    cmd.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    cluster_option(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.attribute import attribute

    options = dict(group_by=args.group_by, rank_map=args.rank_map)  # one set for a single run and a batch alike
    if is_batch(args, None):
        return run_batch(args, **options)
    summary = attribute(args.trace[0], args.output, overwrite=args.overwrite, **options, **reading(args))
    report("attribute", summary, args, to_stderr=args.output == "-")


@view("attribute")
def rows(summary: dict) -> Rows:
    what = "(rank, cpu op) rows" if summary["group_by"] == "op" else "GPU events"
    return [("attributed", f"{summary['rows']:,} {what}"), ("output", str(summary["output"])),
            *linking_rows(summary)]
