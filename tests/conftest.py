"""Shared test fixtures: the real traces beside the repo, and small helpers."""
from __future__ import annotations

import gzip
import json
import os
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


@pytest.fixture(params=REAL_TRACES, ids=lambda p: p.name)
def real_trace(request) -> Path:
    return request.param


def pytest_collection_modifyitems(items):
    if not REAL_TRACES:
        raise pytest.UsageError(f"no real traces found in {TRACES} (set STREAMTRACE_TRACES)")
