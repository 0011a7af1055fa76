"""``streamtrace inspect``: options, runner and human report."""
from __future__ import annotations

import argparse

from ..commands.inspect import inspect
from .options import common_options, paragraphs, reading, redaction, secrets_options
from .report import Rows, counted, listed, ms, pid_text, report, short, took, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``inspect``'s options."""
    cmd = commands.add_parser(
        "inspect", help="summarise what is in a trace (one pass)",
        description=paragraphs("One streaming pass over TRACE: top-level keys, event counts by (ph, cat), "
                        "the devices, pids with events (role, rank), GPU streams, GPU busy time per GPU (the "
                        "union of its slices), the top 10 kernels by total time, runtime and graph launches, "
                        "correlation-id collisions across pids/ranks, PP annotation counts, time span, size, "
                        "time, peak RSS. Prints a short report; --json prints everything."),
        epilog="example: streamtrace inspect rank0_trace.json.gz --json | jq .graph_launches",
    )
    cmd.add_argument("trace", help="trace file, '-' for stdin, or a URL")
    cmd.add_argument("--overwrite", action="store_true", help="replace the --summary FILE if it exists")
    secrets_options(cmd, "inspect")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    summary = inspect(args.trace, secrets=redaction(args), overwrite=args.overwrite, **reading(args))
    report("inspect", summary, args)


@view("inspect")
def rows(summary: dict) -> Rows:
    span = summary["time_span_us"]
    devices = summary["devices"]
    graphs = summary["graph_launches"]
    rows = [
        ("input", f"{summary['input']} ({summary['compression']}, {summary['bytes_raw']:,} bytes, "
                  f"{summary['events']:,} events)"),
        ("time span", ms(span["duration"]) if span["duration"] is not None else "no timed events"),
        ("devices", ", ".join(f"{count} x {name}" for name, count in devices["names"].items()) or "none listed"),
        ("ranks", ", ".join(map(str, summary["ranks"])) or "unknown"),
        ("processes", listed([f"{pid_text(p['pid'])} {p['role']} {p['events']:,} events"
                               + (f" ({counted(p['gpu_streams'], 'stream')})" if p.get("gpu_streams") else "")
                               for p in summary["pids"]])),
    ]
    if summary["gpu_busy"]:
        rows.append(("GPU busy", listed([f"pid {pid} {ms(busy['busy_us'])} of {ms(busy['span_us'])}"
                                          + (f" ({busy['busy_percent']}%)" if busy["busy_percent"] is not None else "")
                                          for pid, busy in summary["gpu_busy"].items()], 3)))
    rows.append(("launches", f"{summary['runtime_launches']:,} runtime calls, {graphs['count']:,} graph launches"
                 + (f" ({graphs['gpu_events_per_launch_mean']} GPU events each)" if graphs["count"] else "")))
    for number, kernel in enumerate(summary["top_kernels"][:3]):
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
    rows.append(took(summary))
    return rows
