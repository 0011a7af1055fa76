#!/usr/bin/env python3
"""Mutation fuzzing: damage the real traces byte by byte, run every command on each mutant.

Usage: python scripts/fuzz_mutants.py [--mutants 2000] [--seed 1] [--workers 2] [--traces DIR]

Each mutant is a real trace (../shared/traces) with random damage: bit
flips, truncation, a deleted or duplicated byte range, inserted garbage, or
a damaged gzip/zstd frame, applied to the file as stored or to its JSON
(then stored plain, gzip'ed or zstd'ed).  Every command runs on it through
the library API, in worker processes (a mutant that takes longer than the
timeout is a hang: its worker is killed and replaced).  Each run is
classified: processed, repaired (the summary counts a repair) or refused
(a TraceError of one line naming the file).  Failures: any other exception
(a traceback for the user), a hang, an output left behind by a refusal or
an unreadable output after success, a changed input.  Prints the outcome
counts per command; exit status 1 if any failure.  The same seed gives the
same mutants and the same table.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ijson
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import streamtrace  # noqa: E402

DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
MAX_TRACE_BYTES = 2_000_000  # decompressed: larger real traces make a run of 2,000 mutants take hours
TIMEOUT_SECONDS = 60
JOBS = 1  # -j N gives the same bytes for every N (tests/test_jobs.py); one process per run keeps 2,000 mutants quick
OUTCOMES = ("processed", "repaired", "refused")
FAILURES = ("traceback", "hang", "partial output", "files left", "bad output", "input changed", "not one line")
REPAIR_COUNTERS = ("invalid_utf8_repaired", "control_chars_repaired", "truncated_salvaged", "unterminated_array")
GARBAGE = (b"\x00", b"\xff\xfe", b"{", b"}", b"[", b"]", b'"', b"\\", b",", b":", b"NaN", b"-", b"1e999",
           b"99999999999999999999999", b"\n", b"\x1f\x8b", b'"ph":', b"null", b"\xc3")

RANK1 = json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 9999, "world_size": 10000},
                    "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0,
                                     "dur": 1.0, "args": {"correlation": 1, "stream": 7, "device": 0}}]}).encode()
"""A valid second rank for merge."""


@dataclass(frozen=True)
class Command:
    """How to run one command on a mutant: ``run(input, workdir)`` returns
    the summary; ``output`` is what it writes in ``workdir`` (None: nothing)."""

    name: str
    run: Callable[[str, Path], dict]
    output: str | None


COMMANDS = (
    Command("inspect", lambda src, work: streamtrace.inspect(src, spool_dir=str(work / "spool"), jobs=JOBS), None),
    Command("convert", lambda src, work: streamtrace.convert(src, work / "out.json", spool_dir=str(work / "spool"), jobs=JOBS),
            "out.json"),
    Command("compact", lambda src, work: streamtrace.compact(src, work / "out.json", spool_dir=str(work / "spool"), jobs=JOBS),
            "out.json"),
    Command("merge", lambda src, work: streamtrace.merge([src, str(work.parent / "rank9999_trace.json")],
                                                         work / "out.json", spool_dir=str(work / "spool"), jobs=JOBS),
            "out.json"),
    Command("relink", lambda src, work: streamtrace.relink(src, work / "out.json", spool_dir=str(work / "spool"), jobs=JOBS),
            "out.json"),
    Command("split", lambda src, work: streamtrace.split(src, work / "split", spool_dir=str(work / "spool"), jobs=JOBS),
            "split"),
    Command("attribute", lambda src, work: streamtrace.attribute(src, work / "out.csv", spool_dir=str(work / "spool"), jobs=JOBS),
            "out.csv"),
    Command("slice", lambda src, work: streamtrace.slice_trace(src, work / "out.json", max_mb=1, spool_dir=str(work / "spool"),
                                                               jobs=JOBS), "out.json"),
    Command("analyze", lambda src, work: streamtrace.analyze(src, str(work / "tables"), spool_dir=str(work / "spool"),
                                                             jobs=JOBS), "tables"),
)


# ---- mutations -------------------------------------------------------------

def _flip_bits(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(out))
        out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(len(data))]


def _span(data: bytes, rng: random.Random) -> tuple[int, int]:
    start = rng.randrange(len(data))
    return start, min(len(data), start + rng.choice((1, 2, 7, 64, 512, 4096, 65536)))


def _delete_range(data: bytes, rng: random.Random) -> bytes:
    start, end = _span(data, rng)
    return data[:start] + data[end:]


def _duplicate_range(data: bytes, rng: random.Random) -> bytes:
    start, end = _span(data, rng)
    return data[:end] + data[start:end] + data[end:]


def _insert_garbage(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    garbage = rng.choice(GARBAGE) if rng.random() < 0.6 else rng.randbytes(rng.randint(1, 32))
    return data[:at] + garbage + data[at:]


BYTE_MUTATIONS = {
    "bit flips": _flip_bits,
    "truncation": _truncate,
    "deleted range": _delete_range,
    "duplicated range": _duplicate_range,
    "inserted garbage": _insert_garbage,
}


def _damage_frame(data: bytes, rng: random.Random) -> bytes:
    """Damage where a compressed frame keeps its structure: the header, the
    end (gzip CRC/size, zstd checksum) or the middle of the blocks."""
    out = bytearray(data)
    region = rng.choice(("head", "tail", "middle"))
    if region == "head":
        at = rng.randrange(min(18, len(out)))
    elif region == "tail":
        at = len(out) - 1 - rng.randrange(min(8, len(out)))
    else:
        at = rng.randrange(len(out))
    out[at] ^= rng.randint(1, 255)
    return bytes(out)


def _decompressed(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def make_mutant(seed: int, index: int, traces: list[tuple[str, bytes, bytes]]) -> tuple[str, bytes, str]:
    """Mutant ``index`` of run ``seed``: (its description, its bytes, the file suffix)."""
    rng = random.Random(seed * 1_000_003 + index)
    name, stored, content = rng.choice(traces)
    layer = rng.choice(("stored", "content", "content", "frame"))
    if layer == "frame":
        packer = rng.choice(("gzip", "zstd"))
        packed = gzip.compress(content, mtime=0) if packer == "gzip" else zstandard.ZstdCompressor(
            write_checksum=True).compress(content)
        return f"{name}: damaged {packer} frame", _damage_frame(packed, rng), ".json.gz"
    kind = rng.choice(tuple(BYTE_MUTATIONS))
    if layer == "stored":
        return f"{name}: {kind} (as stored)", BYTE_MUTATIONS[kind](stored, rng), ".json.gz"
    damaged = BYTE_MUTATIONS[kind](content, rng)
    store = rng.choice(("plain", "gzip", "zstd"))
    if store == "gzip":
        damaged = gzip.compress(damaged, mtime=0)
    elif store == "zstd":
        damaged = zstandard.ZstdCompressor().compress(damaged)
    return f"{name}: {kind} (in the JSON, stored {store})", damaged, ".json"


def load_traces(directory: Path, max_bytes: int) -> list[tuple[str, bytes, bytes]]:
    """(name, bytes as stored, decompressed JSON) of the real traces up to ``max_bytes`` of JSON."""
    found = []
    for path in sorted(directory.glob("*.json*")) + sorted(directory.glob("*/*.json*"))[:1]:
        stored = path.read_bytes()
        content = _decompressed(stored)
        if len(content) <= max_bytes:
            found.append((str(path.relative_to(directory)), stored, content))
    return found


# ---- running ---------------------------------------------------------------

def _output_readable(path: Path) -> bool:
    """A JSON output parses (streamed: kept top-level keys may nest deep), a CSV
    is not empty, a directory holds readable files."""
    if path.is_dir():
        return any(path.iterdir()) and all(_output_readable(item) for item in path.iterdir())
    if path.suffix == ".csv":
        return path.stat().st_size > 0
    with path.open("rb") as raw:
        handle = gzip.open(raw) if raw.read(2) == b"\x1f\x8b" else raw
        raw.seek(0)
        try:
            for _ in ijson.basic_parse(handle):
                pass
        except (ijson.JSONError, OSError, EOFError):
            return False
    return True


def _repaired(summary: object) -> bool:
    """Does the summary count a repair (any of :data:`REPAIR_COUNTERS` non-zero, at any depth)?"""
    if isinstance(summary, dict):
        return any((key in REPAIR_COUNTERS and bool(value)) or _repaired(value) for key, value in summary.items())
    if isinstance(summary, list):
        return any(_repaired(item) for item in summary)
    return False


def run_command(command: Command, mutant: Path, work: Path) -> str:
    """One command on one mutant: its outcome, or the failure it showed."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "spool").mkdir(parents=True)
    digest = hashlib.sha256(mutant.read_bytes()).digest()
    output = work / command.output if command.output else None
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
            summary = command.run(str(mutant), work)
        outcome = "repaired" if _repaired(summary) else "processed"
        if output is not None and not (output.exists() and _output_readable(output)):
            outcome = "bad output"
    except streamtrace.TraceError as exc:
        message = str(exc)
        outcome = "refused"
        if "\n" in message or str(mutant) not in message:
            outcome = f"not one line: {message[:300]}"
        elif output is not None and output.exists():
            outcome = "partial output"
    except Exception as exc:  # anything else reaches the user as a traceback
        outcome = f"traceback: {type(exc).__name__}: {str(exc)[:200]}"
    if hashlib.sha256(mutant.read_bytes()).digest() != digest:
        outcome = "input changed"
    kept = {"spool", command.output}
    leftovers = list((work / "spool").iterdir()) + [path for path in work.iterdir() if path.name not in kept]
    if leftovers and outcome in OUTCOMES:
        outcome = "files left"
    return outcome


