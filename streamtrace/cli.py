"""Command line: a thin layer that parses flags and prints library summaries."""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import textwrap
from collections import Counter
from typing import Callable, Sequence

from . import __version__
from .algo.rules import DEFAULT_RULES_TOML
from .algo.secrets import DEFAULT_SECRETS_RULES_TOML
from .commands.analyze import analyze, report_rows
from .commands.attribute import attribute
from .commands.batch import batch
from .commands.compact import compact
from .commands.convert import convert
from .commands.inspect import TOP_KERNELS, inspect
from .commands.merge import merge, parse_rank_list
from .commands.redact import redact
from .commands.relink import relink
from .commands.slicing import slice_trace
from .commands.split import SUFFIXES, split
from .errors import TraceError
from .io.destinations import summary_json
from .io.redact import RedactOptions
from .io.sink import COMPRESSIONS
from .resources import STOPS_REQUESTED

EPILOG = """\
Inputs are paths, '-' for stdin, or URLs (https://, s3://, gs://; extras
'http', 's3', 'gcs' or 'cloud' for all three), downloaded once. Outputs may be
paths, '-', s3:// or gs:// URLs. gzip and zstd inputs are recognised by their
magic bytes. Outputs are written to a temporary file (or upload) made final at
the end, so a failed run never leaves a partial file or object. Errors print
one line and exit with status 1.
"""


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--salvage", action="store_true",
                       help="read a trace cut off mid-array (profiler killed) up to its last complete event")
    group.add_argument("--spool-dir", metavar="DIR",
                       help="directory for temporary spool files (default: the system temp dir)")
    group.add_argument("--reread-remote", action="store_true",
                       help="read a URL input again from the bucket when a second reading is needed, instead of "
                            "keeping a local copy in the spool dir while it is downloaded (the default)")
    group.add_argument("-j", "--jobs", metavar="N",
                       help="busy processes: N, or 'auto' (default: the CPUs this process may use, at most 4; "
                            "$STREAMTRACE_JOBS overrides the default). -j 1 runs in one process; the output is "
                            "the same for every N")
    group.add_argument("--json", action="store_true",
                       help="print the full JSON summary instead of the short human report")
    group.add_argument("--summary", metavar="FILE", help="also write the full JSON summary to FILE")
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


def _original_stream(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-original-stream", action="store_true",
                        help="do not keep each moved slice's CUDA stream as args.original_stream")


def _cluster(parser: argparse.ArgumentParser) -> None:
    """--dask: the commands that run one task per input (merge's ranks, batch runs)."""
    parser.add_argument("--dask", metavar="ADDRESS",
                        help="run one task per input on the Dask cluster whose scheduler is ADDRESS "
                             "(e.g. tcp://head:8786; default $STREAMTRACE_DASK; needs the 'dask' extra and a "
                             "--spool-dir that every worker shares); -j then does not apply. A single input runs here")


def _secrets_options(parser: argparse.ArgumentParser, role: str = "writer") -> None:
    """Secret rules for inspect, redact and (with --redact) every command that writes a trace."""
    group = parser.add_argument_group("secrets (see 'streamtrace redact --help')")
    if role == "writer":
        group.add_argument("--redact", action="store_true",
                           help="replace credentials in the output by \"<redacted:KIND>\" (as 'redact' does)")
    group.add_argument("--secrets-rules", metavar="FILE", help="TOML secret rules (see redact --print-secrets-rules)")
    group.add_argument("--pattern", action="append", default=[], metavar="NAME=REGEX",
                       help="also treat matches of REGEX as secrets of kind NAME (repeatable)")
    if role != "inspect":
        group.add_argument("--pseudonymize", metavar="KINDS", default="",
                           help="also replace these by stable pseudonyms: comma-separated hosts,users,paths")


