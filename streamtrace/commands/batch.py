"""Batch runs: one per-rank command over many inputs, one task per input.

The inputs are named as every command names them (:mod:`streamtrace.io.inputs`:
files, directories, globs, archives).  ``compact``, ``relink``, ``redact``
and ``convert`` write one output per input into a directory, under the name
the single run would give it beside its input (convert: the input's own
name), its suffix the compression written; ``attribute`` writes
one CSV of every input's rows (the rank column tells them apart), in input
order.  Each task runs the single command in one process (``jobs=1``) on
this machine or on a Dask cluster (:mod:`streamtrace.engine.executors`).

Nothing appears unless every input succeeds: the tasks write into a hidden
directory inside the output directory (so a rename moves each file into
place) or, for attribute's CSV parts, into the run's spool directory; the
coordinator renames or concatenates only after the last task.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from ..engine.executors import TaskRunner, remove_tree, shared_path
from ..engine.jobs import resolve_jobs
from ..errors import TraceError
from ..io.destinations import Destinations
from ..io.formats import SUFFIXES
from ..io.inputs import expand_inputs
from ..io.redact import summed_redaction
from ..io.sink import SinkSpec, default_output, make_folders, publish_all, remove_empty_folders, remove_quietly
from ..resources import peak_rss_mb

PER_INPUT = {"compact": "_compacted", "relink": "_relinked", "redact": "_redacted", "convert": ""}
"""The commands that write one output per input, and the tag of its name (convert: the input's own name)."""
SUMMED = ("events_read", "events_written")
CSV_PIECE = 1 << 20


def batch(command: str, srcs: Sequence[str | os.PathLike], dst: str | None = None, *, jobs: int | str | None = None,
          dask: str | None = None, spool_dir: str | None = None, progress: bool | str | None = False,
          overwrite: bool = False, summary_file: str | os.PathLike | None = None, **options: object) -> dict:
    """Run ``command`` (compact, relink, redact, convert or attribute) on
    every input (``srcs``: files, directories, globs, archives); returns the
    summary: the outputs, the per-input summaries, their summed counts.

    ``dst``: for attribute the CSV (default stdout), else a directory
    (created if missing; default but for convert: each output beside its input).
    ``options`` are the single command's keyword arguments; ``summary_file``
    receives this summary.
    """
    started = time.perf_counter()
    if command not in (*PER_INPUT, "attribute"):
        raise ValueError(f"no batch mode for {command!r}")
    files = expand_inputs(srcs)
    if not files:
        raise TraceError(f"{command} needs at least one input")
    if "-" in files:  # (the only input: among others, expand_inputs refused it)
        raise TraceError(f"{command} into a directory reads files or URLs, not stdin ('-'): give -o a file name")
    destinations = Destinations(files, overwrite=overwrite, summary=summary_file)
    with TaskRunner(resolve_jobs(jobs), dask=dask, spool_dir=spool_dir, progress=progress) as runner:
        if runner.distributed:
            files = [shared_path(path) for path in files]
        if command == "attribute":
            outputs, runs = _attribute_all(files, "-" if dst is None else dst, runner, destinations, options)
        else:
            outputs, runs = _each_to_directory(command, files, dst, runner, destinations, options)
    return destinations.finish({
        "command": command,
        "inputs": len(files),
        "output": outputs,
        **{key: sum(run.get(key, 0) for run in runs) for key in SUMMED if any(key in run for run in runs)},
        **summed_redaction(runs),
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })


def _each_to_directory(command: str, files: list[str], directory: str | None, runner: TaskRunner,
                       destinations: Destinations, options: dict) -> tuple[list[str], list[dict]]:
    tag = PER_INPUT[command]
    if directory is not None:
        destinations.directory(directory, writes=f"{command}'s outputs of several inputs")
    elif not tag:
        raise TraceError(f"{command} of several inputs writes into a directory: give one (DIR/)")
    beside = [compressed_name(default_output(path, tag), options.get("compress")) for path in files]  # type: ignore[arg-type]
    finals = beside if directory is None else [os.path.join(directory, os.path.basename(path)) for path in beside]
    for src, final in zip(files, finals):  # every one before any work
        destinations.claim(final, compress=options.get("compress"), role=f"output of {src}")  # type: ignore[arg-type]
    with staged(finals, destinations.overwrite) as staged_paths:
        calls = [(command, src, out, runner.work_dir, options) for src, out in zip(files, staged_paths)]
        runs = list(runner.ordered(_run_one, calls, label="inputs done"))
    for final, run in zip(finals, runs):
        run["output"] = final
    return finals, runs


def compressed_name(name: str, compress: str | None) -> str:
    """``name`` with the suffix of the compression ``compress`` asks for
    (``x.json.gz`` -> ``x.json.zst`` for zstd): the name tells what is written."""
    if compress is None:
        return name
    stem = next((name[: -len(suffix)] for suffix in (".json.gz", ".json.zst", ".json") if name.endswith(suffix)), name)
    return stem + SUFFIXES[compress]


@contextmanager
def staged(finals: list[str], overwrite: bool) -> Iterator[list[str]]:
    """Where tasks write the files ``finals``: a hidden folder inside each
    one's folder (created if missing), so a rename moves each into place.
    When the block ends normally they are published all or none; whatever
    happens, the hidden folders go, and the folders the run created unless
    it succeeded."""
    groups = {os.path.dirname(os.path.abspath(final)) for final in finals}
    staging: dict[str, str] = {}
    created: list[str] = []
    try:
        for folder in sorted(groups):
            created += make_folders(folder)
            staging[folder] = tempfile.mkdtemp(prefix=".streamtrace-batch-", dir=folder)
        paths = [os.path.join(staging[os.path.dirname(os.path.abspath(final))], os.path.basename(final))
                 for final in finals]
        yield paths
        publish_all(zip(paths, finals), overwrite)
        created.clear()  # the run succeeded: its folders stay
    finally:
        for folder in staging.values():
            remove_tree(folder)  # (a task abandoned on a cluster may still be writing there)
        remove_empty_folders(created)


def _run_one(command: str, src: str, dst: str, spool_dir: str | None, options: dict) -> dict:
    """One input in one process (a task)."""
    return _single(command)(src, dst, spool_dir=spool_dir, jobs=1, progress=False, **options)


def _single(command: str) -> Callable[..., dict]:
    """The one-input function of ``command`` (imported here: convert's Parquet side uses merge, which uses this
    module)."""
    from .attribute import attribute
    from .compact import compact
    from .convert import convert
    from .redact import redact
    from .relink import relink

    return {"attribute": attribute, "compact": compact, "convert": convert, "redact": redact, "relink": relink}[command]


def _attribute_all(files: list[str], dst: SinkSpec, runner: TaskRunner, destinations: Destinations,
                   options: dict) -> tuple[str, list[dict]]:
    """Every input's CSV, written as parts by the tasks and joined under one header here."""
    target = destinations.target(dst, compress=options.pop("compress", None), holds="CSV")  # type: ignore[arg-type]
    parts_dir = tempfile.mkdtemp(prefix="streamtrace-parts-", dir=runner.work_dir)
    try:
        calls = [("attribute", src, os.path.join(parts_dir, f"{n}.csv"), runner.work_dir, options)
                 for n, src in enumerate(files)]
        runs = list(runner.ordered(_run_one, calls, label="inputs done"))
        with target.open() as out:
            for n, (_, _, part, _, _) in enumerate(calls):
                with open(part, "rb") as rows:
                    header = rows.readline()
                    if n == 0:
                        out.write(header)
                    shutil.copyfileobj(rows, out, CSV_PIECE)
                remove_quietly(part)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    for run in runs:
        run["output"] = target.name
    return target.name, runs
