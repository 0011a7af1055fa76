"""TraceLens's model of Inductor's compiled Triton kernels
(``triton_poi_``, ``triton_red_``, ``triton_per_`` ops; the unified summary
only, no sheet), from the op's own arguments as PyTorch 2.4+ records them.

The element count: the last integer among the concrete inputs (a
reduction's last two: elements times reduced length).  FLOPs: that count
times the FLOPs per element of the ATen ops the kernel's name lists (its
fused ops, segmented against PyTorch's operator names; unknown ops count
0).  Bytes: each tensor input's elements at its ``c10::`` dtype's size (0
for ``float``, ``int`` and other names), plus for a pointwise kernel the
count at the first tensor's size (the output).  Compute spec ``vector_``
and the first sized dtype's short name (``bfloat16``).  An op without
concrete inputs, shapes, dtypes or an integer count has no model.

TraceLens falls back on the machine's Inductor cache for such an op, but
its report never asks (it models only ops whose arguments suffice), so the
tables do not depend on where it runs.
"""
from __future__ import annotations

import re
from functools import lru_cache
from math import prod

from .atenops import ATEN_OPS

PREFIXES = ("triton_poi_", "triton_red_", "triton_per_")
FLOPS_PER_ELEMENT = {
    "aten.add": 1, "aten.sub": 1, "aten.mul": 1, "aten.div": 1, "aten.pow": 2, "aten.sqrt": 2, "aten.rsqrt": 2,
    "aten.exp": 4, "aten.log": 4, "aten.sigmoid": 4, "aten.tanh": 4, "aten.relu": 1, "aten.silu": 4,
    "aten.gelu": 8, "aten.mean": 1, "aten.sum": 1, "aten.var": 2, "aten.abs": 1, "aten.neg": 1,
    "aten.reciprocal": 2, "aten.ne": 1, "aten.eq": 1, "aten.lt": 1, "aten.gt": 1,
}
BYTES_PER_ELEMENT = {"c10::BFloat16": 2, "c10::Half": 2, "c10::Float": 4, "c10::Double": 8, "c10::Byte": 1,
                     "c10::Char": 1, "c10::Int": 4, "c10::Long": 8}
_NAME = re.compile(r"triton_(?:poi|red|per)_fused_(.+)_(\d+)$")


@lru_cache(maxsize=4096)  # (per kernel name: an Inductor trace launches each many times)
def fused_ops(name: str) -> tuple[str, ...]:
    """The ATen ops a kernel's name lists: its underscore-joined words cut
    into known operator names, from the end taking the longest name that
    leaves a cuttable rest; none when the words cannot be cut."""
    match = _NAME.match(name)
    if not match:
        return ()
    words = match.group(1).split("_")
    ends: list[list[tuple[str, int]] | None] = [None] * (len(words) + 1)
    ends[0] = []
    for end in range(1, len(words) + 1):
        for start in range(end):
            candidate = "_".join(words[start:end])
            if ends[start] is not None and candidate in ATEN_OPS:
                ends[end] = [*(ends[end] or []), (candidate, start)]
    if not ends[len(words)]:
        return ()
    found: list[str] = []
    at = len(words)
    while at > 0:
        candidate, at = max(ends[at], key=lambda option: len(option[0]))  # type: ignore[arg-type]
        found.append(candidate)
    return tuple(f"aten.{op}" for op in reversed(found))


def metadata(name: str, args: dict) -> dict | None:
    """TraceLens's ``_meta_from_trace_args``: counts, ops, bytes and dtype, or None (no model)."""
    concrete, dims, types = args.get("Concrete Inputs"), args.get("Input Dims"), args.get("Input type")
    if not concrete or not dims or not types:
        return None
    integers = []
    for value in concrete:
        if value == "":
            continue
        try:
            integers.append(int(value))
        except (ValueError, TypeError):
            continue
    if name.startswith(("triton_red_", "triton_per_")) and len(integers) >= 2:
        count, reduced = integers[-2], integers[-1]
    elif integers:
        count, reduced = integers[-1], 1
    else:
        return None
    sizes, shapes, dtype = [], [], None
    for shape, dtype_name in zip(dims, types):
        if dtype_name == "Scalar" or not shape:
            continue
        size = BYTES_PER_ELEMENT.get(dtype_name, 0)
        sizes.append(size)
        shapes.append(shape)
        if dtype is None and size > 0:
            dtype = dtype_name.split("::")[-1].lower()
    moved = float(sum(prod(shape) * size for shape, size in zip(shapes, sizes)))
    if name.startswith("triton_poi_") and sizes:
        moved += sizes[0] * count
    return {"ops": fused_ops(name), "xnumel": count, "rnumel": reduced, "bytes": moved, "dtype": dtype}


def has_model(name: str, args: dict) -> bool:
    """TraceLens's ``can_model``: an Inductor kernel op whose arguments give its metadata."""
    return name.startswith(PREFIXES) and metadata(name, args) is not None


def triton_compiled(name: str, args: dict, kernels: list[str]) -> tuple[dict, float, float, str]:
    meta = metadata(name, args)
    if meta is None:
        raise NotImplementedError(f"{name}: no Inductor metadata among its arguments")
    params = {"fused_ops": ", ".join(meta["ops"]), "xnumel": meta["xnumel"], "rnumel": meta["rnumel"]}
    per_element = sum(FLOPS_PER_ELEMENT.get(op, 0) for op in meta["ops"])
    spec = f"vector_{meta['dtype']}" if meta["dtype"] else ""
    return params, float(per_element * (meta["xnumel"] * meta["rnumel"])), meta["bytes"], spec
