"""``streamtrace compact``: options, runner and human report."""
from __future__ import annotations

import argparse
import sys

from ..errors import TraceError
from .batch import is_batch, run_batch
from .options import (
    cluster_option,
    common_options,
    original_stream_option,
    output_option,
    output_options,
    paragraphs,
    reading,
    redaction,
    secrets_options,
)
from .report import Rows, events_row, lanes, pp_arrows, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``compact``'s options."""
    cmd = commands.add_parser(
        "compact", help="repack CUDA-graph replay streams into a few semantic lanes (for Perfetto)",
        description=paragraphs("Two streaming passes over TRACE. GPU slices (kernel, gpu_memcpy, gpu_memset) keep "
                        "name, ts, dur, pid and args; only tid/args.stream change (the old stream is kept as "
                        "args.original_stream unless --no-original-stream): slices are packed per GPU pid "
                        "and group (Compute, NCCL all-gather, reduce-scatter, all-reduce, other, memcpy, memset...) "
                        "into the fewest non-overlapping lanes. GPU annotations move to per-lane annotation tracks "
                        "(identical overlapping ones merged), per-kernel args.name labels become spans, ac2g flow "
                        "endpoints follow their kernels, and rank-local pipeline-parallel arrows are added. "
                        "The run validates itself and writes nothing if a check fails."),
        epilog="examples:\n  streamtrace compact rank0_trace.json.gz            # -> rank0_trace_compacted.json.gz\n"
               "  streamtrace compact trace.json -o view.json.zst --rules my_rules.toml\n"
               "  streamtrace compact --print-rules > my_rules.toml     # start from the defaults",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="*", metavar="TRACE",
                     help="trace file, '-' for stdin (then give -o), or a URL; several, a directory or a glob: one task each")
    output_option(cmd, "_compacted")
    cmd.add_argument("--rules", metavar="FILE", help="TOML file with lane groups, labels and match rules")
    cmd.add_argument("--print-rules", action="store_true", help="print the default rules file and exit")
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add rank-local PP dependency arrows")
    original_stream_option(cmd)
    cmd.add_argument("--strict", action="store_true",
                     help="fail on an ac2g endpoint that matches no slice start (default: move it to the "
                          "nearest slice's lane and count it as gpu_flow_endpoints_unmatched)")
    output_options(cmd, "the output")
    cluster_option(cmd)
    secrets_options(cmd)
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..algo.rules import DEFAULT_RULES_TOML
    from ..commands.compact import compact

    if args.print_rules:
        sys.stdout.write(DEFAULT_RULES_TOML)
        return
    if not args.trace:
        raise TraceError("give a TRACE to compact (or --print-rules)")
    options = dict(rules=args.rules, pp_flows=not args.no_pp_flows, strict=args.strict,
                   original_stream=not args.no_original_stream, compress=args.compress, level=args.level,
                   redact=redaction(args))  # one set for a single run and a batch alike
    if is_batch(args, args.output):
        return run_batch(args, **options)
    summary = compact(args.trace[0], args.output, overwrite=args.overwrite, **options, **reading(args))
    report("compact", summary, args, to_stderr=args.output == "-")


@view("compact")
def rows(summary: dict) -> Rows:
    rows = [("compacted", lanes(summary) if summary["measured_slices"] else "nothing"),
            ("output", summary["output"]), events_row(summary)]
    if summary.get("gpu_annotations_mapped"):
        rows.append(("annotations", f"{summary['gpu_annotations_mapped']:,} GPU annotations moved to lane tracks, "
                                    f"{summary['gpu_annotations_coalesced']:,} merged"))
    if summary.get("pp_compute_dependency_pairs") or summary.get("pp_unshard_compute_pairs"):
        rows.append(("PP arrows", pp_arrows(summary)))
    if summary.get("gpu_flow_endpoints_unmatched"):
        rows.append(("warning", f"{summary['gpu_flow_endpoints_unmatched']:,} ac2g endpoints matched no slice start "
                                "(trimmed or windowed capture); moved to the nearest slice's lane"))
    return rows
