"""``streamtrace diff``: options, runner and human report."""
from __future__ import annotations

import argparse
import shlex

from .options import common_options, paragraphs, reading
from .report import Rows, listed, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``diff``'s options."""
    cmd = commands.add_parser(
        "diff", help="what changed between two runs: HTA's TraceDiff, streamed",
        description=paragraphs(
            "HTA 0.5.0's TraceDiff.compare_traces and ops_diff of two traces: per operator or kernel name, its "
            "count and total duration in one rank and iteration of each run (trace_diff.csv, HTA's columns with "
            "its labels Control and Test), and the names added, deleted, increased, decreased and unchanged "
            "(ops_diff.csv). As HTA: the first rank and the first iteration of each run unless told, durations "
            "in whole microseconds, a kernel in the iteration of its launch.",
            "Each side is a trace file, rank files (a directory, a glob, an archive) or a merged multi-rank file "
            "(its ranks told apart as analyze does), of which one rank is read. docs/diff.md states HTA's rules."),
        epilog="examples:\n  streamtrace diff yesterday/ today/ -o diff/\n"
               "  streamtrace diff run.json.gz run.json.gz --control-iteration 5 --test-iteration 6 --device gpu",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("control", metavar="CONTROL", help="the reference run: a trace, or rank files")
    cmd.add_argument("test", metavar="TEST", help="the run compared with it")
    cmd.add_argument("-o", "--output", metavar="DIR", help="write trace_diff.csv and ops_diff.csv into DIR")
    cmd.add_argument("--device", choices=("cpu", "gpu", "all"), default="all",
                     help="CPU operators (stream -1), GPU kernels (any other stream) or both (default: all)")
    for side in ("control", "test"):
        cmd.add_argument(f"--{side}-rank", type=int, metavar="N", help=f"the {side} run's rank (default: its first)")
        cmd.add_argument(f"--{side}-iteration", type=int, metavar="N",
                         help=f"the {side} run's iteration, N of ProfilerStep#N (default: its first)")
    cmd.add_argument("--short-names", action="store_true",
                     help="compare names without argument lists and template arguments (HTA's use_short_name)")
    cmd.add_argument("--tables", action="store_true",
                     help="also analyze both runs (every rank) and write each of analyze's tables side by side "
                          "(<column>__Control, __Test, __diff, __pct; 'present': both, control or test), and each "
                          "rank's mean step in both (step_time_per_rank.csv)")
    cmd.add_argument("--html", metavar="FILE",
                     help="also write a self-contained report page: the step-time shift per rank, both runs per rank "
                          "side by side, the top changes (implies --tables; needs streamtrace[report])")
    cmd.add_argument("--overwrite", action="store_true", help="replace existing files it writes (CSVs, summary)")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.diff import diff

    summary = diff(args.control, args.test, args.output, device=args.device, control_rank=args.control_rank,
                   test_rank=args.test_rank, control_iteration=args.control_iteration,
                   test_iteration=args.test_iteration, short_names=args.short_names, tables=args.tables,
                   overwrite=args.overwrite, html=args.html, command=shlex.join(["streamtrace", *args.argv]),
                   **reading(args))
    report("diff", summary, args)


@view("diff")
def rows(summary: dict) -> Rows:
    from ..commands.diff import report_rows

    rows = report_rows(summary)
    if summary["output"]:
        rows.append(("output", listed(summary["output"], 2)))
    return rows
