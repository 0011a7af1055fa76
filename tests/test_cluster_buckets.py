"""merge on a Dask cluster whose machines share only a bucket.

On loopback: moto's S3 server, a scheduler, and two worker processes started
as ``dask worker`` with a working directory and a temporary directory of
their own (neither is this process's); the inputs are objects in one bucket,
the spool is a prefix of another.  The oracle is ``merge -j 1`` of the same
files on local disk, compared byte for byte.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import orjson
import pytest
import zstandard
from bucket_servers import S3_SETTINGS, counting_proxy, object_server, s3_environment
from dask_faults import kill_workers_during

import streamtrace
from streamtrace.commands.batch import batch
from streamtrace.errors import TraceError
from streamtrace.io import objectstore
from streamtrace.io.objectstore import MIN_PART, assemble_s3, copy_ranges, part_groups
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # a Dask cluster on a bucket: CI runs it, the quick loop does not

distributed = pytest.importorskip("distributed")
pytest.importorskip("moto", reason="the dev extra (moto's S3 server)")
s3fs = pytest.importorskip("s3fs")

TRACES, RUNS = "traces", "runs"
SPOOL = f"s3://{RUNS}/spool"
SMALL = dict(microbatches=2, steps=1, graph_kernels=8, graph_streams=4, eager_kernels=4, python_noise=1)
NETWORK_SHARE = 0.05  # the coordinator's S3 traffic, as a share of the output's size


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """moto's S3 server; this process reaches it through AWS_ENDPOINT_URL."""
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made for another test's server would be reused
    try:
        with s3_environment() as url:
            yield url
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3(endpoint):
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=TRACES)
    client.create_bucket(Bucket=RUNS)
    return client


def keys(client, bucket: str = RUNS, prefix: str = "") -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"] for item in listed)


def clear(client, bucket: str = RUNS) -> None:
    for key in keys(client, bucket):
        client.delete_object(Bucket=bucket, Key=key)


@contextmanager
def workers(address: str, home: Path, endpoint: str, count: int = 2, **environment: str) -> Iterator[Path]:
    """``dask worker`` processes (one thread each) in ``home``, with their own
    temporary directory (yielded) and S3 settings."""
    scratch = home / "tmp"
    scratch.mkdir(parents=True)
    env = {**os.environ, **S3_SETTINGS, "AWS_ENDPOINT_URL": endpoint, "TMPDIR": str(scratch), **environment}
    process = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", str(count),
                                "--nthreads", "1", "--no-dashboard", "--local-directory", str(home / "dask")],
                               cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield scratch
    finally:
        process.terminate()
        process.wait(60)


@contextmanager
def scheduler() -> Iterator[tuple[str, object]]:
    with distributed.LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as client:
            yield cluster.scheduler_address, client


@pytest.fixture(scope="module")
def cluster(endpoint, tmp_path_factory):
    """The scheduler and two workers that share nothing with this process but the bucket."""
    with scheduler() as (address, client):
        with workers(address, tmp_path_factory.mktemp("worker-home"), endpoint) as scratch:
            client.wait_for_workers(2, timeout=120)
            yield address, client, scratch


def upload(client, directory: Path, prefix: str) -> list[str]:
    urls = []
    for path in sorted(directory.glob("rank*_trace.json*")):
        client.upload_file(str(path), TRACES, f"{prefix}/{path.name}")
        urls.append(f"s3://{TRACES}/{prefix}/{path.name}")
    return urls


def generated(client, tmp_path: Path, name: str, *, ranks: int, pp_stages: int, target_bytes: int,
              compress: str = "gz") -> tuple[Path, list[str]]:
    """Generated ranks of ``target_bytes`` each, on disk and as objects under ``name``."""
    directory = tmp_path / name
    write_traces(SynthConfig(ranks=ranks, pp_stages=pp_stages, microbatches=2, target_bytes=target_bytes,
                             graph_kernels=8, graph_streams=4), directory, compress=compress, merged=False)
    return directory, upload(client, directory, name)


