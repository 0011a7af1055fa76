"""``streamtrace inspect``: options, runner and human report."""
from __future__ import annotations

import argparse
import sys

from ..errors import TraceError
from .options import common_options, paragraphs, reading, redaction, secrets_options
from .report import Rows, counted, listed, ms, pid_text, plain, report, short, view, warn_of_secrets, write_json

RANK_ROWS = 8  # ranks shown in the report


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``inspect``'s options."""
    cmd = commands.add_parser(
        "inspect", help="summarise what is in a trace (one pass)",
        description=paragraphs("One streaming pass over each TRACE: top-level keys, event counts by (ph, cat), "
                        "the devices, pids with events (role, rank: as relink, split and attribute decide it), "
                        "per rank its GPU busy time (the union of its GPU slices, exact in any order) and its "
                        "profiler steps (count, first, last and median duration), GPU streams, the top kernels "
                        "by total time, runtime and graph launches, correlation-id "
                        "collisions across pids/ranks, PP annotation counts, the time span (and when it ran, "
                        "in UTC, where the trace says), size, time, peak RSS. Prints a short report per trace; "
                        "--json prints everything (a list for several traces)."),
        epilog="example: streamtrace inspect rank0_trace.json.gz --json | jq .by_rank",
    )
    cmd.add_argument("trace", nargs="*", metavar="TRACE", help="trace files, directories of them, globs, '-' for "
                     "stdin, or URLs (none: stdin, when it is not a terminal)")
    cmd.add_argument("--top", type=int, metavar="N",
                     help="list the N kernels with the most GPU time (default: 10 in --json, 3 in the report; "
                          "full names in --json)")
    cmd.add_argument("--overwrite", action="store_true", help="replace the --summary FILE if it exists")
    secrets_options(cmd, "inspect")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Each trace in turn; with several, --json prints one list and --summary is refused (one file, one summary)."""
    from ..commands.inspect import TOP_KERNELS, inspect
    from ..io.inputs import expand_inputs

    if not args.trace and sys.stdin.isatty():
        raise TraceError("give a TRACE to inspect (a file, directory, glob or URL), or pipe one in: "
                         "streamtrace inspect < trace.json.gz")
    traces = expand_inputs(args.trace or ["-"])
    if len(traces) > 1 and args.summary:
        raise TraceError("--summary takes one trace; with several, --json prints them all")
    summaries = []
    for number, trace in enumerate(traces):
        summary = inspect(trace, secrets=redaction(args), overwrite=args.overwrite,
                          top=TOP_KERNELS if args.top is None else args.top, **reading(args))
        if len(traces) == 1 or not args.json:
            if number:
                print()
            shown = summary if args.json or args.top is not None else {**summary, "top_kernels": summary["top_kernels"][:3]}
            report("inspect", shown, args)
        summaries.append(summary)
    if len(traces) > 1 and args.json:
        write_json(summaries, sys.stdout)
        for summary in summaries:
            warn_of_secrets(summary)


@view("inspect")
def rows(summary: dict) -> Rows:
    span = summary["time_span_us"]
    devices = summary["devices"]
    graphs = summary["graph_launches"]
    rows = [
        ("input", f"{summary['input']} ({compression(summary['compression'])}, {summary['bytes_raw']:,} bytes, "
                  f"{counted(summary['events'], 'event')})"),
        ("time span", (ms(span["duration"]) + (f", {span['start_utc']} to {span['end_utc']}" if "start_utc" in span else ""))
         if span["duration"] is not None else "no timed events"),
        ("devices", ", ".join(f"{count} x {name or '(no name)'}" for name, count in devices["names"].items()) or "none listed"),
        ("ranks", ", ".join(map(str, summary["ranks"])) or "unknown"),
        ("processes", listed([f"{pid_text(p['pid'])} {p['role']} {counted(p['events'], 'event')}"
                               + (f" ({counted(p['gpu_streams'], 'stream')})" if p.get("gpu_streams") else "")
                               for p in summary["pids"]])),
    ]
    shown = [entry for entry in summary["by_rank"] if "gpu_busy" in entry or "steps" in entry]
    for number, entry in enumerate(shown[:RANK_ROWS]):
        rows.append(("per rank" if number == 0 else "", _rank_shape(entry)))
    if len(shown) > RANK_ROWS:
        rows.append(("", f"and {len(shown) - RANK_ROWS} more ranks (--json lists all)"))
    rows.append(("launches", f"{counted(summary['runtime_launches'], 'runtime call')}, {counted(graphs['count'], 'graph launch')}"
                 + (f" ({plain(graphs['gpu_events_per_launch_mean'])} GPU events each)" if graphs["count"] else "")))
    for number, kernel in enumerate(summary["top_kernels"]):
        rows.append(("top kernels" if number == 0 else "",
                     f"{ms(kernel['total_us'])} {kernel['count']:,}x {short(kernel['name'])}"))
    if summary["pp_annotations"]:
        rows.append(("PP annotations", listed([f"{k} {v}" for k, v in summary["pp_annotations"].items()])))
    repairs = [f"{summary[key]} {label}" for key, label in (
        ("invalid_utf8_repaired", "invalid UTF-8 sequences replaced"),
        ("control_chars_repaired", "raw control characters escaped")) if summary[key]]
    if summary["truncated_salvaged"]:
        repairs.append("input was truncated: complete events kept (--salvage)")
    if repairs:
        rows.append(("repairs", "; ".join(repairs)))
    return rows


def _rank_shape(entry: dict) -> str:
    """``rank 3: GPU busy 1.2 ms of 4.0 ms (30.0%), 12 steps 5-16 (first 9.1 ms, last 4.0 ms, median 4.1 ms)``."""
    parts = []
    busy = entry.get("gpu_busy")
    if busy:
        parts.append(busy_text(busy))
    steps = entry.get("steps")
    if steps:
        parts.append(f"{counted(steps['count'], 'step')} {steps['first']}-{steps['last']} (first {ms(steps['first_us'])}, "
                     f"last {ms(steps['last_us'])}, median {ms(steps['median_us'])})")
    who = "rank unknown" if entry["rank"] is None else f"rank {entry['rank']}"
    return f"{who}: " + ", ".join(parts)


def compression(name: str) -> str:
    """``gzip``, ``zstd``; ``uncompressed`` rather than ``none``."""
    return "uncompressed" if name == "none" else name


def busy_text(busy: dict) -> str:
    """``GPU busy 1.200 ms of 4.000 ms (30.0%)``, ``GPU busy (one of 2 GPUs at least) ...`` for a union over
    several GPUs; GPUs whose slices all last 0 us have no busy fraction to give."""
    if not busy["span_us"]:
        return "no GPU time (its slices last 0 us)"
    several = f" (one of {busy['gpu_pids']} GPUs at least)" if busy.get("gpu_pids") else ""
    return f"GPU busy{several} {ms(busy['busy_us'])} of {ms(busy['span_us'])}" + (
        f" ({busy['busy_percent']}%)" if busy["busy_percent"] is not None else "")
