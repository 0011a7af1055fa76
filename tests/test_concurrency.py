"""Several runs at once: two writing the same output path, several sharing
one --spool-dir, and a spool filesystem that fills up while the output's
has room."""
from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from badinputs.matrix import CLI, cli_env, files_under
from conftest import TRACES, load_json
from test_faults import FullDisk

from streamtrace import cli

TRACE = TRACES / "nccl_rank0.json.gz"  # 9.8 MB of JSON: a run takes about a second


@pytest.fixture(scope="module")
def two_traces(tmp_path_factory) -> tuple[Path, Path]:
    """TRACE, and the same events under another top-level key set (so the outputs differ)."""
    directory = tmp_path_factory.mktemp("inputs")
    first, second = directory / "a.json.gz", directory / "b.json.gz"
    first.write_bytes(TRACE.read_bytes())
    document = load_json(TRACE)
    document["runMarker"] = "b"
    second.write_bytes(gzip.compress(json.dumps(document).encode(), compresslevel=1))
    return first, second


def start(argv: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *argv, "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
                            **kwargs)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=120)
    return process.returncode, err.decode()


@pytest.mark.slow
def test_two_runs_writing_one_output_leave_one_complete_trace(two_traces, tmp_path):
    """With --overwrite both succeed and the later rename wins; whenever the
    path exists (checked all along) it holds one whole trace, one of the two."""
    out = tmp_path / "out.json"
    expected = {}
    for name, trace in zip("ab", two_traces):
        assert cli.main(["convert", str(trace), str(tmp_path / f"{name}.json"), "-q"]) == 0
        expected[(tmp_path / f"{name}.json").read_bytes()] = name
    runs = [start(["convert", str(trace), str(out), "--overwrite"]) for trace in two_traces]
    seen = set()
    while any(run.poll() is None for run in runs):
        try:
            content = out.read_bytes()
        except FileNotFoundError:
            continue
        assert content in expected, "the output path held something other than one complete trace"
        seen.add(expected[content])
        time.sleep(0.01)
    assert [finish(run) for run in runs] == [(0, ""), (0, "")]
    assert out.read_bytes() in expected
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "out.json"]  # no temporary file left


def test_two_runs_without_overwrite_exactly_one_writes(two_traces, tmp_path):
    """Without --overwrite the output is published by a hard link, which
    fails if the name exists: one run writes, the other is refused in one
    line and leaves nothing."""
    out = tmp_path / "out.json"
    runs = [start(["convert", str(trace), str(out)]) for trace in two_traces]
    results = sorted(finish(run) for run in runs)
    assert results[0] == (0, "")
    status, err = results[1]
    assert status == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"streamtrace: error: {out}: ")
    assert "pass --overwrite to replace it" in err  # "exists" or "appeared while this run was writing it"
    assert os.listdir(tmp_path) == ["out.json"]
    assert json.loads(out.read_bytes())["traceEvents"]


@pytest.mark.slow
def test_runs_sharing_one_spool_dir(two_traces, tmp_path):
    """Four runs at once with one --spool-dir (event spools, a piped input's
    copy, pass-2 workers), one of them failing: each good output equals the
    same run done alone, the failure is one line, the spool dir ends empty."""
    spool = tmp_path / "spool"
    spool.mkdir()
    first, second = two_traces
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    alone = tmp_path / "alone"
    alone.mkdir()
    for command, name, trace in (("compact", "a", first), ("compact", "b", second), ("relink", "r", first)):
        assert cli.main([command, str(trace), "-o", str(alone / f"{name}.json.gz"), "-q", "-j", "1"]) == 0
    with open(second, "rb") as piped:
        runs = [start(["compact", str(first), "-o", str(tmp_path / "a.json.gz"), "--spool-dir", str(spool), "-j", "2"]),
                start(["compact", "-", "-o", str(tmp_path / "b.json.gz"), "--spool-dir", str(spool), "-j", "1"],
                      stdin=piped),
                start(["compact", str(cut), "-o", str(tmp_path / "cut_out.json.gz"), "--spool-dir", str(spool)]),
                start(["relink", str(first), "-o", str(tmp_path / "r.json.gz"), "--spool-dir", str(spool), "-j", "2"])]
        results = [finish(run) for run in runs]
    assert results[0] == (0, "") and results[1] == (0, "") and results[3] == (0, ""), results
    status, err = results[2]
    assert status == 1 and err.startswith(f"streamtrace: error: {cut}: ") and len(err.splitlines()) == 1, err
    for name in ("a", "b", "r"):
        assert (tmp_path / f"{name}.json.gz").read_bytes() == (alone / f"{name}.json.gz").read_bytes()
    assert os.listdir(spool) == []
    assert not (tmp_path / "cut_out.json.gz").exists()


@pytest.mark.parametrize("room", [0, 256 << 10], ids=["full", "fills-mid-run"])
@pytest.mark.parametrize("piped", [False, True], ids=["file", "stdin"])
@pytest.mark.parametrize("jobs", ["1", "2"], ids=lambda n: f"j{n}")
def test_full_spool_filesystem_stops_the_run_cleanly(room, piped, jobs, two_traces, tmp_path, monkeypatch, capsys):
    """Only files in the spool dir (the event spool, a piped input's copy)
    hit ENOSPC; the output's directory has room: one line naming the spool
    file and saying the disk is full, exit 1, no output, the spool dir empty."""
    spool, out_dir = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    out_dir.mkdir()
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        in_spool = os.readlink(f"/proc/self/fd/{fd}").startswith(str(spool))
        return FullDisk(handle, room) if "w" in mode and in_spool else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
    source = str(two_traces[0])
    if piped:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(two_traces[0].read_bytes())))
        source = "-"
    out = out_dir / "view.json.gz"
    saved = signal.getsignal(signal.SIGTERM)
    try:
        status = cli.main(["compact", source, "-o", str(out), "--spool-dir", str(spool), "-q", "-j", jobs])
    finally:
        signal.signal(signal.SIGTERM, saved)
    lines = capsys.readouterr().err.splitlines()
    assert status == 1 and len(lines) == 1, lines
    assert re.fullmatch(f"streamtrace: error: {re.escape(str(spool))}/streamtrace-[a-z]+-[^/:]+: disk full while writing "
                        "a temporary file; give --spool-dir a directory on a filesystem with room", lines[0]), lines[0]
    assert files_under(tmp_path) == [] and not out.exists()
