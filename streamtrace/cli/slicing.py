"""``streamtrace slice``: options, runner and human report."""
from __future__ import annotations

import argparse

from .options import (
    RANK_RULES,
    common_options,
    drop_cat_option,
    output_options,
    paragraphs,
    rank_map_option,
    reading,
    redaction,
    secrets_options,
)
from .report import Rows, listed, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``slicing``'s options."""
    cmd = commands.add_parser(
        "slice", help="cut a huge trace into pieces a viewer can open (steps, time window, ranks, size)",
        description=paragraphs(
            "Write the events of TRACE that every given selection keeps, as a complete trace of its own: the "
            "input's top-level keys, the metadata (process and thread names, sort indexes) of every pid it keeps "
            "and of every pid with no events at all, and only whole flows (an arrow whose other end is not kept is "
            "dropped and counted; one whose other end the input already lacks is kept as it is). Events are kept "
            "whole, byte for byte, in input order. A selection that keeps no event is refused, naming the trace's "
            "time span, ranks and steps.",
            "Steps are the ProfilerStep#N spans (user_annotation or cpu_op), per rank in a merged file. A step "
            "keeps the CPU events that start inside its span and the GPU events launched inside it, found by "
            "(rank, correlation), even when they run after the span ends; GPU events with no known launch go by "
            "their own start time. --max-mb takes the longest run of consecutive steps, from the first step of "
            "--steps or else from the first step every rank has, whose output fits (the summary says which); "
            "without --steps, a trace that fits whole is kept whole.",
            "Two streaming passes; memory holds compact indexes, per-event columns go to a temporary file. "
            "Ranks: " + RANK_RULES + "."),
        epilog="examples:\n  streamtrace slice trace.json.gz -o step5.json.gz --steps 5\n"
               "  streamtrace slice huge.json.gz -o view.json.gz --max-mb 500         # small enough for ui.perfetto.dev\n"
               "  streamtrace slice merged.json.gz -o r0.json.gz --ranks 0 --window +2s:+2.5s\n"
               "  streamtrace slice trace.json.gz -o steps/ --each-step --drop-cat python_function\n\n"
               "Times are microseconds of the trace's timeline; 'ms' and 's' suffixes scale them, a leading '+'\n"
               "counts from the trace's first event; an empty end is open (+2s: = from 2 s to the end).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", help="trace file, '-' for stdin, or a URL")
    cmd.add_argument("-o", "--output", required=True,
                     help="output path or '-' (with --each-step: a directory for step<N>.json.gz files)")
    cmd.add_argument("--steps", metavar="LIST", help="profiler steps to keep, e.g. 3,5-6")
    cmd.add_argument("--window", metavar="START:END", help="keep events overlapping this time range, e.g. "
                     "1500:2500, 2.5ms:3ms, +2s:+2.5s")
    cmd.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-3,7")
    cmd.add_argument("--pids", metavar="LIST", help="only these pids (comma-separated, as written in the trace)")
    drop_cat_option(cmd)
    cmd.add_argument("--drop-name", metavar="REGEX", help="drop events whose name matches this regular expression")
    cmd.add_argument("--max-mb", type=float, metavar="N", help="the longest run of consecutive steps whose output "
                     "fits in N MB (10^6 bytes) uncompressed")
    cmd.add_argument("--each-step", action="store_true", help="one file per step into the directory -o, each "
                     "complete on its own")
    rank_map_option(cmd)
    output_options(cmd, "the output")
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.slicing import slice_trace

    summary = slice_trace(
        args.trace, args.output, steps=args.steps, window=args.window, ranks=args.ranks, pids=args.pids,
        drop_categories=args.drop_cat, drop_name=args.drop_name, max_mb=args.max_mb, each_step=args.each_step,
        rank_map=args.rank_map, overwrite=args.overwrite, compress=args.compress, level=args.level,
        redact=redaction(args), **reading(args),
    )
    report("slice", summary, args, to_stderr=args.output == "-")


@view("slice")
def rows(summary: dict) -> Rows:
    where = summary.get("output") or f"{len(summary['files'])} step files in {summary['output_dir']}"
    dropped = sum(summary["events_dropped"].values())
    rows = [("sliced", f"{where} ({summary['output_bytes'] or 0:,} bytes)")]
    if summary["steps_selected"] is not None:
        rows.append(("steps", listed([str(step) for step in summary["steps_selected"]], 12)))
    elif summary.get("whole_trace_fits"):
        rows.append(("steps", "all: the whole trace fits in --max-mb, kept whole"))
    unpaired = summary.get("flow_events_unpaired_in_input")
    rows += [("events", f"{summary['events_read']:,} read, {summary['events_written']:,} written, {dropped:,} dropped"),
             ("flows", f"{summary['flow_events_kept']:,} flow events kept"
                       + (f" ({unpaired:,} of them without their other end in the input already)" if unpaired else "")
                       + f", {summary['flow_events_dropped_without_partner']:,} dropped: the selection cut their "
                         "other end")]
    return rows
