"""The command line as a user meets it: help, exit codes, stdin and stdout.

Bad inputs are in test_badinputs.py, signals, pipes and full disks in test_faults.py."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from badinputs.matrix import CLI, cli_env
from conftest import TRACES, events_of, load_json

NCCL = TRACES / "nccl_rank0.json.gz"


def run(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=120,
                          env={**cli_env(), **(env or {})})


def test_help_teaches_every_command():
    top = run("--help")
    assert top.returncode == 0
    for command in ("inspect", "convert", "compact", "relink", "split", "attribute", "demo"):
        assert command in top.stdout.decode()
        sub = run(command, "--help")
        assert sub.returncode == 0 and b"usage:" in sub.stdout


def test_inspect_prints_a_short_report_or_json(tmp_path):
    result = run("inspect", str(NCCL))
    text = result.stdout.decode()
    assert result.returncode == 0
    assert f"{len(events_of(load_json(NCCL))):,} events" in text.splitlines()[0] and "{" not in text
    only_json = run("inspect", "--json", "--summary", str(tmp_path / "s.json"), str(NCCL))
    assert json.loads(only_json.stdout)["events"] == len(events_of(load_json(NCCL)))
    assert json.loads((tmp_path / "s.json").read_bytes()) == json.loads(only_json.stdout)


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"[1")
    result = run("inspect", "--debug", str(bad))
    assert result.returncode != 0 and b"Traceback" in result.stderr


def test_missing_file_and_directory_input(tmp_path):
    for path in (tmp_path / "nope.json", tmp_path):
        result = run("inspect", str(path))
        assert result.returncode == 1 and b"Traceback" not in result.stderr


@pytest.mark.slow
def test_stdin_to_zstd_then_stdout_round_trip(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "out.json.zst"
    piped = run("convert", "--json", "-", str(out), "--spool-dir", str(spool), stdin=NCCL.read_bytes())
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["events_written"] == len(events_of(load_json(NCCL)))
    assert os.listdir(spool) == []
    back = run("convert", "--json", str(out), "-")
    assert back.returncode == 0
    assert json.loads(back.stdout) == load_json(NCCL)
    assert json.loads(back.stderr)["output"] == "<stdout>"


def test_stdin_spool_removed_after_failure(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    cut = gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a\nb", "ts": 1}, {"ph": "X", "ts": 18446744073709551616}, {')
    result = run("convert", "-", str(tmp_path / "o.json"), "--spool-dir", str(spool), stdin=cut)
    assert result.returncode == 1 and b"truncated" in result.stderr
    assert os.listdir(spool) == []
    assert not (tmp_path / "o.json").exists()


def test_stdin_reread_in_exact_mode_after_big_integer(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    data = b'{"traceEvents": [{"ph": "X", "name": "a\nb", "ts": 1.250}, {"ph": "X", "ts": 2, "args": {"id": 18446744073709551616}}]}'
    result = run("convert", "-", str(tmp_path / "o.json"), "--spool-dir", str(spool), stdin=gzip.compress(data))
    assert result.returncode == 0, result.stderr
    assert os.listdir(spool) == []
    assert json.loads((tmp_path / "o.json").read_bytes()) == json.loads(data.replace(b"\n", b"\\n"))


def test_compact_cli_writes_default_output_and_refuses_overwrite(tmp_path):
    trace = tmp_path / "rank0_trace.json"
    trace.write_bytes(gzip.decompress(NCCL.read_bytes()))
    first = run("compact", str(trace), "-q", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["output"] == str(tmp_path / "rank0_trace_compacted.json")
    again = run("compact", str(trace), "-q")
    assert again.returncode == 1 and b"--overwrite" in again.stderr and again.stderr.count(b"\n") == 1
    rules = run("compact", "--print-rules")
    assert rules.returncode == 0 and b"[groups]" in rules.stdout


def complete(line: str, tmp_path) -> list[str]:
    """What the shell's TAB offers after ``line`` (argcomplete's protocol, as its bash and fish hooks call it)."""
    answer = tmp_path / "completions"
    result = run(env={"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
                      "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)})
    assert result.returncode == 0, result.stderr
    return [word.strip() for word in answer.read_text().split("\v")]


def test_shell_completion_offers_commands_options_and_choices(tmp_path):
    assert complete("streamtrace mer", tmp_path) == ["merge"]
    assert {"--no-compact", "--no-original-stream", "--no-pp-flows"} <= set(complete("streamtrace merge --no-", tmp_path))
    assert sorted(complete("streamtrace synth out/ --compress ", tmp_path)) == ["gzip", "none", "zstd"]


HEAVY = "import sys; sys.argv = ['streamtrace', {flag!r}]\ntry:\n    import streamtrace.cli; streamtrace.cli.main()\n" \
        "except SystemExit:\n    pass\nprint(sorted(name for name in sys.modules if name.split('.')[0] in " \
        "('numpy', 'fsspec', 'dask', 'distributed', 'msgspec', 'pyarrow') or name.startswith('streamtrace.commands') or name == 'streamtrace.synth'))"


def test_help_and_version_import_no_command_and_no_numpy():
    """What makes start-up slow is imported only when a command runs (its speed is measured, not tested)."""
    for flag in ("--version", "--help"):
        result = subprocess.run([sys.executable, "-c", HEAVY.format(flag=flag)], capture_output=True, text=True,
                                env=cli_env(), timeout=120)
        assert result.returncode == 0 and result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr
