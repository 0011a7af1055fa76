"""TraceLens's performance-model sheets (``GEMM``, ``UnaryElementwise``,
``BinaryElementwise``, ``Reduce_*``, ``SDPA_*``, ``CONV_*``,
``Normalization``, ``RMSNorm_fwd``, ``RoPE_fwd``, ``CrossEntropy_fwd``): one row per op name and distinct parameters, with its
FLOPs, bytes moved, achieved TFLOP/s and TB/s over the kernels of its
subtree (``build_df_perf_metrics`` then ``summarize_df_perf_metrics``).

docs/analyze.md states the rules and TraceLens's accidents.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from . import (
    iterannotation,
    optree,
    perfmodel,
    perfmodels_attention,
    perfmodels_collective,
    perfmodels_conv,
    perfmodels_elementwise,
    perfmodels_fused,
    perfmodels_gemm,
    perfmodels_gemm_fp4,
    perfmodels_inference,
    perfmodels_mhc,
    perfmodels_moe,
    perfmodels_norm,
    perfmodels_rmsnorm,
    perfmodels_ssm,
    perfmodels_te,
)
from .columns import slice_positions
from .opcategories import CATEGORY_OF_OP
from .opstables import (
    NA,
    STATS,
    OpTree,
    Table,
    cell_number,
    grouped,
    kernel_stats_of,
    process_and_thread,
    truncated,
    welford_std,
)

# sheet -> op name -> model (see perfmodel.Model), and the backward models of the split sheets
MODELS: dict[str, dict[str, perfmodel.Model]] = {
    **perfmodel.MODELS, "GEMM": {**perfmodel.MODELS["GEMM"], **perfmodels_gemm.MODELS, **perfmodels_gemm_fp4.MODELS},
    "UnaryElementwise": {**perfmodel.MODELS["UnaryElementwise"], **perfmodels_elementwise.UNARY_MODELS},
    "BinaryElementwise": {**perfmodel.MODELS["BinaryElementwise"], **perfmodels_elementwise.BINARY_MODELS},
    "SDPA": perfmodels_attention.MODELS, "CONV": perfmodels_conv.MODELS,
    "Normalization": {**perfmodels_norm.MODELS, **perfmodels_rmsnorm.NORM_MODELS},
    "RMSNorm": {**perfmodels_norm.RMS_MODELS, **perfmodels_rmsnorm.RMS_MODELS},
    "RoPE": perfmodels_te.ROPE_MODELS, "CrossEntropy": perfmodels_te.CROSS_ENTROPY_MODELS, **perfmodels_moe.MODELS,
    "InferenceAttention": perfmodels_inference.MODELS, "SSM": perfmodels_ssm.MODELS, "mHC": perfmodels_mhc.MODELS,
    **perfmodels_fused.MODELS, "CustomCollective": perfmodels_collective.MODELS}


def _declined(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int, str]:
    """The backward model of a class that has none (TraceLens's NotImplementedError or AttributeError): no row."""
    raise NotImplementedError(name)


BACKWARD_MODELS: dict[str, perfmodel.Model] = {
    **perfmodels_attention.BACKWARD_MODELS, **perfmodels_conv.BACKWARD_MODELS,
    **dict.fromkeys([*MODELS["RMSNorm"], *perfmodels_te.ROPE_MODELS, *perfmodels_te.CROSS_ENTROPY_MODELS,
                     *(name for sheets in (perfmodels_moe.MODELS, perfmodels_fused.MODELS) for models in sheets.values()
                       for name in models),
                     *perfmodels_inference.MODELS, *perfmodels_ssm.MODELS, *perfmodels_mhc.MODELS,
                     *perfmodels_collective.MODELS], _declined),
    **perfmodels_moe.BACKWARD_MODELS, **perfmodels_ssm.BACKWARD_MODELS}
SHEET_OPS_BEYOND_MODELS = {"SDPA": perfmodels_attention.SHEET_OPS_BEYOND_MODELS,
                           "MoE_unfused": perfmodels_moe.UNFUSED_SHEET_OPS_BEYOND_MODELS,
                           "InferenceAttention": perfmodels_inference.SHEET_OPS_BEYOND_MODELS}
SPLIT_SHEETS = perfmodel.SPLIT_SHEETS | {"SDPA", "CONV", "RMSNorm", "RoPE", "CrossEntropy", "InferenceAttention", "SSM",
                                         "mHC", "CustomCollective", *perfmodels_moe.MODELS, *perfmodels_fused.MODELS}
SHEET_OPS = {
    "GEMM": frozenset(name for name, category in CATEGORY_OF_OP.items() if category == "GEMM"),
    **{sheet: frozenset(models) | frozenset(SHEET_OPS_BEYOND_MODELS.get(sheet, ()))
       for sheet, models in MODELS.items() if sheet != "GEMM"},
}
# what a model raising any of these means: TraceLens's model failed on the op, which gets no row
MODEL_FAILURES = (KeyError, IndexError, TypeError, ValueError, AttributeError, SyntaxError, ArithmeticError,
                  NotImplementedError)
ARG_COLUMNS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")  # (then "Output type")
RATE_STATS = ("mean", "median", "std", "min", "max")
OP_BLOCK = 1 << 16  # a sheet's ops whose models are found at a time
LINK_BLOCK = 1 << 18  # ... and at most about this many of their GPU events (more when one op has more)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def backward_ops(tree: OpTree) -> tuple[np.ndarray, np.ndarray]:
    """TraceLens's forward -> backward op links, as (forward ops, their backward ops) in the order the
    sequence numbers first come: per sequence number, the first ``autograd::engine::evaluate_function:``
    event is the backward op, and the forward op is the latest-starting other event of that number on
    another thread (the first of equal starts).  A sequence number's members sorted by number, not a
    list per number."""
    f = tree.f
    hs = np.flatnonzero(f.h_seq != optree.NO_LINK)
    hs = hs[np.argsort(f.h_seq[hs], kind="stable")]  # (by number, each number's in event order)
    if not len(hs):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    seq = f.h_seq[hs]
    heads = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    group = np.repeat(np.arange(len(heads)), np.diff(np.append(heads, len(hs))))
    evaluate = np.array([name.startswith("autograd::engine::evaluate_function:") for name in f.names])
    at = np.arange(len(hs))
    first_bwd = np.full(len(heads), len(hs), dtype=np.int64)
    np.minimum.at(first_bwd, group[evaluate[f.h_name[hs]]], at[evaluate[f.h_name[hs]]])
    has_bwd = first_bwd < len(hs)
    bwd = np.where(has_bwd, hs[np.minimum(first_bwd, len(hs) - 1)], -1)
    other = has_bwd[group] & (f.h_thread[hs] != f.h_thread[np.maximum(bwd[group], 0)])
    # (the forward op: per number the latest start among the others, the first event of equal starts)
    candidates = at[other][np.lexsort((hs[other], -f.h_ts[hs[other]], group[other]))]
    numbers, first = np.unique(group[candidates], return_index=True)
    fwd = hs[candidates[first]]
    in_order = np.argsort(hs[heads[numbers]], kind="stable")  # (numbers in the order they first come)
    return fwd[in_order], bwd[numbers][in_order]


def backward_pairs(tree: OpTree, ops: np.ndarray | list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`backward_links` as arrays (not a list per op): the ops linked to some backward op, ascending,
    and (op, GPU event) pairs by op, each op's backward ops ascending, each one's GPU events as
    :meth:`OpTree.link_pairs` lists them."""
    forwards, backwards = backward_ops(tree)
    ops = np.unique(np.asarray(ops, dtype=np.int64))
    wanted = np.zeros(len(tree.f.h_ts), dtype=bool)
    wanted[ops] = True
    found_op, found_bwd = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    current, bwd = forwards, backwards
    while len(current):  # (a level of ancestors at a time, from each forward op itself up)
        mine = wanted[current]
        found_op.append(current[mine])
        found_bwd.append(bwd[mine])
        up = tree.parent[current]
        current, bwd = up[up != optree.NO_PARENT], bwd[up != optree.NO_PARENT]
    owned = ops[np.isin(ops, forwards)]
    op, bwd = np.concatenate(found_op), np.concatenate(found_bwd)
    width = len(tree.f.h_ts)
    pairs = np.unique((op * width + bwd)[np.isin(op, owned)])  # (each op's backward ops once, ascending)
    op, bwd = pairs // width, pairs % width
    below_op, below_gpu = tree.link_pairs(np.unique(bwd))
    first = np.searchsorted(below_op, bwd)
    sizes = np.searchsorted(below_op, bwd, "right") - first
    return owned, np.repeat(op, sizes), below_gpu[slice_positions(first, sizes)]


def backward_links(tree: OpTree, ops: list[int]) -> dict[int, list[int]]:
    """The GPU events of the backward ops of each op linked to some: its own
    and its descendants' backward ops, each with its whole subtree."""
    owned, op, gpu = backward_pairs(tree, ops)
    bounds = zip(np.searchsorted(op, owned).tolist(), np.searchsorted(op, owned, "right").tolist())
    return {h: gpu[lo:hi].tolist() for h, (lo, hi) in zip(owned.tolist(), bounds)}


def rate_stats(values: list[float]) -> dict[str, object]:
    """median, std, min, max of one group's rates, skipping missing ones as pandas does."""
    present = [v for v in values if not math.isnan(v)]
    if not present:
        return dict.fromkeys(RATE_STATS, NA)
    return {"median": float(np.median(present)), "std": welford_std(present), "min": min(present),
            "max": max(present)}


def model_sheets(tree: OpTree, signature_values: list[list], spec: dict | None = None,
                 ) -> tuple[dict[str, Table], list[str]]:
    """The sheets TraceLens writes for the trace's ops, and notes on those
    left out because some of their ops need models not here yet.  ``spec``:
    a GPU spec in TraceLens's arch JSON form, for the roofline columns."""
    sheets: dict[str, Table] = {}
    notes: list[str] = []
    for sheet in SHEET_OPS:
        table, note = model_sheet(tree, sheet, signature_values, spec)
        notes += note
        if table is not None and sheet in SPLIT_SHEETS:
            backward, _ = model_sheet(tree, sheet, signature_values, spec, backward=True)
            forward, backward = _split(table, backward)
            sheets.update({f"{sheet}_{part}": split for part, split in (("fwd", forward), ("bwd", backward))
                           if split is not None})
        elif table is not None:
            sheets[sheet] = table
    return sheets, notes


def _split(forward: Table, backward: Table | None) -> tuple[Table | None, Table | None]:
    """TraceLens's fix-up of a split sheet: the rows of backward ops it models
    as forward ones (``aten::convolution_backward`` ...) move from the
    ``_fwd`` sheet to the end of the ``_bwd`` one, forward convolutions leave
    the ``_bwd`` sheet; a sheet left without rows is not written."""
    moved = [row for row in forward.rows if row[0] in perfmodels_conv.MOVED_TO_BACKWARD]
    kept = Table(forward.header, [row for row in forward.rows if row[0] not in perfmodels_conv.MOVED_TO_BACKWARD])
    if backward is None:
        backward_rows, header = [], forward.header[0]
    else:
        header = backward.header[0] + [column for column in forward.header[0] if column not in backward.header[0]]
        padding = [NA] * (len(header) - len(backward.header[0]))  # (pandas' concat: the forward sheet's columns)
        backward_rows = [row + padding for row in backward.rows if row[0] not in perfmodels_conv.FORWARD_ONLY]
    places = {column: at for at, column in enumerate(forward.header[0])}
    moved = [[row[places[column]] if column in places else NA for column in header] for row in moved]
    joined = Table([header], backward_rows + moved)
    return (kept if kept.rows else None), (joined if joined.rows else None)


def model_sheet(tree: OpTree, sheet: str, signature_values: list[list], spec: dict | None = None,
                backward: bool = False) -> tuple[Table | None, list[str]]:
    """One sheet, or None (and a note) when TraceLens writes none or the
    trace has ops of it whose model is not here yet.  ``backward``: the
    ``_bwd`` sheet, over the ops linked to backward ops and the kernels of
    those, with the op's backward model where it has one (a reduction's
    backward FLOPs and bytes equal its forward ones)."""
    f = tree.f
    names = np.array([name in SHEET_OPS[sheet] for name in f.names] or [False])
    ops = np.flatnonzero(names[f.h_name])
    if not len(ops):
        return None, []
    models = MODELS[sheet]
    present = {f.names[at] for at in np.unique(f.h_name[ops]).tolist()}
    other = sorted(present - set(models))
    if backward:
        models = {name: BACKWARD_MODELS.get(name, model) for name, model in models.items()}
    if other:
        return None, [f"{sheet} sheet not written: no model here yet for {', '.join(other)}"]
    owned, op, gpu = backward_pairs(tree, ops) if backward else (ops, *tree.link_pairs(ops))
    forwards = cached_forwards(tree, signature_values) if present & perfmodels_conv.CACHED_FORWARD.keys() else {}
    alone = np.array([name in perfmodels_inference.ANNOTATED or name in perfmodels_conv.CACHED_FORWARD
                      for name in f.names] or [False])
    first = np.searchsorted(op, owned)
    count = np.searchsorted(op, owned, "right") - first
    ends = first + count
    rows: list[dict] = []
    lo = 0
    while lo < len(owned):  # (a block of ops, about LINK_BLOCK GPU events, at a time: its arrays a block's)
        hi = min(lo + OP_BLOCK, max(lo + 1, int(np.searchsorted(ends, first[lo] + LINK_BLOCK, "right"))))
        start, stop = int(first[lo]), int(ends[hi - 1])
        block = _Block(tree, owned[lo:hi], first[lo:hi] - start, count[lo:hi], op[start:stop], gpu[start:stop])
        rows += block.rows(models, alone, signature_values, spec, forwards)
        lo = hi
    if not rows:
        return None, []
    return _summarize(tree, rows), []


class _Block:
    """A block of a sheet's ops (ascending), their GPU events by start (ties as listed) and those events'
    names, as numbers; ``placed``, ``count``: where each op's lie in them.  ``op``, ``gpu``: the block's
    (op, GPU event) pairs, by op."""

    def __init__(self, tree: OpTree, ops: np.ndarray, placed: np.ndarray, count: np.ndarray, op: np.ndarray,
                 gpu: np.ndarray) -> None:
        self.tree, self.ops, self.placed, self.count = tree, ops, placed, count
        self.by_start = gpu[np.lexsort((tree.f.g_ts[gpu], op))]
        self.kernels = tree.f.g_name[self.by_start]

    def rows(self, models: dict[str, perfmodel.Model], alone: np.ndarray, signature_values: list[list],
             spec: dict | None, forwards: dict) -> list[dict]:
        """The rows of the ops their models succeed on, in op order: a model's outcome found once per
        group (:meth:`groups`: ops of one shape are many), the busy time only of those ops."""
        tree, f = self.tree, self.tree.f
        group, firsts = self.groups(alone)
        outcomes = []
        for i in firsts.tolist():
            h, lo = int(self.ops[i]), int(self.placed[i])
            kernels = tuple(self.kernels[lo:lo + int(self.count[i])].tolist())
            outcomes.append(model_outcome(tree, h, models[f.names[f.h_name[h]]], kernels, signature_values,
                                          forward_args(tree, forwards, h, before=True)))
        failed = np.array([isinstance(outcome, BaseException) for outcome in outcomes])
        good = np.flatnonzero(~failed[group])
        busy, integral = tree.busy_slices(self.by_start, self.placed[good], self.count[good])
        rows = []
        for i, time, whole in zip(good.tolist(), busy.tolist(), integral.tolist()):
            lo = int(self.placed[i])
            try:
                rows.append(_metrics(tree, int(self.ops[i]), outcomes[group[i]],
                                     self.by_start[lo:lo + int(self.count[i])].copy(), time, whole,
                                     signature_values, spec))
            except MODEL_FAILURES:
                continue  # TraceLens leaves the op out (its rates fail on the model's result)
        return rows

    def groups(self, alone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each op's group and each group's first op (places in the block): the ops of one name, signature
        and kernel names (a hash of the names puts them side by side, then each is compared with the one
        before), but an op whose model reads more of it (``alone``, by name: an annotation, a cached
        forward op) in a group of its own."""
        f = self.tree.f
        names, sigs, count, hashes = f.h_name[self.ops], f.h_sig[self.ops], self.count, self._hashes()
        order = np.lexsort((hashes, count, sigs, names))
        now, before = order[1:], order[:-1]
        same = np.r_[False, (names[now] == names[before]) & (sigs[now] == sigs[before]) & (count[now] == count[before])
                     & (hashes[now] == hashes[before]) & ~alone[names[now]]]
        kin = np.flatnonzero(same)
        sizes = count[order[kin]]
        mine = slice_positions(self.placed[order[kin]], sizes)
        theirs = mine + np.repeat(self.placed[order[kin - 1]] - self.placed[order[kin]], sizes)
        same[np.repeat(kin, sizes)[self.kernels[mine] != self.kernels[theirs]]] = False  # (a hash collision)
        group = np.empty(len(order), dtype=np.int64)
        group[order] = np.cumsum(~same) - 1
        return group, order[~same]

    def _hashes(self) -> np.ndarray:
        """A 64-bit hash of each op's kernel names in order (wrapping arithmetic; equal names, equal hash)."""
        position = np.arange(len(self.kernels)) - np.repeat(self.placed, self.count)
        mixed = (self.kernels.astype(np.uint64) * _MIX[0]) ^ (position.astype(np.uint64) * _MIX[1])
        mixed ^= mixed >> np.uint64(31)
        mixed *= _MIX[2]
        hashes = np.zeros(len(self.count), dtype=np.uint64)
        held = self.count > 0
        if held.any():
            hashes[held] = np.add.reduceat(mixed, self.placed[held])
        return hashes


def op_args(values: list) -> dict:
    """An op's arguments as its model reads them (the keys the trace gives)."""
    return {key: value for key, value in zip((*ARG_COLUMNS, "Output type"), values) if value is not None}


def cached_forwards(tree: OpTree, signature_values: list[list]) -> dict[tuple[str, int], list[tuple[int, dict]]]:
    """The forward ops whose parameters TraceLens's models cache for their
    backward ops (``ConvBias_`` ...): per (name, sequence number), the
    (UID, arguments) of each op whose model gets that far, by UID."""
    f = tree.f
    forward_names = set(perfmodels_conv.CACHED_FORWARD.values())
    wanted = [at for at, name in enumerate(f.names) if name in forward_names]
    found: dict[tuple[str, int], list[tuple[int, dict]]] = {}
    if not wanted:
        return found
    for h in np.flatnonzero(np.isin(f.h_name, wanted) & (f.h_seq != optree.NO_LINK)).tolist():
        name = f.names[f.h_name[h]]
        args = op_args(signature_values[f.h_sig[h]])
        try:
            perfmodels_conv.conv_bias_cached(args)
        except MODEL_FAILURES:
            continue
        found.setdefault((name, int(f.h_seq[h])), []).append((int(f.h_uid[h]), args))
    return {key: sorted(ops, key=lambda op: op[0]) for key, ops in found.items()}


def forward_args(tree: OpTree, forwards: dict, h: int, before: bool) -> dict | None:
    """What TraceLens's cache holds for backward op ``h`` when its model
    runs: the arguments of the last forward op of its sequence number
    modelled by then (``before``: in a sheet, the forward ops before it in
    event order; else, in the unified summary, all of them); None when
    ``h`` reads no cache or the cache has nothing for it."""
    f = tree.f
    forward = perfmodels_conv.CACHED_FORWARD.get(f.names[f.h_name[h]])
    if forward is None or f.h_seq[h] == optree.NO_LINK:
        return None
    cached = [args for uid, args in forwards.get((forward, int(f.h_seq[h])), []) if not before or uid < f.h_uid[h]]
    return cached[-1] if cached else None


def op_metrics(tree: OpTree, h: int, model: perfmodel.Model, gpu: list[int], signature_values: list[list],
               spec: dict | None, forward: dict | None = None) -> dict:
    """TraceLens's ``compute_perf_metrics`` of op ``h`` over the GPU events
    ``gpu`` (its subtree's, or its backward ops'): the model's parameters,
    GFLOPS, bytes and rates over their busy time (raises what the model
    raises on the op's arguments).  ``forward``: the arguments of the
    forward op whose cached parameters the model reads."""
    metrics = op_outcome(tree, h, model, gpu, signature_values, spec, forward)
    if isinstance(metrics, BaseException):
        raise copy.copy(metrics)  # (a copy: the kept one gathers no frames that would hold the tree)
    return metrics


def op_outcome(tree: OpTree, h: int, model: perfmodel.Model, gpu: list[int], signature_values: list[list],
               spec: dict | None, forward: dict | None = None) -> dict | BaseException:
    """:func:`op_metrics`, or what the model raised, not raised (a sheet leaves out the ops a model fails
    on, often many of one shape: no exception copied and raised for each)."""
    f = tree.f
    listed = np.asarray(gpu, dtype=np.int64)
    by_start = listed[np.argsort(f.g_ts[listed], kind="stable")]  # (ties as listed)
    result = model_outcome(tree, h, model, tuple(f.g_name[by_start].tolist()), signature_values, forward)
    if isinstance(result, BaseException):
        return result
    busy, integral = tree.busy(gpu) if gpu else (0, True)
    return _metrics(tree, h, result, by_start, busy, integral, signature_values, spec)


def _metrics(tree: OpTree, h: int, result: tuple, by_start: np.ndarray, busy: float, integral: bool,
             signature_values: list[list], spec: dict | None) -> dict:
    """:func:`op_metrics` from the model's result, the op's GPU events by start (as numbers: their
    details are read from the columns when the sheet is made) and their busy time."""
    f = tree.f
    return {"h": h, "name": f.names[f.h_name[h]], "values": signature_values[f.h_sig[h]],
            "kernels": by_start, **rated(result, busy, integral, spec)}


def model_outcome(tree: OpTree, h: int, model: perfmodel.Model, kernels: tuple[int, ...], signature_values: list[list],
                  forward: dict | None = None) -> tuple | BaseException:
    """The model's (parameters, FLOPs, bytes, compute spec) of op ``h`` over
    kernels of these names (numbers in ``f.names``, in start order), or what
    it raised (one of ``MODEL_FAILURES``); found once per distinct model,
    name, signature, enclosing annotation and kernel names (in
    ``tree.model_results``: ops of one shape are many), unless a forward
    op's arguments are read."""
    f = tree.f
    name, sig = f.names[f.h_name[h]], int(f.h_sig[h])
    annotation = None
    if name in perfmodels_inference.ANNOTATED:
        found = iterannotation.enclosing(f.a_ts, f.a_end, f.a_name, f.h_ts[h], f.h_end[h])
        annotation = f.names[found] if found >= 0 else iterannotation.NONE
    key = None if forward is not None else (model, name, sig, annotation, kernels)
    result = tree.model_results.get(key) if key is not None else None
    if result is None:
        args = op_args(signature_values[sig])
        if forward is not None:
            args[perfmodels_conv.FORWARD_ARGS] = forward
        if annotation is not None:
            args[perfmodels_inference.ANNOTATION] = annotation
        try:
            result = model(name, args, [f.names[kernel] for kernel in kernels])
        except MODEL_FAILURES as exc:  # (kept too: the ops of a shape a model fails on are as many)
            result = exc.with_traceback(None)
        if key is not None:
            tree.model_results[key] = result
    return result


def rated(result: tuple, busy: float, integral: bool, spec: dict | None) -> dict:
    """A model's result over the busy time of its kernels: parameters, GFLOPS, bytes, rates (and the roofline
    with a ``spec``), as :func:`op_metrics` gives them."""
    params, flops, moved, compute = result
    gflops = flops / 1e9
    row = {
        "params": params, "GFLOPS": gflops, "busy": busy, "busy_int": integral,
        "TFLOPS/s": (gflops / 1e3) / (busy / 1e6) if busy > 0 else math.nan,
        "Data Moved (MB)": moved / (1024 * 1024) if moved is not None else math.nan,
        "FLOPS/Byte": ((gflops * 1e9) / moved if moved > 0 else math.nan) if moved is not None else math.nan,
        "TB/s": ((moved / 1e12) / (busy / 1e6) if busy > 0 else math.nan) if moved is not None else math.nan,
        "Compute Spec": compute,
    }
    if spec is not None:
        row.update(roofline(spec, compute, gflops, moved, busy))
    return row


def roofline(spec: dict, compute: str, gflops: float, moved: int | None, busy: float) -> dict:
    """TraceLens's roofline columns of one op: the time at the spec's peak
    for its compute kind and precision or at its memory bandwidth, whichever
    is longer, and the achieved share of it; none without a peak, a
    bandwidth, bytes or FLOPs."""
    peak = (spec.get("max_achievable_tflops") or {}).get(compute) if compute else None
    bandwidth = spec.get("mem_bw_gbps")
    if peak is None or bandwidth is None or moved is None or not gflops > 0:
        return {}
    compute_us = (gflops * 1e9 / (peak * 1e12)) * 1e6
    memory_us = (moved / (bandwidth * 1e9)) * 1e6
    bound = max(compute_us, memory_us)
    return {"Roofline Time (µs)": bound, "Roofline Bound": "COMPUTE_BOUND" if compute_us >= memory_us else "MEMORY_BOUND",
            "Pct Roofline": (bound / busy) * 100 if busy > 0 else math.nan}


def group_means(groups, values: list[float], sums: np.ndarray | None = None) -> list[object]:
    """pandas' grouped mean of a column with missing values (skipped; then added row by row); ``sums``:
    the column's ``groups.sums`` when all its values are finite (they are the means' sums then)."""
    array = np.array(values, dtype=np.float64)
    present = ~np.isnan(array)
    if sums is None:
        sums = groups.sums(array) if present.all() else optree.group_sums_kahan(
            np.where(present, groups.codes, -1), np.nan_to_num(array), len(groups.keys))
    seen = np.bincount(groups.codes[present], minlength=len(groups.keys))
    return [float(sums[k] / seen[k]) if seen[k] else NA for k in range(len(groups.keys))]


def _param_texts(values: list) -> list:
    """A parameter column as pandas 3's ``astype(str)`` writes it (missing
    stays missing): numbers in a column with a missing value or a float are
    a float column (``3`` written ``3.0``)."""
    present = [value for value in values if value is not None]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)
    floats = numbers and bool(present) and (len(present) < len(values) or any(isinstance(v, float) for v in present))
    return [NA if value is None else str(float(value)) if floats else str(value) for value in values]


def _summarize(tree: OpTree, rows: list[dict]) -> Table:
    f = tree.f
    param_names: list[str] = []
    for row in rows:
        param_names += [key for key in row["params"] if key not in param_names]
    columns = [_param_texts([row["params"].get(p) for row in rows]) for p in param_names]
    keys = [(row["name"], *(column[i] for column in columns)) for i, row in enumerate(rows)]
    groups = grouped(keys)
    members: list[list[int]] = [[] for _ in groups.keys]
    for i, code in enumerate(groups.codes.tolist()):
        members[code].append(i)
    busy = np.array([r["busy"] for r in rows], dtype=np.float64)
    busy_int = all(r["busy_int"] for r in rows)
    busy_sums = groups.sums(busy)
    counts = groups.counts()
    with_roofline = any("Roofline Time (µs)" in r for r in rows)
    rated = ("TB/s", "TFLOPS/s", *(["Pct Roofline"] if with_roofline else []))
    rate_means = {column: group_means(groups, [r.get(column, math.nan) for r in rows]) for column in rated}
    header = ["name", *[f"param: {p}" for p in param_names], "GFLOPS_first", "Data Moved (MB)_first",
              "FLOPS/Byte_first"]
    header += [f"TB/s_{s}" for s in RATE_STATS] + [f"TFLOPS/s_{s}" for s in RATE_STATS]
    header += ["process_name_first", "process_label_first", "thread_name_first", "Compute Spec"]
    if with_roofline:
        header += ["Roofline Time (µs)_first", "Roofline Bound_first", *[f"Pct Roofline_{s}" for s in RATE_STATS]]
    header += ["kernel_details__summarize_kernel_stats", "trunc_kernel_details", *[f"{c}_first" for c in ARG_COLUMNS]]
    header += [f"Kernel Time (µs)_{s}" for s in STATS] + ["name_count", "UID_first"]
    table = Table([header])
    records = []
    for k, key in enumerate(groups.keys):
        group = [rows[i] for i in members[k]]
        first = group[0]
        record = list(key)
        for column in ("GFLOPS", "Data Moved (MB)", "FLOPS/Byte"):
            record.append(next((r[column] for r in group if not math.isnan(r[column])), NA))
        for column in ("TB/s", "TFLOPS/s"):
            stats = rate_stats([r[column] for r in group])
            stats["mean"] = rate_means[column][k]
            record += [stats[s] for s in RATE_STATS]
        record += [*process_and_thread(f, first["h"]), first["Compute Spec"]]
        if with_roofline:
            record += [next((r[c] for r in group if c in r), NA) for c in ("Roofline Time (µs)", "Roofline Bound")]
            stats = rate_stats([r.get("Pct Roofline", math.nan) for r in group])
            stats["mean"] = rate_means["Pct Roofline"][k]
            record += [stats[s] for s in RATE_STATS]
        lists = [r["kernels"] for r in group if len(r["kernels"])]
        count = np.array([len(kernels) for kernels in lists], dtype=np.int64)
        summary = kernel_stats_of(f, np.concatenate(lists), np.cumsum(count) - count, count) if lists else []
        record += [repr(summary), truncated(summary)]
        for i in range(len(ARG_COLUMNS)):
            record.append(next((str(r["values"][i]) for r in group if r["values"][i] is not None), NA))
        times = busy[members[k]]
        record += [float(busy_sums[k] / counts[k]), float(np.median(times)), welford_std(times.tolist()),
                   cell_number(times.min(), busy_int), cell_number(times.max(), busy_int),
                   cell_number(busy_sums[k], busy_int), int(counts[k]), int(f.h_uid[first["h"]])]
        records.append(record)
    total = header.index("Kernel Time (µs)_sum")
    records.sort(key=lambda r: (-r[total], r[-1]))
    table.rows = records
    return table