def _worker(tasks, results, root: str) -> None:
    """Run mutants from ``tasks`` until None; report (index, {command: outcome})."""
    root_path = Path(root)
    (root_path / "work").mkdir()
    (root_path / "work" / "rank9999_trace.json").write_bytes(RANK1)  # beside the commands' directories
    while True:
        task = tasks.get()
        if task is None:
            return
        index, description, data, suffix = task
        mutant = root_path / f"rank{index}_trace{suffix}"  # merge takes the rank from the name when the trace has none
        mutant.write_bytes(data)
        outcomes = {command.name: run_command(command, mutant, root_path / "work" / command.name)
                    for command in COMMANDS}
        mutant.unlink()
        results.put((index, outcomes))


class Pool:
    """Worker processes, each with its own directory; a hung one is killed and replaced."""

    def __init__(self, workers: int, root: Path) -> None:
        self._context = multiprocessing.get_context("spawn")  # fork from a threaded parent (pytest) can deadlock
        self._root = root
        self._slots: list[dict] = [self._start(n) for n in range(workers)]

    def _start(self, n: int) -> dict:
        tasks, results = self._context.Queue(), self._context.Queue()
        directory = self._root / f"worker{n}-{time.monotonic_ns()}"
        directory.mkdir()
        process = self._context.Process(target=_worker, args=(tasks, results, str(directory)))
        process.start()
        return {"n": n, "tasks": tasks, "results": results, "process": process, "task": None, "since": 0.0}

    def run(self, mutants, on_result) -> None:
        pending = list(mutants)
        pending.reverse()
        busy = 0
        while pending or busy:
            for slot in self._slots:
                if slot["task"] is None and pending:
                    slot["task"] = pending.pop()
                    slot["since"] = time.monotonic()
                    slot["tasks"].put(slot["task"])
                    busy += 1
            time.sleep(0.005)
            for position, slot in enumerate(self._slots):
                if slot["task"] is None:
                    continue
                try:
                    index, outcomes = slot["results"].get_nowait()
                except Exception:  # queue.Empty: still working
                    if time.monotonic() - slot["since"] > TIMEOUT_SECONDS or not slot["process"].is_alive():
                        failure = "hang" if slot["process"].is_alive() else "traceback: worker died"
                        slot["process"].kill()
                        on_result(slot["task"], {command.name: failure for command in COMMANDS})
                        self._slots[position] = self._start(slot["n"])
                        busy -= 1
                    continue
                on_result(slot["task"], outcomes)
                slot["task"] = None
                busy -= 1

    def close(self) -> None:
        for slot in self._slots:
            slot["tasks"].put(None)
            slot["process"].join(timeout=5)
            if slot["process"].is_alive():
                slot["process"].kill()


