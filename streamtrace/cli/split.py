"""``streamtrace split``: options, runner and human report."""
from __future__ import annotations

import argparse

from ..io.formats import SUFFIXES
from .options import (
    RANK_MAP_HELP,
    RANK_RULES,
    common_options,
    level_option,
    paragraphs,
    rank_map_option,
    reading,
    redaction,
    secrets_options,
)
from .report import Rows, counted, listed, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``split``'s options."""
    cmd = commands.add_parser(
        "split", help="write one trace per rank out of a merged trace",
        description=paragraphs(
            "Write DIR/rank<N>_trace.json.gz for every rank of TRACE, each with that rank's events in input "
            "order, the merged file's top-level keys, and distributedInfo.rank set to N (added when missing).",
            "Ranks: " + RANK_RULES + ". Events of pids no rule places (Spans, Record Window End) go with the "
            "closest preceding ranked event.",
            "One pass indexes, then the events are streamed to one open writer per rank. At most "
            "--max-open-files writers are open at once (default 128, less if the open-file limit is lower): "
            "with more ranks, the events are streamed again for each further group of ranks. Files appear only "
            "when all of them are complete."),
        epilog="examples:\n  streamtrace split merged.json.gz -o per_rank/\n"
               "  streamtrace split merged.json.gz -o per_rank/ --compress zstd --max-open-files 32\n\n"
               + RANK_MAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", help="merged trace file, '-' for stdin, or a URL")
    cmd.add_argument("-o", "--output-dir", required=True, metavar="DIR", help="directory for the per-rank files "
                     "(created if missing)")
    rank_map_option(cmd)
    cmd.add_argument("--compress", choices=tuple(SUFFIXES), default="gzip",
                     help="per-rank file compression: gzip (.json.gz, default), zstd (.json.zst), none (.json)")
    level_option(cmd)
    cmd.add_argument("--max-open-files", type=int, metavar="N",
                     help="writers open at once (default: 128 or the open-file limit minus 32)")
    cmd.add_argument("--overwrite", action="store_true", help="replace existing rank<N>_trace files in DIR")
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.split import split

    summary = split(
        args.trace, args.output_dir, rank_map=args.rank_map, compress=args.compress, level=args.level,
        max_open=args.max_open_files, overwrite=args.overwrite, redact=redaction(args), **reading(args),
    )
    report("split", summary, args)


@view("split")
def rows(summary: dict) -> Rows:
    files = [f"{name} {count:,} events" for name, count in summary["files"].items()]
    return [("split", f"{counted(len(files), 'rank')} into {summary['output_dir']}"), ("files", listed(files)),
            ("events", f"{summary['events_read']:,} read, {summary['events_copied_to_every_file']:,} copied to every "
                       "file")]
