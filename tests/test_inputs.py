"""Naming inputs, one rule for every command (streamtrace.io.inputs): a
directory stands for its trace files and a glob for what it matches; a
command that runs once per input runs on each, into -o DIR/; one that reads
one trace refuses, naming the glob.  stdin ('-') is an input wherever README
says so, as the one input."""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest
import zstandard
from badinputs.matrix import CLI, cli_env
from conftest import TRACES, events_of, load_json, refused

SMALL = TRACES / "kineto_small.json"
CUPTI = TRACES / "cupti_profiler.json.gz"
BOTH = sorted([SMALL, CUPTI], key=lambda path: path.name)  # a directory's traces, in name order


def run(*args: object, stdin: bytes | int | None = None) -> subprocess.CompletedProcess:
    feed = {"stdin": stdin} if isinstance(stdin, int) else {"input": stdin}
    return subprocess.run([*CLI, *map(str, args), "-q"], capture_output=True, timeout=120, env=cli_env(), **feed)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr.decode()
    return result


def text_of(path: Path) -> bytes:
    """A written file's content, whatever its compression (told by its magic bytes)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


def named(trace: Path, tag: str) -> str:
    """The name a single run gives its output beside ``trace``."""
    for suffix in (".json.gz", ".json"):
        if trace.name.endswith(suffix):
            return trace.name[: -len(suffix)] + tag + suffix
    raise AssertionError(trace)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two real traces, and a file that is not one."""
    traces = tmp_path / "traces"
    traces.mkdir()
    for trace in BOTH:
        shutil.copy(trace, traces / trace.name)
    (traces / "notes.txt").write_text("not a trace\n")
    return traces


# --- item: a directory or a glob means its trace files ------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["directory", "glob"])
@pytest.mark.parametrize(("command", "tag"), [("compact", "_compacted"), ("relink", "_relinked"),
                                              ("redact", "_redacted"), ("convert", "")])
def test_a_directory_or_a_glob_runs_the_command_on_each_trace(tmp_path, folder, spelling, command, tag):
    """Each output in -o DIR/ is what the single run writes for that trace."""
    spec = folder if spelling == "directory" else f"{folder}/*.json*"
    out = tmp_path / "out"
    ok(run(command, spec, f"{out}/") if command == "convert" else run(command, spec, "-o", f"{out}/"))
    assert sorted(os.listdir(out)) == sorted(named(trace, tag) for trace in BOTH)
    for trace in BOTH:
        single = tmp_path / "single" / named(trace, tag)
        single.parent.mkdir(exist_ok=True)
        ok(run(command, trace, single) if command == "convert" else run(command, trace, "-o", single))
        assert text_of(out / named(trace, tag)) == text_of(single)


def test_the_outputs_of_a_directory_are_named_for_the_compression_written(tmp_path, folder):
    """--compress zstd writes .json.zst files, not zstd under the inputs' .json.gz and .json names."""
    out = tmp_path / "out"
    ok(run("convert", folder, f"{out}/", "--compress", "zstd"))
    assert sorted(os.listdir(out)) == sorted(trace.name.split(".json")[0] + ".json.zst" for trace in BOTH)
    for trace in BOTH:
        written = out / (trace.name.split(".json")[0] + ".json.zst")
        assert written.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
        assert events_of(json.loads(text_of(written))) == events_of(load_json(trace))


def test_attribute_of_a_directory_writes_every_traces_rows(tmp_path, folder):
    ok(run("attribute", folder, "-o", tmp_path / "all.csv"))
    expected: list[list[str]] = []
    for trace in BOTH:
        ok(run("attribute", trace, "-o", tmp_path / f"{trace.name}.csv"))
        expected += list(csv.reader(open(tmp_path / f"{trace.name}.csv")))[1:]
    rows = list(csv.reader(open(tmp_path / "all.csv")))
    assert rows[1:] == expected and len(expected) > 0


def test_inspect_of_a_directory_reports_each_trace(folder):
    summaries = json.loads(ok(run("inspect", folder, "--json")).stdout)
    assert [summary["events"] for summary in summaries] == [len(events_of(load_json(trace))) for trace in BOTH]


@pytest.mark.parametrize("argv", [("slice", "DIR", "-o", "OUT/s.json", "--steps", "1"),
                                  ("split", "DIR", "-o", "OUT/per_rank")])
def test_a_command_reading_one_trace_refuses_a_directory_or_a_glob(tmp_path, folder, argv):
    out = tmp_path / "out"
    out.mkdir()
    argv = [arg.replace("DIR", str(folder)).replace("OUT", str(out)) for arg in argv]
    refused(run(*argv), f"'{folder}/*.json*'", "one trace file")
    pattern = [f"{folder}/*.json*" if arg == str(folder) else arg for arg in argv]
    refused(run(*pattern), f"{folder}/*.json*", "one trace file, not a pattern")
    assert os.listdir(out) == []


def test_several_inputs_into_one_trace_file_are_refused(tmp_path, folder):
    refused(run("convert", folder, tmp_path / "x.json"), "x.json", "directory")
    assert sorted(os.listdir(tmp_path)) == ["traces"]


# --- item: '-' wherever README says inputs may be '-' -------------------------------------------------------------

@pytest.mark.parametrize("argv", [("inspect", "-"), ("analyze", "-"), ("compact", "-", "-o", "OUT/c.json"),
                                  ("relink", "-", "-o", "OUT/r.json"), ("redact", "-", "-o", "OUT/d.json"),
                                  ("convert", "-", "OUT/v.json"), ("attribute", "-"),
                                  ("slice", "-", "-o", "OUT/s.json", "--window", "+0:+1ms"),
                                  ("split", "-", "-o", "OUT/per_rank")])
def test_every_command_reads_stdin(tmp_path, argv):
    ok(run(*[arg.replace("OUT", str(tmp_path)) for arg in argv], stdin=CUPTI.read_bytes()))


def test_analyze_of_stdin_equals_analyze_of_the_file():
    piped = json.loads(ok(run("analyze", "-", "--json", stdin=CUPTI.read_bytes())).stdout)
    named_file = json.loads(ok(run("analyze", CUPTI, "--json")).stdout)
    assert piped["tables"] == named_file["tables"] and piped["ranks"] == named_file["ranks"]


def test_inspect_with_no_trace_reads_piped_stdin():
    piped = json.loads(ok(run("inspect", "--json", stdin=CUPTI.read_bytes())).stdout)
    named_file = json.loads(ok(run("inspect", CUPTI, "--json")).stdout)
    assert piped["input"] == "<stdin>"
    assert (piped["events"], piped["by_rank"], piped["top_kernels"]) == \
           (named_file["events"], named_file["by_rank"], named_file["top_kernels"])


def test_inspect_with_no_trace_on_a_terminal_says_how_to_give_one():
    main, terminal = pty.openpty()
    try:
        refused(run("inspect", stdin=terminal), "give a TRACE", "inspect < trace.json.gz")
    finally:
        os.close(main)
        os.close(terminal)


@pytest.mark.parametrize("command", ["analyze", "merge", "compact"])
def test_stdin_among_other_inputs_is_refused(tmp_path, command):
    """One process reads stdin, once: among other inputs (read by workers) it would read as empty."""
    refused(run(command, "-", SMALL, "-o", tmp_path / "out/", stdin=CUPTI.read_bytes()), "stdin ('-')", "one input")
    assert os.listdir(tmp_path) == []