def _redaction(args: argparse.Namespace) -> RedactOptions | None:
    """What _secrets_options asked for; None when a writing command is not to redact."""
    pseudonymize = tuple(kind for kind in getattr(args, "pseudonymize", "").split(",") if kind)
    if not (getattr(args, "redact", True) or args.secrets_rules or args.pattern or pseudonymize):
        return None
    return RedactOptions(args.secrets_rules, tuple(args.pattern), pseudonymize)


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
        description=_paragraphs("One streaming pass over each TRACE: top-level keys, event counts by (ph, cat), "
                        "the devices, pids with events (role, rank), per rank its GPU busy time (the union of "
                        "its slices) and its profiler steps (count, first, last and median duration), GPU "
                        "streams, the top kernels by total time, runtime and graph launches, correlation-id "
                        "collisions across pids/ranks, PP annotation counts, the time span (and when it ran, "
                        "in UTC, where the trace says), size, time, peak RSS. Prints a short report per trace; "
                        "--json prints everything (a list for several traces)."),
        epilog="example: streamtrace inspect rank0_trace.json.gz --json | jq .by_rank",
    )
    cmd.add_argument("trace", nargs="+", help="trace file(s), '-' for stdin, or a URL")
    cmd.add_argument("--top", type=int, metavar="N",
                     help="list the N kernels with the most GPU time (default: 10 in --json, 3 in the report; "
                          "full names in --json)")
    cmd.add_argument("--overwrite", action="store_true", help="replace the --summary FILE if it exists")
    _secrets_options(cmd, "inspect")
    _common(cmd)
    cmd.set_defaults(run=_run_inspect)

    cmd = commands.add_parser(
        "convert", help="recompress / normalise a trace, optionally dropping categories",
        description=_paragraphs("Stream IN to OUT event by event. Output compression follows OUT's suffix "
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
    cmd.add_argument("--drop-cat", action="append", default=[], metavar="CAT",
                     help="drop events of this category (repeatable), e.g. python_function")
    _output_options(cmd, "OUT")
    _secrets_options(cmd)
    _common(cmd)
    cmd.set_defaults(run=_run_convert)

    cmd = commands.add_parser(
        "redact", help="copy a trace with its credentials replaced, to share it",
        description=_paragraphs(
            "One streaming pass: TRACE with every secret replaced by \"<redacted:KIND>\": strings shaped like "
            "credentials (Hugging Face, GitHub, AWS, OpenAI, Slack, Google API keys, JWTs, private key blocks, "
            "passwords in URLs; only the matched part), and whole strings under keys naming a secret (*TOKEN*, "
            "*SECRET*, *PASSWORD*, *API_KEY*, ...) unless short or benign. Events, names, args at any depth, "
            "stack frames and every top-level key are looked at; a top-level key without a secret is copied "
            "byte for byte. 'inspect' reports the same findings by JSON path; every command that writes a "
            "trace takes --redact."),
        epilog="examples:\n  streamtrace redact trace.json.gz                  # -> trace_redacted.json.gz\n"
               "  streamtrace redact trace.json.gz -o share.json.gz --pseudonymize hosts,users,paths\n"
               "  streamtrace redact trace.json.gz --pattern employee_id='EMP-[0-9]{6}'\n"
               "  streamtrace redact --print-secrets-rules > rules.toml   # start from the defaults",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="?", help="trace file, '-' for stdin (then give -o), or a URL")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: <name>_redacted.json.gz beside the input)")
    cmd.add_argument("--print-secrets-rules", action="store_true", help="print the default secret rules and exit")
    _secrets_options(cmd, "redact")
    _output_options(cmd, "the output")
    _common(cmd)
    cmd.set_defaults(run=_run_redact)

    cmd = commands.add_parser(
        "compact", help="repack CUDA-graph replay streams into a few semantic lanes (for Perfetto)",
        description=_paragraphs("Two streaming passes over TRACE. GPU slices (kernel, gpu_memcpy, gpu_memset) keep "
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
                     help="trace file, '-' for stdin (then give -o), or a URL; several: one task each (batch)")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: <name>_compacted.json.gz beside the input); "
                                            "with several inputs a directory DIR/")
    cmd.add_argument("--rules", metavar="FILE", help="TOML file with lane groups, labels and match rules")
    cmd.add_argument("--print-rules", action="store_true", help="print the default rules file and exit")
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add rank-local PP dependency arrows")
    _original_stream(cmd)
    cmd.add_argument("--strict", action="store_true",
                     help="fail on an ac2g endpoint that matches no slice start (default: move it to the "
                          "nearest slice's lane and count it as gpu_flow_endpoints_unmatched)")
    _output_options(cmd, "the output")
    _cluster(cmd)
    _secrets_options(cmd)
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
               "the capture window cut a pipeline step; SEND/RECV blocks whose peer stage is in no merged file\n"
               "(--ranks left its rank out) are counted apart, with the PP group's ranks not merged.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("inputs", nargs="+", metavar="INPUT", help="trace files, directories or glob patterns")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: merged_compacted.json.gz, or "
                                            "pp_traces_merged_compacted.json.gz with PP annotations, beside the inputs)")
    cmd.add_argument("--ranks", metavar="LIST", help="only these global ranks, e.g. 0-7,12")
    cmd.add_argument("--no-compact", action="store_true", help="keep the GPU streams as they are")
    _original_stream(cmd)
    cmd.add_argument("--no-pp-flows", action="store_true", help="do not add pipeline-parallel arrows")
    cmd.add_argument("--rules", metavar="FILE", help="compaction rules file (see compact --print-rules)")
    _output_options(cmd, "the output")
    _cluster(cmd)
    _secrets_options(cmd)
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
                     help="merged trace file, '-' for stdin (then give -o), or a URL; several: one task each (batch)")
    cmd.add_argument("-o", "--output", help="output path or '-' (default: <name>_relinked.json.gz beside the input); "
                                            "with several inputs a directory DIR/")
    _rank_map(cmd)
    _output_options(cmd, "the output")
    _cluster(cmd)
    _secrets_options(cmd)
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
    _secrets_options(cmd)
    _common(cmd)
    cmd.set_defaults(run=_run_split)

    cmd = commands.add_parser(
        "slice", help="cut a huge trace into pieces a viewer can open (steps, time window, ranks, size)",
        description=_paragraphs(
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
    _secrets_options(cmd)
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
    cmd.add_argument("trace", nargs="+", metavar="TRACE",
                     help="trace file, '-' for stdin, or a URL; several: one task each, their rows in one CSV")
    cmd.add_argument("-o", "--output", default="-",
                     help="CSV path ('.gz'/'.zst' compress it) or '-' for stdout (default; the summary then goes "
                          "to stderr)")
    cmd.add_argument("--group-by", choices=("op",), help="print GPU time per (rank, cpu op) instead of rows")
    _rank_map(cmd)
    cmd.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    _cluster(cmd)
    _common(cmd)
    cmd.set_defaults(run=_run_attribute)

    cmd = commands.add_parser(
        "analyze", help="where did the time go, which rank is slow: HTA's tables, streamed",
        description=_paragraphs(
            "The tables of Holistic Trace Analysis (HTA 0.5.0), with its column names and rules, for every rank of "
            "the inputs: temporal_breakdown, kernel_type_breakdown, kernel_breakdown, comm_comp_overlap, "
            "idle_time_breakdown, kernel_launch_stats (every rank), profiler_steps, step_times (per rank and "
            "step), stragglers (HTA's candidates and each rank's lag per step), and utilization (each rank's GPU "
            "busy fraction per time bin, not HTA's). As HTA, the last profiler step is left out unless "
            "--include-last-step.",
            "Inputs are what 'merge' takes (rank files, globs, directories, archives, URLs) or one merged "
            "multi-rank file (ranks found as relink finds them). One task per input (-j, --dask). "
            "docs/analyze.md states each rule, and where it departs from HTA."),
        epilog="examples:\n  streamtrace analyze dlrm/\n  streamtrace analyze 'ranks/*.json.gz' -o tables/\n"
               "  streamtrace analyze merged.json.gz --json | jq .tables.temporal_breakdown\n"
               "  streamtrace analyze dlrm/ --html report.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("inputs", nargs="+", metavar="INPUT", help="rank traces, globs, directories, archives, URLs, "
                     "or a merged trace")
    cmd.add_argument("-o", "--output", metavar="DIR", help="write one CSV per table into DIR")
    cmd.add_argument("--html", metavar="FILE", help="also write a self-contained report page (figures per rank, step "
                     "and time; needs streamtrace[report])")
    cmd.add_argument("--include-last-step", action="store_true", help="keep the last profiler step (HTA leaves it out)")
    cmd.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-3,7")
    cmd.add_argument("--candidates", type=int, default=2, metavar="N", help="straggler candidates (HTA's "
                     "num_candidates, default 2)")
    cmd.add_argument("--overwrite", action="store_true", help="replace existing files it writes (CSVs, page, summary)")
    _cluster(cmd)
    _common(cmd)
    cmd.set_defaults(run=_run_analyze)

    _synth_parser(commands)

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


SYNTH_OPTIONS = (  # (group, SynthConfig field, help): each an option named after its field
    ("run shape", "ranks", "world size"),
    ("run shape", "pp_stages", "pipeline stages; ranks must be a multiple"),
    ("run shape", "microbatches", "microbatches per step"),
    ("run shape", "schedule", "PP schedule: 1f1b (F/B), zb (F/I/W), gpipe ('Forward <mb>' names)"),
    ("run shape", "steps", "profiler steps (ignored with --target-mb)"),
    ("content", "graph_streams", "streams a CUDA-graph replay spreads its kernels over"),
    ("content", "graph_kernels", "kernels per graph replay, 0 for none"),
    ("content", "eager_kernels", "eager kernels per PP compute action"),
    ("content", "python_noise", "python_function frames around every cpu_op"),
    ("content", "kernel_annotations", "graph kernels' args.name labels"),
    ("content", "hip", "AMD naming (hipGraphLaunch, hipLaunchKernel, ...)"),
    ("content", "seed", "random seed"),
    ("content", "base_time_ns", "baseTimeNanoseconds of rank 0"),
    ("content", "base_skew_ns", "added to the base time per rank, to test alignment"),
    ("content", "slow_rank", "a straggler: this rank runs --slow-factor times slower (-1: none)"),
    ("content", "slow_factor", "how much slower --slow-rank runs"),
)


def _synth_parser(commands: argparse._SubParsersAction) -> None:
    """``synth``: the generator (streamtrace.synth) with every knob as an option."""
    from .synth import COMPRESSIONS as SYNTH_COMPRESSIONS
    from .synth import KERNEL_ANNOTATIONS, MERGED_STYLES, SCHEDULES, SynthConfig

    defaults = SynthConfig()
    cmd = commands.add_parser(
        "synth", help="write realistic synthetic per-rank traces (and a merged one) with their ground truth",
        description=_paragraphs(
            "Write OUTDIR/rank<N>_trace.json[.gz|.zst] for a pipeline-parallel training run of RANKS ranks "
            "(CUDA-graph replays over many streams, eager kernels, NCCL with PP SEND/RECV, PP annotations, "
            "python_function frames), a naive merged_trace.json (colliding correlation ids, as tools that "
            "concatenate ranks write it) and truth.json: what every command should find. Deterministic for a "
            "--seed: for bug reports and benchmarks without real data.",
            "Ranks are split into --pp-stages stages (ranks must be a multiple); every rank file grows with "
            "--steps, or until --target-mb."),
        epilog="examples:\n  streamtrace synth demo/                         # 2 ranks, 2 steps\n"
               "  streamtrace synth big/ --ranks 8 --pp-stages 4 --schedule zb --target-mb 250 --seed 1\n"
               "  streamtrace synth amd/ --hip --compress zst --no-merged",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("outdir", help="output directory (created if missing)")
    choices = {"schedule": SCHEDULES, "kernel_annotations": KERNEL_ANNOTATIONS}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for group, name, text in SYNTH_OPTIONS:
        where = groups.setdefault(group, cmd.add_argument_group(group))
        flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
        if type(default) is bool:
            where.add_argument(flag, action="store_true", help=text)
        else:
            where.add_argument(flag, type=type(default), choices=choices.get(name), default=default,
                               help=f"{text} (default %(default)s)")
        if name == "steps":
            where.add_argument("--target-mb", type=float, help="add steps until every rank file is at least this "
                                                                 "many MB (1e6 bytes) uncompressed")
    groups["content"].add_argument("--no-big-ints", action="store_true", help="omit NCCL 'Comms Id' values >= 2**63")
    files = cmd.add_argument_group("files")
    files.add_argument("--compress", choices=tuple(SYNTH_COMPRESSIONS), default="gz",
                       help="rank file compression (default %(default)s)")
    files.add_argument("--no-merged", action="store_true", help="do not write merged_trace.json[.gz|.zst]")
    files.add_argument("--merged-style", choices=MERGED_STYLES, default="rank-arg",
                       help="how the merged file states ranks: args.rank on events, or process names "
                            "(default %(default)s)")
    files.add_argument("--json", action="store_true", help="print the ground truth summary as JSON")
    cmd.set_defaults(run=_run_synth, debug=False, summary=None)


def _run_synth(args: argparse.Namespace) -> None:
    from .synth import SynthConfig, summary, write_traces

    config = SynthConfig(**{name: getattr(args, name) for _, name, _ in SYNTH_OPTIONS},
                         target_bytes=None if args.target_mb is None else int(args.target_mb * 1e6),
                         big_ints=not args.no_big_ints)
    try:
        config.validate()
    except ValueError as exc:
        raise TraceError(f"synth: {exc}") from None
    truth = write_traces(config, args.outdir, compress=args.compress, merged=not args.no_merged,
                         merged_style=args.merged_style)
    report("synth", summary(truth), args)


Rows = list[tuple[str, str]]
VIEWS: dict[str, Callable[[dict], Rows]] = {}
NAME_WIDTH = 70
RANK_ROWS = 8  # ranks shown by inspect's report


def view(command: str) -> Callable[[Callable[[dict], Rows]], Callable[[dict], Rows]]:
    """Register the human report of a command: a function from its summary
    to (label, text) rows, a few of them (a label "" continues the row
    above).  Warnings (``summary["warnings"]``, each once with a count) and
    ``summary["hints"]`` are added by :func:`report`.  A new command plugs
    in with ``@view("name")`` and ``report("name", summary, args)``."""
    def register(render: Callable[[dict], Rows]) -> Callable[[dict], Rows]:
        VIEWS[command] = render
        return render
    return register


def report(command: str, summary: dict, args: argparse.Namespace, *, to_stderr: bool = False) -> None:
    """The summary as asked (the library wrote ``--summary FILE``): on the
    terminal the JSON with ``--json``, else the short human report
    (``to_stderr`` when the command's output went to stdout)."""
    stream = sys.stderr if to_stderr else sys.stdout
    stream.write(summary_json(summary).decode() if args.json else human_report(command, summary))
    stream.flush()
    if summary.get("secrets_found"):  # on stderr whatever the output: it must not go unseen
        print(f"streamtrace: warning: {summary['warnings'][-1]}", file=sys.stderr)


def human_report(command: str, summary: dict) -> str:
    """Aligned lines: the command's rows, then each warning once (with how often), then hints."""
    rows = list(VIEWS[command](summary)) + _redaction_rows(summary)
    notices = [summary["notice"]] if summary.get("notice") else []
    for text, count in Counter(notices + list(summary.get("warnings") or ())).items():
        rows.append(("warning", text + (f" ({count} times)" if count > 1 else "")))
    rows.extend(("hint", text) for text in summary.get("hints") or ())
    width = max(len(label) for label, _ in rows)
    return "".join(f"{label:<{width}}  {text}\n" for label, text in rows)


def _redaction_rows(summary: dict) -> Rows:
    """What a writing command replaced on the way out (``--redact``, ``redact``)."""
    redaction = summary.get("redaction")
    if redaction is None:
        return []
    found = redaction["secrets_redacted"]
    kinds = ", ".join(f"{kind} {entry['count']:,}" for kind, entry in found.items())
    rows = [("redacted", f"{sum(entry['count'] for entry in found.values()):,} secrets" + (f" ({kinds})" if kinds else ""))]
    if redaction.get("pseudonymized"):
        rows.append(("pseudonyms", ", ".join(f"{kind} {count:,}" for kind, count in redaction["pseudonymized"].items())))
    return rows


def _took(summary: dict) -> tuple[str, str]:
    return "took", f"{summary['wall_seconds']} s, peak RSS {summary['peak_rss_mb']} MB"


def _events(summary: dict) -> tuple[str, str]:
    return "events", f"{summary['events_read']:,} read, {summary['events_written']:,} written"


def _short(name: object) -> str:
    text = str(name)
    return text if len(text) <= NAME_WIDTH else text[:NAME_WIDTH - 3] + "..."


def _ms(us: float | None) -> str:
    return "?" if us is None else f"{us / 1000:,.3f} ms"


def _listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _lanes(compaction: dict) -> str:
    groups = ", ".join(f"{name} {count}" for name, count in compaction["lanes_by_group"].items())
    return (f"{compaction['measured_slices']:,} GPU slices from {compaction['original_streams']} streams into "
            f"{compaction['compacted_lanes']} lanes ({groups})")


@view("inspect")
def _inspect_view(summary: dict) -> Rows:
    span = summary["time_span_us"]
    devices = summary["devices"]
    graphs = summary["graph_launches"]
    rows = [
        ("input", f"{summary['input']} ({summary['compression']}, {summary['bytes_raw']:,} bytes, "
                  f"{summary['events']:,} events)"),
        ("time span", (_ms(span["duration"]) + (f", {span['start_utc']} to {span['end_utc']}" if "start_utc" in span else ""))
         if span["duration"] is not None else "no timed events"),
        ("devices", ", ".join(f"{count} x {name}" for name, count in devices["names"].items()) or "none listed"),
        ("ranks", ", ".join(map(str, summary["ranks"])) or "unknown"),
        ("processes", _listed([f"{_pid(p['pid'])} {p['role']} {p['events']:,} events"
                               + (f" ({_count(p['gpu_streams'], 'stream')})" if p.get("gpu_streams") else "")
                               for p in summary["pids"]])),
    ]
    shown = [entry for entry in summary["by_rank"] if "gpu_busy" in entry or "steps" in entry]
    for number, entry in enumerate(shown[:RANK_ROWS]):
        rows.append(("per rank" if number == 0 else "", _rank_shape(entry)))
    if len(shown) > RANK_ROWS:
        rows.append(("", f"and {len(shown) - RANK_ROWS} more ranks (--json lists all)"))
    rows.append(("launches", f"{summary['runtime_launches']:,} runtime calls, {graphs['count']:,} graph launches"
                 + (f" ({graphs['gpu_events_per_launch_mean']} GPU events each)" if graphs["count"] else "")))
    for number, kernel in enumerate(summary["top_kernels"]):
        rows.append(("top kernels" if number == 0 else "",
                     f"{_ms(kernel['total_us'])} {kernel['count']:,}x {_short(kernel['name'])}"))
    if summary["pp_annotations"]:
        rows.append(("PP annotations", _listed([f"{k} {v}" for k, v in summary["pp_annotations"].items()])))
    repairs = [f"{summary[key]} {label}" for key, label in (
        ("invalid_utf8_repaired", "invalid UTF-8 sequences replaced"),
        ("control_chars_repaired", "raw control characters escaped")) if summary[key]]
    if summary["truncated_salvaged"]:
        repairs.append("input was truncated: complete events kept (--salvage)")
    if repairs:
        rows.append(("repairs", "; ".join(repairs)))
    rows.append(_took(summary))
    return rows


def _rank_shape(entry: dict) -> str:
    """``rank 3: GPU busy 1.2 ms of 4.0 ms (30.0%), 12 steps 5-16 (first 9.1 ms, last 4.0 ms, median 4.1 ms)``."""
    parts = []
    busy = entry.get("gpu_busy")
    if busy:
        parts.append(f"GPU busy {_ms(busy['busy_us'])} of {_ms(busy['span_us'])}"
                     + (f" ({busy['busy_percent']}%)" if busy["busy_percent"] is not None else ""))
    steps = entry.get("steps")
    if steps:
        parts.append(f"{_count(steps['count'], 'step')} {steps['first']}-{steps['last']} (first {_ms(steps['first_us'])}, "
                     f"last {_ms(steps['last_us'])}, median {_ms(steps['median_us'])})")
    who = "rank unknown" if entry["rank"] is None else f"rank {entry['rank']}"
    return f"{who}: " + ", ".join(parts)


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def _pid(pid: object) -> str:
    return f"pid {pid!r}" if isinstance(pid, str) else f"pid {pid}"


@view("convert")
def _convert_view(summary: dict) -> Rows:
    dropped = ", ".join(f"{cat} {count:,}" for cat, count in summary["dropped_by_category"].items() if count)
    return [
        ("converted", f"{summary['input']} -> {summary['output']} ({summary['output_compression']})"),
        ("events", f"{summary['events']:,} read, {summary['events_written']:,} written, "
                   f"{summary['events_dropped']:,} dropped" + (f" ({dropped})" if dropped else "")),
        _took(summary),
    ]


@view("redact")
def _redact_view(summary: dict) -> Rows:
    """convert's rows; the redaction rows come with every writing command's."""
    return _convert_view(summary)


@view("compact")
def _compact_view(summary: dict) -> Rows:
    rows = [("compacted", _lanes(summary) if summary["measured_slices"] else "nothing"),
            ("output", summary["output"]), _events(summary)]
    if summary.get("gpu_annotations_mapped"):
        rows.append(("annotations", f"{summary['gpu_annotations_mapped']:,} GPU annotations moved to lane tracks, "
                                    f"{summary['gpu_annotations_coalesced']:,} merged"))
    if summary.get("pp_compute_dependency_pairs") or summary.get("pp_unshard_compute_pairs"):
        rows.append(("PP arrows", f"{summary['pp_compute_dependency_pairs']} compute dependencies, "
                                  f"{summary['pp_unshard_compute_pairs']} unshard->compute"))
    if summary.get("gpu_flow_endpoints_unmatched"):
        rows.append(("warning", f"{summary['gpu_flow_endpoints_unmatched']:,} ac2g endpoints matched no slice start "
                                "(trimmed or windowed capture); moved to the nearest slice's lane"))
    rows.append(_took(summary))
    return rows


@view("merge")
def _merge_view(summary: dict) -> Rows:
    ranks = summary["pp_ranks"]
    rules = sorted({entry["rank_from"] for entry in ranks})
    offsets = [abs(offset) for offset in summary["time_offsets_us"].values()]
    rows = [
        ("merged", f"{summary['ranks']} ranks ({_listed([str(entry['global_rank']) for entry in ranks], 8)}; "
                   f"rank from {' / '.join(rules)})"),
        ("output", summary["output"]),
        ("time", f"aligned on {summary['time_alignment']}, offsets up to {max(offsets):,} us"),
        ("order", summary["pp_order"]),
        _events(summary),
    ]
    compactions = [c for c in summary["per_rank_compaction"].values() if c]
    if compactions:
        rows.append(("compaction", f"{sum(c['measured_slices'] for c in compactions):,} GPU slices from "
                                   f"{sum(c['original_streams'] for c in compactions)} streams into "
                                   f"{sum(c['compacted_lanes'] for c in compactions)} lanes"))
    if "pp_send_recv_pairs" in summary and (summary["pp_send_recv_pairs"] or summary["pp_compute_dependency_pairs"]):
        rows.append(("PP arrows", f"{summary['pp_send_recv_pairs']} SEND->RECV, "
                                  f"{summary['pp_compute_dependency_pairs']} compute dependencies, "
                                  f"{summary['pp_unshard_compute_pairs']} unshard->compute"))
    unmatched = [f"{key} {value}" for key, value in summary.items() if key.endswith("_unmatched") and value]
    if unmatched:
        rows.append(("unmatched", ", ".join(unmatched) + " (usually the capture window cut a pipeline step)"))
    if summary.get("pp_send_recv_peer_stage_absent"):
        missing = summary["pp_ranks_not_merged"]
        rows.append(("no peer", f"{summary['pp_send_recv_peer_stage_absent']:,} SEND/RECV blocks have their peer stage "
                                + (f"on ranks not merged (global ranks {_listed([str(rank) for rank in missing], 8)})"
                                   if missing else "nowhere in the merged files")))
    rows.append(_took(summary))
    return rows


def _linking_rows(summary: dict) -> Rows:
    """What relink and attribute found: ranks, links, shared ids."""
    ambiguous = [f"pid {entry['pid']} (ranks {entry['ranks']})" for entry in summary["ambiguous_pids"]]
    rows = [("ranks", _listed([str(rank) for rank in summary["ranks"]], 8) or "unknown"),
            ("links", f"{summary['links']:,} GPU events linked to their launch, {summary['orphans']:,} orphans "
                      f"(launched before the capture window), "
                      f"{summary['correlation_collisions']['ids_shared_across_ranks']:,} ids shared across ranks")]
    if ambiguous:
        rows.append(("ambiguous", _listed(ambiguous)))
    return rows


@view("relink")
def _relink_view(summary: dict) -> Rows:
    ids = ("ids already rank-unique (kept as they are)" if summary["ids_already_rank_unique"] else
           f"{summary['ids_rewritten']:,} correlation ids made rank-unique")
    return [("relinked", f"{ids}, {summary['ac2g_flows_written']:,} ac2g flow events written from the "
                         f"(rank, correlation) links in place of the input's {summary['ac2g_flows_replaced']:,}"),
            ("output", summary["output"]), *_linking_rows(summary), _events(summary), _took(summary)]


@view("split")
def _split_view(summary: dict) -> Rows:
    files = [f"{name} {count:,} events" for name, count in summary["files"].items()]
    return [("split", f"{len(files)} ranks into {summary['output_dir']}"), ("files", _listed(files)),
            ("events", f"{summary['events_read']:,} read, {summary['events_copied_to_every_file']:,} copied to every "
                       "file"), _took(summary)]


@view("slice")
def _slice_view(summary: dict) -> Rows:
    where = summary.get("output") or f"{len(summary['files'])} step files in {summary['output_dir']}"
    dropped = sum(summary["events_dropped"].values())
    rows = [("sliced", f"{where} ({summary['output_bytes'] or 0:,} bytes)")]
    if summary["steps_selected"] is not None:
        rows.append(("steps", _listed([str(step) for step in summary["steps_selected"]], 12)))
    elif summary.get("whole_trace_fits"):
        rows.append(("steps", "all: the whole trace fits in --max-mb, kept whole"))
    unpaired = summary.get("flow_events_unpaired_in_input")
    rows += [("events", f"{summary['events_read']:,} read, {summary['events_written']:,} written, {dropped:,} dropped"),
             ("flows", f"{summary['flow_events_kept']:,} flow events kept"
                       + (f" ({unpaired:,} of them without their other end in the input already)" if unpaired else "")
                       + f", {summary['flow_events_dropped_without_partner']:,} dropped: the selection cut their "
                         "other end"),
             _took(summary)]
    return rows


@view("attribute")
def _attribute_view(summary: dict) -> Rows:
    what = "(rank, cpu op) rows" if summary["group_by"] == "op" else "GPU events"
    return [("attributed", f"{summary['rows']:,} {what}"), ("output", str(summary["output"])),
            *_linking_rows(summary), _took(summary)]


@view("analyze")
def _analyze_view(summary: dict) -> Rows:
    rows = report_rows(summary)
    if summary["output"]:
        rows.append(("output", _listed(summary["output"], 3)))
    return [*rows, _took(summary)]


@view("batch")
def _batch_view(summary: dict) -> Rows:
    outputs = summary["output"] if isinstance(summary["output"], list) else [summary["output"]]
    rows = [(summary["command"], f"{_count(summary['inputs'], 'input')}, one task each"), ("output", _listed(outputs, 3))]
    if "events_read" in summary:
        rows.append(_events(summary))
    return [*rows, _took(summary)]


@view("synth")
def _synth_view(truth: dict) -> Rows:
    ranks = truth["ranks"]
    rows = [("wrote", f"{len(ranks)} rank files ({truth['pp_stages']} PP stages, {truth['schedule']}, "
                      f"{_count(truth['steps'], 'step')}): {_listed([rank['file'] for rank in ranks], 3)}"),
            ("events", f"{truth['total_events']:,} in all, {sum(rank['bytes'] for rank in ranks):,} bytes")]
    if truth.get("merged"):
        rows.append(("merged", f"{truth['merged']['file']} ({truth['merged']['events']:,} events, colliding "
                               "correlation ids: try streamtrace relink)"))
    rows.append(("truth", "truth.json: what each command should find"))
    return rows


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.quiet else None


def _reading(args: argparse.Namespace) -> dict:
    """The common options' library keywords, which every command takes."""
    return dict(salvage=args.salvage, spool_dir=args.spool_dir, reread_remote=args.reread_remote,
                progress=_progress(args), jobs=args.jobs, summary_file=args.summary)


def _run_inspect(args: argparse.Namespace) -> None:
    """Each trace in turn; with several, --json prints one list and --summary is refused (one file, one summary)."""
    if len(args.trace) > 1 and args.summary:
        raise TraceError("--summary takes one trace; with several, --json prints them all")
    summaries = []
    for number, trace in enumerate(args.trace):
        summary = inspect(trace, secrets=_redaction(args), overwrite=args.overwrite,
                          top=TOP_KERNELS if args.top is None else args.top, **_reading(args))
        if len(args.trace) == 1 or not args.json:
            if number:
                print()
            shown = summary if args.json or args.top is not None else {**summary, "top_kernels": summary["top_kernels"][:3]}
            report("inspect", shown, args)
        summaries.append(summary)
    if len(args.trace) > 1 and args.json:
        sys.stdout.write(summary_json(summaries).decode())
        for summary in summaries:
            if summary.get("secrets_found"):
                print(f"streamtrace: warning: {summary['warnings'][-1]}", file=sys.stderr)


def _run_convert(args: argparse.Namespace) -> None:
    source = args.input if len(args.input) > 1 else args.input[0]  # several: into one .parquet
    summary = convert(
        source, args.output, drop_categories=args.drop_cat, compress=args.compress, level=args.level,
        overwrite=args.overwrite, redact=_redaction(args), **_reading(args),
    )
    report("convert", summary, args, to_stderr=args.output == "-")


def _run_redact(args: argparse.Namespace) -> None:
    if args.print_secrets_rules:
        sys.stdout.write(DEFAULT_SECRETS_RULES_TOML)
        return
    if args.trace is None:
        raise TraceError("give a TRACE to redact (or --print-secrets-rules)")
    options = _redaction(args)
    summary = redact(
        args.trace, args.output, rules=options.rules, patterns=options.patterns, pseudonymize=options.pseudonymize,
        compress=args.compress, level=args.level, overwrite=args.overwrite, **_reading(args),
    )
    report("redact", summary, args, to_stderr=args.output == "-")


def _run_compact(args: argparse.Namespace) -> None:
    if args.print_rules:
        sys.stdout.write(DEFAULT_RULES_TOML)
        return
    if not args.trace:
        raise TraceError("give a TRACE to compact (or --print-rules)")
    if _batch(args, args.output):
        return _run_batch(args, rules=args.rules, pp_flows=not args.no_pp_flows, strict=args.strict,
                          original_stream=not args.no_original_stream, compress=args.compress, level=args.level)
    summary = compact(
        args.trace[0], args.output, rules=args.rules, pp_flows=not args.no_pp_flows, strict=args.strict,
        original_stream=not args.no_original_stream, overwrite=args.overwrite, compress=args.compress,
        level=args.level, redact=_redaction(args), **_reading(args),
    )
    report("compact", summary, args, to_stderr=args.output == "-")


def _run_merge(args: argparse.Namespace) -> None:
    summary = merge(
        args.inputs, args.output, compact=not args.no_compact, original_stream=not args.no_original_stream,
        pp_flows=not args.no_pp_flows, ranks=args.ranks, overwrite=args.overwrite, rules=args.rules,
        compress=args.compress, level=args.level, redact=_redaction(args), **_reading(args), dask=args.dask,
    )
    report("merge", summary, args, to_stderr=args.output == "-")


def _run_relink(args: argparse.Namespace) -> None:
    if _batch(args, args.output):
        return _run_batch(args, rank_map=args.rank_map, compress=args.compress, level=args.level)
    summary = relink(
        args.trace[0], args.output, rank_map=args.rank_map, overwrite=args.overwrite, compress=args.compress,
        level=args.level, redact=_redaction(args), **_reading(args),
    )
    report("relink", summary, args, to_stderr=args.output == "-")


def _run_split(args: argparse.Namespace) -> None:
    summary = split(
        args.trace, args.output_dir, rank_map=args.rank_map, compress=args.compress, level=args.level,
        max_open=args.max_open_files, overwrite=args.overwrite, redact=_redaction(args), **_reading(args),
    )
    report("split", summary, args)


def _run_slice(args: argparse.Namespace) -> None:
    summary = slice_trace(
        args.trace, args.output, steps=args.steps, window=args.window, ranks=args.ranks, pids=args.pids,
        drop_categories=args.drop_cat, drop_name=args.drop_name, max_mb=args.max_mb, each_step=args.each_step,
        rank_map=args.rank_map, overwrite=args.overwrite, compress=args.compress, level=args.level,
        redact=_redaction(args), **_reading(args),
    )
    report("slice", summary, args, to_stderr=args.output == "-")


def _run_attribute(args: argparse.Namespace) -> None:
    if _batch(args, None):
        return _run_batch(args, group_by=args.group_by, rank_map=args.rank_map)
    summary = attribute(
        args.trace[0], args.output, group_by=args.group_by, rank_map=args.rank_map, overwrite=args.overwrite, **_reading(args),
    )
    report("attribute", summary, args, to_stderr=args.output == "-")


def _run_analyze(args: argparse.Namespace) -> None:
    summary = analyze(args.inputs, args.output, include_last_step=args.include_last_step, num_candidates=args.candidates,
                      ranks=None if args.ranks is None else parse_rank_list(args.ranks), overwrite=args.overwrite,
                      dask=args.dask, html=args.html, command=shlex.join(["streamtrace", *sys.argv[1:]]),
                      **_reading(args))
    report("analyze", summary, args)


def _batch(args: argparse.Namespace, output_dir: str | None) -> bool:
    """Several inputs, or an output that names a directory (DIR/ or an existing one): a batch run."""
    return len(args.trace) > 1 or output_dir is not None and (output_dir.endswith(os.sep) or os.path.isdir(output_dir))


def _run_batch(args: argparse.Namespace, **options: object) -> None:
    summary = batch(args.command, args.trace, args.output, dask=args.dask, overwrite=args.overwrite,
                    **_reading(args), **options)
    report("batch", summary, args, to_stderr=args.command == "attribute" and args.output == "-")


def _run_demo(args: argparse.Namespace) -> None:
    from .synth import SynthConfig, write_traces

    directory = args.dir or tempfile.mkdtemp(prefix="streamtrace-demo-")
    os.makedirs(directory, exist_ok=True)
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1), directory, compress="gz")
    trace = os.path.join(directory, "rank0_trace.json.gz")
    print(f"demo traces written to {directory}")
    summary = inspect(trace, spool_dir=args.spool_dir, progress=_progress(args))
    sys.stdout.write(human_report("inspect", summary))
    compacted = compact(trace, overwrite=True, spool_dir=args.spool_dir, progress=_progress(args))
    print(f"\ncompacted {compacted['measured_slices']:,} GPU slices from {compacted['original_streams']} streams "
          f"into {compacted['compacted_lanes']} lanes: {compacted['output']}")
    merged = merge([os.path.join(directory, f"rank{rank}_trace.json.gz") for rank in (0, 1)],
                   overwrite=True, spool_dir=args.spool_dir, progress=_progress(args))
    print(f"merged 2 ranks with {merged['pp_send_recv_pairs']} SEND->RECV arrows: {merged['output']}")
    print("open them in https://ui.perfetto.dev; next: streamtrace inspect --json, streamtrace compact --help, "
          "streamtrace merge --help")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same cleanup runs."""



def install_signal_handlers() -> None:
    """SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt``,
    so that temporary files are cleaned up, in this process only.

    A worker forked from this process inherits the handlers until it sets
    its own; a signal in that moment (the run stopping as the worker starts)
    ends the worker at once and quietly, instead of raising in it: the
    parent does the cleaning up and says what happened."""
    owner = os.getpid()
    report_unraisable = sys.unraisablehook

    def handle(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        STOPS_REQUESTED.append(signum)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def unraisable(hook_args: object) -> None:  # the stop is reported once, by main()
        if not isinstance(getattr(hook_args, "exc_value", None), KeyboardInterrupt):
            report_unraisable(hook_args)  # type: ignore[arg-type]

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    sys.unraisablehook = unraisable


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_signal_handlers()
    run: Callable[[argparse.Namespace], None] = args.run
    try:
        run(args)
    except KeyboardInterrupt as exc:
        return _interrupted(STOPS_REQUESTED[0] if STOPS_REQUESTED else
                            signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except TraceError as exc:
        if STOPS_REQUESTED:  # the run failed because it was being stopped (a worker the signal ended)
            return _interrupted(STOPS_REQUESTED[0])
        if args.debug:
            raise
        print(f"streamtrace: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except OSError as exc:
        if STOPS_REQUESTED:
            return _interrupted(STOPS_REQUESTED[0])
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"streamtrace: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _interrupted(signum: int) -> int:
    print("streamtrace: interrupted; no output written", file=sys.stderr)
    return 128 + signum


def _silence_stdout() -> None:
    """The reader closed the pipe: keep Python from failing again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
