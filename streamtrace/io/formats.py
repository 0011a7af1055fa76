"""How a trace file may be compressed, and the suffix each way gives it: kept
apart from the writers so that the command line offers them without
importing the writers (``streamtrace --help`` stays quick)."""
from __future__ import annotations

COMPRESSIONS = ("none", "gzip", "zstd")
SUFFIXES = {"gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}