def fuzz(mutants: int, seed: int, workers: int, traces_dir: Path, max_bytes: int = MAX_TRACE_BYTES,
         report: Callable[[str], None] | None = None) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Run ``mutants`` mutants; return the outcome counts per command and the failures found."""
    traces = load_traces(traces_dir, max_bytes)
    if not traces:
        raise SystemExit(f"no traces under {traces_dir}")
    counts = {command.name: {} for command in COMMANDS}
    problems: list[str] = []

    def on_result(task, outcomes: dict[str, str]) -> None:
        index, description = task[0], task[1]
        for name, outcome in outcomes.items():
            label = outcome.split(":")[0]
            counts[name][label] = counts[name].get(label, 0) + 1
            if label not in OUTCOMES:
                problems.append(f"mutant {index} ({description}), {name}: {outcome}")
        if report and (index + 1) % 100 == 0:
            report(f"{index + 1} mutants done")

    work = Path(tempfile.mkdtemp(prefix="fuzz-mutants-"))
    pool = Pool(workers, work)
    try:
        pool.run(((index, *make_mutant(seed, index, traces)) for index in range(mutants)), on_result)
    finally:
        pool.close()
        shutil.rmtree(work, ignore_errors=True)
    return counts, problems


def table(counts: dict[str, dict[str, int]]) -> str:
    columns = OUTCOMES + FAILURES
    lines = ["| command | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, found in counts.items():
        lines.append(f"| {name} | " + " | ".join(str(found.get(label, 0)) for label in columns) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--max-bytes", type=int, default=MAX_TRACE_BYTES,
                        help="skip real traces with more JSON bytes than this")
    args = parser.parse_args()
    started = time.perf_counter()
    counts, problems = fuzz(args.mutants, args.seed, args.workers, args.traces, args.max_bytes,
                            report=lambda text: print(text, file=sys.stderr, flush=True))
    print(table(counts))
    print(f"\n{args.mutants} mutants (seed {args.seed}) in {time.perf_counter() - started:.0f} s")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
