"""inspect and convert on every real trace, in every input form."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import zstandard
from conftest import events_of, load_json

import streamtrace


def _plain_bytes(path: Path) -> bytes:
    import gzip
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _forms(path: Path, tmp: Path) -> dict[str, Path]:
    """The same trace as plain JSON, gzip and zstd files."""
    import gzip
    plain = _plain_bytes(path)
    forms = {"plain": tmp / "t.json", "gzip": tmp / "t.json.gz", "zstd": tmp / "t.json.zst"}
    forms["plain"].write_bytes(plain)
    forms["gzip"].write_bytes(gzip.compress(plain))
    forms["zstd"].write_bytes(zstandard.ZstdCompressor().compress(plain))
    return forms


def test_inspect_counts_every_event_in_every_form(real_trace, tmp_path):
    expected = events_of(load_json(real_trace))
    for form, path in _forms(real_trace, tmp_path).items():
        summary = streamtrace.inspect(path)
        assert summary["events"] == len(expected), form
        assert summary["compression"] == {"plain": "none"}.get(form, form)
        by_kind = sum(summary["events_by_ph_cat"].values())
        assert by_kind == len(expected)
    piped = subprocess.run(
        [sys.executable, "-m", "streamtrace", "inspect", "--json", "-"],
        stdin=open(real_trace, "rb"), capture_output=True, check=True,
    )
    assert json.loads(piped.stdout)["events"] == len(expected)


def test_convert_gz_zst_json_round_trip_preserves_everything(real_trace, tmp_path):
    original = load_json(real_trace)
    gz = tmp_path / "a.json.gz"
    zst = tmp_path / "b.json.zst"
    plain = tmp_path / "c.json"
    streamtrace.convert(real_trace, gz)
    streamtrace.convert(gz, zst)
    summary = streamtrace.convert(zst, plain)
    assert zst.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    result = json.loads(plain.read_bytes())
    assert events_of(result) == events_of(original)
    assert summary["events_written"] == len(events_of(original))
    if isinstance(original, dict):
        assert list(result) == list(original)
        assert result == original


def test_convert_drop_category_removes_exactly_those_events(real_trace, tmp_path):
    original = events_of(load_json(real_trace))
    out = tmp_path / "dropped.json"
    summary = streamtrace.convert(real_trace, out, drop_categories=["cpu_op", "python_function"])
    kept = events_of(json.loads(out.read_bytes()))
    assert kept == [e for e in original if e.get("cat") not in ("cpu_op", "python_function")]
    assert summary["events_dropped"] == len(original) - len(kept)
