"""URL inputs and bucket outputs against servers the tests start on loopback:
an HTTP server with Range support (fsspec's HTTP filesystem) and moto's S3
API in server mode (s3fs).  Plain, gzip and zstd objects through several
commands (same bytes as from a local file, for -j 1 and -j 2); one download
per run unless --reread-remote; uploads that appear only when complete; and
faults (404, 403, a connection closed mid-object, a truncated object), each
one line naming the URL, exit 1, no output, no spool left.
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from badinputs.matrix import CLI, cli_env, find_key
from bucket_servers import object_server, s3_environment
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace import cli
from streamtrace.io import remote

pytest.importorskip("aiohttp", reason="the http extra")
pytest.importorskip("s3fs", reason="the s3 extra")
pytest.importorskip("moto", reason="the dev extra (moto's S3 server)")

TRACE = TRACES / "nccl_rank0.json.gz"  # 0.75 MB gzip, 9.8 MB of JSON, 7 MB when convert writes it plain
SMALL = TRACES / "sglang_decode_qwen3.json.gz"
BUCKET = "traces"
JOBS = pytest.mark.parametrize("jobs", ["1", "2"], ids=lambda n: f"j{n}")


def plain_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def encoded(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, compresslevel=1)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


@pytest.fixture(scope="module")
def http():
    with object_server() as server:
        yield server


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server; this process and the CLI subprocesses reach it through AWS_ENDPOINT_URL."""
    with s3_environment() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def s3(s3_endpoint):
    """A boto3 client on the test server, with the bucket made."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


def keys(client) -> list[str]:
    return sorted(item["Key"] for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def open_uploads(client) -> list:
    return client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


def run_cli(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (a process that imports everything afresh)."""
    return subprocess.run([*CLI, *argv, "-q"], capture_output=True, text=True, timeout=120, env=env or cli_env())


