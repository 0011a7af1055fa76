"""Object storage failing under a run, on loopback: moto's S3 server behind a
proxy that cuts connections or answers errors on purpose (tests/bucket_servers.py).

A connection cut mid-object (reading an input, uploading a part), 503
SlowDown, a credential that expires mid-run, another writer taking the
output's name while the run uploads: a passing fault is retried (botocore's
and s3fs's retries) and the output is the same; one that persists is one
line, exit 1, and leaves no object and no open multipart upload.
"""
from __future__ import annotations

import os
import re

import pytest
from bucket_servers import CUT_REQUEST, CUT_RESPONSE, fault_proxy, s3_error
from test_buckets import BUCKET, SMALL, TRACE, keys, open_uploads, run_main, s3, s3_endpoint, small_parts  # noqa: F401

import streamtrace
from streamtrace.io import remote

pytestmark = pytest.mark.slow  # object-storage faults with retries: CI runs it, the quick loop does not

s3fs = pytest.importorskip("s3fs", reason="the s3 extra")

PART = re.compile(r"[?&]partNumber=(\d+)")
AUTH_KEY = re.compile(r"Credential=([^/]+)/")


@pytest.fixture(scope="module")
def proxy(s3_endpoint):  # noqa: F811
    """The proxy in front of moto; this process's S3 requests go through it."""
    with fault_proxy(s3_endpoint) as server:
        saved = os.environ["AWS_ENDPOINT_URL"]
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        try:
            yield server
        finally:
            os.environ["AWS_ENDPOINT_URL"] = saved
            s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def fresh(proxy, monkeypatch):
    """Each test: no fault yet, a new S3 filesystem (a new client reads AWS_MAX_ATTEMPTS), fault counts zero."""
    monkeypatch.setattr(proxy, "fault", lambda method, path, headers: None)
    proxy.faults.clear()
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def few_attempts(monkeypatch) -> None:
    """botocore tries each request twice (s3fs's own retries multiply that): a persisting fault ends in seconds."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")


def upload_parts(method: str, path: str) -> bool:
    return method == "PUT" and PART.search(path) is not None


def reads_of(key: str):
    return lambda method, path: method == "GET" and path.split("?")[0].endswith(key)


def one_line(status: int, lines: list[str], url: str, says: str) -> None:
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"streamtrace: error: {url}: ") and says in lines[0], lines[0]


def nothing_left(s3, prefix: str) -> None:  # noqa: F811
    assert [key for key in keys(s3) if key.startswith(prefix)] == [] and open_uploads(s3) == []


# --- no clobber ---------------------------------------------------------------------------------------


def test_a_writer_taking_the_name_before_completion_keeps_its_object(s3, monkeypatch, capsys):  # noqa: F811
    """The other writer creates the object after this run's check and before
    its completion: the conditional completion refuses, theirs stays."""
    url = f"s3://{BUCKET}/race/out.json"
    commit = remote.RemoteUpload.commit

    def raced(upload) -> None:
        s3.put_object(Bucket=BUCKET, Key="race/out.json", Body=b"theirs")
        commit(upload)

    monkeypatch.setattr(remote.RemoteUpload, "commit", raced)
    status, _, lines = run_main(["convert", str(SMALL), url], capsys)
    one_line(status, lines, url, "appeared while this run was writing it; pass --overwrite to replace it")
    assert s3.get_object(Bucket=BUCKET, Key="race/out.json")["Body"].read() == b"theirs"
    assert open_uploads(s3) == []


def test_the_completion_is_conditional_unless_overwriting(proxy, s3, tmp_path):  # noqa: F811
    conditions = []

    def seen(method, path, headers):
        if method == "POST" and "uploadId=" in path:
            conditions.append(headers.get("If-None-Match"))

    proxy.fault = seen
    streamtrace.convert(SMALL, f"s3://{BUCKET}/conditional/out.json")
    streamtrace.convert(SMALL, f"s3://{BUCKET}/conditional/out.json", overwrite=True)
    assert conditions == ["*", None]


def test_a_store_without_conditional_writes_gets_the_output_all_the_same(proxy, s3, tmp_path):  # noqa: F811
    """501 Not Implemented to the conditional completion: completed without the
    condition (the existence check just before stands alone)."""
    proxy.fault = lambda method, path, headers: s3_error(501, "NotImplemented") if "If-None-Match" in headers else None
    streamtrace.convert(SMALL, tmp_path / "local.json")
    streamtrace.convert(SMALL, f"s3://{BUCKET}/unconditional/out.json")
    assert proxy.faults["error"] == 1
    body = s3.get_object(Bucket=BUCKET, Key="unconditional/out.json")["Body"].read()
    assert body == (tmp_path / "local.json").read_bytes() and open_uploads(s3) == []


def test_a_client_too_old_to_ask_the_condition_completes_without_it(proxy, s3, tmp_path):  # noqa: F811
    """botocore before 1.35.20 refuses the IfNoneMatch parameter itself (ParamValidationError)."""
    from botocore.exceptions import ParamValidationError

    url = f"s3://{BUCKET}/old_client/out.json"
    fs = remote._filesystem(url)[0]  # the instance the run gets (fsspec hands out one per options)
    fs.connect()
    refused = []

    def unknown_parameter(params, **kwargs):
        if "IfNoneMatch" in params:
            refused.append(params["Key"])
            raise ParamValidationError(report="Unknown parameter in input: \"IfNoneMatch\"")

    fs.s3.meta.events.register("before-parameter-build.s3.CompleteMultipartUpload", unknown_parameter)
    streamtrace.convert(SMALL, tmp_path / "local.json")
    streamtrace.convert(SMALL, url)
    assert refused == ["old_client/out.json"]
    body = s3.get_object(Bucket=BUCKET, Key="old_client/out.json")["Body"].read()
    assert body == (tmp_path / "local.json").read_bytes() and open_uploads(s3) == []


def test_a_filesystem_without_exclusive_writes_uploads_all_the_same(s3, tmp_path, monkeypatch):  # noqa: F811
    """Older fsspec and s3fs refuse the mode "xb" when the file is opened."""
    opened = []
    open_file = s3fs.S3FileSystem._open

    def without_x(fs, path, mode="rb", **kwargs):
        opened.append(mode)
        if "x" in mode:
            raise NotImplementedError("File mode not supported")
        return open_file(fs, path, mode, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_open", without_x)
    streamtrace.convert(SMALL, tmp_path / "local.json")
    streamtrace.convert(SMALL, f"s3://{BUCKET}/no_x/out.json")
    assert opened == ["xb", "wb"]
    body = s3.get_object(Bucket=BUCKET, Key="no_x/out.json")["Body"].read()
    assert body == (tmp_path / "local.json").read_bytes() and open_uploads(s3) == []


# --- connections cut ----------------------------------------------------------------------------------


def test_a_read_cut_once_is_read_again(proxy, s3, tmp_path):  # noqa: F811
    s3.put_object(Bucket=BUCKET, Key="cut/once.json.gz", Body=TRACE.read_bytes())
    cuts = []

    def cut_first(method, path, headers):
        if reads_of("cut/once.json.gz")(method, path) and not cuts:
            cuts.append(path)
            return CUT_RESPONSE
        return None

    proxy.fault = cut_first
    streamtrace.convert(TRACE, tmp_path / "local.json")
    streamtrace.convert(f"s3://{BUCKET}/cut/once.json.gz", tmp_path / "remote.json")
    assert proxy.faults["cut response"] == 1
    assert (tmp_path / "remote.json").read_bytes() == (tmp_path / "local.json").read_bytes()


def test_a_read_cut_every_time_is_one_line(proxy, s3, few_attempts, tmp_path, capsys):  # noqa: F811
    s3.put_object(Bucket=BUCKET, Key="cut/always.json.gz", Body=TRACE.read_bytes())
    url = f"s3://{BUCKET}/cut/always.json.gz"
    proxy.fault = lambda method, path, headers: CUT_RESPONSE if reads_of("cut/always.json.gz")(method, path) else None
    spool = tmp_path / "spool"
    spool.mkdir()
    for argv in (["convert", url, str(tmp_path / "out.json")],
                 ["convert", url, f"s3://{BUCKET}/cut/always_out.json"]):
        status, _, lines = run_main([*argv, "--spool-dir", str(spool)], capsys)
        one_line(status, lines, url, "the connection was closed before the object's end")
    assert proxy.faults["cut response"] > 1
    assert os.listdir(tmp_path) == ["spool"] and os.listdir(spool) == []
    nothing_left(s3, "cut/always_out")


def test_an_upload_cut_once_is_sent_again(proxy, s3, small_parts, tmp_path):  # noqa: F811
    cuts = []

    def cut_second_part(method, path, headers):
        if upload_parts(method, path) and PART.search(path).group(1) == "2" and not cuts:
            cuts.append(path)
            return CUT_REQUEST
        return None

    proxy.fault = cut_second_part
    streamtrace.convert(TRACE, tmp_path / "local.json")
    streamtrace.convert(TRACE, f"s3://{BUCKET}/cut/upload_once.json")
    assert cuts and proxy.faults["cut request"] == 1
    assert s3.get_object(Bucket=BUCKET, Key="cut/upload_once.json")["Body"].read() == (tmp_path / "local.json").read_bytes()
    assert open_uploads(s3) == []


def test_an_upload_cut_every_time_is_one_line_and_leaves_nothing(proxy, s3, small_parts, few_attempts, capsys):  # noqa: F811
    url = f"s3://{BUCKET}/cut/upload_always.json"
    proxy.fault = lambda method, path, headers: CUT_REQUEST if upload_parts(method, path) else None
    status, _, lines = run_main(["convert", str(TRACE), url], capsys)
    one_line(status, lines, url, "cannot upload: the connection was closed")
    assert proxy.faults["cut request"] > 1
    nothing_left(s3, "cut/upload_always")


# --- the store pushing back -----------------------------------------------------------------------------


def test_slowdown_is_answered_with_retries(proxy, s3, small_parts, tmp_path):  # noqa: F811
    """503 SlowDown to the first three requests for parts: botocore backs off and sends them again."""
    def slow_down(method, path, headers):
        if upload_parts(method, path) and proxy.faults["error"] < 3:
            return s3_error(503, "SlowDown")
        return None

    proxy.fault = slow_down
    streamtrace.convert(TRACE, tmp_path / "local.json")
    streamtrace.convert(TRACE, f"s3://{BUCKET}/slow/out.json")
    assert proxy.faults["error"] == 3
    assert s3.get_object(Bucket=BUCKET, Key="slow/out.json")["Body"].read() == (tmp_path / "local.json").read_bytes()
    assert open_uploads(s3) == []


def test_slowdown_that_persists_is_one_line_and_leaves_nothing(proxy, s3, few_attempts, capsys):  # noqa: F811
    url = f"s3://{BUCKET}/slow/always.json"
    proxy.fault = lambda method, path, headers: s3_error(503, "SlowDown") if upload_parts(method, path) else None
    status, _, lines = run_main(["convert", str(SMALL), url], capsys)
    one_line(status, lines, url, "HTTP 503 SlowDown")
    nothing_left(s3, "slow/always")


def test_a_credential_expiring_mid_upload_is_one_line_and_leaves_nothing(proxy, s3, small_parts, monkeypatch,  # noqa: F811
                                                                         capsys):
    """After the first part the run's key is refused as expired and its
    source has a renewed one: the run stops, and the upload is aborted with
    the renewed credentials."""
    expired = os.environ["AWS_ACCESS_KEY_ID"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", expired)  # restored after the test

    def expiring(method, path, headers):
        if upload_parts(method, path) and PART.search(path).group(1) == "2":
            os.environ["AWS_ACCESS_KEY_ID"] = "renewed"
        key = AUTH_KEY.search(headers.get("Authorization", ""))
        return s3_error(400, "ExpiredToken") if key and key.group(1) == expired and \
            os.environ["AWS_ACCESS_KEY_ID"] == "renewed" else None

    proxy.fault = expiring
    url = f"s3://{BUCKET}/expired/out.json"
    status, _, lines = run_main(["convert", str(TRACE), url], capsys)
    one_line(status, lines, url, "cannot upload: HTTP 400 ExpiredToken")
    nothing_left(s3, "expired/")


def test_a_credential_expiring_between_inputs_is_one_line(proxy, s3, tmp_path, monkeypatch, capsys):  # noqa: F811
    for rank in (0, 1):
        s3.put_object(Bucket=BUCKET, Key=f"expiring/rank{rank}_trace.json.gz", Body=SMALL.read_bytes())
    expired = os.environ["AWS_ACCESS_KEY_ID"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", expired)

    def expiring(method, path, headers):
        if "rank1" in path:
            os.environ["AWS_ACCESS_KEY_ID"] = "renewed"
        key = AUTH_KEY.search(headers.get("Authorization", ""))
        return s3_error(400, "ExpiredToken") if key and key.group(1) == expired and "rank1" in path else None

    proxy.fault = expiring
    inputs = [f"s3://{BUCKET}/expiring/rank{rank}_trace.json.gz" for rank in (0, 1)]
    status, _, lines = run_main(["merge", *inputs, "-o", str(tmp_path / "merged.json"), "-j", "1"], capsys)
    one_line(status, lines, inputs[1], "cannot open: HTTP 400")  # (a HEAD's error has no body to name the code)
    assert os.listdir(tmp_path) == []
