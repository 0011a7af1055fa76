"""Small user-given files read whole: compact's rules, a rank map.

They are kilobytes, so reading them at once is right; the pure parsers in
``algo`` decide what they mean.
"""
from __future__ import annotations

import json
import os

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
