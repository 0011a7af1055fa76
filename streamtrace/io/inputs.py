"""How inputs are named, one rule for every command: a file, URL or ``-`` is
itself; a directory stands for its trace files and a glob pattern for the
files it matches (also in a bucket); an archive for its members.

Commands that run once per input (compact, relink, redact, convert,
attribute, inspect) take all of them; merge and analyze take a directory's
rank files; a command that reads one trace refuses a directory, naming
the glob of its traces (:class:`~.source.InputSource`).
"""
from __future__ import annotations

import glob
import os
import re
from typing import Callable, Sequence

from ..errors import TraceError
from .archive import outer_path
from .objectstore import remote_glob
from .remote import is_url
from .source import archive_members

TRACE_SUFFIX = re.compile(r"\.json(\.gz|\.zst)?$", re.IGNORECASE)
OWN_OUTPUT = re.compile(r"_(compacted|relinked|redacted)\.json")  # what compact, relink, redact write beside their input


def names_several(spec: str | os.PathLike) -> bool:
    """Does ``spec`` stand for files rather than name one: a directory, or a glob pattern (not a file's own name)?"""
    name = os.fspath(spec)
    if is_url(name):
        return glob.has_magic(name)
    return os.path.isdir(name) or glob.has_magic(name) and not os.path.exists(name)


def trace_names_in(directory: str) -> list[str]:
    """The trace files in ``directory`` (``.json``, ``.json.gz``, ``.json.zst``), sorted, leaving out what
    compact, relink and redact write beside their input (so a second run does not take them as inputs)."""
    return sorted(name for name in os.listdir(directory) if TRACE_SUFFIX.search(name)
                  and not OWN_OUTPUT.search(name) and os.path.isfile(os.path.join(directory, name)))


def trace_files_in(directory: str) -> list[str]:
    """A directory's trace files (:func:`trace_names_in`); refused when it holds none."""
    found = [os.path.join(directory, name) for name in trace_names_in(directory)]
    if not found:
        seen = ", ".join(sorted(os.listdir(directory))[:8]) or "nothing"
        raise TraceError(f"holds no trace file (.json, .json.gz, .json.zst); seen: {seen}", path=directory)
    return found


def expand_inputs(specs: Sequence[str | os.PathLike],
                  directory_files: Callable[[str], list[str]] = trace_files_in) -> list[str]:
    """The files ``specs`` name, in the order given: files, URLs and ``-``
    as they are, directories by ``directory_files``, glob patterns by what
    they match, archives by their members; the same file twice, or stdin
    among others, is refused."""
    files: list[str] = []
    for spec in map(os.fspath, specs):
        if os.path.isdir(spec):
            files.extend(directory_files(spec))
        elif glob.has_magic(spec) and (is_url(spec) or not os.path.exists(spec)):
            found = remote_glob(spec) if is_url(spec) else sorted(glob.glob(spec))
            if not found:
                raise TraceError("the pattern matches no file", path=spec)
            files.extend(found)
        elif not is_url(spec) and spec != "-" and not os.path.exists(outer_path(spec)):
            raise TraceError("no such file or directory", path=spec)
        else:
            files.extend(archive_members(spec) or [spec])  # an archive: its members, like a directory's files
    if "-" in files and len(files) > 1:
        raise TraceError("stdin ('-') can only be the one input (one process reads it, once); "
                         "save it to a file to read it with others")
    seen: dict[str, str] = {}
    for path in files:
        real = path if path == "-" or is_url(path) else os.path.realpath(path)
        if real in seen:
            raise TraceError(f"the same file is given twice: {seen[real]} and {path}")
        seen[real] = path
    return files

