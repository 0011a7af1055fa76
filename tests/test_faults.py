"""Faults around a good input, for every command of the matrix table
(tests/badinputs/matrix.py): signals mid-run, a reader closing the pipe, an
output directory that cannot be written, a full disk.  Each must end cleanly:
no traceback, no output or partial file, no spool left, no process left
running, input unchanged; in one process (-j 1) and with a parse child and
pass-2 workers (-j 2).  Then runs with workers signalled at chosen moments
(``interrupt_at.py``): merge's per-rank tasks and batch runs, range
workers, the parse child and pass-2 workers; SIGINT and SIGTERM to the
process and to its process group, and a worker killed outright."""
from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from badinputs.matrix import CLI, COMMANDS, Command, available, cli_env, command_line, files_under
from conftest import TRACES, all_but_first_slow, events_of, load_json

from streamtrace import cli
from streamtrace.cli import signals
from streamtrace.engine import indexworkers, parseproc
from streamtrace.engine import parallel as parallel_module
from streamtrace.io import spool as spool_module
from streamtrace.synth import SynthConfig, write_traces

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


@pytest.mark.slow  # the matrix: every moment, signal and target
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see when the run is under way")
@pytest.mark.parametrize("whom,signum", [
    ("process", signal.SIGINT), ("process", signal.SIGTERM), ("process", signal.SIGKILL),
    ("group", signal.SIGINT), ("group", signal.SIGTERM),
], ids=lambda x: x if isinstance(x, str) else x.name)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
@JOBS
def test_signal_mid_run_leaves_nothing(command, whom, signum, jobs, big_trace, tmp_path):
    """A signal to the CLI's process, or to its whole process group (Ctrl-C
    at a terminal: the parse child and workers get it too)."""
    needs(command)
    before = digest(big_trace)
    argv, output, spool = command_line(command, big_trace, tmp_path)
    inputs_before = files_under(tmp_path)
    process = subprocess.Popen([*CLI, *argv, "-j", jobs], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=cli_env(), start_new_session=True)
    deadline = time.time() + 30
    while not has_open(process.pid, big_trace):
        assert process.poll() is None and time.time() < deadline, "the command never opened its input"
        time.sleep(0.01)
    time.sleep(0.3)
    helpers = family(process.pid)[1:]
    if whom == "group":
        os.killpg(process.pid, signum)
    else:
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


@pytest.mark.slow  # the matrix: every command at every N
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


@pytest.mark.parametrize("command", ["compact", "relink", "slice"])
def test_a_full_disk_met_by_a_pass_2_worker_is_one_line_and_leaves_nothing(command, tmp_path, monkeypatch, capsys):
    """Into a plain file the pass-2 workers write their blocks themselves:
    a write there that hits ENOSPC (after the first block) ends the run as
    one written here does."""
    trace = tmp_path / "trace.json"
    trace.write_bytes(gzip.decompress((TRACES / "nccl_rank0.json.gz").read_bytes()))
    output = tmp_path / "out.json"
    spool = tmp_path / "spool"
    spool.mkdir()
    real_pwrite = os.pwrite

    def pwrite(fd: int, data, offset: int) -> int:
        if offset > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)  # the forked workers inherit it
    monkeypatch.setattr(parallel_module, "_AHEAD", 0)  # each block written as soon as its place is known
    monkeypatch.setattr(spool_module, "READ_BLOCK", 16 << 10)  # blocks of pass 2, several on this file
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 16 << 10)  # spool segments of pass-1 workers likewise
    argv = [command, str(trace), "-o", str(output), "-q", "-j", "2", "--spool-dir", str(spool)]
    with cli_signal_handlers():
        status = cli.main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert status == 1 and len(lines) == 1, lines
    assert "disk full" in lines[0] and str(output) in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["spool", "trace.json"] and os.listdir(spool) == []


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
        signals.install_signal_handlers()
        worker = multiprocessing.get_context("fork").Process(target=lambda: os.kill(os.getpid(), signum))
        worker.start()
        worker.join(30)
    assert worker.exitcode == 128 + signum
    assert capfd.readouterr().err == ""


STOPPED_IN_A_FINALIZER = """
import os, signal, sys
from streamtrace import cli
from streamtrace.cli import inspect
from streamtrace.errors import TraceError
from streamtrace.io.destinations import Destinations

class Pipe:
    def __del__(self):
        os.kill(os.getpid(), signal.{name})
        for _ in range(10_000):  # the handler runs here, inside the finalizer: Python drops what it raises
            pass

def run(args):
    Pipe()
    if {publishes}:  # the run goes on to its end: it must not publish
        Destinations([]).write("out.json", b"{{}}")
    raise TraceError("a pass-2 worker stopped unexpectedly (exit status -15)")  # the worker the signal ended

inspect.run = run
sys.exit(cli.main(["inspect", "trace.json"]))
"""


