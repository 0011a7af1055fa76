"""streamtrace: bounded-memory processing of huge PyTorch profiler traces.

The library API mirrors the command line: each function takes sources and
destinations (paths, ``-`` or binary file objects) and returns the summary
the command prints.
"""
from .commands.analyze import analyze
from .commands.attribute import attribute
from .commands.batch import batch
from .commands.compact import compact
from .commands.convert import convert
from .commands.inspect import inspect
from .commands.merge import merge
from .commands.redact import redact
from .commands.relink import relink
from .commands.slicing import slice_trace
from .commands.split import split
from .errors import TraceError
from .io.redact import RedactOptions

__all__ = ["RedactOptions", "TraceError", "analyze", "attribute", "batch", "compact", "convert", "inspect", "merge", "redact",
           "relink", "slice_trace", "split"]
__version__ = "0.1.0"
