"""Small user-given files read whole: compact's rules, a rank map, a GPU spec.

They are kilobytes, so reading them at once is right; the pure parsers in
``algo`` decide what they mean.
"""
from __future__ import annotations

import json
import os

import orjson

from ..algo.rankmap import rank_map_from_json
from ..algo.rules import DEFAULT_RULES_TOML, Rules, parse_rules
from ..errors import TraceError


def load_rules(path: str | None) -> Rules:
    """The rules in ``path``, or the defaults."""
    if path is None:
        return parse_rules(DEFAULT_RULES_TOML, "default rules")
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_rules(handle.read(), path)
    except OSError as exc:
        raise TraceError(f"cannot read rules: {exc.strerror}", path=path) from None


def load_rank_map(path: str | os.PathLike) -> dict[object, int]:
    """A ``--rank-map`` file: a JSON object from pid to rank."""
    try:
        with open(path, "rb") as handle:
            mapping = json.loads(handle.read())
    except OSError as exc:
        raise TraceError(f"cannot read the rank map: {exc.strerror}", path=os.fspath(path)) from None
    except ValueError as exc:
        raise TraceError(f"rank map is not JSON: {exc}", path=os.fspath(path)) from None
    return rank_map_from_json(mapping, os.fspath(path))


def load_spec(path: str) -> dict:
    """A GPU spec in TraceLens's arch JSON form: ``mem_bw_gbps`` and
    ``max_achievable_tflops`` by compute spec (``matrix_bf16``, ...)."""
    try:
        with open(path, "rb") as handle:
            spec = orjson.loads(handle.read())
    except OSError as exc:
        raise TraceError(f"cannot read the GPU spec: {exc.strerror}", path=path) from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"the GPU spec is no JSON: {exc}", path=path) from None
    peaks = spec.get("max_achievable_tflops") if isinstance(spec, dict) else None
    bandwidth = spec.get("mem_bw_gbps") if isinstance(spec, dict) else None
    if not isinstance(peaks, dict) or not all(_positive(v) for v in peaks.values()) or not _positive(bandwidth):
        raise TraceError("a GPU spec is an object with mem_bw_gbps (a positive number) and max_achievable_tflops "
                         "(compute spec such as matrix_bf16 -> positive TFLOP/s), as TraceLens's arch files",
                         path=path)
    return spec


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
