"""``streamtrace sql``: options, runner and human report."""
from __future__ import annotations

import argparse

from .options import common_options, paragraphs, reading
from .report import Rows, counted, report, view

DEFAULT_MEMORY_MB = 256  # (commands.sql's, not imported: --help stays quick)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``sql``'s options."""
    cmd = commands.add_parser(
        "sql", help="SQL over the events of a trace of any size (a table named events)",
        description=paragraphs(
            "Run QUERY (DuckDB's SQL) over the table 'events': one row per event of every TRACE, the "
            "columns 'convert TRACE OUT.parquet' writes: rank, ph, cat, name, pid, tid, pid_text, tid_text, "
            "ts, dur (microseconds), id, correlation, stream, device, external_id, args (JSON text), extra. "
            "Several traces (files, globs, directories) are one table, each row with its rank.",
            "The events go through a Parquet file in a temporary directory (--spool-dir), which DuckDB "
            "reads within --memory, spilling to that directory beyond it; the directory is removed at the "
            "end. The answer is printed as a table, or CSV (--csv, or -o FILE.csv), row batch by row batch."),
        epilog="examples:\n"
               "  streamtrace sql trace.json.gz \"SELECT cat, count(*) FROM events GROUP BY cat\"\n"
               "  streamtrace sql ranks/ \"SELECT rank, sum(dur) FROM events WHERE cat = 'kernel' GROUP BY 1\" --csv\n"
               "  streamtrace sql merged.json.gz \"SELECT name, args FROM events WHERE cat = 'kernel'\" -o k.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="+", metavar="TRACE",
                     help="trace file, '-' for stdin, or a URL; several (files, globs, directories): one table")
    cmd.add_argument("query", metavar="QUERY", help="the SQL, over the table events (quote it)")
    cmd.add_argument("-o", "--output", default="-",
                     help="write the answer here: CSV for a .csv name (.csv.gz/.csv.zst compress it), else a "
                          "table as text; '-' for stdout (default: no report then, --json puts the summary on "
                          "stderr)")
    cmd.add_argument("--csv", action="store_true", help="CSV (a header line, NULL as an empty field) instead of a table")
    cmd.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                     help=f"DuckDB's memory limit; sorts, joins and aggregates beyond it spill to disk "
                          f"(default {DEFAULT_MEMORY_MB})")
    cmd.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.sql import sql

    source = args.trace if len(args.trace) > 1 else args.trace[0]
    summary = sql(source, args.query, args.output, csv_format=args.csv or None, overwrite=args.overwrite,
                  memory_mb=args.memory, **reading(args))
    if args.output != "-":
        report("sql", summary, args)
    elif args.json:
        report("sql", summary, args, to_stderr=True)


@view("sql")
def rows(summary: dict) -> Rows:
    return [("answered", f"{counted(summary['row_count'], 'row')} of {len(summary['columns'])} columns, from "
                         f"{counted(summary['table_rows'], 'event')}"),
            ("output", f"{summary['output']} ({summary['output_format']})")]
