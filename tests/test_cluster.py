"""Per-rank tasks through the executor seam: processes here, or a real Dask cluster.

The cluster is a ``dask.distributed.LocalCluster`` started by this module on
loopback, with two worker processes of one thread each (the machine's two
cores), and torn down at the end.  The oracle everywhere is the plain
single-process run (``-j 1``, one input at a time), compared byte for byte.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from conftest import TRACES
from dask_faults import kill_workers_during

import streamtrace
from streamtrace.commands.batch import batch
from streamtrace.engine.executors import TaskRunner
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # a local Dask cluster and 16 to 64 generated ranks

distributed = pytest.importorskip("distributed")

SMALL = dict(microbatches=2, steps=1, graph_kernels=8, graph_streams=4, eager_kernels=4, python_noise=1)
COORDINATOR_LIMIT_MB = 150


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as local:
        with distributed.Client(local) as client:
            yield local, client


@pytest.fixture(scope="module")
def address(cluster) -> str:
    return cluster[0].scheduler_address


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory) -> Path:
    """16 ranks, PP 4 x DP 4."""
    directory = tmp_path_factory.mktemp("ranks16")
    write_traces(SynthConfig(ranks=16, pp_stages=4, **SMALL), directory, compress="gz", merged=False)
    return directory


def rank_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("rank*_trace.json*"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spool(tmp_path: Path) -> Path:
    """A spool directory the test can check is left empty."""
    directory = tmp_path / "spool"
    directory.mkdir()
    return directory


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtrace", *args], capture_output=True, text=True)


# --- merge ----------------------------------------------------------------------------------------


def test_merge_on_the_cluster_equals_one_process(sixteen, address, tmp_path):
    alone = streamtrace.merge(sixteen, tmp_path / "alone.json.gz", jobs=1)
    spooled = spool(tmp_path)
    summary = streamtrace.merge(sixteen, tmp_path / "cluster.json.gz", dask=address, spool_dir=str(spooled))
    assert digest(tmp_path / "cluster.json.gz") == digest(tmp_path / "alone.json.gz")
    assert summary["ranks"] == alone["ranks"] == 16
    assert [entry["global_rank"] for entry in summary["pp_ranks"]] == [entry["global_rank"] for entry in alone["pp_ranks"]]
    assert list(spooled.iterdir()) == []


def test_per_stage_files_are_written_by_the_cluster_as_one_process_writes_them(sixteen, address, tmp_path):
    """Each stage's file is one task; the files are those of the run in this process."""
    alone = streamtrace.merge(sixteen, tmp_path / "alone", per_stage=True, jobs=1)
    spooled = spool(tmp_path)
    summary = streamtrace.merge(sixteen, tmp_path / "cluster", per_stage=True, dask=address, spool_dir=str(spooled))
    names = [f"pp_stage{stage}.json.gz" for stage in range(4)]
    assert sorted(os.listdir(tmp_path / "cluster")) == names
    assert [digest(tmp_path / "cluster" / name) for name in names] == [digest(tmp_path / "alone" / name) for name in names]
    assert summary["pp_cross_stage_arrows"] == alone["pp_cross_stage_arrows"] > 0
    assert list(spooled.iterdir()) == []


def test_merge_takes_the_cluster_from_the_environment(sixteen, address, tmp_path, monkeypatch):
    streamtrace.merge(rank_files(sixteen)[:4], tmp_path / "alone.json.gz", jobs=1)
    monkeypatch.setenv("STREAMTRACE_DASK", address)
    done = cli("merge", *map(str, rank_files(sixteen)[:4]), "-o", str(tmp_path / "env.json.gz"), "--spool-dir",
               str(spool(tmp_path)), "-q")
    assert done.returncode == 0, done.stderr
    assert digest(tmp_path / "env.json.gz") == digest(tmp_path / "alone.json.gz")


def test_a_cluster_needs_a_shared_spool_directory(sixteen, address, tmp_path):
    with pytest.raises(TraceError, match="--dask needs --spool-dir"):
        streamtrace.merge(sixteen, tmp_path / "out.json.gz", dask=address)
    assert not (tmp_path / "out.json.gz").exists()


def test_a_damaged_rank_stops_the_run_with_one_line_naming_it(sixteen, address, tmp_path):
    damaged = tmp_path / "ranks"
    damaged.mkdir()
    for path in rank_files(sixteen):
        (damaged / path.name).write_bytes(path.read_bytes())
    bad = damaged / "rank6_trace.json.gz"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # gzip cut off halfway
    spooled = spool(tmp_path)
    for where in (["--dask", address], ["-j", "2"]):
        done = cli("merge", str(damaged), "-o", str(tmp_path / "out.json.gz"), "--spool-dir", str(spooled), "-q",
                   *where)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("streamtrace: error: ") and "rank6_trace.json.gz" in lines[0], lines
        assert not (tmp_path / "out.json.gz").exists()
        assert list(spooled.iterdir()) == []
    done = cli("compact", *map(str, rank_files(damaged)), "-o", str(tmp_path / "compacted") + "/", "--dask", address,
               "--spool-dir", str(spooled), "-q")
    assert done.returncode == 1 and "rank6_trace.json.gz" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "compacted").exists() and list(spooled.iterdir()) == []  # the folder it made goes too


