"""The bad-input matrix: every command against every damaged trace.

A command is ONE row of :data:`COMMANDS` (how to build its argv for an input
and an output, and which outputs must not exist after a refusal).  Commands
not on this branch yet are found missing at run time and skipped, so when
they land the matrix covers them with no further change.  The expected
outcome of each (command, input) pair is :func:`expected`; the README section
"What streamtrace accepts, repairs and refuses" says the same in words.  For
merge, relink, split and attribute the expectations follow the rule the
present commands keep (refuse an event only when a field the command needs
is missing or of the wrong type) and are to be confirmed when they land.

Each case runs the CLI as a subprocess (``python -m streamtrace``) with
``PYTHONPATH`` at the checkout these tests come from, in a directory of its
own, and records what a user would see: exit status, stderr, files left
behind, whether the input changed and how long it took.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import ijson

from .generate import BAD_INPUTS, BadInput, good_rank1_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 30
MEMORY_LIMIT_MB = 200
"""Peak RSS any case may reach: memory is bounded whatever the input."""
CLI = [sys.executable, "-m", "streamtrace"]
POSITION = re.compile(r"(event \d+|byte \d+)")


def cli_env() -> dict[str, str]:
    """The environment that runs this checkout's streamtrace, wherever it was cloned."""
    while True:  # the matrix's threads copy it while pytest's main thread sets and deletes PYTEST_CURRENT_TEST
        try:
            environment = dict(os.environ)
            break
        except KeyError:  # a key listed, then deleted before it was read: copy again
            continue
    path = environment.get("PYTHONPATH")
    return {**environment, "PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else "")}


@dataclass(frozen=True)
class Command:
    """How the matrix runs one command.

    ``argv(inputs, output)`` builds the arguments after ``streamtrace``;
    ``inputs`` is the bad file, plus a good second rank when ``needs_second_rank``.
    ``output`` is the file (or, for ``output_is_dir``, directory) the command
    writes; None for commands that write no file.  ``stdout_argv`` builds a
    run that writes the trace to stdout (pipe tests), None if the command has
    no such mode.
    """

    name: str
    argv: Callable[[list[str], str], list[str]]
    output_name: str | None = "out.json"
    output_is_dir: bool = False
    needs_second_rank: bool = False
    stdout_argv: Callable[[list[str]], list[str]] | None = None
    small_outputs: bool = False  # its files are a few KB: a disk that fills "mid-run" must fill sooner


COMMANDS: tuple[Command, ...] = (
    Command("inspect", lambda i, o: ["inspect", "--json", i[0]], output_name=None,
            stdout_argv=lambda i: ["inspect", i[0]]),
    Command("convert", lambda i, o: ["convert", "--json", i[0], o], stdout_argv=lambda i: ["convert", i[0], "-"]),
    Command("compact", lambda i, o: ["compact", "--json", i[0], "-o", o], stdout_argv=lambda i: ["compact", i[0], "-o", "-"]),
    Command("merge", lambda i, o: ["merge", "--json", *i, "-o", o], needs_second_rank=True,
            stdout_argv=lambda i: ["merge", *i, "-o", "-"]),
    Command("relink", lambda i, o: ["relink", "--json", i[0], "-o", o], stdout_argv=lambda i: ["relink", i[0], "-o", "-"]),
    Command("split", lambda i, o: ["split", "--json", i[0], "-o", o], output_name="split", output_is_dir=True),
    Command("attribute", lambda i, o: ["attribute", "--json", i[0], "-o", o], output_name="kernels.csv",
            stdout_argv=lambda i: ["attribute", i[0], "-o", "-"]),
    Command("analyze", lambda i, o: ["analyze", "--json", i[0], "-o", o], output_name="tables", output_is_dir=True,
            small_outputs=True),
)
COMMAND_BY_NAME = {command.name: command for command in COMMANDS}


@lru_cache(maxsize=None)
def available(command: str) -> bool:
    """Is the command on this checkout?  (``streamtrace CMD --help`` succeeds.)"""
    result = subprocess.run([*CLI, command, "--help"], capture_output=True, env=cli_env(), timeout=TIMEOUT_SECONDS)
    return result.returncode == 0


@dataclass(frozen=True)
class Outcome:
    """What a command must do with an input.

    Accepted: exit 0, and ``counter`` (a summary key, searched at any depth)
    says the repair happened.  Refused: exit 1 and one stderr line naming the
    file, a position (event index and/or byte offset) and ``reason``.
    """

    accepted: bool
    reason: str = ""
    counter: str | None = None

    def describe(self) -> str:
        if self.accepted:
            return f"processed, {self.counter} counted" if self.counter else "processed"
        return f"refused: {self.reason}"


def accept(counter: str | None = None) -> Outcome:
    return Outcome(True, counter=counter)


def refuse(reason: str) -> Outcome:
    return Outcome(False, reason)


WRITERS = ("convert", "compact", "merge", "relink", "split")
"""Commands that write events out (``inspect`` and ``attribute`` write summaries and rows)."""
PLACERS = ("compact", "merge")
"""Commands that place GPU slices on lanes: they need a slice's pid, numeric ts and dur >= 0."""
RANKERS = ("merge", "relink", "split", "attribute")
"""Commands that give every event a rank.  ``relink``, ``split`` and
``attribute`` keep events whose pid is missing or not a scalar as unranked
(split: with the closest preceding ranked event; attribute: an empty rank),
``merge`` needs the pid to renumber it."""

_EXPECTED: dict[str, Outcome | dict[str, Outcome]] = {
    "truncated_gzip": refuse("truncated"),
    "truncated_zstd": refuse("truncated"),
    "corrupt_gzip_crc": refuse("corrupt gzip data"),
    "corrupt_zstd": refuse("corrupt zstd data"),
    "corrupt_gzip_deflate": refuse("corrupt gzip data"),
    "top_level_value_malformed": refuse("malformed JSON in the value of top-level key 'deviceProperties'"),
    "top_level_value_control_chars": accept("control_chars_repaired"),
    "empty": refuse("empty input"),
    "whitespace_only": refuse("empty input"),
    "not_json": refuse("not JSON"),
    "top_level_number": refuse("top level is a number"),
    "top_level_string": refuse("top level is a string"),
    "top_level_null": refuse("top level is null"),
    "no_trace_events": refuse("no traceEvents"),
    "trace_events_not_list": refuse("traceEvents is an object"),
    "trailing_garbage": refuse("trailing garbage"),
    "event_not_object": refuse("event is a number"),
    "key_fields_not_scalar": {name: refuse("pid is a list, expected a number or string")
                              for name in ("inspect", "merge", "split", "attribute", "analyze")},
    "missing_ph": accept(),
    "missing_ts_gpu_slice": {name: refuse("needs numeric ts and dur") for name in PLACERS},
    "missing_ts_cpu_op": accept(),
    "missing_pid_gpu_slice": {name: refuse("GPU slice has no pid") for name in PLACERS},
    "missing_pid_cpu_op": accept(),
    "ts_string_gpu_slice": {name: refuse("needs numeric ts and dur") for name in PLACERS},
    "ts_string_cpu_op": accept(),
    "negative_dur_gpu_slice": {name: refuse("negative dur") for name in PLACERS},
    "negative_dur_cpu_op": accept(),
    "nan_literal": refuse("malformed JSON"),
    "infinity_literal": refuse("malformed JSON"),
    "int_beyond_64_bits": accept("exact_numbers"),
    "invalid_utf8": accept("invalid_utf8_repaired"),
    "raw_control_chars": accept("control_chars_repaired"),
    "duplicate_keys": accept(),
    "string_10mb": accept(),
    **{f"deep_{kind}_{place}_1e3": {name: refuse("nested more than 254 levels") for name in WRITERS}
       for kind in ("arrays", "objects") for place in ("event", "args")},
    **{f"deep_{kind}_top_1e3": accept() for kind in ("arrays", "objects")},
    **{f"deep_{kind}_{place}_1e{power}": refuse("nested more than 1024 levels deep")
       for kind in ("arrays", "objects") for place in ("event", "args", "top") for power in (4, 5, 6)},
    "deep_arrays_end_1e6": refuse("nested more than 1024 levels deep"),
    "truncated_object_form": refuse("truncated"),
    "truncated_array_form": refuse("truncated"),
}
_DEFAULT_FOR_SEMANTIC_CASES = accept()


def expected(command: str, bad: str) -> Outcome:
    """The documented outcome of ``command`` on the input named ``bad``."""
    rule = _EXPECTED[bad]
    if isinstance(rule, Outcome):
        return rule
    return rule.get(command, _DEFAULT_FOR_SEMANTIC_CASES)


@dataclass
class CaseRun:
    """What one (command, input) run left behind."""

    command: str
    bad: str
    input_path: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    input_unchanged: bool
    leftovers: list[str]
    outputs_present: list[str]
    output_parses: bool | None
    peak_rss_mb: float
    summary: dict | None = field(default=None, repr=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def find_key(value: object, key: str) -> object:
    """The first value of ``key`` anywhere in a nested summary (commands nest read stats differently)."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        for item in value.values():
            found = find_key(item, key)
            if found is not None:
                return found
    return None


def _summary(text: str) -> dict | None:
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _parses(path: Path) -> bool:
    """Does a written output read back (JSON traces) or exist with content (CSV, split dirs)?"""
    if path.is_dir():
        return all(_parses(item) for item in path.iterdir()) and any(path.iterdir())
    if path.name.endswith(".json"):
        try:
            with path.open("rb") as handle:  # a streaming check: top-level keys may nest beyond json's recursion
                for _ in ijson.basic_parse(handle):
                    pass
        except ijson.JSONError:
            return False
        return True
    return path.stat().st_size > 0


def command_line(command: Command, trace: Path, workdir: Path, *, output_dir: Path | None = None,
                 to_stdout: bool = False) -> tuple[list[str], Path | None, Path]:
    """argv (after ``streamtrace``) running ``command`` on ``trace``, its output
    path (in ``output_dir``, default ``workdir``) and its spool dir; writes the
    good second rank into ``workdir`` when the command needs one."""
    workdir.mkdir(parents=True, exist_ok=True)
    spool = workdir / "spool"
    spool.mkdir(exist_ok=True)
    inputs = [str(trace)]
    if command.needs_second_rank:
        second = workdir / "rank1_trace.json"
        second.write_bytes(good_rank1_trace())
        inputs.append(str(second))
    output = (output_dir or workdir) / command.output_name if command.output_name else None
    if to_stdout:
        assert command.stdout_argv is not None
        argv, output = command.stdout_argv(inputs), None
    else:
        argv = command.argv(inputs, str(output) if output else "")
    return [*argv, "-q", "--spool-dir", str(spool)], output, spool


def run_measured(argv: list[str], workdir: Path) -> tuple[int | None, bytes, bytes, float]:
    """Run ``argv`` as a child: exit status (None: killed after the timeout),
    stdout, stderr and the child's peak RSS in MiB (through ``measure.py``,
    which keeps this process's own size out of the figure)."""
    report = workdir / "measure.json"
    launcher = [sys.executable, str(Path(__file__).with_name("measure.py")), str(report), str(TIMEOUT_SECONDS)]
    with open(workdir / "stdout.capture", "w+b") as out, open(workdir / "stderr.capture", "w+b") as err:
        subprocess.run([*launcher, *argv], stdout=out, stderr=err, env=cli_env(), check=True,
                       timeout=TIMEOUT_SECONDS + 30)
        out.seek(0)
        err.seek(0)
        captured = out.read(), err.read()
    measured = json.loads(report.read_text())
    for name in ("stdout.capture", "stderr.capture", "measure.json"):
        (workdir / name).unlink()
    return measured["returncode"], *captured, measured["peak_rss_kib"] / 1024


def run_case(command: Command, bad: BadInput, workdir: Path) -> CaseRun:
    """Run one case as a user would and record everything the assertions look at."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / bad.filename
    trace.write_bytes(bad.build())
    argv, output, _ = command_line(command, trace, workdir)
    before = {path: sha256(path) for path in workdir.iterdir() if path.is_file()}
    started = time.perf_counter()
    returncode, stdout, stderr, peak_mb = run_measured([*CLI, *argv], workdir)
    seconds = time.perf_counter() - started
    unchanged = all(path.exists() and sha256(path) == digest for path, digest in before.items())
    present = [str(output)] if output is not None and output.exists() else []
    inputs = {str(path.relative_to(workdir)) for path in before}
    leftovers = [name for name in files_under(workdir) if name not in inputs
                 and not (present and (workdir / name).is_relative_to(output))]
    return CaseRun(command.name, bad.name, str(workdir / bad.filename), returncode,
                   stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), seconds, unchanged,
                   leftovers, present, _parses(output) if present else None, peak_mb,
                   _summary(stdout.decode("utf-8", "replace")))


def problems(run: CaseRun, outcome: Outcome) -> list[str]:
    """Every way a run differs from its documented outcome (empty: as documented)."""
    found = []
    if run.returncode is None:
        return [f"no answer within {TIMEOUT_SECONDS} s"]
    if run.peak_rss_mb > MEMORY_LIMIT_MB:
        found.append(f"peak RSS {run.peak_rss_mb:.0f} MiB, more than {MEMORY_LIMIT_MB} MiB")
    if "Traceback" in run.stderr:
        found.append("traceback on stderr")
    if not run.input_unchanged:
        found.append("input changed")
    if run.leftovers:
        found.append(f"files left behind: {run.leftovers}")
    if outcome.accepted:
        if run.returncode != 0:
            found.append(f"exit {run.returncode}, expected 0: {run.stderr.strip()[:300]}")
        elif run.summary is None:
            found.append("no JSON summary on stdout")
        elif outcome.counter and not find_key(run.summary, outcome.counter):
            found.append(f"summary does not count the repair ({outcome.counter})")
        if run.returncode == 0 and COMMAND_BY_NAME[run.command].output_name and not run.output_parses:
            found.append("output missing or unreadable")
        return found
    lines = run.stderr.splitlines()
    if run.returncode != 1:
        found.append(f"exit {run.returncode}, expected 1")
    if len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr, expected 1")
    message = lines[0] if lines else ""
    if not message.startswith("streamtrace: error: ") or run.input_path not in message:
        found.append(f"error does not name the file: {message[:200]!r}")
    if not POSITION.search(message.replace(run.input_path, "")):
        found.append(f"error gives no event index or byte offset: {message[:200]!r}")
    if outcome.reason not in message:
        found.append(f"error does not say {outcome.reason!r}: {message[:200]!r}")
    if run.outputs_present:
        found.append(f"output written: {run.outputs_present}")
    return found


def cases() -> list[tuple[Command, BadInput]]:
    return [(command, bad) for command in COMMANDS for bad in BAD_INPUTS]


def run_all(root: Path, selected: Iterable[tuple[Command, BadInput]], workers: int | None = None
            ) -> dict[tuple[str, str], Future]:
    """Start every available case in a small thread pool (each is a subprocess)."""
    pool = ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2))
    futures = {(command.name, bad.name): pool.submit(run_case, command, bad, root / command.name / bad.name)
               for command, bad in selected if available(command.name)}
    pool.shutdown(wait=False)
    return futures


def failures(results: dict[tuple[str, str], CaseRun]) -> dict[tuple[str, str], list[str]]:
    """The cases that did not go as documented, with what went wrong."""
    found = {key: problems(run, expected(*key)) for key, run in results.items()}
    return {key: wrong for key, wrong in found.items() if wrong}


def cell(run: CaseRun | None, outcome: Outcome) -> str:
    """One table cell: the outcome, or what went wrong."""
    if run is None:
        return "skipped"
    wrong = problems(run, outcome)
    if wrong:
        return "FAIL: " + "; ".join(wrong)
    if outcome.accepted:
        return "repaired" if outcome.counter else "processed"
    return "refused"


def markdown_table(results: dict[tuple[str, str], CaseRun]) -> str:
    """Per input (rows) and command (columns): the outcome, plus counts per command."""
    names = [command.name for command in COMMANDS]
    lines = ["| input | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    counts: dict[str, dict[str, int]] = {name: {} for name in names}
    for bad in BAD_INPUTS:
        row = []
        for name in names:
            text = cell(results.get((name, bad.name)), expected(name, bad.name))
            label = text.split(":")[0]
            counts[name][label] = counts[name].get(label, 0) + 1
            row.append(text)
        lines.append(f"| {bad.name} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append("skipped: the command is not on this branch yet.")
    lines.append("")
    lines.append("| command | " + " | ".join(("processed", "repaired", "refused", "FAIL", "skipped")) + " |")
    lines.append("|---" * 6 + "|")
    for name in names:
        lines.append(f"| {name} | " + " | ".join(str(counts[name].get(label, 0)) for label in
                                                   ("processed", "repaired", "refused", "FAIL", "skipped")) + " |")
    peaks = [(run.peak_rss_mb, key) for key, run in results.items()]
    if peaks:
        peak, (command, bad) = max(peaks)
        lines.append("")
        lines.append(f"highest peak RSS: {peak:.0f} MiB ({command} on {bad}; limit {MEMORY_LIMIT_MB} MiB)")
    return "\n".join(lines)
