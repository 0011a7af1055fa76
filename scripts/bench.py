#!/usr/bin/env python3
"""Time a streamtrace command against yardsticks, in alternating rounds.

Yardsticks (each a child process over the same input):

- ``ijson``: a bare ``ijson.items(..., "traceEvents.item")`` pass, the
  cheapest way to stream every event;
- ``orjson``: ``orjson.loads`` of the whole decompressed document, what
  in-memory tools do (time and peak RSS), with the garbage collector off:
  the fastest that approach can be;
- ``scan``: msgspec scanning the whole document in C, keeping each event
  as its raw bytes (no Python object per field): the physical limit of
  any reading that looks at every byte once (not run unless asked).

Each round runs every yardstick and then the command, so the ratios of one
round were measured under the same machine conditions; the figures to quote
are the medians of the per-round ratios (with min and max), on a noisy
machine as well as a quiet one.  Peak RSS comes from wait4 per child; the
command's whole process tree (workers included) is sampled for RSS and PSS
(PSS splits pages that forked processes share), all in MiB.  When the command prints a
JSON summary with ``pass1_seconds`` / ``plan_seconds`` / ``wall_seconds``,
their medians are reported too.

Every run's page faults are counted, and for each yardstick its user time
(CPU time less the kernel's) and the kernel's time per fault: ``orjson``
hands gigabytes of fresh memory to the process, and what a fault costs
varies with the machine far more than the parse does (several microseconds
on a virtual machine, and from run to run there).  So each command gets a second
ratio per round, ``ratio_to_NAME_user_time``: its wall time over the
yardstick's user time, as if the yardstick's page faults cost nothing.
A run stopped by SIGTERM or Ctrl-C stops its child and removes its scratch
directory.

    python scripts/bench.py big.json -- streamtrace inspect {input} --json -j 2
    python scripts/bench.py big.json --rounds 5 -- streamtrace compact {input} -o {tmp}/out.json.gz -q -j 1

Several commands, each after its own ``--``, share the yardstick runs of a
round (one report per command; each after the first also gets its per-round
ratio to the first, e.g. a command against ``inspect`` of the same input):

    python scripts/bench.py big.json -- streamtrace relink {input} -o {tmp}/o.json.gz -q -j 1 \
        -- streamtrace relink {input} -o {tmp}/o.json.gz -q -j 2

``{input}`` is replaced by the (first) input, ``{inputs}`` by all of them,
``{tmp}`` by a fresh temporary directory (deleted after each run).

Before the rounds, the ``streamtrace`` package that commands run from this
working directory import is byte-compiled, as pip does when it installs a
wheel: where the environment sets PYTHONDONTWRITEBYTECODE, every run would
otherwise compile it again (about a third of a second here); and the inputs
are read once, so that the first round does not read them from the disk
(where the system pages out files left idle, a minute is enough).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import BinaryIO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IJSON_CODE = """
import sys, ijson
sys.path.insert(0, {root!r})
from streamtrace.io.source import InputSource
class Plain:
    def __init__(self, stream): self.stream = stream
    def read(self, size): return self.stream.read(size) if size else b""
def count(path, use_float):
    with InputSource(path) as source:
        return sum(1 for _ in ijson.items(Plain(source.open()), "traceEvents.item", use_float=use_float))
total = 0
for path in sys.argv[1:]:
    try:
        total += count(path, True)
    except ijson.JSONError as exc:
        if "overflow" not in str(exc):
            raise
        total += count(path, False)
print(total)
"""
ORJSON_CODE = """
import gc, sys, orjson
gc.disable()  # the fastest an in-memory load can be: with the collector on it takes 2-3x longer at 1 GB
sys.path.insert(0, {root!r})
from streamtrace.io.source import InputSource
total = 0
for path in sys.argv[1:]:
    with InputSource(path) as source:
        stream = source.open()
        document = orjson.loads(b"".join(iter(lambda: stream.read(1 << 24), b"")))
    total += len(document["traceEvents"] if isinstance(document, dict) else document)
    del document