@pytest.fixture(scope="module")
def sixteen(s3, tmp_path_factory) -> tuple[Path, list[str]]:
    """16 small ranks (PP 4 x DP 4) on disk and as objects."""
    directory = tmp_path_factory.mktemp("ranks16")
    write_traces(SynthConfig(ranks=16, pp_stages=4, **SMALL), directory, compress="gz", merged=False)
    return directory, upload(s3, directory, "small")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetched(client, key: str) -> bytes:
    return client.get_object(Bucket=RUNS, Key=key)["Body"].read()


def files_in(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()]


def wait_idle(client, timeout: float = 120) -> None:
    """Until no worker holds a task (an abandoned one may run on after its run stopped)."""
    deadline = time.monotonic() + timeout
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.2)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtrace", *args, "-q"], capture_output=True, text=True,
                          timeout=600, env=env)


def test_a_16_rank_merge_with_the_spool_in_a_bucket_equals_one_process(sixteen, cluster, s3, tmp_path):
    directory, urls = sixteen
    address, _, worker_tmp = cluster
    streamtrace.merge(directory, tmp_path / "alone.json.gz", jobs=1)
    streamtrace.merge(directory, tmp_path / "alone.json", jobs=1)
    alone = (tmp_path / "alone.json").read_bytes()
    summary = streamtrace.merge(urls, tmp_path / "cluster.json.gz", dask=address, spool_dir=SPOOL)
    assert summary["ranks"] == 16
    assert digest((tmp_path / "cluster.json.gz").read_bytes()) == digest((tmp_path / "alone.json.gz").read_bytes())
    assert keys(s3) == []  # the run's prefix is gone
    # to S3: made from the ranks' pieces inside the store (these are small: joined by tasks first)
    pattern = f"s3://{TRACES}/small/rank*_trace.json.gz"  # listed in the bucket
    streamtrace.merge(pattern, f"s3://{RUNS}/out/merged.json", dask=address, spool_dir=SPOOL)
    streamtrace.merge(urls, f"s3://{RUNS}/out/merged.json.gz", dask=address, spool_dir=SPOOL)
    streamtrace.merge(urls, f"s3://{RUNS}/out/merged.json.zst", dask=address, spool_dir=SPOOL)
    assert digest(fetched(s3, "out/merged.json")) == digest(alone)
    assert digest(gzip.decompress(fetched(s3, "out/merged.json.gz"))) == digest(alone)  # one gzip member per rank
    frames = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(fetched(s3, "out/merged.json.zst")),
                                                        read_across_frames=True)
    assert digest(frames.read()) == digest(alone)  # one frame per rank
    assert keys(s3) == ["out/merged.json", "out/merged.json.gz", "out/merged.json.zst"]
    assert s3.list_multipart_uploads(Bucket=RUNS).get("Uploads", []) == []
    assert files_in(worker_tmp) == []  # each task's scratch went with it
    clear(s3)


