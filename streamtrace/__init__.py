"""streamtrace: bounded-memory processing of huge PyTorch profiler traces.

The library API mirrors the command line: each function takes sources and
destinations (paths, ``-`` or binary file objects) and returns the summary
the command prints.  Each is imported on first use (``streamtrace.merge``),
so that the command line starts quickly whatever it runs.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .commands.analyses.frames import TraceAnalysis, analyze_frames
    from .commands.analyze import analyze
    from .commands.attribute import attribute
    from .commands.batch import batch
    from .commands.compact import compact
    from .commands.convert import convert
    from .commands.diff import diff
    from .commands.inspect import inspect
    from .commands.merge import merge
    from .commands.redact import redact
    from .commands.relink import relink
    from .commands.slicing import slice_trace
    from .commands.split import split
    from .commands.sql import sql
    from .commands.synth import synthesize
    from .errors import TraceError
    from .io.redact import RedactOptions

_HOMES = {"analyze": "commands.analyze", "analyze_frames": "commands.analyses.frames",
          "TraceAnalysis": "commands.analyses.frames", "attribute": "commands.attribute", "batch": "commands.batch",
          "compact": "commands.compact", "convert": "commands.convert", "diff": "commands.diff", "inspect": "commands.inspect",
          "merge": "commands.merge", "redact": "commands.redact", "relink": "commands.relink",
          "slice_trace": "commands.slicing", "split": "commands.split", "synthesize": "commands.synth", "TraceError": "errors",
          "RedactOptions": "io.redact", "sql": "commands.sql"}
__all__ = ["RedactOptions", "TraceAnalysis", "TraceError", "analyze", "analyze_frames", "attribute", "batch", "compact",
           "convert", "diff", "inspect", "merge", "redact", "relink", "slice_trace", "split", "sql", "synthesize"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``streamtrace.merge`` and the others, imported when first asked for."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value
