"""The human report: each command registers a view of its summary; warnings and hints are added here."""
from __future__ import annotations

import argparse
import io
import sys
from collections import Counter
from typing import Callable, TextIO

Rows = list[tuple[str, str]]
VIEWS: dict[str, Callable[[dict], Rows]] = {}
NAME_WIDTH = 70


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
    if args.json:
        write_json(summary, stream)
    else:
        stream.write(human_report(command, summary))
    stream.flush()
    if args.json or not (stream.isatty() or to_stderr):
        # it must not go unseen: on stderr too unless the human report, with it, is on the terminal already
        warn_of_secrets(summary)


def write_json(summary: dict | list, stream: TextIO) -> None:
    """The full summary (or several) as JSON, as ``--summary`` writes it: its long lists streamed from disk
    into the stream's bytes where it has them."""
    from ..io import streamjson

    raw = getattr(stream, "buffer", None)
    if raw is None:  # (a text-only stream)
        held = io.BytesIO()
        streamjson.write(summary, held)
        stream.write(held.getvalue().decode())
        return
    stream.flush()
    streamjson.write(summary, raw)
    raw.flush()


def warn_of_secrets(summary: dict) -> None:
    """The warning that the trace (inspect) or a copy written holds secrets, on stderr, when there are any."""
    if summary.get("secrets_found"):
        print(f"streamtrace: warning: {summary['warnings'][-1]}", file=sys.stderr)
    elif summary.get("secrets_copied"):
        from ..io.redact import copied_secrets_warning

        print(f"streamtrace: warning: {copied_secrets_warning(summary['secrets_copied'])}", file=sys.stderr)


def human_report(command: str, summary: dict) -> str:
    """Aligned lines: the command's rows, what was redacted, each warning once (with how often), hints,
    and what the run took."""
    rows = list(VIEWS[command](summary)) + _redaction_rows(summary)
    notices = [summary["notice"]] if summary.get("notice") else []
    for text, count in Counter(notices + list(summary.get("warnings") or ())).items():
        rows.append(("warning", text + (f" ({count} times)" if count > 1 else "")))
    rows.extend(("hint", text) for text in summary.get("hints") or ())
    if "wall_seconds" in summary:  # last: what was done, then how long it took
        rows.append(took(summary))
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


def took(summary: dict) -> tuple[str, str]:
    return "took", f"{summary['wall_seconds']} s, peak RSS {summary['peak_rss_mb']} MB"


def events_row(summary: dict) -> tuple[str, str]:
    return "events", f"{summary['events_read']:,} read, {summary['events_written']:,} written"


def short(name: object) -> str:
    text = str(name)
    return text if len(text) <= NAME_WIDTH else text[:NAME_WIDTH - 3] + "..."


def ms(us: float | None) -> str:
    """``12.345 ms``; under a millisecond in microseconds, so that a short span does not read ``0.000 ms``."""
    if us is None:
        return "?"
    return f"{us / 1000:,.3f} ms" if abs(us) >= 1000 else f"{us:,.3f} us"


def listed(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def lanes(compaction: dict) -> str:
    groups = ", ".join(f"{name} {count}" for name, count in compaction["lanes_by_group"].items())
    return slices_into_lanes(compaction["measured_slices"], compaction["original_streams"],
                             compaction["compacted_lanes"]) + f" ({groups})"


def slices_into_lanes(slices: int, streams: int, lanes: int) -> str:
    return f"{counted(slices, 'GPU slice')} from {counted(streams, 'stream')} into {counted(lanes, 'lane')}"


def plain(value: float) -> str:
    """``421`` for 421.0, ``420.5``: no decimal that says nothing."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def counted(number: int, noun: str) -> str:
    """``1 stream``, ``2,048 streams``, ``3 graph launches``."""
    return f"{number:,} {noun}" + ("" if number == 1 else "es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def pid_text(pid: object) -> str:
    if pid == "":
        return "pid (empty)"
    return f"pid {pid!r}" if isinstance(pid, str) else f"pid {pid}"


def linking_rows(summary: dict) -> Rows:
    """What relink and attribute found: ranks, links, shared ids."""
    ambiguous = [f"pid {entry['pid']} (ranks {entry['ranks']})" for entry in summary["ambiguous_pids"]]
    rows = [("ranks", listed([str(rank) for rank in summary["ranks"]], 8) or "unknown"),
            ("links", f"{summary['links']:,} GPU events linked to their launch, {summary['orphans']:,} orphans "
                      f"(launched before the capture window), "
                      f"{summary['correlation_collisions']['ids_shared_across_ranks']:,} ids shared across ranks")]
    if ambiguous:
        rows.append(("ambiguous", listed(ambiguous)))
    return rows


def pp_arrows(summary: dict) -> str:
    """The rank-local pipeline-parallel arrows compact and merge add."""
    return (f"{summary['pp_compute_dependency_pairs']:,} compute dependencies, "
            f"{summary['pp_unshard_compute_pairs']:,} unshard->compute")
