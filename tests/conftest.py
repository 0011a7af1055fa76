"""Shared test fixtures: the real traces beside the repo, and small helpers."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("STREAMTRACE_TRACES", ROOT.parent / "shared" / "traces"))
REAL_TRACES = sorted(p for p in TRACES.glob("*") if p.name.endswith((".json", ".json.gz")))

sys.path.insert(0, str(ROOT / "scripts"))


def load_json(path: Path) -> dict | list:
    """Load a small trace whole: the independent reference in tests."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as handle:
        return json.load(handle)


def events_of(document: dict | list) -> list:
    return document["traceEvents"] if isinstance(document, dict) else document


QUICK_TRACE_BYTES = 100 << 10  # the shared traces above this are the four largest, most of a matrix's time


def large_ones_slow(paths: list[Path]) -> list:
    """Matrix cases over real traces: the large traces only outside the quick loop (CI runs every case)."""
    return [pytest.param(path, marks=pytest.mark.slow) if path.stat().st_size > QUICK_TRACE_BYTES else path
            for path in paths]


def all_but_first_slow(cases: list) -> list:
    """A matrix whose cases all test one mechanism: the quick loop runs the first, CI runs every case."""
    return [pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=() if index == 0 else pytest.mark.slow)
            for index, case in enumerate(cases)]


@pytest.fixture(params=large_ones_slow(REAL_TRACES), ids=lambda p: p.name)
def real_trace(request) -> Path:
    return request.param


def pytest_collection_modifyitems(items):
    if not REAL_TRACES:
        raise pytest.UsageError(f"no real traces found in {TRACES} (set STREAMTRACE_TRACES)")


def refused(result: subprocess.CompletedProcess, *said: str) -> str:
    """The run failed with one line saying all of ``said``."""
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    for text in said:
        assert text in lines[0], lines[0]
    return lines[0]
