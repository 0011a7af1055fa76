"""analyze --ops with more than one process (-j) makes the ops tables in a forked child while the
rank analyses run: the same files and summary as at -j 1, a failure there one line with nothing
written or left behind, and a Ctrl-C meanwhile stops the child too."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from badinputs.matrix import cli_env
from conftest import TRACES
from test_faults import assert_gone, run_in_session, session_members

import streamtrace
from streamtrace.algo import opsreport
from streamtrace.errors import TraceError

TIMES = ("wall_seconds", "peak_rss_mb", "pass1_seconds")  # (what differs from one run to the next)


def _merged_ranks(tmp_path: Path) -> str:
    """A generated file of two ranks (each event with its args.rank)."""
    work = tmp_path / "synth"
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(work), "--ranks", "2", "--pp-stages", "1",
                    "--steps", "2", "--graph-kernels", "8", "--eager-kernels", "6", "--compress", "none", "--seed", "3",
                    "--merged-style", "rank-arg", "-q"], check=True, env=cli_env())
    return str(work / "merged_trace.json")


def _run(trace: str, out: Path, jobs: int) -> tuple[dict[str, bytes], bytes]:
    """analyze --ops at ``jobs``: the ops folder's files and the summary (less its times)."""
    summary = streamtrace.analyze(trace, str(out), ops=True, jobs=jobs)
    for key in TIMES:
        summary.pop(key)
    files = {path.relative_to(out / "ops").as_posix(): path.read_bytes() for path in sorted((out / "ops").rglob("*"))
             if path.is_file()}
    return files, orjson.dumps(summary, option=orjson.OPT_SORT_KEYS).replace(os.fsencode(str(out)), b"OUT")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["b200_eager.json.gz", "nccl_rank0.json.gz", "merged"])
def test_the_tables_and_summary_are_the_same_at_one_and_two_processes(case: str, tmp_path: Path) -> None:
    trace = _merged_ranks(tmp_path) if case == "merged" else str(TRACES / case)
    one, two = _run(trace, tmp_path / "j1", 1), _run(trace, tmp_path / "j2", 2)
    assert one[0] and any("/" in name for name in one[0])
    if case == "merged":
        assert {name.split("/")[0] for name in one[0]} == {"rank0", "rank1"}
    assert two == one


def _failing_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise TraceError(f"tables made by process {os.getpid()}")

    monkeypatch.setattr(opsreport, "perf_tables", fail)


def test_a_failure_making_the_tables_in_the_child_is_the_childs_error_and_writes_nothing(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    _failing_tables(monkeypatch)
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "out"
    with pytest.raises(TraceError, match=r"tables made by process (\d+)") as failure:
        streamtrace.analyze(str(TRACES / "kineto_small.json"), str(out), ops=True, jobs=2, spool_dir=str(spool))
    assert failure.value.args[0] != f"tables made by process {os.getpid()}"  # (in a child)
    assert not out.exists() or not list(out.rglob("*.csv"))
    assert os.listdir(spool) == []


def test_at_one_process_the_tables_are_made_in_this_process(tmp_path: Path, monkeypatch) -> None:
    _failing_tables(monkeypatch)
    with pytest.raises(TraceError, match=f"tables made by process {os.getpid()}$"):
        streamtrace.analyze(str(TRACES / "kineto_small.json"), str(tmp_path / "out"), ops=True, jobs=1)


def test_a_child_that_dies_is_one_line(tmp_path: Path, monkeypatch) -> None:
    parent = os.getpid()
    monkeypatch.setattr(opsreport, "perf_tables", lambda *args, **kwargs: os.getpid() != parent and os._exit(7))
    with pytest.raises(TraceError, match=r"^a worker process stopped unexpectedly \(exit status 7\)$"):
        streamtrace.analyze(str(TRACES / "kineto_small.json"), str(tmp_path / "out"), ops=True, jobs=2)
    assert not list((tmp_path / "out").rglob("*.csv"))


CTRL_C_IN_THE_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from streamtrace import cli
    from streamtrace.algo import opsreport

    def tables(*args, **kwargs):
        open(sys.argv[1], "w").write(str(os.getpid()))
        os.killpg(0, signal.SIGINT)  # (Ctrl-C at a terminal: the whole group)
        time.sleep(60)

    opsreport.perf_tables = tables
    sys.exit(cli.main(sys.argv[2:]))
""")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_ctrl_c_while_the_child_makes_the_tables_leaves_nothing(tmp_path: Path) -> None:
    spool, out, marker = tmp_path / "spool", tmp_path / "out", tmp_path / "child"
    spool.mkdir()
    process, _, stderr = run_in_session([sys.executable, "-c", CTRL_C_IN_THE_CHILD, str(marker), "analyze",
                                         str(TRACES / "kineto_small.json"), "-o", str(out), "--ops", "-j", "2", "-q",
                                         "--spool-dir", str(spool)], timeout=60)
    assert marker.exists() and int(marker.read_text()) != process.pid
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert stderr.decode().splitlines() == ["streamtrace: interrupted; no output written"]
    assert_gone(session_members(process.pid))
    assert not out.exists() or not list(out.rglob("*.csv"))
    assert os.listdir(spool) == []
