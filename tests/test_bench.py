"""scripts/bench.py: its ratios and fault counts, and a run stopped by SIGTERM
leaves neither its child nor its scratch directory behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import bench
import pytest
from conftest import ROOT, TRACES

BENCH = str(ROOT / "scripts" / "bench.py")


def _run(seconds: float, *, cpu: float = 1.0, sys_cpu: float = 0.0, faults: int = 0) -> dict:
    return {"seconds": seconds, "cpu_seconds": cpu, "sys_cpu_seconds": sys_cpu, "page_faults": faults,
            "main_cpu_seconds": cpu, "peak_rss_mb": 10.0, "tree_rss_mb": 10.0, "tree_pss_mb": 10.0, "stdout": "7\n"}


def test_ratios_to_the_yardstick_and_to_its_user_time(tmp_path):
    """Round by round: the command's wall time over the yardstick's wall time,
    and over the yardstick's user time alone (its CPU time less the kernel's)."""
    (tmp_path / "in.json").write_bytes(b"[]")
    args = Namespace(label="", inputs=[str(tmp_path / "in.json")], rounds=3)
    runs = [_run(2.0), _run(3.0), _run(1.0)]
    orjson = [_run(4.0, cpu=3.0, sys_cpu=2.0, faults=1000),  # user 1.0 s
              _run(6.0, cpu=5.0, sys_cpu=2.0, faults=500),  # user 3.0 s
              _run(4.0, cpu=2.5, sys_cpu=0.5, faults=250)]  # user 2.0 s
    report = bench.report_for(["streamtrace", "inspect"], runs, {"orjson": orjson}, args, runs)
    assert report["ratio_to_orjson"] == {"median": 0.5, "min": 0.25, "max": 0.5}  # 2/4, 3/6, 1/4
    assert report["ratio_to_orjson_user_time"] == {"median": 1.0, "min": 0.5, "max": 2.0}  # 2/1, 3/3, 1/2
    assert report["orjson_user_cpu_seconds"] == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert report["orjson_page_faults"] == {"median": 500, "min": 250, "max": 1000}
    assert report["orjson_sys_microseconds_per_fault"] == {"median": 2000.0, "min": 2000.0, "max": 4000.0}


def test_a_real_run_counts_the_yardsticks_page_faults(tmp_path):
    trace = TRACES / "kineto_small.json"
    command = [sys.executable, "-m", "streamtrace", "inspect", "{input}", "--json", "-q"]
    done = subprocess.run([sys.executable, BENCH, str(trace), "--rounds", "1", "--yardsticks", "orjson", "--", *command],
                          capture_output=True, text=True, check=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    report = json.loads(done.stdout)
    assert report["orjson_events"] == len(json.loads(trace.read_text())["traceEvents"])
    assert report["orjson_page_faults"]["median"] > 0 and report["command_page_faults"]["median"] > 0
    # the yardstick runs on one thread: its user time is at most its wall time
    assert report["ratio_to_orjson_user_time"]["median"] >= report["ratio_to_orjson"]["median"]
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_sigterm_stops_the_child_and_removes_the_scratch_directory(tmp_path):
    child = "import os, sys, time; open(sys.argv[1] + '/pid', 'w').write(str(os.getpid())); time.sleep(120)"
    trace = TRACES / "kineto_small.json"
    process = subprocess.Popen([sys.executable, BENCH, str(trace), "--rounds", "1", "--yardsticks", "",
                                "--", sys.executable, "-c", child, "{tmp}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    pid_files: list[Path] = []
    while not pid_files and time.monotonic() < deadline:
        time.sleep(0.1)
        pid_files = [path for path in tmp_path.glob("streamtrace-bench-*/pid") if path.read_text()]
    assert pid_files, "the child did not start"
    pid = int(pid_files[0].read_text())
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not list(tmp_path.iterdir())


def test_a_large_summary_does_not_raise_the_next_commands_peak(tmp_path):
    """A child reports the bench process's high-water mark as its own peak (it shares it until its exec): a
    command printing 80 MB must not make the next one look 80 MB larger; the timing fields are still read."""
    trace = TRACES / "kineto_small.json"
    large = ("import sys; sys.stdout.write('{\"rows\": [' + ','.join(['12345678'] * 9_000_000) + '], "
             "\"wall_seconds\": 1.5}')")
    done = subprocess.run([sys.executable, BENCH, str(trace), "--rounds", "1", "--yardsticks", "",
                           "--", sys.executable, "-c", large, "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, check=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    first, second = json.loads(done.stdout)
    assert first["command_wall_seconds"]["median"] == 1.5
    assert second["command_peak_rss_mb"] < 60, second["command_peak_rss_mb"]