@pytest.mark.parametrize("publishes", [False, True], ids=["fails", "finishes"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_raised_in_a_finalizer_is_still_the_stop(signum, publishes, tmp_path):
    """A signal whose exception lands in a finalizer (a pipe's __del__) is
    dropped by Python; the run is still stopped: a failure that follows (a
    worker the same signal ended) is reported as the stop, and a run that
    goes on publishes nothing."""
    code = STOPPED_IN_A_FINALIZER.format(name=signum.name, publishes=publishes)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=tmp_path, env=cli_env(), timeout=60)
    assert_interrupted(result, signum)
    assert not (tmp_path / "out.json").exists()
    assert os.listdir(tmp_path) == []


CTRL_C_WHILE_IMPORTING = """
import importlib, os, runpy, signal, sys

class CtrlC:  # SIGINT to this process as the module starts to be imported
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["streamtrace", "inspect", "trace.json"]
if {entry_point!r}:  # what the installed script does: import the entry point, call it
    module, function = {entry_point!r}.split(":")
    sys.exit(getattr(importlib.import_module(module), function)())
runpy.run_module("streamtrace", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["streamtrace.cli", "streamtrace.cli.signals"])
@pytest.mark.parametrize("console_script", [False, True], ids=["python-m", "console-script"])
def test_ctrl_c_while_the_command_line_imports_is_one_line(module, console_script, tmp_path):
    """Ctrl-C before the command line has set its own handlers (it is still
    being imported) ends the run as Ctrl-C during one does, whether started
    as ``python -m streamtrace`` or by pyproject's console script."""
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    entry_point = pyproject["project"]["scripts"]["streamtrace"] if console_script else ""
    code = CTRL_C_WHILE_IMPORTING.format(module=module, entry_point=entry_point)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=tmp_path, env=cli_env(), timeout=60)
    assert_interrupted(result, signal.SIGINT)


NEEDS_PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc to find the run's processes")
INTERRUPT_AT = [sys.executable, str(Path(__file__).with_name("interrupt_at.py"))]
INTERRUPTIONS = [(whom, signum) for whom in ("process", "group") for signum in (signal.SIGINT, signal.SIGTERM)]
"""A run stopped by its user: a signal to the CLI's process, or to its whole
process group (Ctrl-C at a terminal), which its workers get too."""


@pytest.fixture(scope="module")
def rank_traces(tmp_path_factory) -> tuple[Path, Path]:
    """Two 4 MB rank traces: a few pieces of pass 1 and blocks of pass 2 each."""
    directory = tmp_path_factory.mktemp("ranks")
    write_traces(SynthConfig(ranks=2, pp_stages=2, target_bytes=4 << 20), directory, compress="none", merged=False)
    return directory / "rank0_trace.json", directory / "rank1_trace.json"


def several_inputs(command: str, inputs: tuple[Path, Path], workdir: Path) -> list[str]:
    """``command`` over both inputs: merge's per-rank tasks, or a batch run (one task per input)."""
    files = [str(path) for path in inputs]
    if command == "merge":
        return ["merge", *files, "-o", str(workdir / "merged.json")]
    if command == "attribute":
        return ["attribute", *files, "-o", str(workdir / "kernels.csv")]
    return [command, *files, "-o", f"{workdir / 'outputs'}{os.sep}"]  # a directory the run creates


def one_input(command: str, trace: Path, workdir: Path) -> list[str]:
    """``command`` on one input: range workers or the parse child in pass 1, pass-2 workers."""
    if command == "slice":
        return ["slice", str(trace), "--max-mb", "1", "-o", str(workdir / "pieces")]
    if command == "split":
        return ["split", str(trace), "-o", str(workdir / "ranks")]
    output = workdir / ("kernels.csv" if command == "attribute" else "out.json")
    return [command, str(trace), "-o", str(output)]


def session_members(session: int) -> list[int]:
    """Live processes of a session (a run started in a session of its own, with every process it forked)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == session:
                members.append(int(entry))
    return members


def run_in_session(argv: list[str], timeout: float) -> tuple[subprocess.Popen, bytes, bytes]:
    """Run ``argv`` in a session of its own (a signal to its group reaches no test process), its whole
    session killed if it outlives ``timeout``: the process, its stdout and stderr."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process, stdout, stderr


def run_interrupted(argv: list[str], moment: str, whom: str, signum: int, workdir: Path) -> subprocess.CompletedProcess:
    """Run the CLI at -j 2 in a session of its own, signalled at ``moment``
    (``interrupt_at.py``); check that the moment came, and that no process
    of the run outlives it."""
    spool = workdir / "spool"
    spool.mkdir()
    marker = workdir / "marker"
    process, stdout, stderr = run_in_session([*INTERRUPT_AT, moment, whom, signal.Signals(signum).name, str(marker),
                                              *argv, "-q", "--spool-dir", str(spool), "-j", "2"], timeout=120)
    assert marker.exists(), f"the run never came to {moment}: {stderr.decode()}"
    assert_gone(session_members(process.pid))
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def assert_left_nothing(workdir: Path, inputs_dir: Path, inputs_before: list[str]) -> None:
    """Only what the test made is left: no output, no staging directory, no spool, nothing beside the inputs."""
    assert sorted(os.listdir(workdir)) == ["marker", "spool"]
    assert os.listdir(workdir / "spool") == []
    assert sorted(os.listdir(inputs_dir)) == inputs_before


