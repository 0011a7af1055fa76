"""``-j N``: one meaning everywhere, and the same output for every N.

Children and workers only pay off on large inputs, so these tests lower the
thresholds: every file is read by pass-1 workers (``parseproc.MIN_BYTES``)
in chunks of 8 KiB (``indexworkers.CHUNK_BYTES``), many per worker, cut by
windows up to near the end (``reader.TAIL_WINDOW``), and the spool is read
back in small blocks (``spool.READ_BLOCK``), so that pass 2
hands many blocks to each worker, out of step with the event kinds.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from conftest import REAL_TRACES, ROOT, all_but_first_slow, large_ones_slow
from hypothesis import given, settings
from hypothesis import strategies as st
from test_redact import write_planted_run

import streamtrace
from streamtrace.commands import compactemit
from streamtrace.commands.inspectindex import InspectVisitor
from streamtrace.engine import indexworkers, parseproc
from streamtrace.engine import jobs as jobs_module
from streamtrace.engine.jobs import resolve_jobs
from streamtrace.errors import TraceError
from streamtrace.io import reader, spool
from streamtrace.io.gzipped import GzipPieces
from streamtrace.io.projection import Projection
from streamtrace.io.sink import EvenWrites, OutputTarget
from streamtrace.io.writer import TraceWriter
from streamtrace.synth import SynthConfig, write_traces

TIMING = {"wall_seconds", "pass1_seconds", "plan_seconds", "pass2_seconds", "peak_rss_mb"}


@pytest.fixture
def small_pieces(monkeypatch):
    """Every file read by pass-1 workers (or the parse child) 8 KiB at a
    time, a plain file's chunks cut by windows up to its last 24 KiB, the
    spool read 16 KiB at a time, and gzip outputs cut into 1 KiB pieces (so
    that pass-2 workers compress whole pieces and straddling ones remain)."""
    monkeypatch.setattr(GzipPieces, "PIECE", 1 << 10)
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 8 << 10)
    monkeypatch.setattr(reader, "TAIL_WINDOW", 16 << 10)
    monkeypatch.setattr(spool, "READ_BLOCK", 16 << 10)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """A single-rank PP trace with CUDA-graph replays, and a merged 4-rank one."""
    directory = tmp_path_factory.mktemp("jobs")
    write_traces(SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=2, graph_kernels=8, graph_streams=4),
                 directory, compress="none")
    return {"single": directory / "rank0_trace.json", "merged": directory / "merged_trace.json"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(directory: Path) -> dict[str, str]:
    return {path.name: digest(path) for path in sorted(directory.iterdir())}


def without_timing(summary: dict, *paths: str) -> dict:
    """A summary with what differs between any two runs (times, memory, output paths) left out."""
    return {key: value for key, value in summary.items() if key not in TIMING and key not in paths}


# --- resolve_jobs -------------------------------------------------------------------------------


def test_auto_is_the_usable_cpus_at_most_four(monkeypatch):
    monkeypatch.delenv(jobs_module.ENVIRONMENT, raising=False)
    for cpus, expected in ((1, 1), (2, 2), (3, 3), (4, 4), (64, 4)):
        monkeypatch.setattr(jobs_module, "usable_cpus", lambda cpus=cpus: cpus)
        assert resolve_jobs(None) == expected
        assert resolve_jobs("auto") == expected
        assert resolve_jobs("AUTO") == expected


def test_usable_cpus_follow_the_affinity_mask():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity call on this platform")
    assert jobs_module.usable_cpus() == len(os.sched_getaffinity(0))


def test_environment_replaces_the_default_only(monkeypatch):
    monkeypatch.setenv(jobs_module.ENVIRONMENT, "3")
    assert resolve_jobs(None) == 3
    assert resolve_jobs(1) == 1
    assert resolve_jobs("2") == 2


@pytest.mark.parametrize("bad", [0, -1, "0", "two", "1.5", "", True, 2.0])
def test_bad_counts_are_refused(bad, monkeypatch):
    monkeypatch.delenv(jobs_module.ENVIRONMENT, raising=False)
    with pytest.raises(TraceError, match="-j takes"):
        resolve_jobs(bad)


def test_an_empty_environment_value_means_the_default(monkeypatch):
    monkeypatch.setenv(jobs_module.ENVIRONMENT, "")
    monkeypatch.setattr(jobs_module, "usable_cpus", lambda: 3)
    assert resolve_jobs(None) == 3


def test_bad_environment_value_is_named(monkeypatch):
    monkeypatch.setenv(jobs_module.ENVIRONMENT, "many")
    with pytest.raises(TraceError, match="STREAMTRACE_JOBS takes"):
        resolve_jobs(None)


@pytest.mark.parametrize("argv, env, words", [
    (["-j", "0"], {}, "-j takes"),
    (["-j", "lots"], {}, "-j takes"),
    ([], {"STREAMTRACE_JOBS": "x"}, "STREAMTRACE_JOBS takes"),
])
def test_cli_refuses_a_bad_count_in_one_line(argv, env, words, tmp_path):
    trace = REAL_TRACES[0]
    result = subprocess.run([sys.executable, "-m", "streamtrace", "inspect", str(trace), "--json", *argv],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"streamtrace: error: {result.stderr.split('error: ', 1)[1].strip()}"]
    assert words in result.stderr


# --- the same output for every N ----------------------------------------------------------------


def run_all(command, source: Path, tmp_path: Path, name: str, **options) -> list[tuple[str, dict]]:
    """(output digest, summary) of ``command`` at -j 1, 2 and 3."""
    results = []
    for jobs in (1, 2, 3):
        out = tmp_path / f"{jobs}-{name}"
        summary = command(source, out, jobs=jobs, **options)
        results.append((digest(out) if out.is_file() else tree_digest(out), without_timing(summary, "output",
                                                                                          "output_dir")))
    return results


COMMANDS = {
    "compact": (streamtrace.compact, "out.json", {}),
    "compact to gzip": (streamtrace.compact, "out.json.gz", {}),
    "relink": (streamtrace.relink, "out.json", {}),
    "relink to gzip": (streamtrace.relink, "out.json.gz", {}),
    "convert": (streamtrace.convert, "out.json.gz", {}),
    "convert --drop-cat": (streamtrace.convert, "out.json", {"drop_categories": ["python_function", "nope"]}),
    "split": (streamtrace.split, "ranks", {"compress": "none"}),
    "attribute": (streamtrace.attribute, "out.csv", {}),
    "slice-window": (streamtrace.slice_trace, "out.json", {"window": "+10us:+2ms", "drop_categories": ["Trace"]}),
    "slice-steps": (streamtrace.slice_trace, "out.json.gz", {"steps": "1"}),
    "slice-each-step": (streamtrace.slice_trace, "steps", {"each_step": True, "compress": "none"}),
}


@pytest.mark.slow  # the matrix: every real trace through every command at every N
@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("trace", REAL_TRACES, ids=lambda p: p.name)
def test_real_traces_come_out_the_same_for_every_n(name, trace, tmp_path, small_pieces):
    command, output, options = COMMANDS[name]
    try:
        results = run_all(command, trace, tmp_path, output, **options)
    except TraceError as refused:  # e.g. split of a file without ranks: the same refusal at every N
        for jobs in (2, 3):
            with pytest.raises(TraceError) as again:
                command(trace, tmp_path / f"again{jobs}-{output}", jobs=jobs, **options)
            assert str(again.value) == str(refused)
        return
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.slow  # the matrix: generated traces through every command at every N
@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("kind", ["single", "merged"])
def test_generated_traces_come_out_the_same_for_every_n(name, kind, generated, tmp_path, small_pieces):
    command, output, options = COMMANDS[name]
    results = run_all(command, generated[kind], tmp_path, output, **options)
    assert results[1] == results[0] and results[2] == results[0]


def _events_one_a_line(events: list, dumps) -> bytes:
    return b",\n".join(dumps(event).encode() for event in events)


TEXT_FORMS = {  # the same trace written in other ways a JSON writer may: (document) -> bytes
    "compact": lambda document: json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode(),
    "spaces after colons": lambda document: json.dumps({**document, "traceEvents": []}).encode().replace(
        b'"traceEvents": []', b'"traceEvents": [\n' + _events_one_a_line(document["traceEvents"], json.dumps) + b"\n]"),
    "escaped unicode and slashes": lambda document: json.dumps(document, separators=(",", ":")).replace(
        "/", "\\/").encode(),
    "pretty-printed": lambda document: json.dumps(document, indent=2, ensure_ascii=False).encode(),
    "CRLF": lambda document: json.dumps(document, indent=1).replace("\n", "\r\n").encode(),
    "one line with spaces": lambda document: json.dumps(document, ensure_ascii=False).encode(),
}


@pytest.fixture(scope="module")
def unusual_texts(generated, tmp_path_factory) -> dict[str, Path]:
    """The generated single-rank trace, its names given non-ASCII letters
    and slashes, written in each of :data:`TEXT_FORMS`."""
    document = json.loads(generated["single"].read_bytes())
    for event in document["traceEvents"]:
        if isinstance(event.get("name"), str) and event.get("cat") in ("kernel", "gpu_user_annotation", "cpu_op"):
            event["name"] = event["name"] + " é/ü"
    directory = tmp_path_factory.mktemp("texts")
    paths = {}
    for form, write in TEXT_FORMS.items():
        paths[form] = directory / (form.replace(" ", "_") + ".json")
        paths[form].write_bytes(write(document))
    return paths


@pytest.mark.parametrize("name", all_but_first_slow(["compact", "relink", "split", "slice-window"]))
@pytest.mark.parametrize("form", TEXT_FORMS)
def test_unusual_text_comes_out_the_same_for_every_n_and_as_json(name, form, unusual_texts, tmp_path, small_pieces):
    """Events whose own text reaches the spool (spaces, escapes, line
    breaks): the output is the same bytes at every N, valid JSON, and holds
    the same events as the compact writing of the same trace gives."""
    command, output, options = COMMANDS[name]
    results = run_all(command, unusual_texts[form], tmp_path, output, **options)
    assert results[1] == results[0] and results[2] == results[0]
    reference = tmp_path / "reference"
    command(unusual_texts["compact"], reference, jobs=2, **options)
    got = tmp_path / f"1-{output}"
    pairs = [(got, reference)] if got.is_file() else [(got / path.name, path) for path in sorted(reference.iterdir())]
    for produced, expected in pairs:
        assert json.loads(produced.read_bytes()) == json.loads(expected.read_bytes())


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES), ids=lambda p: p.name)
def test_inspect_says_the_same_for_every_n(trace, small_pieces):
    summaries = [without_timing(streamtrace.inspect(trace, jobs=jobs)) for jobs in (1, 2, 3)]
    assert summaries[1] == summaries[0] and summaries[2] == summaries[0]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Path]:
    """The generated traces with secrets planted (as in test_redact), and home paths to pseudonymize."""
    return write_planted_run(SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=2, graph_kernels=8,
                                         graph_streams=4), tmp_path_factory.mktemp("planted_jobs"))


REDACTING = {  # name: (command, input, output, options)
    "redact": (streamtrace.redact, "rank0_trace.json", "out.json.gz", {"pseudonymize": ("hosts", "users", "paths")}),
    "convert": (streamtrace.convert, "rank0_trace.json", "out.json",
                {"redact": streamtrace.RedactOptions(pseudonymize=("users",))}),
    "compact": (streamtrace.compact, "rank0_trace.json", "out.json", {"redact": True}),
    "relink": (streamtrace.relink, "merged_trace.json", "out.json.zst", {"redact": True}),
    "split": (streamtrace.split, "merged_trace.json", "ranks", {"compress": "none", "redact": True}),
    "slice": (streamtrace.slice_trace, "merged_trace.json", "out.json", {"steps": "1", "redact": True}),
}


@pytest.mark.parametrize("name", REDACTING)
def test_redaction_comes_out_the_same_for_every_n(name, planted, tmp_path, small_pieces):
    command, trace, output, options = REDACTING[name]
    results = run_all(command, planted[trace], tmp_path, output, **options)
    assert results[0][1]["redaction"]["secrets_redacted"]
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.slow
def test_redacting_merge_comes_out_the_same_for_every_n(planted, tmp_path, small_pieces):
    ranks = [planted["rank0_trace.json"], planted["rank1_trace.json"]]
    results = []
    for jobs in (1, 2, 3):
        out = tmp_path / f"merged{jobs}.json"
        summary = streamtrace.merge(ranks, out, jobs=jobs, redact=streamtrace.RedactOptions(pseudonymize=("paths",)))
        results.append((digest(out), without_timing(summary, "output")))
    assert results[0][1]["redaction"]["secrets_redacted"]
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.parametrize("kind", ["single", "merged"])
def test_inspect_of_generated_traces_says_the_same_for_every_n(kind, generated, small_pieces):
    summaries = [without_timing(streamtrace.inspect(generated[kind], jobs=jobs)) for jobs in (1, 2, 3)]
    assert summaries[0]["graph_launches"]["count"] and summaries[0]["gpu_busy"]
    assert summaries[1] == summaries[0] and summaries[2] == summaries[0]


def colliding_launches(path: Path) -> Path:
    """Two ranks' GPU events whose ids also name a kernel launch of the other
    rank, launched before or after them, by a graph launch or not, spread over
    many 8 KiB chunks: which GPU events belong to a graph launch depends on
    what came before each one."""
    filler = [{"ph": "X", "cat": "cpu_op", "name": "aten::pad" + "x" * 60, "pid": 9, "tid": 1, "ts": n, "dur": 1}
              for n in range(60)]
    events: list[dict] = []
    for round_ in range(40):
        launchers = ((1, "cudaGraphLaunch"), (2, "cudaLaunchKernel"))
        for pid, name in launchers if round_ % 4 else launchers[::-1]:
            kernel = {"ph": "X", "cat": "kernel", "name": f"k{round_ % 3}", "pid": pid + 10, "tid": 7,
                      "ts": 1000 * round_ + pid, "dur": 3.25, "args": {"correlation": round_}}
            launch = {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": 1,
                      "ts": 1000 * round_, "dur": 1, "args": {"correlation": round_}}
            gap = filler[:round_ % 7 * 9]
            events += [kernel, *gap, launch] if (round_ + pid) % 3 else [launch, *gap, kernel]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_graph_launches_are_judged_the_same_for_every_n(tmp_path, small_pieces):
    trace = colliding_launches(tmp_path / "collide.json")
    summaries = [without_timing(streamtrace.inspect(trace, jobs=jobs)) for jobs in (1, 2, 3)]
    assert summaries[0]["graph_launches"]["count"] == 40
    assert summaries[1] == summaries[0] and summaries[2] == summaries[0]


@pytest.mark.parametrize("member", [b'"x": 1e400', b'"x": 2E+308', b'"x": "caf\xe9"', b'"x": 123456789012345678901234'])
def test_a_projection_reads_no_chunk_the_fast_reading_would_not(member):
    """A projection skips members it does not read; the fast reading (orjson) parses them, and refuses a
    float beyond a double and text that is not UTF-8 (and rounds an integer beyond 64 bits): such a chunk
    must go the ordinary way, as the -j 1 reading would."""
    plain = b'{"ph": "X", "cat": "kernel", "pid": 1, "ts": 5, "dur": 2, "args": {"y": 1}}'
    odd = plain.replace(b'"y": 1', member)
    projection = Projection({"ph": None, "ts": None})
    assert [event.ts for event in projection.decode(plain + b"," + plain)] == [5, 5]
    assert projection.decode(plain + b"," + odd) is None
    assert InspectVisitor.projection.decode(plain + b"," + odd) is None


def test_inspect_of_numbers_the_fast_reading_refuses_says_the_same_for_every_n(tmp_path, small_pieces):
    events = [{"ph": "X", "cat": "kernel", "name": f"k{n % 3}", "pid": 1, "tid": 7, "ts": 10 * n, "dur": 3,
               "args": {"correlation": n, "note": "N"}} for n in range(400)]
    text = json.dumps({"traceEvents": events}).replace('"note": "N"', '"note": 1e400', 1)
    (tmp_path / "huge.json").write_text(text)
    summaries = [without_timing(streamtrace.inspect(tmp_path / "huge.json", jobs=jobs)) for jobs in (1, 2, 3)]
    assert summaries[0]["exact_numbers"]
    assert summaries[1] == summaries[0] and summaries[2] == summaries[0]


def test_inspect_finds_the_same_secrets_for_every_n(planted, small_pieces):
    found = [streamtrace.inspect(planted["merged_trace.json"], jobs=jobs)["secrets_found"] for jobs in (1, 2, 3)]
    assert found[0] and found[1] == found[0] and found[2] == found[0]


@pytest.mark.slow
def test_merge_comes_out_the_same_for_every_n(generated, tmp_path, small_pieces):
    ranks = sorted(generated["single"].parent.glob("rank*_trace.json"))
    results = []
    for jobs in (1, 2, 3):
        out = tmp_path / f"merged{jobs}.json"
        summary = streamtrace.merge(ranks, out, jobs=jobs)
        results.append((digest(out), without_timing(summary, "output")))
    assert results[1] == results[0] and results[2] == results[0]


# --- failures in workers ------------------------------------------------------------------------


def compact_with_a_planted_fault(fault, generated, tmp_path: Path, monkeypatch,
                                 output: str = "out.json") -> tuple[Path, Path]:
    """Run compact at -j 2 into ``output`` with ``fault()`` called in the
    worker that gets a block after the first; returns (output, spool dir)."""
    real_lines = compactemit.CompactPlan.lines

    def planted(self, block, first_index):
        if first_index > 0:
            fault(first_index)
        return real_lines(self, block, first_index)

    monkeypatch.setattr(compactemit.CompactPlan, "lines", planted)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    out = tmp_path / output
    streamtrace.compact(generated["single"], out, jobs=2, spool_dir=str(spool_dir))
    return out, spool_dir


@pytest.mark.parametrize("output", ["out.json", "out.json.gz", "out.json.zst"])
def test_a_worker_failure_is_raised_and_leaves_nothing(output, generated, tmp_path, small_pieces, monkeypatch):
    """A check that fails in a pass-2 worker stops the run like it does in
    one process, whether the workers write their blocks, compress their
    pieces or send their text."""
    def fail(first_index: int) -> None:
        raise TraceError("validation failed: planted", event_index=first_index)

    with pytest.raises(TraceError, match="planted"):
        compact_with_a_planted_fault(fail, generated, tmp_path, monkeypatch, output)
    assert [path.name for path in tmp_path.iterdir()] == ["spool"]  # no output, no part file
    assert os.listdir(tmp_path / "spool") == []


@pytest.mark.parametrize("output", ["out.json", "out.json.gz"])
def test_a_worker_failure_met_while_its_block_is_placed_is_raised(output, generated, tmp_path, small_pieces,
                                                                   monkeypatch):
    """Into a plain file (or a gzip one) the workers write (or compress)
    their blocks for where this process places them: a worker that failed
    (and went) before its place was sent is reported by its failure, not as
    a worker that stopped."""
    real_reserve = TraceWriter.reserve

    def slow_reserve(self, *args) -> tuple[int, bool, bytes]:
        time.sleep(0.3)  # meanwhile the worker fails at its next block and exits
        return real_reserve(self, *args)

    def fail(first_index: int) -> None:
        raise TraceError("validation failed: planted", event_index=first_index)

    monkeypatch.setattr(TraceWriter, "reserve", slow_reserve)
    with pytest.raises(TraceError, match="planted"):
        compact_with_a_planted_fault(fail, generated, tmp_path, monkeypatch, output)
    assert [path.name for path in tmp_path.iterdir()] == ["spool"]
    assert os.listdir(tmp_path / "spool") == []


def test_a_worker_that_dies_is_reported(generated, tmp_path, small_pieces, monkeypatch):
    with pytest.raises(TraceError, match="worker stopped unexpectedly"):
        compact_with_a_planted_fault(lambda first_index: os._exit(9), generated, tmp_path, monkeypatch)
    assert [path.name for path in tmp_path.iterdir()] == ["spool"]
    assert os.listdir(tmp_path / "spool") == []


@given(pieces=st.lists(st.binary(max_size=3000), max_size=40), compression=st.sampled_from(["gzip", "zstd"]))
@settings(max_examples=40, deadline=None)
def test_compressed_output_does_not_depend_on_how_writes_fall(pieces, compression, tmp_path_factory):
    """The same bytes, written in any pieces, compress to the same file."""
    directory = tmp_path_factory.mktemp("even")
    whole = b"".join(pieces)
    outputs = []
    pieces_of = GzipPieces if compression == "gzip" else EvenWrites
    size, pieces_of.PIECE = pieces_of.PIECE, 4096  # many pieces, and writes that straddle them
    try:
        for name, writes in (("pieces", pieces), ("whole", [whole])):
            target = OutputTarget(str(directory / f"{name}.out"), compress=compression)
            with target.open() as out:
                for piece in writes:
                    out.write(piece)
            outputs.append((directory / f"{name}.out").read_bytes())
    finally:
        pieces_of.PIECE = size
    assert outputs[0] == outputs[1]
    reader = gzip.decompress if compression == "gzip" else zstandard.ZstdDecompressor().decompressobj().decompress
    assert reader(outputs[0]) == whole


@pytest.mark.parametrize("command", all_but_first_slow(["compact", "relink"]))
def test_a_small_file_and_the_same_text_through_a_pipe_give_the_same_bytes(tmp_path: Path, command: str) -> None:
    """A pipe (of unknown size) is read by ranges; a small file must be read
    the same way, or events kept in their own text by one reading would be
    re-encoded by the other (Kineto writes spaces after colons)."""
    real = next(path for path in REAL_TRACES if path.name == "nccl_rank0.json.gz")
    trace = tmp_path / "spaced.json"  # json.dumps spaces its items, as Kineto does
    trace.write_text(json.dumps(json.loads(gzip.decompress(real.read_bytes()))))
    outputs = []
    for source, stdin in ((str(trace), os.devnull), ("-", trace)):
        out = tmp_path / f"out{len(outputs)}.json"
        with open(stdin, "rb") as feed:
            subprocess.run([sys.executable, "-m", "streamtrace", command, source, "-o", str(out), "-q"], stdin=feed,
                           check=True, timeout=120)
        outputs.append(out.read_bytes())
    assert b'"traceEvents"' in outputs[0] and outputs[0] == outputs[1]
