"""Every file one run writes, checked together before the long pass.

A command makes one :class:`Destinations` from its inputs and ``overwrite``
and claims each file it will write (traces, the ``--summary`` file, CSVs,
per-rank and per-step files, batch outputs) as soon as it knows its name:
up front, or right after pass 1 for names that depend on what the input
holds (ranks, steps).  A claim applies the rules of every written file
(docs/input-handling.md, "Writing"): never onto an input, never twice in one
run, never over an existing file without ``overwrite``, into a directory
that exists (or that the run creates) and is writable, and never under a
suffix promising a compression streamtrace does not write.  The files are
then written atomically by :class:`~.sink.OutputTarget`.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import BinaryIO, Iterable, Iterator

from ..errors import TraceError
from . import streamjson
from .redact import copied_secrets_warning
from .remote import is_url
from .sink import (
    UNWRITTEN_SUFFIXES,
    OutputTarget,
    SinkSpec,
    check_file,
    compression_for,
    make_folders,
    publish_all,
    refuse_other_format,
    remove_empty_folders,
    remove_quietly,
)

# not names for a directory a run creates: the user meant a file
FILE_LIKE = (".json", ".gz", ".gzip", ".zst", ".zstd", ".csv", ".html", ".parquet", *UNWRITTEN_SUFFIXES)


class Destinations:
    """The destinations of one run: what it may write, reserved as checked.

    Used as a context manager, the files written through :meth:`open` and
    :meth:`write` inside the block are published together when it ends (all
    or none); outside one, each is published when written.
    """

    def __init__(self, inputs: Iterable[str | os.PathLike | None] = (), *, overwrite: bool = False,
                 summary: str | os.PathLike | None = None) -> None:
        self.inputs = [os.fspath(source) for source in inputs if source is not None]
        self.overwrite = overwrite
        self._claimed: dict[str, tuple[str, str]] = {}  # identity -> (what the run writes there, its name)
        self._directories: set[str] = set()  # directories the run writes into (created if missing)
        self._pending: list[tuple[str, str]] | None = None  # (temp, final) while publishing together
        self._created: list[str] = []  # folders made for files written inside the block (gone if it fails)
        self.summary = None if summary is None else self.claim(summary, role="summary", holds="JSON")

    def check(self, spec: SinkSpec, *, compress: str | None = None, role: str = "output",
              holds: str | None = None) -> None:
        """Refuse ``spec`` now if writing it later would break a rule; ``holds``:
        the format written (JSON, CSV, ...), which a name must not contradict."""
        name = _name(spec)
        if name is None:
            return
        earlier = self._claimed.get(_identity(name))
        if earlier is not None:
            first = earlier[0] if earlier[1] == name else f"{earlier[0]}, named {earlier[1]},"
            raise TraceError(f"this run would write it twice (as the {first} and as the {role}); "
                             "give each its own name", path=name)
        if name == "-":
            return
        if is_url(name):
            OutputTarget(name, overwrite=self.overwrite, compress=compress, inputs=self.inputs)
        else:
            planned = os.path.dirname(os.path.abspath(name)) in self._directories
            check_file(name, self.inputs, overwrite=self.overwrite, directory_planned=planned)
            compression_for(name, compress)
        if holds is not None:
            refuse_other_format(name, holds)

    def claim(self, spec: SinkSpec, *, compress: str | None = None, role: str = "output",
              holds: str | None = None) -> str | None:
        """:meth:`check` ``spec`` and reserve it for this run; returns its name
        (None for a file object, which is the caller's own)."""
        self.check(spec, compress=compress, role=role, holds=holds)
        name = _name(spec)
        if name is not None:
            self._claimed[_identity(name)] = (role, name)
        return name

    def claim_all(self, specs: Iterable[SinkSpec], *, role: str = "output") -> None:
        for spec in specs:
            self.claim(spec, role=role)

    def directory(self, path: str | os.PathLike, *, writes: str = "files", existing: str | None = None) -> str:
        """Check a directory the run writes several files into (created if
        missing): local, not a file, not named like one unless it exists, in
        a writable place.  ``existing``: a regular expression of the names the
        run may write there; without overwrite a directory already holding
        one is refused now, before the pass that finds the exact names."""
        directory = os.fspath(path)
        if directory == "-" or is_url(directory):
            raise TraceError(f"{writes} go into a local directory; give its path (copy them to a bucket afterwards)",
                             path=directory)
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise TraceError(f"exists and is not a directory ({writes} go into a directory)", path=directory)
        if not os.path.isdir(directory) and directory.lower().endswith(FILE_LIKE):
            raise TraceError(f"is named like a file, but {writes} go into a directory: give a directory name "
                             "(e.g. DIR/)", path=directory)
        existing_parent = directory
        while not os.path.isdir(existing_parent):  # created later: its nearest existing parent decides
            existing_parent = os.path.dirname(os.path.abspath(existing_parent))
        if not os.access(existing_parent, os.W_OK):
            raise TraceError("output directory is not writable", path=directory)
        if existing is not None and not self.overwrite and os.path.isdir(directory):
            pattern = re.compile(existing)
            clash = next((name for name in sorted(os.listdir(directory)) if pattern.fullmatch(name)), None)
            if clash is not None:
                raise TraceError(f"already holds {clash}, a name this run may write; pass --overwrite to replace "
                                 "such files, or give another directory", path=directory)
        self._directories.add(os.path.abspath(directory))
        return directory

    def target(self, spec: SinkSpec, *, compress: str | None = None, level: int | None = None,
               background: bool = True, redactor: object = None, role: str = "output",
               holds: str = "JSON") -> OutputTarget:
        """Claim ``spec`` and give the :class:`OutputTarget` that writes it
        atomically (a JSON trace unless ``holds`` names another format)."""
        self.claim(spec, compress=compress, role=role, holds=holds)
        return OutputTarget(spec, overwrite=self.overwrite, compress=compress, level=level, inputs=self.inputs,
                            background=background, redactor=redactor)  # type: ignore[arg-type]

    @contextmanager
    def open(self, spec: SinkSpec, *, compress: str | None = None, role: str = "output") -> Iterator[BinaryIO]:
        """A binary stream to the claimed file ``spec`` (claimed here if not
        yet); it appears only if the block succeeds (inside ``with self``:
        when that block ends)."""
        name = _name(spec)
        if name is None or _identity(name) not in self._claimed:
            self.claim(spec, compress=compress, role=role)
        pending = self._pending
        folder = None if name is None or name == "-" else os.path.dirname(os.path.abspath(name))
        if folder in self._directories:  # a directory the run writes into, made now if missing
            made = make_folders(folder)
            if pending is not None:
                self._created += made
        target = OutputTarget(spec, overwrite=self.overwrite, compress=compress, inputs=self.inputs, background=False)
        final = target.path
        hold = None if pending is None or final is None else (lambda temp: pending.append((temp, final)))
        with target.open(hold=hold) as out:
            yield out

    def write(self, spec: SinkSpec, data: bytes, *, role: str = "output") -> None:
        """Write a small file (a summary, a table, a report) whole and atomically."""
        with self.open(spec, role=role) as out:
            out.write(data)

    def finish(self, summary: dict) -> dict:
        """Write the run's summary to the claimed summary file, if any; returns it.
        A copy holding secrets (``secrets_copied``) gets its warning here, once for every command."""
        if summary.get("secrets_copied"):
            summary["warnings"] = [*summary.get("warnings", ()), copied_secrets_warning(summary["secrets_copied"])]
        if self.summary is not None:
            with self.open(self.summary, role="summary") as out:
                streamjson.write(summary, out)  # (as --json prints it; long lists streamed from disk)
        return summary

    def __enter__(self) -> Destinations:
        self._pending = []
        self._created = []
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        pending, self._pending = self._pending or [], None
        created, self._created = self._created, []
        try:
            if kind is None:
                publish_all(pending, self.overwrite)
                created = []  # the files are there: their folders stay
        finally:
            for temp, _ in pending:  # those published are gone already
                remove_quietly(temp)
            remove_empty_folders(created)


def check_destinations(paths: Iterable[SinkSpec], inputs: Iterable[str | os.PathLike | None], *,
                       overwrite: bool = False, summary: str | os.PathLike | None = None) -> Destinations:
    """Check every destination of a run against the rules and one another
    before any work; the returned :class:`Destinations` writes them."""
    destinations = Destinations(inputs, overwrite=overwrite, summary=summary)
    destinations.claim_all(paths)
    return destinations


def _name(spec: SinkSpec) -> str | None:
    """The name a destination is known by: a path, a URL, ``-``; None for a file object."""
    return os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None


def _identity(name: str) -> str:
    """One key for every spelling of a destination (relative, through symlinked directories)."""
    if name == "-" or is_url(name):
        return name
    return os.path.realpath(name)
