"""Sources: compression by magic bytes, multi-frame streams, URLs, progress."""
from __future__ import annotations

import gzip
import io
import json

import pytest
import zstandard

import streamtrace
from streamtrace.io.progress import Progress

EVENTS = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i + 0.5, "dur": 0.25} for i in range(300)]
DOC = json.dumps({"schemaVersion": 1, "traceEvents": EVENTS}).encode()


def test_compression_is_told_by_magic_not_suffix(tmp_path):
    misleading = tmp_path / "trace.json"
    misleading.write_bytes(zstandard.ZstdCompressor().compress(DOC))
    summary = streamtrace.inspect(misleading)
    assert summary["compression"] == "zstd" and summary["events"] == len(EVENTS)
    plain_named_gz = tmp_path / "trace.json.gz"
    plain_named_gz.write_bytes(DOC)
    assert streamtrace.inspect(plain_named_gz)["compression"] == "none"


def test_multi_frame_zstd_and_multi_member_gzip(tmp_path):
    half = len(DOC) // 2
    frames = zstandard.ZstdCompressor().compress(DOC[:half]) + zstandard.ZstdCompressor().compress(DOC[half:])
    members = gzip.compress(DOC[:half]) + gzip.compress(DOC[half:])
    for name, blob in (("t.zst", frames), ("t.gz", members)):
        path = tmp_path / name
        path.write_bytes(blob)
        assert streamtrace.inspect(path)["events"] == len(EVENTS)


def test_binary_file_objects_in_and_out():
    out = io.BytesIO()
    summary = streamtrace.convert(io.BytesIO(gzip.compress(DOC)), out, compress="zstd")
    assert summary["events_written"] == len(EVENTS)
    assert json.loads(zstandard.ZstdDecompressor().decompressobj().decompress(out.getvalue()))["traceEvents"] == EVENTS


def test_corrupt_gzip_is_a_clean_error(tmp_path):
    blob = bytearray(gzip.compress(DOC))
    blob[-6] ^= 0xFF  # CRC
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(blob))
    with pytest.raises(streamtrace.TraceError, match="corrupt gzip"):
        streamtrace.inspect(path)


def test_fsspec_url_source(tmp_path):
    pytest.importorskip("fsspec")
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC))
    summary = streamtrace.inspect(f"file://{path}")
    assert summary["events"] == len(EVENTS) and summary["input"] == f"file://{path}"


def test_progress_reports_bytes_events_and_pass():
    stream = io.StringIO()
    progress = Progress(2_000_000_000, enabled=True, stream=stream)
    progress._next = 0
    progress.update("pass 1", 500_000_000, 1000)
    assert "pass 1: 0.50 of 2.00 GB (25%), 1,000 events" in stream.getvalue()
    progress.done()
    quiet = io.StringIO()
    Progress(10, enabled=False, stream=quiet).update("pass 1", 5, 5)
    assert quiet.getvalue() == ""
