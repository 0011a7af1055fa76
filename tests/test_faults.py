"""Faults around a good input, for every command of the matrix table
(tests/badinputs/matrix.py): signals mid-run, a reader closing the pipe, an
output directory that cannot be written, a full disk.  Each must end cleanly:
no traceback, no output or partial file, no spool left, no process left
running, input unchanged; in one process (-j 1) and with a parse child and
pass-2 workers (-j 2)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from badinputs.matrix import CLI, COMMANDS, Command, available, cli_env, command_line, files_under
from conftest import TRACES, events_of, load_json

from streamtrace import cli
from streamtrace.engine import indexworkers
from streamtrace.io import parseproc

OUTPUT_COMMANDS = [command for command in COMMANDS if command.output_name]
STDOUT_COMMANDS = [command for command in COMMANDS if command.stdout_argv]
JOBS = pytest.mark.parametrize("jobs", ["1", "2"], ids=lambda n: f"j{n}")


def needs(command: Command) -> None:
    if not available(command.name):
        pytest.skip(f"'{command.name}' is not on this branch yet")


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    """A 69 MB plain trace (a real one, eight times over): every command takes seconds on it."""
    events = events_of(load_json(TRACES / "nccl_rank0.json.gz"))
    path = tmp_path_factory.mktemp("big") / "rank0_big.json"  # merge reads the rank from the name
    body = json.dumps(events)[1:-1].encode()
    with open(path, "wb") as handle:
        handle.write(b'{"traceEvents": [' + b",".join([body] * 8) + b"]}")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def family(pid: int) -> list[int]:
    """``pid`` and its descendants (a command may parse in a child process)."""
    pids, found = [pid], 0
    while found < len(pids):
        current = pids[found]
        found += 1
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pids.extend(int(child) for child in children.read().split())
        except OSError:
            continue
    return pids


def assert_gone(pids: list[int]) -> None:
    """The parse child and pass-2 workers of a stopped run end with it."""
    deadline = time.time() + 10
    while True:
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]
        if not alive:
            return
        assert time.time() < deadline, f"helper processes {alive} outlived the run"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def has_open(pid: int, path: Path) -> bool:
    """Has the process (or a child of it) opened ``path``, so the run is under way?"""
    for member in family(pid):
        try:
            links = [os.readlink(f"/proc/{member}/fd/{fd}") for fd in os.listdir(f"/proc/{member}/fd")]
        except OSError:
            continue
        if str(path) in links:
            return True
    return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see when the run is under way")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
@JOBS
def test_signal_mid_run_leaves_nothing(command, signum, jobs, big_trace, tmp_path):
    needs(command)
    before = digest(big_trace)
    argv, output, spool = command_line(command, big_trace, tmp_path)
    inputs_before = files_under(tmp_path)
    process = subprocess.Popen([*CLI, *argv, "-j", jobs], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=cli_env())
    deadline = time.time() + 30
    while not has_open(process.pid, big_trace):
        assert process.poll() is None and time.time() < deadline, "the command never opened its input"
        time.sleep(0.01)
    time.sleep(0.3)
    helpers = family(process.pid)[1:]
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert_gone(helpers)
    assert process.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), stderr
    assert output is None or not output.exists()
    assert digest(big_trace) == before
    if signum != signal.SIGKILL:  # SIGKILL allows no cleanup: only the promise that OUT never appears holds
        assert stderr.decode().splitlines() == ["streamtrace: interrupted; no output written"]
        assert files_under(tmp_path) == inputs_before
        assert os.listdir(spool) == []


@pytest.mark.parametrize("command", STDOUT_COMMANDS, ids=lambda c: c.name)
@JOBS
def test_reader_closing_the_pipe_stops_quietly(command, jobs, big_trace, tmp_path):
    """``streamtrace ... - | head -c 100``: no traceback, no spool, exit 1 when output was cut."""
    needs(command)
    argv, _, spool = command_line(command, big_trace, tmp_path, to_stdout=True)
    inputs_before = files_under(tmp_path)
    process = subprocess.Popen([*CLI, *argv, "-j", jobs], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=cli_env())
    head = process.stdout.read(100)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    process.wait(timeout=60)
    assert len(head) == 100
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    small_output = command.name == "inspect"  # its table fits in the pipe buffer: it may finish first
    assert process.returncode in ((0, 1) if small_output else (1,)), stderr
    assert os.listdir(spool) == []
    assert files_under(tmp_path) == inputs_before


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Make ``directory`` unwritable for this user: read-only mode, or for root
    (who writes anyway) the immutable attribute."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a filesystem without chattr +i: no way to lock a directory")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=lambda c: c.name)
def test_unwritable_output_directory_is_one_line(command, tmp_path):
    needs(command)
    trace = tmp_path / "trace.json"
    shutil.copy(TRACES / "kineto_small.json", trace)
    target_dir = tmp_path / "locked"
    target_dir.mkdir()
    argv, output, spool = command_line(command, trace, tmp_path, output_dir=target_dir)
    with locked(target_dir):
        result = subprocess.run([*CLI, *argv], capture_output=True, env=cli_env(), timeout=60)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert str(output) in lines[0] and "not writable" in lines[0]
    assert os.listdir(target_dir) == [] and os.listdir(spool) == []


class FullDisk:
    """A file whose disk fills up after ``room`` bytes: writes then raise ENOSPC."""

    def __init__(self, inner, room: int) -> None:
        self._inner, self._room = inner, room

    def write(self, data) -> int:
        self._room -= len(data)
        if self._room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._inner.write(data)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __enter__(self) -> "FullDisk":
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


@pytest.mark.parametrize("room", [0, 64 << 10], ids=["full", "fills-mid-run"])
@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=lambda c: c.name)
@JOBS
def test_full_disk_is_one_line_and_leaves_nothing(command, room, jobs, tmp_path, monkeypatch, capsys):
    """Every file opened for writing (output and spools alike) hits ENOSPC."""
    needs(command)
    trace = tmp_path / "trace.json.gz"
    shutil.copy(TRACES / "nccl_rank0.json.gz", trace)
    before = digest(trace)
    argv, output, spool = command_line(command, trace, tmp_path)
    argv += ["-j", jobs]
    if room and command.small_outputs:
        room = 4 << 10
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # -j 2: pass-1 workers or the parse child even on this small file
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 16 << 10)
    inputs_before = files_under(tmp_path)
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        return FullDisk(handle, room) if "w" in mode else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
    with cli_signal_handlers():
        status = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert status == 1 and len(lines) == 1, err
    assert "No space left" in lines[0] or "disk full" in lines[0]
    assert not output.exists()
    assert files_under(tmp_path) == inputs_before and os.listdir(spool) == []
    assert digest(trace) == before


@contextmanager
def cli_signal_handlers() -> Iterator[None]:
    """The CLI's signal handlers while the block runs; this process's own after."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_worker_signalled_before_it_sets_its_own_handlers_ends_quietly(signum, capfd):
    """The run stops just as a worker starts: the worker still has the CLI's
    handlers, which end it at once, without a traceback (the parent reports)."""
    import multiprocessing

    with cli_signal_handlers():
        cli.install_signal_handlers()
        worker = multiprocessing.get_context("fork").Process(target=lambda: os.kill(os.getpid(), signum))
        worker.start()
        worker.join(30)
    assert worker.exitcode == 128 + signum
    assert capfd.readouterr().err == ""
