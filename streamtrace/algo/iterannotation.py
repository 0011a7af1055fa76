"""The iteration annotation TraceLens's report gives vLLM's attention op:
which user annotation encloses the op, and the batch's query and key
lengths it states (vLLM's, SGLang's and ATOM's detailed formats).

TraceLens's ``apply_annotation`` gives each op named
``vllm::unified_attention_with_output...`` the name of the first
annotation, by start time (ties in event order), whose category contains
``user_annotation`` (GPU ones too, any thread) that starts at or before
the op and ends strictly after it; ``NA`` when none does.  Its
``IterationAnnotation`` tries the formats in a fixed order and the first
that matches decides: only the detailed ones carry the sums the
attention model reads (:func:`chunk_stats`).
"""
from __future__ import annotations

import re

import numpy as np

NONE = "NA"  # (TraceLens's annotation of an op no annotation encloses)
ANNOTATED_PREFIX = "vllm::unified_attention_with_output"  # the ops TraceLens annotates (name prefix)
CATEGORY = "user_annotation"  # an annotation: its category contains this

STATS = ("c_sq", "c_sk", "c_sqsq", "c_sqsk", "g_sq", "g_sk", "g_sqsq", "g_sqsk")
_SUMS = r"\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
_VLLM_DETAILED = re.compile(rf"execute_\d+_context_\d+{_SUMS}_generation_\d+{_SUMS}")
_VLLM_NATIVE = re.compile(r"execute_context_\d+\(\d+\)_generation_\d+\(\d+\)")
_SGLANG_DETAILED = re.compile(r"step\[(?:EXTEND|DECODE|MIXED)\b[^\]]*sqsq=\d+[^\]]*\]")
_SGLANG_NATIVE = re.compile(r"step\[(?:EXTEND|DECODE|MIXED)\b.*\]")
_ATOM = re.compile(r"^(prefill|decode)\[(.*)\]")
_SGLANG_PAIR = re.compile(r"(\w+)=(\d+)")
_ATOM_PAIR = re.compile(r"(\w+)=(\[[^\]]*\](?:\.\.\.\+\d+)?|\S+)")


def enclosing(ts: np.ndarray, end: np.ndarray, names: np.ndarray, op_ts: float, op_end: float) -> int:
    """The name number of the annotation TraceLens gives an op [op_ts, op_end), -1 for none; ``ts``,
    ``end`` and ``names`` are the trace's annotations ordered by start (stably: ties in event order)."""
    started = int(np.searchsorted(ts, op_ts, side="right"))  # (those starting at or before the op)
    outlasting = np.flatnonzero(end[:started] > op_end)
    return int(names[outlasting[0]]) if len(outlasting) else -1


def _number(text: object) -> int:
    """A count as TraceLens reads one (0 when it is no integer)."""
    try:
        return int(text)
    except (ValueError, TypeError):
        return 0


def chunk_stats(annotation: str) -> dict[str, int] | None:
    """The context (``c_``) and generation (``g_``) sums of query lengths, key lengths and their
    products an annotation states; None when its first matching format carries none."""
    found = _VLLM_DETAILED.match(annotation)
    if found:
        return dict(zip(STATS, map(int, found.groups())))
    if _VLLM_NATIVE.match(annotation):
        return None
    if _SGLANG_DETAILED.match(annotation):
        body = annotation[annotation.index("[") + 1:annotation.rindex("]")]
        pairs = dict(_SGLANG_PAIR.findall(body))
        return {key: _number(pairs.get(key, 0)) for key in STATS}
    if _SGLANG_NATIVE.match(annotation):
        return None
    found = _ATOM.match(annotation)
    if not found:
        return None
    pairs = dict(_ATOM_PAIR.findall(found.group(2)))
    if "sqsq" not in pairs or "sqsk" not in pairs:
        return None
    sums = [_number(pairs.get(key, 0)) for key in ("tok", "sk", "sqsq", "sqsk")]
    prefill = found.group(1) == "prefill"
    return dict(zip(STATS, sums + [0] * 4 if prefill else [0] * 4 + sums))
