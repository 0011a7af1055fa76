#!/usr/bin/env python3
"""Time a streamtrace command against the floor: a bare ijson pass.

Both run as child processes in the same invocation, alternating (floor,
command, floor, command, ...), so each pair ran under the same machine
conditions; ``ratio_median_of_pairs`` is the figure to quote on a noisy
machine, ``ratio_to_floor`` compares the fastest of each.  Peak RSS comes from
wait4 per child.

    python scripts/bench.py big.json.gz -- streamtrace inspect {input} --json
    python scripts/bench.py big.json.gz --repeat 3 -- streamtrace convert {input} {tmp}/out.json.zst

``{input}`` is replaced by the (first) input, ``{inputs}`` by all of them,
``{tmp}`` by a fresh temporary directory (deleted afterwards).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

FLOOR_CODE = """
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
        print("floor: integers beyond 64 bits, exact mode", file=sys.stderr)
        total += count(path, False)
print(total)
"""


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


def run_child(argv: list[str]) -> tuple[float, float, str, float, float]:
    """Wall seconds, peak RSS in MB (the largest single process), stdout, and
    the peaks of the whole process tree's RSS and PSS summed (sampled every
    0.1 s: a command may use worker processes)."""
    started = time.perf_counter()
    tree_peak = [0.0, 0.0]
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                tree_peak[:] = map(max, tree_peak, tree_memory_mb(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr = process.stderr.read().decode(errors="replace")
        process.stderr.close()
        if process.returncode != 0:
            raise SystemExit(f"bench: {shlex.join(argv)} failed ({process.returncode}): {stderr.strip()[-500:]}")
        out.seek(0)
        return elapsed, usage.ru_maxrss / 1024, out.read().decode(errors="replace"), *tree_peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="trace file(s) the command reads")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts (default 1)")
    parser.add_argument("--label", default="", help="name for this measurement in the report")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the command to time after --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    floor_argv = [sys.executable, "-c", FLOOR_CODE.format(root=root), *args.inputs]
    floor_runs, command_runs = [], []
    for _ in range(args.repeat):
        floor_runs.append(run_child(floor_argv))
        scratch = tempfile.mkdtemp(prefix="streamtrace-bench-")
        try:
            argv = [part.replace("{input}", args.inputs[0]).replace("{tmp}", scratch) for part in command]
            if "{inputs}" in argv:
                at = argv.index("{inputs}")
                argv[at:at + 1] = args.inputs
            command_runs.append(run_child(argv))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    floor = min(floor_runs)
    best = min(command_runs)
    report = {
        "label": args.label or " ".join(command[:2]),
        "inputs": args.inputs,
        "input_bytes": sum(os.path.getsize(p) for p in args.inputs),
        "events": int(floor[2].strip() or 0),
        "floor_seconds": round(floor[0], 2),
        "floor_peak_rss_mb": round(max(run[1] for run in floor_runs), 1),
        "command": shlex.join(command),
        "command_seconds": round(best[0], 2),
        "command_peak_rss_mb": round(max(run[1] for run in command_runs), 1),
        "command_process_tree_peak_rss_mb": round(max(run[3] for run in command_runs), 1),
        "command_process_tree_peak_pss_mb": round(max(run[4] for run in command_runs), 1),
        "ratio_to_floor": round(best[0] / floor[0], 2),
        "ratio_per_pair": [round(command[0] / bare[0], 2) for bare, command in zip(floor_runs, command_runs)],
        "ratio_median_of_pairs": round(statistics.median(c[0] / f[0] for f, c in zip(floor_runs, command_runs)), 2),
        "repeat": args.repeat,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
