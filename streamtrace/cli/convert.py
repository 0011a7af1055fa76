"""``streamtrace convert``: options, runner and human report."""
from __future__ import annotations

import argparse

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
    cmd.add_argument("input", nargs="+", help="input trace, '-' for stdin, or a URL; for a .parquet output also "
                     "several files, globs or directories, as merge takes them")
    cmd.add_argument("output", help="output path, or '-' for stdout (summary then goes to stderr)")
    drop_cat_option(cmd)
    output_options(cmd, "OUT")
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.convert import convert

    source = args.input if len(args.input) > 1 else args.input[0]  # several: into one .parquet
    summary = convert(
        source, args.output, drop_categories=args.drop_cat, compress=args.compress, level=args.level,
        overwrite=args.overwrite, redact=redaction(args), **reading(args),
    )
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
