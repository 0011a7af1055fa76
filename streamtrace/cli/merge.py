"""``streamtrace merge``: options, runner and human report."""
from __future__ import annotations

import argparse

from .options import (
    cluster_option,
    common_options,
    original_stream_option,
    output_options,
    paragraphs,
    reading,
    redaction,
    secrets_options,
)
from .report import Rows, counted, events_row, listed, ms, pp_arrows, report, slices_into_lanes, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``merge``'s options."""
    cmd = commands.add_parser(
        "merge", help="merge per-rank traces into one aligned, compacted timeline with PP arrows",
        description=paragraphs(
            "Merge the traces of several ranks of one run into one file for Perfetto and analysis tools. Each "
            "rank is compacted (as 'compact' does), shifted onto a common clock (baseTimeNanoseconds), given "
            "fresh pids (CPU processes first, GPU last; ranks stacked in pipeline-parallel order), and its "
            "correlation and flow ids are made unique across ranks (args.correlation_raw keeps the original), "
            "so every CPU launch links to its own rank's kernels.",
            "Pipeline-parallel arrows are added: SEND->RECV across ranks, RECV->compute->SEND and "
            "UNSHARD->compute within a rank.",
            "Each input is read twice (index, then emit); memory holds compact per-rank indexes only, and with "
            "-j N both passes of different ranks run in N processes (the output is the same; each process "
            "holds one rank's indexes at a time)."),
        epilog="examples:\n  streamtrace merge traces/                       # the traces in traces/ that state their rank\n"
               "  streamtrace merge 'run/*rank*.pt.trace.json.gz' -o merged.json.gz -j 2\n"
               "  streamtrace merge traces/ --ranks 0-3 --no-compact\n\n"
               "The rank of a file is its distributedInfo.rank, else the number after 'rank' or 'worker' in its\n"
               "name (a directory gives the .json[.gz|.zst] traces in it that state a rank either way);\n"
               "the PP order comes from the PP process group (pg_name torchtitan_real_pp or pg_desc mesh_pp),\n"
               "else from the global ranks (the summary says which). Non-zero *_unmatched counts usually mean\n"
               "the capture window cut a pipeline step; SEND/RECV blocks whose peer stage is in no merged file\n"
               "(--ranks left its rank out) are counted apart, with the PP group's ranks not merged.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("inputs", nargs="+", metavar="INPUT", help="trace files, directories or glob patterns (in any names)")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: merged_compacted.json.gz, or "
                                            "pp_traces_merged_compacted.json.gz with PP annotations, beside the inputs)")
    cmd.add_argument("--ranks", metavar="LIST", help="only these global ranks, e.g. 0-7,12")
    cmd.add_argument("--per-stage", action="store_true",
                     help="-o is a directory: one file per PP stage (pp_stage<N>.json.gz), written in parallel; "
                          "SEND->RECV arrows between stages are counted")
    cmd.add_argument("--no-compact", action="store_true", help="keep the GPU streams as they are")
    original_stream_option(cmd)
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add pipeline-parallel arrows")
    cmd.add_argument("--rules", metavar="FILE", help="compaction rules file (see compact --print-rules)")
    output_options(cmd, "the output")
    cluster_option(cmd)
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..commands.merge import merge

    summary = merge(
        args.inputs, args.output, compact=not args.no_compact, original_stream=not args.no_original_stream,
        pp_flows=not args.no_pp_flows, ranks=args.ranks, overwrite=args.overwrite, rules=args.rules,
        compress=args.compress, level=args.level, redact=redaction(args), **reading(args), dask=args.dask,
        per_stage=args.per_stage,
    )
    report("merge", summary, args, to_stderr=args.output == "-")


@view("merge")
def rows(summary: dict) -> Rows:
    ranks = summary["pp_ranks"]
    rules = sorted({entry["rank_from"] for entry in ranks})
    largest = max(abs(offset) for offset in summary["time_offsets_us"].values())
    rows = [
        ("merged", f"{counted(summary['ranks'], 'rank')} ({listed([str(entry['global_rank']) for entry in ranks], 8)}; "
                   f"rank from {' / '.join(rules)})"),
        ("output", summary["output"] if "stages" not in summary else
         f"{len(summary['stages'])} files, one per PP stage ({listed(summary['output'], 4)})"),
        ("time", f"aligned on {summary['time_alignment']}, "
                 + (f"offsets up to {ms(largest)}" if largest else "no rank shifted (one clock already)")),
        ("order", summary["pp_order"]),
        events_row(summary),
    ]
    compactions = [c for c in summary["per_rank_compaction"].values() if c]
    if compactions:
        rows.append(("compaction", slices_into_lanes(*(sum(c[key] for c in compactions) for key in (
            "measured_slices", "original_streams", "compacted_lanes")))))
    if "pp_send_recv_pairs" in summary and (summary["pp_send_recv_pairs"] or summary["pp_compute_dependency_pairs"]):
        rows.append(("PP arrows", f"{summary['pp_send_recv_pairs']:,} SEND->RECV, {pp_arrows(summary)}"))
    unmatched = [f"{key} {value:,}" for key, value in summary.items() if key.endswith("_unmatched") and value]
    if unmatched:
        rows.append(("unmatched", ", ".join(unmatched) + " (usually the capture window cut a pipeline step)"))
    if "pp_cross_stage_arrows" in summary:
        rows.append(("across stages", f"{summary['pp_cross_stage_arrows']:,} SEND->RECV arrows join two stages' files "
                                      "(counted, not drawn)"))
    elif summary.get("pp_send_recv_peer_stage_absent") and "stages" not in summary:
        missing = summary["pp_ranks_not_merged"]
        rows.append(("no peer", f"{summary['pp_send_recv_peer_stage_absent']:,} SEND/RECV blocks have their peer stage "
                                + (f"on ranks not merged (global ranks {listed([str(rank) for rank in missing], 8)})"
                                   if missing else "nowhere in the merged files")))
    return rows
