"""Archives as inputs: told by content, one trace read as that trace, merge
reading an archive like a directory of rank files, others refused by name."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard
from conftest import TRACES

import streamtrace
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_rank_trace

SMALL = TRACES / "kineto_small.json"
RANKS = sorted((TRACES / "dlrm_8ranks").glob("*.json.gz"))


def _tar_bytes(members: dict[str, bytes], *, directory: str | None = None) -> bytes:
    """A tar (as GNU tar writes it, a directory entry first when given) of ``members``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if directory:
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(f"{directory}/{name}" if directory else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _gzip(data: bytes) -> bytes:
    import gzip
    return gzip.compress(data, mtime=0)


FORMATS = {
    "tar": lambda members: _tar_bytes(members, directory="agent_evals"),
    "tar.gz": lambda members: _gzip(_tar_bytes(members, directory="agent_evals")),
    "tar.zst": lambda members: zstandard.ZstdCompressor().compress(_tar_bytes(members)),
    "zip": _zip_bytes,
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("form", FORMATS)
def test_an_archive_holding_one_trace_reads_as_that_trace(tmp_path, form):
    """Named like a trace (as the public test traces are), the archive is told
    by its content; every command reads the trace inside (converted output
    equal to converting the trace itself; the archive left unchanged)."""
    trace = SMALL.read_bytes()
    archive = _write(tmp_path / "kineto.trace.json.gz", FORMATS[form]({"kineto_small.json": trace}))
    before = archive.read_bytes()
    streamtrace.convert(SMALL, tmp_path / "expected.json")
    streamtrace.convert(archive, tmp_path / "got.json")
    assert (tmp_path / "got.json").read_bytes() == (tmp_path / "expected.json").read_bytes()
    assert streamtrace.inspect(archive)["events"] == streamtrace.inspect(SMALL)["events"]
    streamtrace.attribute(archive, tmp_path / "got.csv")
    streamtrace.attribute(SMALL, tmp_path / "expected.csv")
    assert (tmp_path / "got.csv").read_bytes() == (tmp_path / "expected.csv").read_bytes()
    assert archive.read_bytes() == before


def test_a_member_inside_an_archive_may_be_compressed_and_named(tmp_path):
    """A gzip'ed trace in a zip; and ``ARCHIVE!MEMBER`` picks one of several."""
    archive = _write(tmp_path / "ranks.zip", _zip_bytes({path.name: path.read_bytes() for path in RANKS[:2]}))
    got = streamtrace.inspect(f"{archive}!{RANKS[1].name}")
    assert got["events"] == streamtrace.inspect(RANKS[1])["events"]


@pytest.mark.parametrize("form", FORMATS)
def test_an_archive_of_several_files_is_refused_naming_them(tmp_path, form):
    members = {"a.json": SMALL.read_bytes(), "notes.txt": b"hello"}
    archive = _write(tmp_path / "x.json", FORMATS[form](members))
    with pytest.raises(TraceError) as caught:
        streamtrace.convert(archive, tmp_path / "out.json")
    assert "holding 2 files" in str(caught.value) and "a.json" in str(caught.value)
    assert "notes.txt" in str(caught.value)
    assert not (tmp_path / "out.json").exists()
    result = subprocess.run([sys.executable, "-m", "streamtrace", "inspect", str(archive)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and str(archive) in result.stderr


@pytest.mark.slow  # every archive form at every N, merged
@pytest.mark.parametrize("form", ["tar.gz", "zip", "tar"])
@pytest.mark.parametrize("jobs", [1, 2])
def test_merge_reads_an_archive_like_a_directory_of_rank_files(tmp_path, form, jobs):
    """The 8 real DLRM ranks in one archive merge to the same bytes as the
    8 files named one by one, for every -j."""
    archive = _write(tmp_path / "traces.bin", FORMATS[form]({path.name: path.read_bytes() for path in RANKS}))
    streamtrace.merge(RANKS, tmp_path / "expected.json", jobs=1)
    streamtrace.merge([archive], tmp_path / "got.json", jobs=jobs)
    assert (tmp_path / "got.json").read_bytes() == (tmp_path / "expected.json").read_bytes()


def test_a_truncated_archive_is_refused_in_one_line(tmp_path):
    whole = _gzip(_tar_bytes({"kineto_small.json": SMALL.read_bytes()}))
    archive = _write(tmp_path / "cut.tgz", whole[: len(whole) * 2 // 3])
    result = subprocess.run([sys.executable, "-m", "streamtrace", "convert", str(archive), str(tmp_path / "o.json")],
                            capture_output=True, text=True)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("form", FORMATS)
def test_pass_one_workers_and_pass_two_read_an_archived_trace(tmp_path, form, monkeypatch):
    """With -j 2, pass-1 workers index chunks of the member (the size floor
    and chunk size lowered so a small trace takes that path, as a multi-GB
    one would), and compact's pass 2 re-reads; the output is the same bytes
    as from the plain trace with -j 1."""
    from streamtrace.engine import indexworkers, parseproc, passes
    used = []
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 8 << 10)
    real = indexworkers.index_by_ranges

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        used.append(result is not None)
        return result

    monkeypatch.setattr(passes, "index_by_ranges", recording)
    trace = tmp_path / "rank0_trace.json"
    with trace.open("wb") as out:
        write_rank_trace(SynthConfig(ranks=1, pp_stages=1), 0, out, steps=2)
    archive = _write(tmp_path / "trace.archive", FORMATS[form]({trace.name: trace.read_bytes()}))
    streamtrace.compact(trace, tmp_path / "expected.json", jobs=1)  # (this process indexes the same chunks)
    assert used == [True]
    streamtrace.compact(archive, tmp_path / "got.json", jobs=2)
    assert used == [True, True]
    assert (tmp_path / "got.json").read_bytes() == (tmp_path / "expected.json").read_bytes()


def test_writing_onto_the_archive_of_an_input_member_is_refused(tmp_path):
    archive = _write(tmp_path / "ranks.zip", _zip_bytes({path.name: path.read_bytes() for path in RANKS[:2]}))
    before = archive.read_bytes()
    with pytest.raises(TraceError, match="onto the input"):
        streamtrace.convert(f"{archive}!{RANKS[0].name}", archive, overwrite=True)
    with pytest.raises(TraceError, match="onto the input"):
        streamtrace.merge([archive], archive, overwrite=True)
    assert archive.read_bytes() == before


def test_an_archive_on_stdin_is_spooled_and_read_as_its_trace(tmp_path):
    archive = FORMATS["tar.gz"]({"kineto_small.json": SMALL.read_bytes()})
    result = subprocess.run([sys.executable, "-m", "streamtrace", "inspect", "-", "--json", "-q"],
                            input=archive, capture_output=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["events"] == streamtrace.inspect(SMALL)["events"]