print(total)
"""
SCAN_CODE = """
import sys, msgspec
sys.path.insert(0, {root!r})
from streamtrace.io.source import InputSource
class Document(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
decoder = msgspec.json.Decoder(Document)
total = 0
for path in sys.argv[1:]:
    with InputSource(path) as source:
        stream = source.open()
        total += len(decoder.decode(b"".join(iter(lambda: stream.read(1 << 24), b""))).traceEvents)
print(total)
"""
YARDSTICKS = {"ijson": IJSON_CODE, "orjson": ORJSON_CODE, "scan": SCAN_CODE}
ONE_THREAD = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""A yardstick's environment: numpy's BLAS would start a thread per core at import, whose start-up alone
takes more CPU time than wall time on a small input; a yardstick is one thread."""
PHASES = ("pass1_seconds", "plan_seconds", "wall_seconds")
SMALL_OUTPUT = 1 << 20  # a child's stdout kept whole up to this size (a yardstick's count of events)


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """Resident memory of a process and all its descendants, now (Linux
    /proc): RSS summed (pages shared by forked processes count in each) and
    PSS summed (shared pages split between their sharers: the real total)."""
    rss = pss = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                rss += next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{current}/smaps_rollup") as rollup:
                pss += next((int(line.split()[1]) for line in rollup if line.startswith("Pss:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            continue
    return rss / 1024, pss / 1024


def own_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process alone, not its children (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def run_child(argv: list[str], env: dict[str, str] | None = None) -> dict:
    """Wall seconds, the largest single process's peak RSS (MiB), stdout, and
    the whole process tree's peak RSS and PSS (sampled every 0.2 s); the main
    process's own CPU time is sampled too, so it may be short by what that
    process spent in its last 0.2 s."""
    started = time.perf_counter()
    tree_peak = [0.0, 0.0]
    main_cpu = [0.0]
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, env=env)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                tree_peak[:] = map(max, tree_peak, tree_memory_mb(process.pid))
                main_cpu[0] = max(main_cpu[0], own_cpu_seconds(process.pid) or 0.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:  # stopped (Ctrl-C, SIGTERM): the child stops too, cleaning up as it does on SIGTERM
            stop_child(process)
            raise
        finally:
            done.set()
            sampler.join()
        elapsed = time.perf_counter() - started
        stderr = process.stderr.read().decode(errors="replace")
        process.stderr.close()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"bench: {shlex.join(argv)} failed ({code}): {stderr.strip()[-500:]}")
        size = out.seek(0, os.SEEK_END)
        out.seek(0)
        found = out.read().decode(errors="replace") if size <= SMALL_OUTPUT else ""
        out.seek(0)
        return {"seconds": elapsed, "peak_rss_mb": usage.ru_maxrss / 1024, "stdout": found, "phases": phases(out),
                "tree_rss_mb": tree_peak[0], "tree_pss_mb": tree_peak[1],
                # the child's own CPU time plus that of every descendant it reaped (its workers)
                "cpu_seconds": usage.ru_utime + usage.ru_stime, "sys_cpu_seconds": usage.ru_stime,
                "main_cpu_seconds": main_cpu[0], "page_faults": usage.ru_minflt + usage.ru_majflt}


def stop_child(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s: a streamtrace command removes its
    spool and partial output on SIGTERM, as it does on Ctrl-C."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit, so that the running child is stopped
    and the scratch directory removed (``finally`` does not run when the
    default action kills the process)."""
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))


CALIBRATION_CODE = "sum(i * i % 7 for i in range(3_000_000))"
"""A fixed pure-Python loop: its time says how fast this machine runs the interpreter, so a reader on
another machine can tell a slower CPU from a slower program."""


def calibration_seconds() -> float:
    """The best of three timings of the calibration loop, in this process."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        exec(CALIBRATION_CODE)
        best = min(best, time.perf_counter() - started)
    return best


def cpu_model() -> str:
    """The processor's name as the kernel reports it (Linux), else the platform's."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def spread(values: list[float], digits: int = 2) -> dict:
    """Median, min and max: the figures to quote on a noisy machine."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def phases(stdout: BinaryIO) -> dict:
    """The timing fields of the command's JSON summary, if it printed one, read as a stream: a summary with
    large tables never sits in this process, whose high-water mark every child started later would report as
    its own peak (a child inherits it until its exec)."""
    import ijson

    found = {}
    try:
        for key, event, value in ijson.parse(stdout):
            if key in PHASES and event == "number":
                found[key] = float(value)
    except (ijson.JSONError, ijson.IncompleteJSONError, ValueError):
        return {}
    return found


def command_lines(argv: list[str]) -> tuple[list[str], list[list[str]]]:
    """The options before the first ``--`` and each command after one."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    commands: list[list[str]] = [[]]
    for part in argv[split + 1:]:
        if part == "--":
            commands.append([])
        else:
            commands[-1].append(part)
    return argv[:split], commands


def byte_compile_streamtrace() -> str:
    """Byte-compile the streamtrace package a child started here imports; its directory."""
    code = ("import compileall, os, streamtrace; folder = os.path.dirname(streamtrace.__file__); "
            "compileall.compile_dir(folder, quiet=1); print(folder)")
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def read_through(paths: list[str]) -> None:
    """Read the files once, into the page cache, as every round after the first finds them."""
    for path in paths:
        with open(path, "rb") as file:
            while file.read(8 << 20):
                pass


def run_command(command: list[str], inputs: list[str]) -> dict:
    """One run of ``command`` with its placeholders filled in."""
    scratch = tempfile.mkdtemp(prefix="streamtrace-bench-")
    try:
        argv = [part.replace("{input}", inputs[0]).replace("{tmp}", scratch) for part in command]
        if "{inputs}" in argv:
            at = argv.index("{inputs}")
            argv[at:at + 1] = inputs
        return run_child(argv)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report_for(command: list[str], runs: list[dict], yardstick_runs: dict[str, list[dict]], args,
               first: list[dict]) -> dict:
    report: dict = {
        "label": args.label or " ".join(command[:2]),
        "inputs": args.inputs,
        "input_bytes": sum(os.path.getsize(p) for p in args.inputs),
        "cpus": len(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "command": shlex.join(command),
        "command_seconds": spread([run["seconds"] for run in runs]),
        "command_seconds_each": [round(run["seconds"], 2) for run in runs],  # round by round, beside the yardsticks'
        "command_cpu_seconds": spread([run["cpu_seconds"] for run in runs]),
        "command_sys_cpu_seconds": spread([run["sys_cpu_seconds"] for run in runs]),
        "command_page_faults": spread([run["page_faults"] for run in runs], 0),
        # the share of the CPU time spent in the main process (reading, cutting chunks, joining, writing)
        "command_main_process_cpu_share": spread([run["main_cpu_seconds"] / max(run["cpu_seconds"], 1e-9) for run in runs]),
        "command_peak_rss_mb": round(max(run["peak_rss_mb"] for run in runs), 1),
        "command_tree_peak_rss_mb": round(max(run["tree_rss_mb"] for run in runs), 1),
        "command_tree_peak_pss_mb": round(max(run["tree_pss_mb"] for run in runs), 1),
    }
    breakdown = [run.get("phases", {}) for run in runs]
    for key in PHASES:
        values = [found[key] for found in breakdown if key in found]
        if len(values) == len(runs):
            report[f"command_{key}"] = spread(values)
    for name, theirs in yardstick_runs.items():
        report[f"{name}_events"] = int(theirs[0]["stdout"].strip() or 0)
        report[f"{name}_seconds"] = spread([run["seconds"] for run in theirs])
        report[f"{name}_seconds_each"] = [round(run["seconds"], 2) for run in theirs]
        report[f"{name}_sys_cpu_seconds_each"] = [round(run["sys_cpu_seconds"], 2) for run in theirs]
        report[f"{name}_cpu_seconds"] = spread([run["cpu_seconds"] for run in theirs])
        # the kernel's part: for orjson mostly page faults for its gigabytes, which vary from run to run
        report[f"{name}_sys_cpu_seconds"] = spread([run["sys_cpu_seconds"] for run in theirs])
        # the user part: for orjson steady while memory is as fast as usual (2.2-2.8 s for 0.5 GB here), up to three
        # times that while it is slow
        report[f"{name}_user_cpu_seconds"] = spread([user_seconds(run) for run in theirs])
        # what a page fault costs sets the kernel's part: on this virtual machine several microseconds, on bare
        # metal a fraction of one
        report[f"{name}_page_faults"] = spread([run["page_faults"] for run in theirs], 0)
        report[f"{name}_sys_microseconds_per_fault"] = spread([1e6 * run["sys_cpu_seconds"] / max(run["page_faults"], 1)
                                                               for run in theirs])
        report[f"{name}_peak_rss_mb"] = round(max(run["peak_rss_mb"] for run in theirs), 1)
        report[f"ratio_to_{name}"] = spread([mine["seconds"] / other["seconds"] for other, mine in zip(theirs, runs)])
        # against the yardstick's user time alone: as if its page faults cost nothing, the strictest reading
        # and the one that depends least on the machine's memory
        report[f"ratio_to_{name}_user_time"] = spread([mine["seconds"] / max(user_seconds(other), 1e-9)
                                                       for other, mine in zip(theirs, runs)])
    if first is not runs:  # the same round's run of the first command: pairs measured under the same load
        report["ratio_to_first_command"] = spread([mine["seconds"] / other["seconds"]
                                                   for other, mine in zip(first, runs)])
    return report


def user_seconds(run: dict) -> float:
    """A run's CPU time less the kernel's: for a yardstick, the parse without its page faults."""
    return run["cpu_seconds"] - run["sys_cpu_seconds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="trace file(s) the command reads")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of yardsticks + commands (default 5)")
    parser.add_argument("--yardsticks", default="ijson,orjson",
                        help="comma-separated, from: ijson, orjson, scan (default ijson,orjson; '' for none)")
    parser.add_argument("--label", default="", help="name for this measurement in the report")
    options, commands = command_lines(sys.argv[1:])
    args = parser.parse_args(options)
    if not commands or not all(commands):
        parser.error("give each command to time after --")
    chosen = [name for name in args.yardsticks.split(",") if name]
    unknown = set(chosen) - set(YARDSTICKS)
    if unknown:
        parser.error(f"unknown yardstick(s): {', '.join(sorted(unknown))}")
    stop_on_sigterm()
    machine = {"cpu_model": cpu_model(), "streamtrace_compiled": byte_compile_streamtrace(),
               "calibration_seconds_before": round(calibration_seconds(), 3)}
    read_through(args.inputs)
    yardstick_runs: dict[str, list[dict]] = {name: [] for name in chosen}
    command_runs: list[list[dict]] = [[] for _ in commands]
    for _ in range(args.rounds):
        for name in chosen:
            code = YARDSTICKS[name].format(root=ROOT)
            yardstick_runs[name].append(run_child([sys.executable, "-c", code, *args.inputs], ONE_THREAD))
        for command, runs in zip(commands, command_runs):
            runs.append(run_command(command, args.inputs))
    machine["calibration_seconds_after"] = round(calibration_seconds(), 3)
    machine["load_average"] = [round(load, 2) for load in os.getloadavg()]
    reports = [{"machine": machine, **report_for(command, runs, yardstick_runs, args, command_runs[0])}
               for command, runs in zip(commands, command_runs)]
    print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
