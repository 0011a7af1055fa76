"""The bad-input matrix (tests/badinputs/): every command, every damaged trace.

Run with ``-s`` to see the outcome table; ``scripts/badinput_matrix.py``
prints the same table without pytest.
"""
from __future__ import annotations

import pytest

from badinputs.generate import BAD_INPUTS
from badinputs.matrix import COMMANDS, available, cases, expected, failures, markdown_table, problems, run_all


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
