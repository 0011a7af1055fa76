"""Mutation fuzzing in the suite: a few hundred damaged real traces, every
command on each (scripts/fuzz_mutants.py runs 2,000 and prints the table)."""
from __future__ import annotations

import pytest
from conftest import TRACES
from fuzz_mutants import COMMANDS, OUTCOMES, fuzz, load_traces, make_mutant, table

MUTANTS = 300
MAX_BYTES = 700_000  # the smaller real traces keep the run near a minute


def test_mutants_are_seeded_and_reproducible():
    traces = load_traces(TRACES, MAX_BYTES)
    assert make_mutant(7, 3, traces) == make_mutant(7, 3, traces)
    assert len({make_mutant(7, index, traces)[1] for index in range(20)}) == 20


@pytest.mark.slow
def test_every_mutant_is_processed_repaired_or_refused_in_one_line(capsys):
    counts, problems = fuzz(MUTANTS, seed=16, workers=2, traces_dir=TRACES, max_bytes=MAX_BYTES)
    with capsys.disabled():
        print("\n" + table(counts))
    assert problems == []
    for command in COMMANDS:
        assert sum(counts[command.name].get(label, 0) for label in OUTCOMES) == MUTANTS
    assert all(counts[command.name].get("refused", 0) for command in COMMANDS)  # the damage is real
    assert all(counts[command.name].get("processed", 0) for command in COMMANDS)  # and not all fatal
