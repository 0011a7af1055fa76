"""Command line: a thin layer that parses flags and prints library summaries."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import textwrap
from typing import Callable, Sequence

import orjson

from . import __version__
from .algo.rules import DEFAULT_RULES_TOML
from .commands.attribute import attribute
from .commands.compact import compact
from .commands.convert import convert
from .commands.inspect import inspect
from .commands.merge import merge
from .commands.relink import relink
from .commands.slicing import slice_trace
from .commands.split import SUFFIXES, split
from .errors import TraceError
from .io.sink import COMPRESSIONS

EPILOG = """\
Inputs are paths, '-' for stdin, or fsspec URLs (s3://, gs://, https://; needs
the 'cloud' extra). gzip and zstd inputs are recognised by their magic bytes.
Outputs are written to a temporary file and renamed at the end, so a failed
run never leaves a partial file. Errors print one line and exit with status 1.
"""


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--salvage", action="store_true",
                       help="read a trace cut off mid-array (profiler killed) up to its last complete event")
    group.add_argument("--spool-dir", metavar="DIR",
                       help="directory for temporary spool files (default: the system temp dir)")
    group.add_argument("-j", "--jobs", metavar="N",
                       help="busy processes: N, or 'auto' (default: the CPUs this process may use, at most 4; "
                            "$STREAMTRACE_JOBS overrides the default). -j 1 runs in one process; the output is "
                            "the same for every N")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress output on stderr")
    group.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


RANK_RULES = ("args.rank, else the rank a process_name states such as 'RANK 3 - GPU', else --rank-map, "
              "else inference: a GPU pid pairs with the CPU pid that launched its correlation ids before "
              "its GPU events ran, else distributedInfo.rank for a single-rank file")
RANK_MAP_HELP = """\
--rank-map FILE is a JSON object from pid to rank, for pids no other rule
places, e.g. {"4037": 0, "0": 0, "4045": 1, "1": 1}. The summary lists every
pid with its rank and the rule that decided it. A pid that several ranks
claim, with colliding correlation ids, stops the command with an error
instead of guessing."""


def _paragraphs(*texts: str) -> str:
    """Descriptions kept readable under RawDescriptionHelpFormatter (which does not wrap)."""
    return "\n\n".join(textwrap.fill(text, 79) if "\n" not in text else text for text in texts)


def _output_options(parser: argparse.ArgumentParser, output: str) -> None:
    """--compress, --level and --overwrite of the commands that write one trace."""
    parser.add_argument("--compress", choices=COMPRESSIONS,
                        help=f"output compression (default: from the suffix of {output})")
    parser.add_argument("--level", type=int, help="compression level (default: gzip 1, zstd 3)")
    parser.add_argument("--overwrite", action="store_true", help=f"replace {output} if it exists")


def _rank_map(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank-map", metavar="FILE", help="JSON object {pid: rank} for pids no other rule places")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamtrace",
        description="Bounded-memory tools for huge PyTorch profiler (Kineto) traces.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"streamtrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cmd = commands.add_parser(
        "inspect", help="summarise what is in a trace (one pass)",
        description=_paragraphs("One streaming pass over TRACE: top-level keys, event counts by (ph, cat), "
                        "pids with role and rank, GPU streams, runtime and graph launches, correlation-id "
                        "collisions across pids/ranks, PP annotation counts, time span, size, time, peak RSS."),
        epilog="example: streamtrace inspect rank0_trace.json.gz --json | jq .graph_launches",
    )
    cmd.add_argument("trace", help="trace file, '-' for stdin, or a URL")
    cmd.add_argument("--json", action="store_true", help="print only the JSON summary")
    _common(cmd)
    cmd.set_defaults(run=_run_inspect)

    cmd = commands.add_parser(
        "convert", help="recompress / normalise a trace, optionally dropping categories",
        description=_paragraphs("Stream IN to OUT event by event. Output compression follows OUT's suffix "
                        "(.gz, .zst, else none) unless --compress says otherwise. The output is a JSON "
                        "object with the input's top-level keys in order and one event per line."),
        epilog="examples:\n  streamtrace convert trace.json.gz trace.json.zst\n"
               "  cat trace.json.gz | streamtrace convert - small.json.gz --drop-cat python_function",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("input", help="input trace, '-' for stdin, or a URL")
    cmd.add_argument("output", help="output path, or '-' for stdout (summary then goes to stderr)")
    cmd.add_argument("--drop-cat", action="append", default=[], metavar="CAT",
                     help="drop events of this category (repeatable), e.g. python_function")
    _output_options(cmd, "OUT")
    _common(cmd)
    cmd.set_defaults(run=_run_convert)

    cmd = commands.add_parser(
        "compact", help="repack CUDA-graph replay streams into a few semantic lanes (for Perfetto)",
        description=_paragraphs("Two streaming passes over TRACE. GPU slices (kernel, gpu_memcpy, gpu_memset) keep "
                        "name, ts, dur, pid and args; only tid/args.stream change: slices are packed per GPU pid "
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
    cmd.add_argument("trace", nargs="?", help="trace file, '-' for stdin (then give -o), or a URL")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: <name>_compacted.json.gz beside the input)")
    cmd.add_argument("--rules", metavar="FILE", help="TOML file with lane groups, labels and match rules")
    cmd.add_argument("--print-rules", action="store_true", help="print the default rules file and exit")
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add rank-local PP dependency arrows")
    cmd.add_argument("--strict", action="store_true",
                     help="fail on an ac2g endpoint that matches no slice start (default: move it to the "
                          "nearest slice's lane and count it as gpu_flow_endpoints_unmatched)")
    _output_options(cmd, "the output")
    _common(cmd)
    cmd.set_defaults(run=_run_compact)

    cmd = commands.add_parser(
        "merge", help="merge per-rank traces into one aligned, compacted timeline with PP arrows",
        description=_paragraphs(
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
        epilog="examples:\n  streamtrace merge traces/                       # rank<N>_trace.json[.gz|.zst] files in traces/\n"
               "  streamtrace merge 'run/*rank*.pt.trace.json.gz' -o merged.json.gz -j 2\n"
               "  streamtrace merge traces/ --ranks 0-3 --no-compact\n\n"
               "The rank of a file is its distributedInfo.rank, else the number after 'rank' in its name;\n"
               "the PP order comes from the PP process group (pg_name torchtitan_real_pp or pg_desc mesh_pp),\n"
               "else from the global ranks (the summary says which). Non-zero *_unmatched counts usually mean\n"
               "the capture window cut a pipeline step.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("inputs", nargs="+", metavar="INPUT", help="trace files, directories or glob patterns")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: merged_compacted.json.gz, or "
                                            "pp_traces_merged_compacted.json.gz with PP annotations, beside the inputs)")
    cmd.add_argument("--ranks", metavar="LIST", help="only these global ranks, e.g. 0-7,12")
    cmd.add_argument("--no-compact", action="store_true", help="keep the GPU streams as they are")
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add pipeline-parallel arrows")
    cmd.add_argument("--rules", metavar="FILE", help="compaction rules file (see compact --print-rules)")
    _output_options(cmd, "the output")
    _common(cmd)
    cmd.set_defaults(run=_run_merge)

    cmd = commands.add_parser(
        "relink", help="repair a merged multi-rank trace: rank-unique correlation ids, correct ac2g flows",
        description=_paragraphs(
            "Two streaming passes over TRACE, a file that merges several ranks (whose correlation ids collide).",
            "Every pid gets a rank: " + RANK_RULES + ". Every GPU event is linked to the one runtime call of its "
            "own rank with its correlation id (or counted as an orphan), so a cudaGraphLaunch gets exactly its "
            "own rank's kernels.",
            "The output is the same trace with correlation ids rewritten to (rank + 1) * 10^k + id (below 2^53) "
            "in runtime calls and GPU events, the original kept as args.correlation_raw, and every ac2g flow "
            "replaced by a correct one beside the events it binds. Tools that key by correlation alone "
            "(TraceLens, HTA, Perfetto's flow matching) then read the file correctly."),
        epilog="examples:\n  streamtrace relink merged.json.gz                   # -> merged_relinked.json.gz\n"
               "  streamtrace relink merged.json.gz -o fixed.json.zst --rank-map ranks.json\n"
               "  streamtrace relink merged.json.gz -o - | gzip > fixed.json.gz\n\n" + RANK_MAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", help="merged trace file, '-' for stdin (then give -o), or a URL")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: <name>_relinked.json.gz beside the input)")
    _rank_map(cmd)
    _output_options(cmd, "the output")
    _common(cmd)
    cmd.set_defaults(run=_run_relink)

    cmd = commands.add_parser(
        "split", help="write one trace per rank out of a merged trace",
        description=_paragraphs(
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
    _rank_map(cmd)
    cmd.add_argument("--compress", choices=tuple(SUFFIXES), default="gzip",
                     help="per-rank file compression: gzip (.json.gz, default), zstd (.json.zst), none (.json)")
    cmd.add_argument("--level", type=int, help="compression level (default: gzip 1, zstd 3)")
    cmd.add_argument("--max-open-files", type=int, metavar="N",
                     help="writers open at once (default: 128 or the open-file limit minus 32)")
    cmd.add_argument("--overwrite", action="store_true", help="replace existing rank<N>_trace files in DIR")
    _common(cmd)
    cmd.set_defaults(run=_run_split)

    cmd = commands.add_parser(
        "slice", help="cut a huge trace into pieces a viewer can open (steps, time window, ranks, size)",
        description=_paragraphs(
            "Write the events of TRACE that every given selection keeps, as a complete trace of its own: the "
            "input's top-level keys, the metadata (process and thread names, sort indexes) of every pid it keeps, "
            "and only whole flows (an arrow whose other end is not kept is dropped and counted). Events are kept "
            "whole, byte for byte, in input order.",
            "Steps are the ProfilerStep#N spans (user_annotation or cpu_op), per rank in a merged file. A step "
            "keeps the CPU events that start inside its span and the GPU events launched inside it, found by "
            "(rank, correlation), even when they run after the span ends; GPU events with no known launch go by "
            "their own start time. --max-mb takes the longest run of consecutive steps, from the first step of "
            "--steps or else from the first step every rank has, whose output fits (the summary says which).",
            "Two streaming passes; memory holds compact indexes, per-event columns go to a temporary file. "
            "Ranks: " + RANK_RULES + "."),
        epilog="examples:\n  streamtrace slice trace.json.gz -o step5.json.gz --steps 5\n"
               "  streamtrace slice huge.json.gz -o view.json.gz --max-mb 500         # fits chrome://tracing\n"
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
    cmd.add_argument("--drop-cat", action="append", default=[], metavar="CAT",
                     help="drop events of this category (repeatable), e.g. python_function")
    cmd.add_argument("--drop-name", metavar="REGEX", help="drop events whose name matches this regular expression")
    cmd.add_argument("--max-mb", type=float, metavar="N", help="the longest run of consecutive steps whose output "
                     "fits in N MB (10^6 bytes) uncompressed")
    cmd.add_argument("--each-step", action="store_true", help="one file per step into the directory -o, each "
                     "complete on its own")
    _rank_map(cmd)
    _output_options(cmd, "the output")
    _common(cmd)
    cmd.set_defaults(run=_run_slice)

    cmd = commands.add_parser(
        "attribute", help="CSV of every GPU event with its rank, launching call and enclosing CPU ops",
        description=_paragraphs(
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
    cmd.add_argument("trace", help="trace file, '-' for stdin, or a URL")
    cmd.add_argument("-o", "--output", default="-",
                     help="CSV path ('.gz'/'.zst' compress it) or '-' for stdout (default; the summary then goes "
                          "to stderr)")
    cmd.add_argument("--group-by", choices=("op",), help="print GPU time per (rank, cpu op) instead of rows")
    _rank_map(cmd)
    cmd.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    _common(cmd)
    cmd.set_defaults(run=_run_attribute)

    cmd = commands.add_parser(
        "demo", help="generate a small example trace, inspect, compact and merge it",
        description=_paragraphs("Write a small generated 2-rank pipeline-parallel trace (CUDA-graph replays, NCCL, "
                        "PP annotations) into DIR, run 'inspect' and 'compact' on rank 0 and 'merge' the two ranks: "
                        "a quick check that everything works, and files to open in Perfetto."),
    )
    cmd.add_argument("dir", nargs="?", help="where to write the example (default: a new temp directory)")
    _common(cmd)
    cmd.set_defaults(run=_run_demo)
    return parser


def _emit_summary(summary: dict, *, to_stderr: bool = False) -> None:
    stream = sys.stderr if to_stderr else sys.stdout
    stream.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    stream.flush()


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.quiet else None


def _run_inspect(args: argparse.Namespace) -> None:
    summary = inspect(args.trace, salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args),
                      jobs=args.jobs)
    if not args.json:
        sys.stdout.write(format_inspect_table(summary) + "\nJSON summary:\n")
    _emit_summary(summary)


def _run_convert(args: argparse.Namespace) -> None:
    summary = convert(
        args.input, args.output, drop_categories=args.drop_cat, compress=args.compress, level=args.level,
        overwrite=args.overwrite, salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args),
        jobs=args.jobs,
    )
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_compact(args: argparse.Namespace) -> None:
    if args.print_rules:
        sys.stdout.write(DEFAULT_RULES_TOML)
        return
    if args.trace is None:
        raise TraceError("give a TRACE to compact (or --print-rules)")
    summary = compact(
        args.trace, args.output, rules=args.rules, pp_flows=not args.no_pp_flows, strict=args.strict,
        overwrite=args.overwrite, compress=args.compress, level=args.level, salvage=args.salvage,
        spool_dir=args.spool_dir, progress=_progress(args), jobs=args.jobs,
    )
    if "notice" in summary:
        print(f"streamtrace: {summary['notice']}", file=sys.stderr)
    if summary.get("gpu_flow_endpoints_unmatched"):
        print(f"streamtrace: {summary['gpu_flow_endpoints_unmatched']} ac2g endpoints matched no slice start "
              "(trimmed or windowed capture); moved to the nearest slice's lane", file=sys.stderr)
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_merge(args: argparse.Namespace) -> None:
    summary = merge(
        args.inputs, args.output, compact=not args.no_compact, pp_flows=not args.no_pp_flows,
        ranks=args.ranks, overwrite=args.overwrite, rules=args.rules, compress=args.compress, level=args.level,
        salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args), jobs=args.jobs,
    )
    unmatched = {key: value for key, value in summary.items() if key.endswith("_unmatched") and value}
    if unmatched:
        print("streamtrace: unmatched PP blocks " + ", ".join(f"{k}={v}" for k, v in unmatched.items())
              + " (usually the capture window cut a pipeline step)", file=sys.stderr)
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_relink(args: argparse.Namespace) -> None:
    summary = relink(
        args.trace, args.output, rank_map=args.rank_map, overwrite=args.overwrite, compress=args.compress,
        level=args.level, salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args),
        jobs=args.jobs,
    )
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_split(args: argparse.Namespace) -> None:
    summary = split(
        args.trace, args.output_dir, rank_map=args.rank_map, compress=args.compress, level=args.level,
        max_open=args.max_open_files, overwrite=args.overwrite, salvage=args.salvage, spool_dir=args.spool_dir,
        progress=_progress(args), jobs=args.jobs,
    )
    _emit_summary(summary)


def _run_slice(args: argparse.Namespace) -> None:
    summary = slice_trace(
        args.trace, args.output, steps=args.steps, window=args.window, ranks=args.ranks, pids=args.pids,
        drop_categories=args.drop_cat, drop_name=args.drop_name, max_mb=args.max_mb, each_step=args.each_step,
        rank_map=args.rank_map, overwrite=args.overwrite, compress=args.compress, level=args.level,
        salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args), jobs=args.jobs,
    )
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_attribute(args: argparse.Namespace) -> None:
    summary = attribute(
        args.trace, args.output, group_by=args.group_by, rank_map=args.rank_map, overwrite=args.overwrite,
        salvage=args.salvage, spool_dir=args.spool_dir, progress=_progress(args), jobs=args.jobs,
    )
    _emit_summary(summary, to_stderr=args.output == "-")


def _run_demo(args: argparse.Namespace) -> None:
    from .synth import SynthConfig, write_traces

    directory = args.dir or tempfile.mkdtemp(prefix="streamtrace-demo-")
    os.makedirs(directory, exist_ok=True)
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1), directory, compress="gz")
    trace = os.path.join(directory, "rank0_trace.json.gz")
    print(f"demo traces written to {directory}")
    summary = inspect(trace, spool_dir=args.spool_dir, progress=_progress(args))
    sys.stdout.write(format_inspect_table(summary))
    compacted = compact(trace, overwrite=True, spool_dir=args.spool_dir, progress=_progress(args))
    print(f"\ncompacted {compacted['measured_slices']:,} GPU slices from {compacted['original_streams']} streams "
          f"into {compacted['compacted_lanes']} lanes: {compacted['output']}")
    merged = merge([os.path.join(directory, f"rank{rank}_trace.json.gz") for rank in (0, 1)],
                   overwrite=True, spool_dir=args.spool_dir, progress=_progress(args))
    print(f"merged 2 ranks with {merged['pp_send_recv_pairs']} SEND->RECV arrows: {merged['output']}")
    print("open them in https://ui.perfetto.dev; next: streamtrace inspect --json, streamtrace compact --help, "
          "streamtrace merge --help")


def format_inspect_table(summary: dict) -> str:
    """A short human-readable digest of an inspect summary."""
    span = summary["time_span_us"]
    collisions = summary["correlation_collisions"]
    graphs = summary["graph_launches"]
    rows = [
        ("input", summary["input"]),
        ("size", f"{summary['bytes_raw']:,} bytes read, {summary['bytes_decompressed']:,} decompressed "
                 f"({summary['compression']})"),
        ("events", f"{summary['events']:,}"),
        ("top-level keys", ", ".join(summary["top_level_keys"])),
        ("ranks", ", ".join(map(str, summary["ranks"])) or "unknown"),
        ("pids", ", ".join(f"{p['pid']} ({p['role']}{'' if p['rank'] is None else ' rank ' + str(p['rank'])})"
                           for p in summary["pids"][:12]) + (" ..." if len(summary["pids"]) > 12 else "")),
        ("GPU streams", ", ".join(f"pid {pid}: {len(s)}" for pid, s in summary["gpu_streams"].items()) or "none"),
        ("runtime launches", f"{summary['runtime_launches']:,}"),
        ("graph launches", f"{graphs['count']:,}" + (
            f", {graphs['gpu_events_per_launch_mean']} GPU events each on average" if graphs["count"] else "")),
        ("correlation ids shared", f"{collisions['ids_shared_across_ranks']:,} across ranks, "
                                   f"{collisions['ids_shared_across_pids']:,} across pids"),
        ("PP annotations", ", ".join(f"{k} {v}" for k, v in summary["pp_annotations"].items()) or "none"),
        ("time span", f"{span['duration']} us" if span["duration"] is not None else "no timed events"),
        ("top categories", ", ".join(f"{k} {v:,}" for k, v in list(summary["events_by_ph_cat"].items())[:6])),
        ("took", f"{summary['wall_seconds']} s, peak RSS {summary['peak_rss_mb']} MB"),
    ]
    repairs = [f"{summary[key]} {label}" for key, label in (
        ("invalid_utf8_repaired", "invalid UTF-8 sequences replaced"),
        ("control_chars_repaired", "raw control characters escaped")) if summary[key]]
    if summary["truncated_salvaged"]:
        repairs.append("input was truncated: complete events kept (--salvage)")
    if repairs:
        rows.append(("repairs", "; ".join(repairs)))
    width = max(len(name) for name, _ in rows)
    return "".join(f"{name:<{width}}  {value}\n" for name, value in rows)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same cleanup runs."""


def _terminate(signum: int, frame: object) -> None:
    """Turn SIGTERM into an exception so temporary files are cleaned up."""
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    run: Callable[[argparse.Namespace], None] = args.run
    try:
        run(args)
    except TraceError as exc:
        if args.debug:
            raise
        print(f"streamtrace: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print("streamtrace: interrupted; no output written", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except OSError as exc:
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"streamtrace: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _silence_stdout() -> None:
    """The reader closed the pipe: keep Python from failing again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
