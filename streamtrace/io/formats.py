"""How a trace file may be compressed, the suffix each way gives it and its levels: kept
apart from the writers so that the command line offers them without
importing the writers (``streamtrace --help`` stays quick)."""
from __future__ import annotations

COMPRESSIONS = ("none", "gzip", "zstd")
SUFFIXES = {"gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}
DEFAULT_LEVEL = {"gzip": 1, "zstd": 3}
LEVELS = {"gzip": range(0, 10), "zstd": range(1, 23)}
"""The compression levels each writer takes (an uncompressed output ignores the level)."""


def chosen_level(compression: str, level: int | None) -> int:
    """The level a writer compresses at: the one asked for, or the compression's default.  (Pass-2 workers
    that compress pieces of a gzip output must use the very level its writer uses.)"""
    return DEFAULT_LEVEL[compression] if level is None else level