QUIET_CHECK = """
import logging, sys
from streamtrace.cli import main
main(sys.argv[1:])
import distributed
print(logging.getLogger("distributed.batched").getEffectiveLevel())
"""


@pytest.mark.parametrize("flags, level", [([], "30"), (["--debug"], "20")])
def test_the_command_line_keeps_distributeds_info_log_off_stderr(flags, level, tmp_path):
    """A failed --dask task closes the client's connection, which distributed logs at INFO with a traceback."""
    trace = TRACES / "kineto_small.json"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DASK_")}
    done = subprocess.run([sys.executable, "-c", QUIET_CHECK, "inspect", str(trace), "-q", *flags],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == level  # WARNING, or INFO under --debug


def size_now(path: Path) -> int:
    """The size of a file a task may rename or delete meanwhile (0 when gone)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def test_a_worker_killed_mid_task_is_replaced_and_the_output_is_the_same(cluster, tmp_path):
    """One worker is killed (SIGKILL) as soon as it is seen holding a task:
    Dask runs that task again elsewhere."""
    local, client = cluster
    ranks = tmp_path / "ranks"
    write_traces(SynthConfig(ranks=4, pp_stages=2, microbatches=2, target_bytes=6_000_000, graph_kernels=8,
                             graph_streams=4), ranks, compress="none", merged=False)
    streamtrace.merge(ranks, tmp_path / "alone.json.gz", jobs=1)
    spooled = spool(tmp_path)
    outcome, killed = kill_workers_during(
        client, lambda: streamtrace.merge(ranks, tmp_path / "cluster.json.gz", dask=local.scheduler_address,
                                          spool_dir=str(spooled)),
        lambda busy: busy[:1])  # killed at once: waiting to be "well into" a task lets short tasks slip by
    assert killed, "no task was seen running"
    assert "error" not in outcome, outcome.get("error")
    assert digest(tmp_path / "cluster.json.gz") == digest(tmp_path / "alone.json.gz")
    assert list(spooled.iterdir()) == []
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)
    client.wait_for_workers(2, timeout=180)  # the nanny starts a new one for the tests after this (slow on a loaded machine)


def test_a_worker_killed_while_writing_a_stage_is_replaced_and_the_files_are_the_same(cluster, tmp_path):
    """The workers are killed (SIGKILL) once a stage's file is well under way
    (a ``.part`` file in the output's hidden folder past 60% of a stage's
    size, so past its first rank): Dask runs the stages again."""
    local, client = cluster
    ranks = tmp_path / "ranks"
    write_traces(SynthConfig(ranks=4, pp_stages=2, microbatches=2, target_bytes=6_000_000, graph_kernels=8,
                             graph_streams=4), ranks, compress="none", merged=False)
    streamtrace.merge(ranks, tmp_path / "alone", per_stage=True, jobs=1)
    smallest = min(path.stat().st_size for path in (tmp_path / "alone").iterdir())

    def under_way(busy: list[str]) -> list[str]:  # (which worker writes which stage is not known: all go)
        parts = (tmp_path / "cluster").glob(".streamtrace-batch-*/.*.part")
        return busy if any(size_now(part) > 0.6 * smallest for part in parts) else []

    spooled = spool(tmp_path)
    outcome, killed = kill_workers_during(
        client, lambda: streamtrace.merge(ranks, tmp_path / "cluster", per_stage=True, dask=local.scheduler_address,
                                          spool_dir=str(spooled)),
        under_way)
    assert killed, "no stage was seen being written"
    assert "error" not in outcome, outcome.get("error")
    names = ["pp_stage0.json.gz", "pp_stage1.json.gz"]
    assert sorted(os.listdir(tmp_path / "cluster")) == names
    assert [digest(tmp_path / "cluster" / name) for name in names] == [digest(tmp_path / "alone" / name) for name in names]
    assert list(spooled.iterdir()) == []
    client.wait_for_workers(2, timeout=180)


def test_the_coordinator_stays_small_while_merging_64_ranks(address, tmp_path):
    write_traces(SynthConfig(ranks=64, pp_stages=4, **SMALL), tmp_path / "ranks", compress="gz", merged=False)
    coordinator = ("import sys, orjson, streamtrace; sys.stdout.buffer.write(orjson.dumps(streamtrace.merge("
                   "sys.argv[1], sys.argv[2], dask=sys.argv[3], spool_dir=sys.argv[4])))")
    done = subprocess.run([sys.executable, "-c", coordinator, str(tmp_path / "ranks"), str(tmp_path / "merged.json.gz"),
                           address, str(spool(tmp_path))], capture_output=True)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads(done.stdout)  # peak_rss_mb: this fresh process's own high-water mark
    assert summary["ranks"] == 64
    print(f"coordinator peak RSS merging 64 ranks on the cluster: {summary['peak_rss_mb']} MB")
    assert summary["peak_rss_mb"] < COORDINATOR_LIMIT_MB


# --- batch runs -----------------------------------------------------------------------------------


def test_batch_compact_equals_single_runs_here_and_on_the_cluster(sixteen, address, tmp_path):
    files = rank_files(sixteen)
    singles = tmp_path / "single"
    singles.mkdir()
    for path in files:
        streamtrace.compact(path, singles / path.name.replace("_trace", "_trace_compacted"), jobs=1)
    expected = {path.name: digest(path) for path in singles.iterdir()}
    assert len(expected) == 16
    local = batch("compact", files, str(tmp_path / "local"), jobs=2)
    on_cluster = batch("compact", files, str(tmp_path / "cluster"), dask=address, spool_dir=str(spool(tmp_path)))
    for directory, summary in ((tmp_path / "local", local), (tmp_path / "cluster", on_cluster)):
        assert {path.name: digest(path) for path in directory.iterdir()} == expected  # no staging left behind
        assert summary["inputs"] == 16 and len(summary["runs"]) == 16
        assert summary["events_read"] == sum(run["events_read"] for run in summary["runs"])


def test_batch_attribute_is_every_input_under_one_header(sixteen, tmp_path):
    files = rank_files(sixteen)[:3]
    parts = []
    for path in files:
        streamtrace.attribute(path, tmp_path / f"{path.name}.csv", jobs=1)
        parts.append((tmp_path / f"{path.name}.csv").read_text().splitlines(keepends=True))
    expected = parts[0][0] + "".join(line for part in parts for line in part[1:])
    done = cli("attribute", *map(str, files), "-o", str(tmp_path / "all.csv"), "-j", "2", "-q")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "all.csv").read_text() == expected
    ranks = {path.name.split("_")[0].removeprefix("rank") for path in files}
    assert {line.split(",")[0] for line in expected.splitlines()[1:]} == ranks  # the rank column tells them apart


def test_batch_refuses_before_any_work(sixteen, tmp_path):
    files = rank_files(sixteen)[:2]
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank0_trace_compacted.json.gz").write_bytes(b"keep")
    with pytest.raises(TraceError, match="exists; pass --overwrite"):
        batch("compact", files, str(out), jobs=1)
    assert (out / "rank0_trace_compacted.json.gz").read_bytes() == b"keep"
    assert sorted(path.name for path in out.iterdir()) == ["rank0_trace_compacted.json.gz"]
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / files[0].name).write_bytes(files[0].read_bytes())
    with pytest.raises(TraceError, match="would write it twice"):
        batch("compact", [files[0], twin / files[0].name], str(tmp_path / "new"), jobs=1)
    for not_a_directory in ("-", str(tmp_path / "merged.json.gz")):
        with pytest.raises(TraceError, match="go into a (local )?directory"):
            batch("relink", files, not_a_directory, jobs=1)
    assert not (tmp_path / "new").exists() and not (tmp_path / "merged.json.gz").exists()


# --- the seam itself ------------------------------------------------------------------------------


def test_results_come_in_input_order_with_progress_from_completions(capsys):
    delays = [0.3, 0.0, 0.1, 0.0]
    with TaskRunner(2, progress=True) as runner:
        assert list(runner.ordered(_sleep_then_echo, [(n, delay) for n, delay in enumerate(delays)],
                                   label="ranks")) == [0, 1, 2, 3]
    assert "ranks: 4/4" in capsys.readouterr().err


def test_a_failed_task_ends_the_others_at_once_and_the_run_directory_goes(tmp_path):
    """Tasks keep their files in the run's directory: a failure ends the task
    under way (it is not waited for) and removes what every task wrote."""
    started = time.perf_counter()
    taken = []
    with TaskRunner(2, spool_dir=str(tmp_path)) as runner:
        calls = [(runner.work_dir, 0, 0.0), (runner.work_dir, 1, 60.0), (runner.work_dir, 2, 0.2)]
        with pytest.raises(TraceError, match="input 2"):
            for result in runner.ordered(_write_then_sleep, calls, label="ranks"):
                taken.append(result)
        assert sorted(os.listdir(runner.work_dir)) == ["0", "1", "2"]
    assert taken == [0] and os.listdir(tmp_path) == []
    assert time.perf_counter() - started < 30


def _sleep_then_echo(value: int, delay: float) -> int:
    time.sleep(delay)
    return value


def _write_then_sleep(directory: str, value: int, delay: float) -> int:
    """A task leaving a file in the run's directory; input 2 fails after its delay."""
    with open(os.path.join(directory, str(value)), "w") as left:
        left.write("spool")
    time.sleep(delay)
    if value == 2:
        raise TraceError(f"input {value}")
    return value