def test_analyze_with_the_spool_in_a_bucket_gives_the_tables_of_one_process(sixteen, cluster, s3, tmp_path):
    """The tasks send back tables; each rank's launch rows come as an object of the run."""
    directory, urls = sixteen
    address, _, worker_tmp = cluster
    alone = streamtrace.analyze(directory, str(tmp_path / "alone"), jobs=1)
    on_cluster = streamtrace.analyze(f"s3://{TRACES}/small/rank*_trace.json.gz", str(tmp_path / "cluster"),
                                     dask=address, spool_dir=SPOOL)
    assert len(on_cluster["ranks"]) == len(urls)
    assert on_cluster["kernel_launch_rows"] == alone["kernel_launch_rows"] > 0
    assert orjson.dumps(on_cluster["tables"]) == orjson.dumps(alone["tables"])  # (NaN: null in both, not unequal)
    written = sorted(path.name for path in (tmp_path / "alone").iterdir())
    assert sorted(path.name for path in (tmp_path / "cluster").iterdir()) == written
    for name in written:
        assert (tmp_path / "cluster" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name
    assert keys(s3) == [] and files_in(worker_tmp) == []


def test_a_damaged_rank_stops_the_run_in_one_line_and_the_prefix_goes(sixteen, cluster, s3, tmp_path):
    directory, urls = sixteen
    address, _, worker_tmp = cluster
    damaged = (directory / "rank6_trace.json.gz").read_bytes()
    s3.put_object(Bucket=TRACES, Key="damaged/rank6_trace.json.gz", Body=damaged[: len(damaged) // 2])
    inputs = [url for url in urls if "/rank6_" not in url] + [f"s3://{TRACES}/damaged/rank6_trace.json.gz"]
    for output in (str(tmp_path / "out.json.gz"), f"s3://{RUNS}/out.json.gz"):
        done = cli("merge", *inputs, "-o", output, "--dask", address, "--spool-dir", SPOOL)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "damaged/rank6_trace.json.gz" in lines[0], lines
    assert not (tmp_path / "out.json.gz").exists()
    wait_idle(cluster[1])
    assert keys(s3) == [] and s3.list_multipart_uploads(Bucket=RUNS).get("Uploads", []) == []
    assert files_in(worker_tmp) == []


def test_per_stage_files_need_a_shared_directory(sixteen, cluster, s3, tmp_path):
    """--per-stage's tasks write the stages' files into the output directory themselves."""
    _, urls = sixteen
    with pytest.raises(TraceError, match="--per-stage's tasks write the stages' files"):
        streamtrace.merge(urls, str(tmp_path / "stages") + "/", per_stage=True, dask=cluster[0], spool_dir=SPOOL)
    assert keys(s3) == [] and not (tmp_path / "stages").exists()


def test_ranks_without_events_before_the_first_with_events(sixteen, cluster, s3, tmp_path):
    """The pieces of ranks that write nothing open the output with no event:
    the first piece with events must not begin with a separator."""
    directory, _ = sixteen
    address, _, _ = cluster
    (tmp_path / "rank0_trace.json").write_text('{"distributedInfo": {"rank": 0}, "traceEvents": []}')
    s3.upload_file(str(tmp_path / "rank0_trace.json"), TRACES, "empty/rank0_trace.json")
    rank1 = directory / "rank1_trace.json.gz"
    streamtrace.merge([tmp_path / "rank0_trace.json", rank1], tmp_path / "alone.json", jobs=1)
    inputs = [f"s3://{TRACES}/empty/rank0_trace.json", f"s3://{TRACES}/small/rank1_trace.json.gz"]
    summary = streamtrace.merge(inputs, f"s3://{RUNS}/empty.json", dask=address, spool_dir=SPOOL)
    assert summary["pp_ranks"][0]["global_rank"] == 0
    assert fetched(s3, "empty.json") == (tmp_path / "alone.json").read_bytes()
    assert orjson.loads(fetched(s3, "empty.json"))["traceEvents"]
    clear(s3)


def test_a_worker_killed_mid_task_is_replaced_and_the_output_is_the_same(cluster, s3, tmp_path):
    """One worker is killed (SIGKILL) as soon as it holds a task; its nanny
    starts another and Dask runs the task again."""
    address, client, _ = cluster
    ranks, urls = generated(s3, tmp_path, "killed", ranks=4, pp_stages=2, target_bytes=6_000_000, compress="none")
    streamtrace.merge(ranks, tmp_path / "alone.json.gz", jobs=1)
    outcome, killed = kill_workers_during(
        client, lambda: streamtrace.merge(urls, f"s3://{RUNS}/killed.json.gz", dask=address, spool_dir=SPOOL),
        lambda busy: busy[:1])
    assert killed, "no task was seen running"
    assert "error" not in outcome, outcome.get("error")
    merged = gzip.decompress(fetched(s3, "killed.json.gz"))
    assert digest(merged) == digest(gzip.decompress((tmp_path / "alone.json.gz").read_bytes()))
    assert keys(s3) == ["killed.json.gz"]
    client.wait_for_workers(2, timeout=120)
    clear(s3)


def test_an_s3_to_s3_merge_passes_few_bytes_through_the_coordinator(cluster, s3, endpoint, tmp_path):
    """16 ranks whose pieces are over 5 MiB each: every part is a server-side
    copy.  The coordinator runs in its own process and reaches S3 through a
    relay that counts every byte it sends and receives."""
    address, _, _ = cluster
    ranks, urls = generated(s3, tmp_path, "large", ranks=16, pp_stages=4, target_bytes=6_000_000)
    streamtrace.merge(ranks, tmp_path / "alone.json", jobs=1)
    with counting_proxy(endpoint) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url()}
        started = time.perf_counter()
        done = cli("merge", *urls, "-o", f"s3://{RUNS}/large.json", "--dask", address, "--spool-dir", SPOOL, env=env)
        seconds = time.perf_counter() - started
        carried = proxy.carried
    assert done.returncode == 0, done.stderr
    size = (tmp_path / "alone.json").stat().st_size
    assert digest(fetched(s3, "large.json")) == digest((tmp_path / "alone.json").read_bytes())
    print(f"s3->s3 merge of 16 ranks, {size / 1e6:.1f} MB: coordinator carried {carried:,} bytes of S3 traffic "
          f"({100 * carried / size:.3f}% of the output), {seconds:.1f} s wall")
    assert size > 16 * MIN_PART
    assert carried < NETWORK_SHARE * size
    assert keys(s3) == ["large.json"]
    clear(s3)


def test_ctrl_c_leaves_nothing_in_the_bucket(cluster, s3, tmp_path):
    """SIGINT once the tasks have kept objects: the run stops, and the prefix
    stays empty after its abandoned tasks have ended too."""
    address, client, _ = cluster
    _, urls = generated(s3, tmp_path, "interrupted", ranks=8, pp_stages=2, target_bytes=3_000_000)
    process = subprocess.Popen([sys.executable, "-m", "streamtrace", "merge", *urls, "-o", str(tmp_path / "out.json.gz"),
                                "--dask", address, "--spool-dir", SPOOL, "-q"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if [key for key in keys(s3, prefix="spool/") if not key.endswith(".live")]:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert len(err.strip().splitlines()) == 1, err
    wait_idle(client)
    time.sleep(1)
    assert keys(s3) == []
    assert s3.list_multipart_uploads(Bucket=RUNS).get("Uploads", []) == []
    assert not (tmp_path / "out.json.gz").exists()


def test_workers_of_another_streamtrace_are_refused_in_one_line(sixteen, endpoint, s3, tmp_path):
    """A worker whose installation says streamtrace 9.9.9 (a dist-info found first on its path)."""
    other = tmp_path / "site"
    (other / "streamtrace-9.9.9.dist-info").mkdir(parents=True)
    (other / "streamtrace-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: streamtrace\n"
                                                                    "Version: 9.9.9\n")
    _, urls = sixteen
    with scheduler() as (address, client):
        with workers(address, tmp_path / "home", endpoint, count=1, PYTHONPATH=str(other)):
            client.wait_for_workers(1, timeout=120)
            done = cli("merge", *urls[:2], "-o", str(tmp_path / "out.json"), "--dask", address, "--spool-dir", SPOOL)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "runs streamtrace 9.9.9, this process" in done.stderr
    assert keys(s3) == [] and not (tmp_path / "out.json").exists()


def test_workers_that_cannot_see_the_spool_are_refused_in_one_line(sixteen, endpoint, s3, tmp_path):
    """Workers pointed at another endpoint, where the run's prefix does not
    exist (a web server answering 404: moto's servers in one process share
    their buckets)."""
    _, urls = sixteen
    with object_server() as elsewhere, scheduler() as (address, client):
        with workers(address, tmp_path / "home", elsewhere.url(""), count=1):
            client.wait_for_workers(1, timeout=120)
            done = cli("merge", *urls[:2], "-o", str(tmp_path / "out.json"), "--dask", address, "--spool-dir", SPOOL)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"--spool-dir {SPOOL}: the worker at tcp://" in done.stderr and "cannot use it" in done.stderr
    assert keys(s3) == [] and not (tmp_path / "out.json").exists()


def test_a_bucket_spool_is_refused_where_it_cannot_serve(sixteen, tmp_path):
    """Before any connection or work: a batch run on a cluster (its tasks
    write files into a directory), and any run on this machine."""
    directory, _ = sixteen
    with pytest.raises(TraceError, match="merge takes a bucket URL"):
        batch("compact", sorted(directory.glob("rank*"))[:2], str(tmp_path / "out"), dask="tcp://127.0.0.1:9",
              spool_dir=SPOOL)
    with pytest.raises(TraceError, match="a bucket holds the spool of --dask runs only"):
        streamtrace.merge(directory, tmp_path / "out.json", jobs=2, spool_dir=SPOOL)
    assert list(tmp_path.iterdir()) == []


def test_pieces_are_grouped_into_parts_of_at_least_the_minimum():
    assert part_groups([6, 7, 5, 1], min_part=5) == [[0], [1], [2], [3]]
    assert part_groups([1, 2, 3, 9, 1], min_part=5) == [[0, 1, 2], [3], [4]]  # small pieces joined up to 5
    assert part_groups([2, 2], min_part=5) == [[0, 1]]
    assert part_groups([]) == []
    groups = part_groups([1] * 25, min_part=2, max_parts=4)  # a part for every 7: 4 parts at most
    assert [len(group) for group in groups] == [7, 7, 7, 4]
    assert sum(groups, []) == list(range(25))


def test_objects_over_the_largest_part_are_copied_in_ranges():
    assert copy_ranges(10, 4) == [(0, 2), (3, 5), (6, 9)]
    assert copy_ranges(8, 4) == [(0, 3), (4, 7)]
    assert copy_ranges(3, 4) == [(0, 2)]


def test_an_object_is_made_from_others_inside_the_store(s3, monkeypatch):
    """Whole copies, a copy in two ranges (the largest part made 6 MiB here),
    and a failed copy that leaves no object and no open upload."""
    pieces = {"a": os.urandom(MIN_PART + 1), "b": os.urandom(11 << 20), "c": b"the end"}
    for name, data in pieces.items():
        s3.put_object(Bucket=RUNS, Key=f"pieces/{name}", Body=data)
    monkeypatch.setattr(objectstore, "MAX_PART", 6 << 20)
    parts = [(f"s3://{RUNS}/pieces/{name}", len(data)) for name, data in pieces.items()]
    assemble_s3(f"s3://{RUNS}/joined", parts, overwrite=False)
    assert fetched(s3, "joined") == b"".join(pieces.values())
    with pytest.raises(TraceError, match="exists; pass --overwrite|appeared while"):
        assemble_s3(f"s3://{RUNS}/joined", parts, overwrite=False)
    with pytest.raises(TraceError, match="cannot copy a fragment into the output: not found"):
        assemble_s3(f"s3://{RUNS}/broken", [*parts[:2], (f"s3://{RUNS}/pieces/missing", 1)], overwrite=False)
    assert keys(s3) == ["joined", "pieces/a", "pieces/b", "pieces/c"]
    assert s3.list_multipart_uploads(Bucket=RUNS).get("Uploads", []) == []
    clear(s3)
