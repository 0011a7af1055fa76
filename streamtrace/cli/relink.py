"""``streamtrace relink``: options, runner and human report."""
from __future__ import annotations

import argparse

from .batch import is_batch, run_batch
from .options import (
    RANK_MAP_HELP,
    RANK_RULES,
    cluster_option,
    common_options,
    output_option,
    output_options,
    paragraphs,
    rank_map_option,
    reading,
    redaction,
    secrets_options,
)
from .report import Rows, events_row, linking_rows, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``relink``'s options."""
    cmd = commands.add_parser(
        "relink", help="repair a merged multi-rank trace: rank-unique correlation ids, correct ac2g flows",
        description=paragraphs(
            "Two streaming passes over TRACE, a file that merges several ranks (whose correlation ids collide).",
            "Every pid gets a rank: " + RANK_RULES + ". Every GPU event is linked to the one runtime call of its "
            "own rank with its correlation id (or counted as an orphan), so a cudaGraphLaunch gets exactly its "
            "own rank's kernels.",
            "The output is the same trace with correlation ids rewritten to (rank + 1) * 10^k + id (below 2^53) "
            "in runtime calls and GPU events, the original kept as args.correlation_raw (ids already in that "
            "form, as merge and relink write them, stay as they are), and every ac2g flow replaced by a correct "
            "one beside the events it binds. Tools that key by correlation alone (TraceLens, HTA, Perfetto's flow "
            "matching) then read the file correctly."),
        epilog="examples:\n  streamtrace relink merged.json.gz                   # -> merged_relinked.json.gz\n"
               "  streamtrace relink merged.json.gz -o fixed.json.zst --rank-map ranks.json\n"
               "  streamtrace relink merged.json.gz -o - | gzip > fixed.json.gz\n\n" + RANK_MAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="+", metavar="TRACE",
                     help="merged trace file, '-' for stdin (then give -o), or a URL; several, a directory or a glob: "
                          "one task each")
    output_option(cmd, "_relinked")
    rank_map_option(cmd)
    output_options(cmd, "the output")
    cluster_option(cmd)
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.relink import relink

    options = dict(rank_map=args.rank_map, compress=args.compress, level=args.level,
                   redact=redaction(args))  # one set for a single run and a batch alike
    if is_batch(args, args.output):
        return run_batch(args, **options)
    summary = relink(args.trace[0], args.output, overwrite=args.overwrite, **options, **reading(args))
    report("relink", summary, args, to_stderr=args.output == "-")


@view("relink")
def rows(summary: dict) -> Rows:
    ids = ("ids already rank-unique (kept as they are)" if summary["ids_already_rank_unique"] else
           f"{summary['ids_rewritten']:,} correlation ids made rank-unique")
    return [("relinked", f"{ids}, {summary['ac2g_flows_written']:,} ac2g flow events written from the "
                         f"(rank, correlation) links in place of the input's {summary['ac2g_flows_replaced']:,}"),
            ("output", summary["output"]), *linking_rows(summary), events_row(summary)]
