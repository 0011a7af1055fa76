"""Slice classification rules for ``compact`` (pure; parsed from TOML text).

Users change which lane group a GPU slice goes to without editing code: a
rules file lists the groups in display order with their labels, and match
rules tried in order (first match wins).  The defaults reproduce the
torchtitan compactor's classification exactly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from ..errors import TraceError

DEFAULT_RULES_TOML = """\
# streamtrace compact rules: which lane group each GPU slice goes to.
# [groups]: every group, in display order, with its lane label.
# [[rules]]: tried in order, first match wins. A rule matches when the slice's
#   category is in `categories` (if given) and its lower-cased name contains
#   every string in `name_contains` (if given).
# default: the group of slices no rule matches.

default = "compute"

[groups]
compute = "Compute"
symmetric_memory_barrier = "Symmetric-memory barrier"
nccl_all_gather = "NCCL all-gather"
nccl_reduce_scatter = "NCCL reduce-scatter"
nccl_all_reduce = "NCCL all-reduce"
nccl_other = "NCCL other"
memcpy = "GPU memcpy"
memset = "GPU memset"

[[rules]]
group = "memcpy"
categories = ["gpu_memcpy"]

[[rules]]
group = "memset"
categories = ["gpu_memset"]

[[rules]]
group = "nccl_all_gather"
name_contains = ["nccl", "allgather"]

[[rules]]
group = "nccl_reduce_scatter"
name_contains = ["nccl", "reducescatter"]

[[rules]]
group = "nccl_all_reduce"
name_contains = ["nccl", "allreduce"]

[[rules]]
group = "nccl_other"
name_contains = ["nccl"]

[[rules]]
group = "symmetric_memory_barrier"
name_contains = ["symmetric_memory", "barrier"]
"""


@dataclass(frozen=True)
class MatchRule:
    group: int
    categories: frozenset[str] | None
    name_contains: tuple[str, ...]


@dataclass(frozen=True)
class Rules:
    """Groups in display order (``names``/``labels``) and the match rules."""

    names: tuple[str, ...]
    labels: tuple[str, ...]
    rules: tuple[MatchRule, ...]
    default: int

    def classify(self, category: object, name: object) -> int:
        """Group index of a slice (an index into ``names``)."""
        lowered = name.lower() if isinstance(name, str) else ""
        for rule in self.rules:
            if rule.categories is not None and category not in rule.categories:
                continue
            if all(part in lowered for part in rule.name_contains):
                return rule.group
        return self.default


def parse_rules(text: str, source: str = "rules") -> Rules:
    """Rules from TOML text; a bad file is a one-line :class:`TraceError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TraceError(f"not valid TOML: {exc}", path=source) from None
    groups = data.get("groups")
    if not isinstance(groups, dict) or not groups:
        raise TraceError("needs a [groups] table naming each group and its label", path=source)
    names = tuple(groups)
    if not all(isinstance(label, str) and label for label in groups.values()):
        raise TraceError("every group label must be a non-empty string", path=source)
    index = {name: position for position, name in enumerate(names)}

    def group_of(value: object, where: str) -> int:
        if value not in index:
            raise TraceError(f"{where} names group {value!r}, which is not in [groups]", path=source)
        return index[value]

    rules = []
    for number, rule in enumerate(data.get("rules", []), 1):
        if not isinstance(rule, dict) or set(rule) - {"group", "categories", "name_contains"}:
            raise TraceError(f"rule {number}: allowed keys are group, categories, name_contains", path=source)
        categories = rule.get("categories")
        contains = rule.get("name_contains", [])
        if categories is not None and not _strings(categories):
            raise TraceError(f"rule {number}: categories must be a list of strings", path=source)
        if not _strings(contains):
            raise TraceError(f"rule {number}: name_contains must be a list of strings", path=source)
        rules.append(MatchRule(group_of(rule.get("group"), f"rule {number}"),
                               frozenset(categories) if categories is not None else None,
                               tuple(part.lower() for part in contains)))
    default = group_of(data.get("default"), "default")
    return Rules(names, tuple(groups.values()), tuple(rules), default)


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
