"""``streamtrace inspect``: options, runner and human report."""
from __future__ import annotations

import argparse

from .options import common_options, paragraphs, reading, redaction, secrets_options
from .report import Rows, counted, listed, ms, pid_text, plain, report, short, took, view


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
    from ..commands.inspect import inspect

    summary = inspect(args.trace, secrets=redaction(args), overwrite=args.overwrite, **reading(args))
    report("inspect", summary, args)


@view("inspect")
def rows(summary: dict) -> Rows:
    span = summary["time_span_us"]
    devices = summary["devices"]
    graphs = summary["graph_launches"]
    rows = [
        ("input", f"{summary['input']} ({compression(summary['compression'])}, {summary['bytes_raw']:,} bytes, "
                  f"{counted(summary['events'], 'event')})"),
        ("time span", ms(span["duration"]) if span["duration"] is not None else "no timed events"),
        ("devices", ", ".join(f"{count} x {name or '(no name)'}" for name, count in devices["names"].items()) or "none listed"),
        ("ranks", ", ".join(map(str, summary["ranks"])) or "unknown"),
        ("processes", listed([f"{pid_text(p['pid'])} {p['role']} {counted(p['events'], 'event')}"
                               + (f" ({counted(p['gpu_streams'], 'stream')})" if p.get("gpu_streams") else "")
                               for p in summary["pids"]])),
    ]
    if summary["gpu_busy"]:
        rows.append(("GPU busy", listed([f"{busy_pid(pid)} {busy_text(busy)}" for pid, busy in summary["gpu_busy"].items()], 3)))
    rows.append(("launches", f"{counted(summary['runtime_launches'], 'runtime call')}, {counted(graphs['count'], 'graph launch')}"
                 + (f" ({plain(graphs['gpu_events_per_launch_mean'])} GPU events each)" if graphs["count"] else "")))
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


def compression(name: str) -> str:
    """``gzip``, ``zstd``; ``uncompressed`` rather than ``none``."""
    return "uncompressed" if name == "none" else name


def busy_text(busy: dict) -> str:
    """``1.200 ms of 4.000 ms (30.0%)``; a GPU whose slices all last 0 us has no busy fraction to give."""
    if not busy["span_us"]:
        return "no GPU time (its slices last 0 us)"
    return f"{ms(busy['busy_us'])} of {ms(busy['span_us'])}" + (
        f" ({busy['busy_percent']}%)" if busy["busy_percent"] is not None else "")


def busy_pid(key: str) -> str:
    """A GPU pid as the summary keys it (JSON keys are text: ``"4"`` is pid 4, ``""`` the empty one)."""
    return pid_text(key) if key == "" else f"pid {key}"