def assert_interrupted(result: subprocess.CompletedProcess, signum: int) -> None:
    assert result.returncode == 128 + signum, result.stderr
    assert result.stderr.decode().splitlines() == ["streamtrace: interrupted; no output written"]


POOL_CASES = [(command, moment) for command in ("merge", "compact", "relink", "attribute")
              for moment in ("fork", "pass1", "between", "pass2", *(("splice",) if command == "merge" else ()))]


@pytest.mark.slow  # the matrix: every command, moment and signal
@NEEDS_PROC
@pytest.mark.parametrize("whom,signum", INTERRUPTIONS, ids=lambda x: x if isinstance(x, str) else x.name)
@pytest.mark.parametrize("command,moment", POOL_CASES, ids=[f"{c}-{m}" for c, m in POOL_CASES])
def test_interrupted_pool_run_leaves_nothing(command, moment, whom, signum, rank_traces, tmp_path):
    """Per-rank tasks (merge) and batch runs (one task per input) at -j 2,
    stopped in each of their stages: workers' spools, parked state,
    fragments, staging directories and the output all go."""
    inputs_before = sorted(os.listdir(rank_traces[0].parent))
    result = run_interrupted(several_inputs(command, rank_traces, tmp_path), moment, whom, signum, tmp_path)
    assert_interrupted(result, signum)
    assert_left_nothing(tmp_path, rank_traces[0].parent, inputs_before)


SINGLE_CASES = [(command, moment) for command in ("compact", "relink", "split", "slice", "attribute")
                for moment in ("fork", "pass1", "between", "pass2", *(("splice",) if command in ("compact", "relink") else ()))]


@pytest.mark.slow
@NEEDS_PROC
@pytest.mark.parametrize("whom,signum", INTERRUPTIONS, ids=lambda x: x if isinstance(x, str) else x.name)
@pytest.mark.parametrize("command,moment", SINGLE_CASES, ids=[f"{c}-{m}" for c, m in SINGLE_CASES])
def test_interrupted_run_with_workers_leaves_nothing(command, moment, whom, signum, rank_traces, tmp_path):
    """One input at -j 2: range workers (compact, relink, split, slice) or
    the parse child (attribute) in pass 1, block workers in pass 2."""
    inputs_before = sorted(os.listdir(rank_traces[0].parent))
    result = run_interrupted(one_input(command, rank_traces[0], tmp_path), moment, whom, signum, tmp_path)
    assert_interrupted(result, signum)
    assert_left_nothing(tmp_path, rank_traces[0].parent, inputs_before)


KILLED_WORKER_CASES = [("several", command, moment) for command, moment in POOL_CASES if moment not in ("fork", "splice")] + [
    ("one", command, "pass2") for command in ("compact", "relink")]


@NEEDS_PROC
@pytest.mark.parametrize("inputs,command,moment", all_but_first_slow(KILLED_WORKER_CASES), ids=["-".join(case) for case in KILLED_WORKER_CASES])
def test_a_killed_worker_stops_the_run_and_leaves_nothing(inputs, command, moment, rank_traces, tmp_path):
    """A pool worker or a pass-2 worker killed outright (SIGKILL, as the OOM
    killer does) cannot clean up: the run stops with one line, and what the
    worker left goes with the run."""
    inputs_before = sorted(os.listdir(rank_traces[0].parent))
    argv = several_inputs(command, rank_traces, tmp_path) if inputs == "several" else \
        one_input(command, rank_traces[0], tmp_path)
    result = run_interrupted(argv, moment, "worker", signal.SIGKILL, tmp_path)
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("streamtrace: error: "), result.stderr
    assert "stopped unexpectedly" in lines[0]
    assert_left_nothing(tmp_path, rank_traces[0].parent, inputs_before)


@NEEDS_PROC
@pytest.mark.parametrize("command", ["compact", "relink", "split"])
def test_a_killed_range_worker_is_read_past(command, rank_traces, tmp_path):
    """Pass 1's range workers only parse: when one is killed, this process
    reads the input the ordinary way, and the output is the one -j 1 writes."""
    alone = tmp_path / "alone"
    alone.mkdir()
    subprocess.run([*CLI, *one_input(command, rank_traces[0], alone), "-q", "-j", "1"], env=cli_env(), check=True)
    workdir = tmp_path / "killed"
    workdir.mkdir()
    result = run_interrupted(one_input(command, rank_traces[0], workdir), "pass1", "worker", signal.SIGKILL, workdir)
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    (output,) = os.listdir(alone)
    assert sorted(os.listdir(workdir)) == sorted(["marker", "spool", output]) and os.listdir(workdir / "spool") == []
    assert files_under(workdir / output) == files_under(alone / output)
    for name in files_under(alone / output) or [""]:
        assert (workdir / output / name).read_bytes() == (alone / output / name).read_bytes()
