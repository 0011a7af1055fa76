"""The bad-input matrix (tests/badinputs/): every command, every damaged trace.

Run with ``-s`` to see the outcome table; ``scripts/badinput_matrix.py``
prints the same table without pytest.
"""
from __future__ import annotations

import json

import pytest
from badinputs.generate import BAD_INPUTS, BY_NAME, base_events
from badinputs.matrix import COMMANDS, available, cases, expected, failures, markdown_table, problems, run_all

import streamtrace

pytestmark = pytest.mark.slow  # the whole matrix: every command on every damaged input


@pytest.fixture(scope="session")
def matrix_runs(tmp_path_factory):
    """All available cases, started together on a small thread pool; each test waits for its own."""
    return run_all(tmp_path_factory.mktemp("badinputs"), cases())


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda bad: bad.name)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_bad_input_gives_the_documented_outcome(matrix_runs, command, bad):
    if not available(command.name):
        pytest.skip(f"'{command.name}' is not on this branch yet; the matrix covers it once it lands")
    run = matrix_runs[(command.name, bad.name)].result()
    assert problems(run, expected(command.name, bad.name)) == []


def test_matrix_table(matrix_runs, capsys):
    """The outcome table (visible with -s); fails if any cell is not as documented."""
    results = {key: future.result() for key, future in matrix_runs.items()}
    table = markdown_table(results)
    with capsys.disabled():
        print("\n" + table)
    assert failures(results) == {}


def test_accepted_damage_comes_out_as_documented(tmp_path):
    """What the README promises for inputs processed as they are: last duplicate
    wins inside an event, duplicate top-level keys kept raw, long strings and
    odd non-GPU events unchanged."""
    def converted(name: str) -> bytes:
        source = tmp_path / BY_NAME[name].filename
        source.write_bytes(BY_NAME[name].build())
        streamtrace.convert(source, tmp_path / f"{name}.out.json")
        return (tmp_path / f"{name}.out.json").read_bytes()

    duplicated = converted("duplicate_keys")
    assert b'"schemaVersion": 1,\n"schemaVersion": 2' in duplicated
    assert json.loads(duplicated)["traceEvents"][4]["ts"] == 22.0
    long_name = json.loads(converted("string_10mb"))["traceEvents"][4]["name"]
    assert long_name == "relu_" + "x" * (10 << 20)
    odd = tmp_path / "odd.json"
    odd.write_bytes(BY_NAME["key_fields_not_scalar"].build())
    streamtrace.compact(odd, tmp_path / "odd.out.json")
    kept = json.loads((tmp_path / "odd.out.json").read_bytes())["traceEvents"][1]
    assert kept == {**base_events()[1], "pid": [100], "tid": {"thread": 101}}
