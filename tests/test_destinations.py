"""Every file a run writes follows one set of rules, checked before the long
pass (docs/input-handling.md, "Writing"): never onto an input, never twice in
one run, never over an existing file without --overwrite, never under a
suffix promising a compression that is not written; atomic.

A refusal is proved to come before reading by giving a truncated input: a
run that read first would fail on the truncation instead."""
from __future__ import annotations

import gzip
import io
import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest
from badinputs.matrix import CLI, cli_env
from conftest import TRACES, events_of, load_json, refused

from streamtrace.errors import TraceError
from streamtrace.io.destinations import Destinations, check_destinations
from streamtrace.synth import SynthConfig, write_traces

SMALL = TRACES / "kineto_small.json"


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args), "-q"], capture_output=True, timeout=120, env=cli_env())


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden staging and .part files included) with its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() if path.is_file() else b"<dir>"
            for path in sorted(directory.rglob("*"))}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Two ranks of a generated PP run (two profiler steps each) and their merged file."""
    directory = tmp_path_factory.mktemp("synth")
    write_traces(SynthConfig(ranks=2, pp_stages=2, steps=2), directory, compress="gz")
    return directory


@pytest.fixture
def truncated(tmp_path, synthetic) -> Path:
    """The merged trace cut short: reading it fails ('truncated')."""
    whole = gzip.decompress((synthetic / "merged_trace.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(whole[: len(whole) // 2])
    assert refused(run("inspect", path), "truncated")
    return path


# --- 1. never onto an input, never twice, never over a file unasked -----------------------------------------

@pytest.mark.slow
def test_the_summary_is_never_written_onto_the_input(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_bytes(SMALL.read_bytes())
    (tmp_path / "hard.json").hardlink_to(victim)
    (tmp_path / "soft.json").symlink_to(victim)
    for summary in (victim, tmp_path / "hard.json", tmp_path / "soft.json", tmp_path / "." / "victim.json"):
        refused(run("inspect", victim, "--summary", summary), str(summary), "onto the input")
        refused(run("compact", victim, "-o", tmp_path / "c.json.gz", "--summary", summary, "--overwrite"),
                "onto the input")
    assert victim.read_bytes() == SMALL.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["hard.json", "soft.json", "victim.json"]


def test_the_summary_is_never_written_onto_the_archive_of_an_input_member(tmp_path):
    archive = tmp_path / "traces.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.write(SMALL, "small.json")
    before = archive.read_bytes()
    refused(run("inspect", f"{archive}!small.json", "--summary", archive), "onto the input")
    assert archive.read_bytes() == before


def test_two_files_of_one_run_never_share_a_name(tmp_path):
    out = tmp_path / "out.json.gz"
    (tmp_path / "alias").symlink_to(tmp_path)
    for summary in (out, tmp_path / "alias" / "out.json.gz", tmp_path / "sub" / ".." / "out.json.gz"):
        refused(run("compact", SMALL, "-o", out, "--summary", summary), str(summary), "twice")
    assert sorted(os.listdir(tmp_path)) == ["alias"]
    out.write_bytes(b"earlier output")  # --overwrite allows replacing a file, not writing one twice
    refused(run("compact", SMALL, "-o", out, "--summary", out, "--overwrite"), "twice")
    assert out.read_bytes() == b"earlier output"
    refused(run("convert", SMALL, "-", "--summary", "-"), "twice")


def test_an_existing_summary_is_replaced_only_with_overwrite(tmp_path):
    summary = tmp_path / "s.json"
    summary.write_bytes(b"keep me")
    refused(run("inspect", SMALL, "--summary", summary), str(summary), "--overwrite")
    assert summary.read_bytes() == b"keep me"
    done = run("inspect", SMALL, "--summary", summary, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_bytes())["events"] == len(events_of(load_json(SMALL)))


def test_split_writes_no_rank_file_onto_its_input_or_its_summary(tmp_path, synthetic):
    per_rank = tmp_path / "per_rank"
    assert run("split", synthetic / "merged_trace.json.gz", "-o", per_rank).returncode == 0
    before = listing(tmp_path)
    refused(run("split", per_rank / "rank0_trace.json.gz", "-o", per_rank, "--overwrite"), "onto the input")
    refused(run("split", synthetic / "merged_trace.json.gz", "-o", per_rank, "--overwrite",
                "--summary", per_rank / "rank1_trace.json.gz"), "rank1_trace.json.gz", "twice")
    assert listing(tmp_path) == before


# --- 2. everything a run can know is checked before the long pass ---------------------------------------------

BEFORE_READING = {  # argv (TRUNCATED: the cut input; OUT: a fresh directory), what the refusal says
    "summary in a missing directory": (["compact", "TRUNCATED", "-o", "OUT/c.json.gz", "--summary", "OUT/no/s.json"],
                                       ["OUT/no/s.json", "does not exist"]),
    "inspect's summary in a missing directory": (["inspect", "TRUNCATED", "--summary", "OUT/no/s.json"],
                                                 ["OUT/no/s.json", "does not exist"]),
    "existing summary": (["relink", "TRUNCATED", "-o", "OUT/r.json.gz", "--summary", "OUT/old.json"],
                         ["OUT/old.json", "--overwrite"]),
    "CSV and summary alike": (["attribute", "TRUNCATED", "-o", "OUT/k.out", "--summary", "OUT/k.out"],
                              ["OUT/k.out", "twice"]),
    "split into a directory holding rank files": (["split", "TRUNCATED", "-o", "OUT/per_rank"],
                                                  ["OUT/per_rank", "rank0_trace.json.gz", "--overwrite"]),
    "step files over earlier ones": (["slice", "TRUNCATED", "--each-step", "-o", "OUT/steps"],
                                     ["OUT/steps", "step1.json.gz", "--overwrite"]),
    "merge's summary onto an input": (["merge", "TRUNCATED", "OUT/rank1_trace.json.gz", "-o", "OUT/m.json.gz",
                                       "--summary", "OUT/rank1_trace.json.gz", "--overwrite"],
                                      ["OUT/rank1_trace.json.gz", "onto the input"]),
    "a gzip level gzip has not": (["convert", "TRUNCATED", "OUT/c.json.gz", "--level", "42"],
                                  ["--level 42", "gzip takes levels 0 to 9"]),
    "a zstd level for split's files": (["split", "TRUNCATED", "-o", "OUT/new_ranks", "--compress", "zstd", "--level", "23"],
                                       ["--level 23", "zstd takes levels 1 to 22"]),
}


@pytest.mark.parametrize("case", BEFORE_READING, ids=lambda case: case.replace(" ", "-"))
def test_destinations_are_refused_before_the_input_is_read(case, tmp_path, truncated, synthetic):
    out = tmp_path / "out"
    (out / "per_rank").mkdir(parents=True)
    (out / "per_rank" / "rank0_trace.json.gz").write_bytes(b"an earlier split")
    (out / "steps").mkdir()
    (out / "steps" / "step1.json.gz").write_bytes(b"an earlier slice")
    (out / "old.json").write_bytes(b"an earlier summary")
    (out / "rank1_trace.json.gz").write_bytes((synthetic / "rank1_trace.json.gz").read_bytes())
    before = listing(tmp_path)
    argv, said = BEFORE_READING[case]
    fill = {"TRUNCATED": str(truncated), "OUT": str(out)}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    refused(run(*map(filled, argv)), *map(filled, said))
    assert listing(tmp_path) == before


# --- 4. a suffix naming a compression that is not written ------------------------------------------------------

@pytest.mark.parametrize("suffix", [".bz2", ".xz", ".lz4", ".zip", ".tar", ".7z", ".br", ".tar.gz", ".BZ2"])
def test_a_suffix_promising_an_unwritten_compression_is_refused(tmp_path, suffix):
    out = tmp_path / f"out.json{suffix}"
    line = refused(run("convert", SMALL, out), str(out), suffix.lower().removesuffix(".gz"), ".gz", ".zst")
    assert "does not write" in line
    assert os.listdir(tmp_path) == []


def test_summaries_and_tables_obey_the_suffix_rule_too(tmp_path):
    refused(run("inspect", SMALL, "--summary", tmp_path / "s.json.xz"), "s.json.xz", ".xz")
    refused(run("attribute", SMALL, "-o", tmp_path / "k.csv.bz2"), "k.csv.bz2", ".bz2")
    assert os.listdir(tmp_path) == []
    done = run("inspect", SMALL, "--summary", tmp_path / "s.json.gz")  # written as named
    assert done.returncode == 0, done.stderr
    assert json.loads(gzip.decompress((tmp_path / "s.json.gz").read_bytes()))["events"] > 0


@pytest.mark.parametrize(("argv", "said"), [
    (("convert", SMALL, "OUT/x.parquet.gz"), "Parquet only as .parquet"),  # was gzipped JSON
    (("convert", SMALL, "OUT/x.parquet.zst"), "Parquet only as .parquet"),
    (("convert", SMALL, "OUT/x.csv.gz"), "writes JSON, not CSV"),
    (("compact", SMALL, "-o", "OUT/x.parquet"), "writes JSON, not Parquet"),  # compact writes no rows
    (("slice", SMALL, "-o", "OUT/x.html", "--window", "+0:+1ms"), "writes JSON, not HTML"),
    (("attribute", SMALL, "-o", "OUT/k.json.gz"), "writes CSV, not JSON"),
    (("inspect", SMALL, "--summary", "OUT/s.csv"), "writes JSON, not CSV"),
    (("convert", SMALL, "OUT/x.json.gz", "--compress", "zstd"), "contradicts"),  # was zstd under .gz
    (("compact", SMALL, "-o", "OUT/x.json.zst", "--compress", "none"), "contradicts"),
])
def test_a_name_for_another_format_streamtrace_writes_is_refused(tmp_path, argv, said):
    """A file named for one of the formats or compressions streamtrace writes holds it, or is not written."""
    argv = [str(arg).replace("OUT", str(tmp_path)) for arg in argv]
    refused(run(*argv), str(tmp_path), said)
    assert os.listdir(tmp_path) == []


def test_each_step_refuses_a_directory_named_like_a_file(tmp_path, synthetic):
    refused(run("slice", synthetic / "rank0_trace.json.gz", "--each-step", "-o", tmp_path / "steps.json.gz"),
            "steps.json.gz", "directory")
    assert os.listdir(tmp_path) == []


# --- the mechanism, as other commands use it ----------------------------------------------------------------------

def test_check_destinations_refuses_every_clash_up_front(tmp_path):
    plan = check_destinations([tmp_path / "a.csv", tmp_path / "b.csv"], [SMALL], summary=tmp_path / "s.json")
    plan.write(tmp_path / "a.csv", b"a\n")
    assert (tmp_path / "a.csv").read_bytes() == b"a\n"
    for paths, inputs, said in (
        ([tmp_path / "a2.csv", tmp_path / "x" / ".." / "a2.csv"], [], "twice"),
        ([tmp_path / "t.csv", SMALL], [SMALL], "onto the input"),
        ([tmp_path / "a.csv"], [], "--overwrite"),
        ([tmp_path / "t.csv", tmp_path / "none" / "t.csv"], [], "does not exist"),
        ([tmp_path / "t.csv.xz"], [], ".xz"),
    ):
        with pytest.raises(TraceError, match=said):
            check_destinations(paths, inputs, summary=tmp_path / "s2.json")
    assert sorted(os.listdir(tmp_path)) == ["a.csv"]


def test_files_written_together_appear_all_or_none(tmp_path):
    names = [tmp_path / "kernels.csv", tmp_path / "report.html"]
    plan = check_destinations(names, [])
    with pytest.raises(RuntimeError), plan:
        plan.write(names[0], b"rows\n")
        raise RuntimeError("the report failed")
    assert os.listdir(tmp_path) == []
    plan = check_destinations(names, [])
    with pytest.raises(TraceError, match="appeared while"), plan:
        plan.write(names[0], b"rows\n")
        with plan.open(names[1]) as out:
            out.write(b"<html>")
        names[1].write_bytes(b"another run's report")  # a name taken while this run wrote
    assert os.listdir(tmp_path) == ["report.html"] and names[1].read_bytes() == b"another run's report"
    names[1].unlink()
    with check_destinations(names, []) as plan:
        plan.write(names[0], b"rows\n")
        with plan.open(names[1]) as out:
            out.write(b"<html>")
        assert all(name.endswith(".part") for name in os.listdir(tmp_path))  # nothing published yet
    assert listing(tmp_path) == {"kernels.csv": b"rows\n", "report.html": b"<html>"}



@pytest.mark.parametrize("stop", [RuntimeError, KeyboardInterrupt])
def test_a_directory_made_for_files_written_together_goes_if_they_do(tmp_path, stop):
    """The directories a run writes into are made when its first file there
    is, and, with every folder made for them, removed again if the files
    are not published; a folder that was there, or one another file ended
    up in, stays."""
    tables = tmp_path / "new" / "deeper" / "tables"
    plan = Destinations([])
    plan.directory(tables)
    with pytest.raises(stop), plan:
        plan.write(tables / "a.csv", b"rows\n")
        assert tables.is_dir()
        raise stop()
    assert os.listdir(tmp_path) == []
    (tmp_path / "new").mkdir()
    plan = Destinations([])
    plan.directory(tables)
    with pytest.raises(stop), plan:
        plan.write(tables / "a.csv", b"rows\n")
        (tmp_path / "new" / "deeper" / "other.txt").write_bytes(b"another program's")
        raise stop()
    assert listing(tmp_path / "new") == {"deeper": b"<dir>", "deeper/other.txt": b"another program's"}
    with plan:
        plan.write(tables / "a.csv", b"rows\n")
    assert (tables / "a.csv").read_bytes() == b"rows\n"


def test_analyze_stopped_while_writing_its_tables_leaves_no_directory(tmp_path, monkeypatch):
    from streamtrace.commands import analyze as analyze_module
    from streamtrace.commands.analyses import tables as tables_module

    def stop(value):
        raise KeyboardInterrupt

    monkeypatch.setattr(tables_module, "_csv_value", stop)  # called for every cell, inside the tables' block
    with pytest.raises(KeyboardInterrupt):
        analyze_module.analyze(SMALL, str(tmp_path / "out" / "tables"))
    assert os.listdir(tmp_path) == []


def test_a_small_file_named_gz_is_compressed(tmp_path):
    check_destinations([], []).write(tmp_path / "t.csv.gz", b"a,b\n")
    assert gzip.GzipFile(fileobj=io.BytesIO((tmp_path / "t.csv.gz").read_bytes())).read() == b"a,b\n"


@pytest.mark.parametrize("command", [["compact", "-o", "{out}"], ["relink", "-o", "{out}"], ["analyze", "-o", "{out}"],
                                     ["attribute", "-o", "{out}"], ["inspect"]])
@pytest.mark.parametrize("spool_dir, said", [("s3://bucket/prefix", "a bucket holds the spool of --dask runs only"),
                                             ("{tmp}/missing", "no such directory")])
def test_a_spool_dir_a_local_run_cannot_use_is_refused_in_one_line(tmp_path: Path, command: list[str], spool_dir: str,
                                                                   said: str) -> None:
    out = tmp_path / ("out" if command[0] == "analyze" else "out.json.gz" if command[0] != "attribute" else "k.csv")
    spool = spool_dir.format(tmp=tmp_path)
    result = run(command[0], SMALL, *(part.format(out=out) for part in command[1:]), "--spool-dir", spool)
    refused(result, f"--spool-dir {spool}", said)
    assert sorted(os.listdir(tmp_path)) == []


# --- synth: a directory of files, all or none --------------------------------------------------------------------

def test_synth_refuses_to_replace_a_run_unasked_and_replaces_it_when_asked(tmp_path):
    """A directory that holds a file synth would write (a user's own rank0_trace.json.gz) is
    refused before anything is written; --overwrite replaces only synth's files."""
    own = gzip.compress(b'{"traceEvents": []}')
    (tmp_path / "rank0_trace.json.gz").write_bytes(own)
    (tmp_path / "notes.txt").write_text("mine")
    refused(run("synth", tmp_path, "--steps", "1"), "rank0_trace.json.gz", "exists; pass --overwrite")
    assert listing(tmp_path) == {"notes.txt": b"mine", "rank0_trace.json.gz": own}
    assert run("synth", tmp_path, "--steps", "1", "--overwrite").returncode == 0
    written = listing(tmp_path)
    assert sorted(written) == ["merged_trace.json.gz", "notes.txt", "rank0_trace.json.gz", "rank1_trace.json.gz",
                               "truth.json", "truth_links_rank0.csv", "truth_links_rank1.csv"]
    assert written["notes.txt"] == b"mine" and events_of(load_json(tmp_path / "rank0_trace.json.gz"))
    refused(run("synth", tmp_path / "notes.txt"), "notes.txt", "not a directory")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError(28, "No space left on device")], ids=["ctrl-c", "disk-full"])
def test_synth_stopped_midway_leaves_nothing(tmp_path, monkeypatch, stop):
    """The generator fails after writing its files but before synth moves them into place:
    the directory it made is gone, and a directory that existed keeps only what it held."""
    from streamtrace import cli
    from streamtrace.commands import synth

    def fail_after_writing(*args, **kwargs):
        write_traces(*args, **kwargs)
        raise stop

    monkeypatch.setattr(synth, "write_traces", fail_after_writing)
    assert cli.main(["synth", str(tmp_path / "new" / "run"), "--steps", "1"]) != 0
    assert listing(tmp_path) == {}
    (tmp_path / "kept.txt").write_text("mine")
    assert cli.main(["synth", str(tmp_path), "--steps", "1"]) != 0
    assert listing(tmp_path) == {"kept.txt": b"mine"}


def test_merge_of_a_missing_directory_says_it_is_missing(tmp_path):
    refused(run("merge", tmp_path / "nosuchdir/", "-o", tmp_path / "out.json"), "nosuchdir", "no such file")


@pytest.mark.slow
def test_demo_writes_into_a_new_or_empty_directory_only(tmp_path):
    """The demo's files (generated ranks, the compacted and merged traces) never replace a user's files unasked."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "rank0_trace.json.gz").write_bytes(b"precious")
    refused(run("demo", mine), "mine", "holds files already", "--overwrite")
    assert listing(mine) == {"rank0_trace.json.gz": b"precious"}
    fresh = tmp_path / "fresh"
    assert run("demo", fresh).returncode == 0
    first = listing(fresh)
    assert {"rank0_trace.json.gz", "rank0_trace_compacted.json.gz", "truth.json"} <= set(first)
    refused(run("demo", fresh), "holds files already")
    assert listing(fresh) == first
    assert run("demo", fresh, "--overwrite").returncode == 0
    assert sorted(listing(fresh)) == sorted(first)


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["asked-nothing", "overwrite"])
def test_a_named_pipe_is_written_into_and_stays_a_pipe(tmp_path, jobs, overwrite):
    """A pipe, a device (``-o /dev/null``) or a socket is written in place, as
    a shell's redirection writes it: a finished file renamed onto it would
    replace the node itself.  Nothing there is replaced, so no --overwrite
    is needed; pass-2 workers hand their blocks to this process (a pipe has
    no places to write them at)."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = subprocess.Popen(["cat", str(pipe)], stdout=subprocess.PIPE)
    try:
        result = run("compact", SMALL, "-o", pipe, "-j", jobs, *overwrite)
        assert result.returncode == 0, result.stderr
        received, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
        reader.wait()
    assert run("compact", SMALL, "-o", tmp_path / "file.json", "-j", "1").returncode == 0
    assert received == (tmp_path / "file.json").read_bytes()
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["file.json", "pipe"]


def test_a_block_device_is_refused(tmp_path, monkeypatch):
    """A disk named as the output would be overwritten past any file system."""
    disk = tmp_path / "disk"
    disk.write_bytes(b"")
    real_stat = os.stat

    def as_a_block_device(path, *args, **kwargs):
        found = real_stat(path, *args, **kwargs)
        if os.fspath(path) != str(disk):
            return found
        return os.stat_result((stat.S_IFBLK | 0o660, *tuple(found)[1:]))

    monkeypatch.setattr(os, "stat", as_a_block_device)
    with pytest.raises(TraceError, match="block device"):
        check_destinations([str(disk)], [str(SMALL)])
    assert disk.read_bytes() == b""
