"""streamtrace: bounded-memory processing of huge PyTorch profiler traces.

The library API mirrors the command line: each function takes sources and
destinations (paths, ``-`` or binary file objects) and returns the summary
the command prints.
"""
from .attribute import attribute
from .compact import compact
from .convert import convert
from .errors import TraceError
from .inspector import inspect
from .merge import merge
from .relink import relink
from .split import split

__all__ = ["TraceError", "attribute", "compact", "convert", "inspect", "merge", "relink", "split"]
__version__ = "0.1.0"