def run_main(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """The CLI's entry point in this process (a subprocess costs a second of imports):
    exit status, stdout and the lines on stderr."""
    capsys.readouterr()
    saved = signal.getsignal(signal.SIGTERM)
    try:
        status = cli.main([*argv, "-q"])
    finally:
        signal.signal(signal.SIGTERM, saved)
    out, err = capsys.readouterr()
    return status, out, err.splitlines()


def serve(http, path: str, body: bytes) -> str:
    http.objects[path] = body
    return http.url(path)


# --- reading -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
@JOBS
def test_http_objects_read_like_local_files(compression, jobs, http, tmp_path):
    """inspect, convert, compact and attribute of an HTTP object: the same
    results as of the same bytes in a local file."""
    body = encoded(plain_bytes(SMALL), compression)
    local = tmp_path / "local.json"
    local.write_bytes(body)
    url = serve(http, f"/read/{compression}/{jobs}/trace.json", body)
    events = events_of(load_json(SMALL))

    summary = streamtrace.inspect(url, jobs=jobs)
    assert summary["input"] == url and summary["events"] == len(events) and summary["compression"] == compression
    assert summary["remote_input"] == {"downloads": 1, "readings": 1, "spooled_bytes": len(body),
                                       "reread_remote": False}

    streamtrace.convert(url, tmp_path / "converted.json", jobs=jobs)
    assert events_of(json.loads((tmp_path / "converted.json").read_bytes())) == events
    for command, name in ((streamtrace.compact, "compacted.json"), (streamtrace.relink, "relinked.json")):
        command(url, tmp_path / f"remote_{name}", jobs=jobs)
        command(local, tmp_path / f"local_{name}", jobs=jobs)
        assert (tmp_path / f"remote_{name}").read_bytes() == (tmp_path / f"local_{name}").read_bytes()
    streamtrace.attribute(url, tmp_path / "remote.csv", jobs=jobs)
    streamtrace.attribute(local, tmp_path / "local.csv", jobs=jobs)
    assert (tmp_path / "remote.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()


def test_second_reading_comes_from_the_spool_unless_reread_remote(http, tmp_path, capsys):
    """A raw control character makes the engine read the input a second time
    (string-repair mode): the server sees one download, or two with
    --reread-remote; the summary says which."""
    body = gzip.compress(plain_bytes(SMALL).replace(b'"name": "aten::arange"', b'"name": "aten::\x01arange"', 1))
    assert b"\x01" in gzip.decompress(body)
    url = serve(http, "/reread/trace.json.gz", body)
    spool = tmp_path / "spool"
    spool.mkdir()
    for flag, downloads in (([], 1), (["--reread-remote"], 2)):
        gets_before, sent_before = http.gets["/reread/trace.json.gz"], http.bytes_sent["/reread/trace.json.gz"]
        out = tmp_path / f"out{downloads}.json"
        status, stdout, _ = run_main(["compact", url, "-o", str(out), "--spool-dir", str(spool), "--json", *flag], capsys)
        assert status == 0
        summary = json.loads(stdout)
        assert find_key(summary, "control_chars_repaired") == 1
        assert summary["remote_input"] == {"downloads": downloads, "readings": 2,
                                           "spooled_bytes": 0 if flag else len(body), "reread_remote": bool(flag)}
        assert http.gets["/reread/trace.json.gz"] - gets_before == downloads
        assert http.bytes_sent["/reread/trace.json.gz"] - sent_before == downloads * len(body)
        assert os.listdir(spool) == []
    assert (tmp_path / "out1.json").read_bytes() == (tmp_path / "out2.json").read_bytes()


@JOBS
def test_merge_of_http_objects(jobs, http, tmp_path):
    """merge reads each rank from its URL (in worker processes with -j 2):
    the same file as from the local copies."""
    ranks = sorted((TRACES / "dlrm_8ranks").iterdir())[:2]
    urls = [serve(http, f"/merge/{jobs}/{path.name}", path.read_bytes()) for path in ranks]
    remote_summary = streamtrace.merge(urls, tmp_path / "remote.json.gz", jobs=jobs)
    streamtrace.merge(ranks, tmp_path / "local.json.gz", jobs=jobs)
    assert remote_summary["input"] == urls
    assert (tmp_path / "remote.json.gz").read_bytes() == (tmp_path / "local.json.gz").read_bytes()


# --- faults --------------------------------------------------------------------------------------------

def _cut(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


FAULTS = {  # name -> (served path, body or None, what the one line says)
    "404": ("/missing/trace.json.gz", None, "cannot open: not found (HTTP 404)"),
    "403": ("/forbidden/trace.json.gz", None, "cannot open: access denied (HTTP 403)"),
    "dropped": ("/drop/trace.json.gz", gzip.compress(plain_bytes(SMALL)),
                "download failed at byte 0: the connection was closed before the object's end"),
    "dropped_late": ("/drop/trace.json", plain_bytes(TRACE),  # the first 5 MiB block arrives whole
                     "download failed at byte "),
    "truncated_gzip": ("/cut/trace.json.gz", _cut(gzip.compress(plain_bytes(SMALL))), "input is truncated"),
    "truncated_zstd": ("/cut/trace.json.zst", _cut(zstandard.ZstdCompressor().compress(plain_bytes(SMALL))),
                       "input is truncated"),
    "truncated_plain": ("/cut/trace.json", _cut(plain_bytes(SMALL)), "input is truncated"),
}


@pytest.mark.parametrize("fault", FAULTS)
@JOBS
def test_http_fault_is_one_line_and_leaves_nothing(fault, jobs, http, tmp_path, capsys):
    path, body, says = FAULTS[fault]
    url = serve(http, path, body) if body is not None else http.url(path)
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "out.json"
    status, _, lines = run_main(["compact", url, "-o", str(out), "--spool-dir", str(spool), "-j", jobs], capsys)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"streamtrace: error: {url}: ") and says in lines[0], lines[0]
    if fault.startswith("dropped"):  # the reading's position in the object, no event or byte of the trace
        assert lines[0].startswith(f"streamtrace: error: {url}: download failed at byte ")
        assert "the connection was closed before the object's end" in lines[0]
    assert not out.exists() and os.listdir(spool) == [] and os.listdir(tmp_path) == ["spool"]


MISSING = [  # argv, the module made unimportable, what the one line says
    (["inspect", "https://127.0.0.1:9/x.json"], "aiohttp",
     "https://127.0.0.1:9/x.json: https:// URLs need the 'http' extra (aiohttp is not installed): "
     "pip install 'streamtrace[http]'"),
    (["inspect", "s3://b/x.json"], "s3fs",
     "s3://b/x.json: s3:// URLs need the 's3' extra (s3fs is not installed): pip install 'streamtrace[s3]'"),
    (["inspect", "gs://b/x.json"], "gcsfs",
     "gs://b/x.json: gs:// URLs need the 'gcs' extra (gcsfs is not installed): pip install 'streamtrace[gcs]'"),
    (["convert", str(SMALL), "s3://b/out.json"], "s3fs",
     "s3://b/out.json: s3:// URLs need the 's3' extra (s3fs is not installed): pip install 'streamtrace[s3]'"),
    (["inspect", "s3://b/x.json"], "fsspec",
     "s3://b/x.json: s3:// URLs need the 's3' extra (fsspec is not installed): pip install 'streamtrace[s3]'"),
]


@pytest.mark.parametrize(("argv", "module", "says"), MISSING, ids=lambda v: v if isinstance(v, str) else None)
def test_missing_scheme_package_names_the_extra(argv, module, says, tmp_path, monkeypatch, capsys):
    """With the scheme's package unimportable (as when its extra is not
    installed), input and output URLs are refused naming the extra."""
    monkeypatch.setitem(sys.modules, module, None)  # import now fails as for a package not installed
    monkeypatch.chdir(tmp_path)
    status, _, lines = run_main(argv, capsys)
    assert status == 1 and lines == [f"streamtrace: error: {says}"]
    assert os.listdir(tmp_path) == []


# --- S3 -----------------------------------------------------------------------------------------------


@JOBS
def test_s3_objects_in_and_out(jobs, s3, tmp_path, capsys):
    """Plain, gzip and zstd objects read through s3fs; outputs written to the
    bucket equal the one written to a local file."""
    plain = plain_bytes(SMALL)
    streamtrace.compact(SMALL, tmp_path / "local.json.zst", jobs=jobs)
    for compression, suffix in (("none", ""), ("gzip", ".gz"), ("zstd", ".zst")):
        key = f"in/{jobs}/trace.json{suffix}"
        s3.put_object(Bucket=BUCKET, Key=key, Body=encoded(plain, compression))
        url = f"s3://{BUCKET}/{key}"
        summary = streamtrace.compact(url, f"s3://{BUCKET}/out/{jobs}/{compression}.json.zst", jobs=jobs)
        assert summary["events_read"] == len(events_of(load_json(SMALL)))
        uploaded = s3.get_object(Bucket=BUCKET, Key=f"out/{jobs}/{compression}.json.zst")["Body"].read()
        assert uploaded == (tmp_path / "local.json.zst").read_bytes()
    status, out, _ = run_main(["relink", f"s3://{BUCKET}/in/{jobs}/trace.json.gz", "--json", "-j", jobs], capsys)
    assert status == 0 and json.loads(out)["output"] == f"s3://{BUCKET}/in/{jobs}/trace_relinked.json.gz"
    assert f"in/{jobs}/trace_relinked.json.gz" in keys(s3)  # the default output lands beside the input
    assert open_uploads(s3) == []


@pytest.fixture
def small_parts(monkeypatch) -> None:
    """Upload parts of 5 MiB (S3's least): TRACE's 7 MB output goes up in two."""
    monkeypatch.setattr(remote, "UPLOAD_PART", 5 << 20)


@pytest.fixture(scope="module")
def cut_trace() -> bytes:
    """TRACE cut at 90%: more than a part's worth of output before the cut."""
    return TRACE.read_bytes()[: TRACE.stat().st_size * 9 // 10]


def test_s3_output_appears_only_when_the_upload_completes(s3, small_parts, monkeypatch):
    """A 7 MB output goes up as a multipart upload: before it is completed
    the parts are there but the object is not."""
    url = f"s3://{BUCKET}/multipart/out.json"
    seen = {}
    commit = remote.RemoteUpload.commit

    def checked_commit(upload) -> None:
        seen["keys"] = keys(s3)
        seen["uploads"] = [u["Key"] for u in open_uploads(s3)]
        upload_id = open_uploads(s3)[0]["UploadId"]
        seen["parts"] = len(s3.list_parts(Bucket=BUCKET, Key="multipart/out.json", UploadId=upload_id)["Parts"])
        commit(upload)

    monkeypatch.setattr(remote.RemoteUpload, "commit", checked_commit)
    streamtrace.convert(TRACE, url)
    assert "multipart/out.json" not in seen["keys"] and seen["uploads"] == ["multipart/out.json"]
    assert seen["parts"] >= 1
    body = s3.get_object(Bucket=BUCKET, Key="multipart/out.json")["Body"].read()
    assert len(body) > remote.UPLOAD_PART and events_of(json.loads(body)) == events_of(load_json(TRACE))
    assert open_uploads(s3) == []


def test_failure_after_a_part_went_up_aborts_the_upload(s3, cut_trace, small_parts, monkeypatch):
    """convert streams its output: parts are uploaded before the truncation
    is met; the upload is aborted and no object appears."""
    s3.put_object(Bucket=BUCKET, Key="aborted/trace.json.gz", Body=cut_trace)
    parts_before_abort = []
    discard = remote.RemoteUpload.discard

    def counted_discard(upload) -> None:
        upload_id = open_uploads(s3)[0]["UploadId"]
        parts_before_abort.append(len(s3.list_parts(Bucket=BUCKET, Key="aborted/out.json", UploadId=upload_id)["Parts"]))
        discard(upload)

    monkeypatch.setattr(remote.RemoteUpload, "discard", counted_discard)
    with pytest.raises(streamtrace.TraceError, match="input is truncated"):
        streamtrace.convert(f"s3://{BUCKET}/aborted/trace.json.gz", f"s3://{BUCKET}/aborted/out.json")
    assert parts_before_abort[0] >= 1
    assert keys(s3) == sorted(k for k in keys(s3) if k != "aborted/out.json") and open_uploads(s3) == []


def test_interrupt_during_upload_leaves_no_object(s3, small_parts, monkeypatch, capsys):
    """Ctrl-C after the first part went up: the upload is aborted."""
    parts = []
    write = remote.RemoteUpload.write

    def interrupted_write(upload, data) -> int:
        if open_uploads(s3):  # a part is up (the upload starts with the first part)
            parts.append(len(s3.list_parts(Bucket=BUCKET, Key="interrupted/out.json",
                                           UploadId=open_uploads(s3)[0]["UploadId"])["Parts"]))
            raise KeyboardInterrupt
        return write(upload, data)

    monkeypatch.setattr(remote.RemoteUpload, "write", interrupted_write)
    status, _, lines = run_main(["convert", str(TRACE), f"s3://{BUCKET}/interrupted/out.json"], capsys)
    assert status == 130 and lines == ["streamtrace: interrupted; no output written"]
    assert parts == [1]
    assert "interrupted/out.json" not in keys(s3) and open_uploads(s3) == []


@JOBS
def test_failed_run_leaves_no_object_and_no_upload(jobs, s3, cut_trace, tmp_path, capsys):
    """A truncated input: exit 1, one line, no object, no upload left open, the spool empty."""
    key = f"failing/{jobs}/trace.json.gz"
    s3.put_object(Bucket=BUCKET, Key=key, Body=cut_trace)
    spool = tmp_path / "spool"
    spool.mkdir()
    for command in (["convert", f"s3://{BUCKET}/{key}", f"s3://{BUCKET}/failing/{jobs}/out.json"],
                    ["compact", f"s3://{BUCKET}/{key}", "-o", f"s3://{BUCKET}/failing/{jobs}/compacted.json"]):
        status, _, lines = run_main([*command, "--spool-dir", str(spool), "-j", jobs], capsys)
        assert status == 1 and len(lines) == 1, lines
        assert lines[0].startswith(f"streamtrace: error: s3://{BUCKET}/{key}: ") and "input is truncated" in lines[0]
        assert keys(s3) == sorted(k for k in keys(s3) if not k.startswith(f"failing/{jobs}/") or k == key)
        assert open_uploads(s3) == [] and os.listdir(spool) == []


def test_s3_faults_are_one_line(s3, tmp_path, capsys):
    existing = f"s3://{BUCKET}/faults/exists.json"
    s3.put_object(Bucket=BUCKET, Key="faults/exists.json", Body=plain_bytes(SMALL))
    cases = [(["inspect", f"s3://{BUCKET}/faults/missing.json"], f"s3://{BUCKET}/faults/missing.json: cannot open: not found"),
             (["inspect", "s3://no-such-bucket/x.json"], "s3://no-such-bucket/x.json: cannot open: not found"),
             (["convert", str(SMALL), existing], f"{existing}: exists; pass --overwrite to replace it"),
             (["convert", existing, existing, "--overwrite"], f"{existing}: refusing to write onto the input"),
             (["convert", str(SMALL), "https://127.0.0.1:9/out.json"],
              "https://127.0.0.1:9/out.json: cannot write to https:// URLs"),
             (["split", existing, "-o", f"s3://{BUCKET}/faults/split/"], "per-rank files go into a local directory")]
    for argv, says in cases:
        status, _, lines = run_main(argv, capsys)
        assert status == 1 and len(lines) == 1, lines
        assert lines[0].startswith("streamtrace: error: ") and says in lines[0], lines[0]
    assert [key for key in keys(s3) if key.startswith("faults/")] == ["faults/exists.json"]


def test_s3_forbidden_is_one_line(s3, tmp_path, capsys):
    """With the server checking credentials (moto's IAM simulation; the test
    keys belong to no user), reads and writes are refused with 403."""
    from moto.core.authorization import enable_iam_authentication

    s3.put_object(Bucket=BUCKET, Key="forbidden/trace.json", Body=plain_bytes(SMALL))
    url = f"s3://{BUCKET}/forbidden/trace.json"
    spool = tmp_path / "spool"
    spool.mkdir()
    with enable_iam_authentication():
        read = run_main(["inspect", url, "--spool-dir", str(spool)], capsys)
        written = run_main(["convert", str(SMALL), f"s3://{BUCKET}/forbidden/out.json"], capsys)
    assert read[0] == 1 and read[2] == [f"streamtrace: error: {url}: cannot open: access denied (HTTP 403)"]
    assert written[0] == 1 and len(written[2]) == 1 and "access denied (HTTP 403)" in written[2][0], written
    assert written[2][0].startswith(f"streamtrace: error: s3://{BUCKET}/forbidden/out.json: ")
    assert "forbidden/out.json" not in keys(s3) and os.listdir(spool) == []


def test_endpoint_from_fsspec_configuration(s3, s3_endpoint, tmp_path):
    """FSSPEC_S3_ENDPOINT_URL (fsspec's configuration) points s3:// at a server
    as well as AWS_ENDPOINT_URL does."""
    s3.put_object(Bucket=BUCKET, Key="config/trace.json", Body=plain_bytes(SMALL))
    env = {**cli_env(), "FSSPEC_S3_ENDPOINT_URL": s3_endpoint}
    env.pop("AWS_ENDPOINT_URL")
    result = run_cli(["inspect", "--json", f"s3://{BUCKET}/config/trace.json"], env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["remote_input"]["downloads"] == 1
