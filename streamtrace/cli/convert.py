"""``streamtrace convert``: options, runner and human report."""
from __future__ import annotations

import argparse

from .batch import is_batch, run_batch
from .options import common_options, drop_cat_option, output_options, paragraphs, reading, redaction, secrets_options
from .report import Rows, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``convert``'s options."""
    cmd = commands.add_parser(
        "convert", help="recompress / normalise a trace, optionally dropping categories",
        description=paragraphs("Stream IN to OUT event by event. Output compression follows OUT's suffix "
                        "(.gz, .zst, else none) unless --compress says otherwise. The output is a JSON "
                        "object with the input's top-level keys in order and one event per line. "
                        "OUT.parquet (the 'parquet' extra) is one row per event for SQL: rank, ph, cat, name, "
                        "pid, tid, ts, dur, ids, args as JSON."),
        epilog="examples:\n  streamtrace convert trace.json.gz trace.json.zst\n"
               "  cat trace.json.gz | streamtrace convert - small.json.gz --drop-cat python_function\n"
               "  streamtrace convert merged.json.gz events.parquet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="+", metavar="IN", help="input trace, '-' for stdin, or a URL; several files, "
                     "globs, directories or an archive of traces: each into the directory OUT/ (one task each), or all "
                     "into one .parquet")
    cmd.add_argument("output", metavar="OUT", help="output path, or '-' for stdout (summary then goes to stderr); "
                     "a directory DIR/ for several inputs")
    drop_cat_option(cmd)
    output_options(cmd, "OUT")
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.convert import convert
    from ..commands.toparquet import is_parquet

    options = dict(drop_categories=args.drop_cat, compress=args.compress, level=args.level,
                   redact=redaction(args))  # one set for a single run and a batch alike
    if not is_parquet(args.output) and is_batch(args, args.output):
        return run_batch(args, **options)
    source = args.trace if len(args.trace) > 1 else args.trace[0]  # several: into one .parquet
    summary = convert(source, args.output, overwrite=args.overwrite, **options, **reading(args))
    report("convert", summary, args, to_stderr=args.output == "-")


@view("convert")
def rows(summary: dict) -> Rows:
    return copy_rows("converted", summary, with_dropped=True)


def copy_rows(label: str, summary: dict, *, with_dropped: bool) -> Rows:
    """What a copying command (convert, redact) did: where from and to, and how many events."""
    dropped = ", ".join(f"{cat} {count:,}" for cat, count in summary["dropped_by_category"].items() if count)
    events = f"{summary['events']:,} read, {summary['events_written']:,} written"
    if with_dropped:
        events += f", {summary['events_dropped']:,} dropped" + (f" ({dropped})" if dropped else "")
    compression = summary["output_compression"].replace("none", "uncompressed")
    return [(label, f"{summary['input']} -> {summary['output']} ({compression})"),
            ("events", events)]
