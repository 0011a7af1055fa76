"""TraceLens's ``unified_perf_summary``: one row per op that stands for
GPU work (an op with a performance model, a backward op computed through
its forward op's model, else the innermost launcher), and per GPU event
under none of them a synthetic op, grouped by name, category, process,
thread and argument lists (``build_df_unified_perf_table`` then
``summarize_df_unified_perf_table``).

docs/analyze.md states the rules and TraceLens's accidents.
"""
from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import numpy as np

from . import opsheets, optree, perfmodels_conv, perfmodels_inductor
from .columns import slice_positions
from .opstables import (
    CPU_OP,
    NA,
    RUNTIME,
    UNIQUE_ARGS_KEYS,
    OpRows,
    OpsFacts,
    OpTree,
    Table,
    cell_number,
    kernel_stats_of,
    percentages,
    truncated,
    unique_args_groups,
)

KNOWN = {name: model for models in opsheets.MODELS.values() for name, model in models.items()}
UNKNOWN = frozenset().union(*opsheets.SHEET_OPS.values()).difference(KNOWN)
# a forward op's model with backward formulas -> the category of the backward op computed through it
BACKWARD_CATEGORY = {name: f"{sheet}_bwd" for sheet in ("SDPA", "CONV", "MoE_comm", "SSM")
                     for name in opsheets.MODELS[sheet]}
FIRST = ("GFLOPS", "Data Moved (MB)", "FLOPS/Byte", "Compute Spec")
RATES = ("TB/s", "TFLOPS/s")
STATS = ("mean", "median", "std", "min", "max")
KERNEL_TIME = "Kernel Time (µs)"
ROW_BLOCK = 1 << 12  # rows made at a time (and summary groups between settles)
KERNEL_BLOCK = 1 << 18  # GPU events whose names are put in order at a time


class UnknownModel(Exception):
    """An op TraceLens has a performance model for that is not here yet: the table cannot be made."""

    def note(self) -> str:
        return f"unified_perf_summary not written: no model here yet for {self}"


class ModelCrash(UnknownModel):
    """An op whose arguments make TraceLens's test for a model raise: TraceLens writes no report."""

    def note(self) -> str:
        return f"unified_perf_summary not written: TraceLens's Inductor model fails on the arguments of {self}"


class _Unified:
    """TraceLens's walk of the op tree for the table (``collect_unified_perf_events``)."""

    def __init__(self, tree: OpTree, signature_values: list[list], spec: dict | None,
                 settle: Callable[..., None] = lambda *held: None) -> None:
        self.tree, self.f, self.values, self.spec, self.settle = tree, tree.f, signature_values, spec, settle
        f, parent = self.f, tree.parent
        count = len(f.h_ts)
        place = np.empty(count, dtype=np.int64)
        place[tree.order] = np.arange(count)
        below = np.flatnonzero(tree.in_tree & (parent != optree.NO_PARENT))
        self._child = below[np.lexsort((place[below], parent[below]))]  # children by parent, in the order taken
        self._parents = parent[self._child]  # (sorted: each event's children one slice, found by searching)
        self._runs = np.unique(f.link_run)
        self.launch = np.zeros(count, dtype=bool)
        self.launch[self._runs] = True
        self.has_gpu = self._marked_above(np.ones(len(f.link_run), dtype=bool))  # (TraceLens's gpu_events)
        self.communication_below = self._marked_above(np.array(tree.communication + [False])[f.g_name[f.link_gpu]])
        self.forward_of = np.full(count, optree.NO_PARENT, dtype=np.int64)  # (each backward op's forward op)
        forwards, backwards = opsheets.backward_ops(tree)
        self.forward_of[backwards] = forwards
        below_cpu_op = np.zeros(count, dtype=bool)  # (a cpu op among its ancestors)
        placed = np.flatnonzero(parent != optree.NO_PARENT)
        below_cpu_op[placed] = tree.cpu_ops_above(parent[placed]) != optree.NO_PARENT
        order = tree.order
        self.roots = order[(tree.in_tree & (f.h_kind == CPU_OP) & ~below_cpu_op)[order]]
        self._model: dict[tuple[int, int], bool] = {}  # (by name and signature)
        self.forwards = opsheets.cached_forwards(tree, signature_values)
        self._sole: dict[int, dict] = {}  # (the found ones; _sole_tried: each host event tried)
        self._sole_tried = bytearray(count)
        self._owns = self._risky = self._launches = np.zeros(0, dtype=bool)  # (by _prepare)
        self._status_of = np.zeros(0, dtype=np.int8)

    def children(self, h: int) -> list[int]:
        return self._child[self._parents.searchsorted(h, "left"):self._parents.searchsorted(h, "right")].tolist()

    def _marked_above(self, links: np.ndarray) -> np.ndarray:
        """Each host event with one of the marked links' calls at or below it."""
        marked = np.zeros(len(self.f.h_ts), dtype=bool)
        current = np.unique(self.f.link_run[links])
        while len(current):  # (a tree level at a time)
            marked[current] = True
            current = self.tree.parent[current]
            current = current[(current != optree.NO_PARENT)]
            current = current[~marked[current]]
        return marked

    def link_slices(self, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The GPU events below each of ``ops`` in TraceLens's order (by launch call, in file order):
        ``flat[first[i]:first[i] + count[i]]`` for ``ops[i]``."""
        op, flat = self.tree.link_pairs(np.unique(ops))
        first = np.searchsorted(op, ops, "left")
        return flat, first, np.searchsorted(op, ops, "right") - first

    def name(self, h: int) -> str:
        return self.f.names[self.f.h_name[h]]

    def is_cpu_op(self, h: int) -> bool:
        return bool(self.f.h_kind[h] == CPU_OP)

    def has_model(self, name: str, sig: int) -> bool:
        """TraceLens's ``_has_perf_model`` (raises :class:`UnknownModel` for one not here)."""
        if name in KNOWN:
            return True
        if name in UNKNOWN:
            raise UnknownModel(name)
        if name.startswith(perfmodels_inductor.PREFIXES):
            try:
                return perfmodels_inductor.has_model(name, opsheets.op_args(self.values[sig]))
            except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
                raise ModelCrash(name) from exc
        return False

    def op_has_model(self, h: int) -> bool:
        key = (int(self.f.h_name[h]), int(self.f.h_sig[h]))
        found = self._model.get(key)
        if found is None:
            found = self._model[key] = self.has_model(self.name(h), key[1])
        return found

    def sole_backward(self, first_parent: int) -> dict | None:
        """The backward metrics of the forward op linked to the autograd
        wrapper within 5 levels above, when the wrapper holds exactly one
        kernel-launching op of the wrapper's function name and the forward
        op's model has backward formulas (``_is_sole_bwd_with_fwd_perf_model``)."""
        if first_parent == optree.NO_PARENT:
            return None
        if not self._sole_tried[first_parent]:  # (marked once found: a test that raised raises again)
            found = self._sole_backward(first_parent)
            self._sole_tried[first_parent] = 1
            if found is not None:
                self._sole[first_parent] = found
        return self._sole.get(first_parent)

    def _sole_backward(self, first_parent: int) -> dict | None:
        f, tree = self.f, self.tree
        wrapper, current = None, first_parent
        for _ in range(5):
            if current == optree.NO_PARENT:
                break
            forward = int(self.forward_of[current])
            if forward != optree.NO_PARENT and f.h_uid[forward] != 0:
                wrapper = current
                break
            current = int(tree.parent[current])
        if wrapper is None or not self.op_has_model(forward):
            return None
        text = self.name(wrapper)
        main = text.split(": ", 1)[1] if ": " in text else None
        if self._count_main(wrapper, main) != 1:
            return None
        name = self.name(forward)
        model = opsheets.BACKWARD_MODELS.get(name)
        if model is None:  # (no backward category, or a norm whose backward model declines)
            return None
        gpu = opsheets.backward_links(tree, [forward]).get(forward, [])
        try:
            metrics = opsheets.op_metrics(tree, forward, model, gpu, self.values, self.spec)
        except opsheets.MODEL_FAILURES:
            return None
        return {**metrics, "category": BACKWARD_CATEGORY[name]}

    def _count_main(self, h: int, main: str | None) -> int:
        count = 0
        for child in self.children(h):
            if self.is_cpu_op(child):
                count += int(self.has_gpu[child] and (main is None or self.name(child) == main))
                count += self._count_main(child, main)
        return count

    def _owns_model_below(self, h: int) -> bool:
        """Some cpu op below ``h`` with a model and GPU work (``_has_descendant_cpu_op_with_own_perf_model``)."""
        stack = self.children(h)
        while stack:
            node = stack.pop()
            if not self.is_cpu_op(node):
                continue
            if self.op_has_model(node) and self.has_gpu[node]:
                return True
            stack.extend(self.children(node))
        return False

    def _launches_directly(self, h: int, depth: int = 10) -> bool:
        """A runtime call (not a driver call) below ``h`` with a GPU event (``_is_leaf_cpu_op``)."""
        if depth <= 0:
            return False
        f = self.f
        for child in self.children(h):
            if f.h_kind[child] == RUNTIME and not f.h_driver[child]:
                if self.launch[child] or self._launches_directly(child, depth - 1):
                    return True
        return False

    def _prepare(self) -> None:
        """:meth:`_owns_model_below` and :meth:`_launches_directly` of every host event at once, a tree level
        at a time; ``_risky``: the ops whose test may meet an op whose model test raises (those test op by op,
        raising where TraceLens would)."""
        f, parent = self.f, self.tree.parent
        cpu_op = self.tree.in_tree & (f.h_kind == CPU_OP)
        ops = np.flatnonzero(cpu_op)
        _, first, inverse = np.unique(f.h_name[ops].astype(np.int64) * (len(self.values) + 1) + f.h_sig[ops],
                                      return_index=True, return_inverse=True)
        status = np.zeros(len(f.h_ts), dtype=np.int8)  # (1: a model, -1: its test raises)
        status[ops] = np.array([self._status(h) for h in ops[first].tolist()] or [0], dtype=np.int8
                               )[inverse.reshape(-1)] if len(ops) else 0
        self._status_of = status
        self._owns = self._below_through_cpu_ops((status == 1) & self.has_gpu, cpu_op)
        self._risky = self._below_through_cpu_ops(status == -1, cpu_op)
        runtime = np.flatnonzero((f.h_kind == RUNTIME) & ~f.h_driver.astype(bool) & (parent != optree.NO_PARENT))
        launches = np.zeros(len(f.h_ts), dtype=bool)
        for _ in range(10):  # (TraceLens's depth limit)
            deeper = np.zeros(len(f.h_ts), dtype=bool)
            deeper[parent[runtime[self.launch[runtime] | launches[runtime]]]] = True
            launches = deeper
        self._launches = launches

    def _status(self, h: int) -> int:
        try:
            return int(self.op_has_model(h))
        except UnknownModel:
            return -1

    def _below_through_cpu_ops(self, marked: np.ndarray, cpu_op: np.ndarray) -> np.ndarray:
        """The host events with a marked event below them reached through cpu ops only (as
        :meth:`_owns_model_below` descends)."""
        parent = self.tree.parent
        found = np.zeros(len(marked), dtype=bool)
        current = parent[np.flatnonzero(marked)]
        while len(current):
            current = current[(current != optree.NO_PARENT)]
            current = current[~found[current]]
            found[current] = True
            current = parent[current[cpu_op[current]]]
        return found

    def collect(self) -> np.ndarray:
        """The ops with a row, in TraceLens's order (its depth-first walk from the roots): found a tree level
        at a time, or where some test on the way may raise, by the walk itself (:meth:`_walk`)."""
        self._prepare()
        found = self._collect_by_levels()
        return self._walk() if found is None else found

    def _collect_by_levels(self) -> np.ndarray | None:
        """:meth:`_walk`'s ops, the walk's choices made for a tree level of ops at a time; None when an op
        on the way has a model test that raises (the walk raises where TraceLens does). A thread's events
        taken by start are its tree in depth-first order, so the walk's order is by root, then by start."""
        f, tree = self.f, self.tree
        walked = (f.h_kind == CPU_OP) & self.has_gpu
        place = np.empty(len(tree.order), dtype=np.int64)
        place[tree.order] = np.arange(len(tree.order))
        ops, roots = [], []
        current, root = self.roots, place[self.roots]
        while len(current):
            mine = walked[current]
            current, root = current[mine], root[mine]
            status = self._status_of[current]
            if (status < 0).any() or self._risky[current].any():
                return None
            modelled = status > 0
            ops.append(current[modelled])
            roots.append(root[modelled])
            current, root = current[~modelled], root[~modelled]
            if not len(current):
                break
            soles = _outcomes(tree.parent[current], self.sole_backward)
            if _per_row(soles, lambda one: isinstance(one, UnknownModel)).any():
                return None
            sole = _per_row(soles, lambda one: one is not None) & ~self._owns[current]
            # (a launcher owns no modelled op below it, so none of its children is one to walk to)
            launching = ~self._owns[current] & ~sole & self._launches[current]
            taken = sole | (launching & ~self.communication_below[current])
            ops.append(current[taken])
            roots.append(root[taken])
            walks_on = ~sole & ~launching
            current, parent_at = self._children_of(current[walks_on])
            root = root[walks_on][parent_at]
        if not ops:
            return np.empty(0, np.int64)
        found, root = np.concatenate(ops), np.concatenate(roots)
        return found[np.lexsort((place[found], root))]

    def _children_of(self, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The children of each of ``hs`` in the order taken, one's after another, and whose each is (an
        index into ``hs``)."""
        lo = self._parents.searchsorted(hs, "left")
        count = self._parents.searchsorted(hs, "right") - lo
        return self._child[slice_positions(lo, count)], np.repeat(np.arange(len(hs)), count)

    def _walk(self) -> np.ndarray:
        """TraceLens's walk itself, a stack here (per host event a byte of each flag, not a Python object)."""
        cpu_op, has_gpu = (self.f.h_kind == CPU_OP).tobytes(), self.has_gpu.tobytes()
        status = (self._status_of + 1).astype(np.uint8).tobytes()  # (0: its test raises, 1: no model, 2: a model)
        collected = array("q")
        visited = bytearray(len(cpu_op))
        for root in map(int, self.roots):  # (a root's walk ends before the next root's begins)
            stack = [root]
            while stack:
                h = stack.pop()
                if visited[h]:
                    continue
                visited[h] = 1
                if not cpu_op[h] or not has_gpu[h]:
                    continue
                if status[h] == 2:
                    collected.append(h)
                    continue
                if status[h] == 0:
                    self.op_has_model(h)  # (raises, where TraceLens's test does)
                stack.extend(reversed(self._visit(h, collected)))
        return np.frombuffer(collected, dtype=np.int64) if len(collected) else np.empty(0, np.int64)

    def _visit(self, h: int, collected: array) -> list[int]:
        """A cpu op with GPU work and no model of its own: collected, or the children to walk next."""
        sole = self.sole_backward(int(self.tree.parent[h])) is not None
        owns = self._owns_model_below(h) if self._risky[h] else self._owns[h]
        if owns:  # (a backward op computed through its forward op yields to a modelled op below it)
            return self.children(h)
        if sole:
            collected.append(h)
            return []
        if self._launches[h]:
            modelled = [c for c in self.children(h) if self.is_cpu_op(c) and self.op_has_model(c) and self.has_gpu[c]]
            if not modelled and not self.communication_below[h]:
                collected.append(h)
            return modelled
        return self.children(h)

    def synthetic(self, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(host event, GPU event) of each GPU event no collected op holds (``held``: those held), as two
        columns: first those with no cpu op above (by their launch call, the call's first kernel first),
        then those with one (with the nearest cpu op)."""
        f, tree = self.f, self.tree
        communication = np.array(tree.communication + [False])[f.g_name]
        left = np.flatnonzero(~held & ~communication & (f.g_parent != optree.NO_PARENT))
        calls = f.g_parent[left]
        above = tree.cpu_ops_above(calls)
        none = above == optree.NO_PARENT
        alone, alone_calls = left[none], calls[none]
        first = np.unique(alone_calls, return_index=True, return_inverse=True)
        by_call = np.argsort(first[1][first[2].reshape(-1)], kind="stable")  # (each call where it first comes)
        return (np.concatenate([alone_calls[by_call], above[~none]]).astype(np.int64),
                np.concatenate([alone[by_call], left[~none]]).astype(np.int64))


def unified_perf_summary(tree: OpTree, signature_values: list[list], spec: dict | None = None,
                         settle: Callable[..., None] = lambda *held: None) -> tuple[Table | None, list[str]]:
    """The table, or None and a note (no op with GPU work; an op whose model is not here). ``settle`` is
    called between steps and blocks with what later ones keep (see :func:`.opsreport.perf_tables`)."""
    walk = _Unified(tree, signature_values, spec, settle)
    settle(walk)
    try:
        rows = _rows(walk)
    except UnknownModel as exc:
        return None, [exc.note()]
    settle()
    return (_summarize(tree, rows, settle) if len(rows) else None), []


RATED = ("GFLOPS", "Data Moved (MB)", "FLOPS/Byte", "TB/s", "TFLOPS/s", "Roofline Time (µs)", "Pct Roofline")
CODED = ("Compute Spec", "Roofline Bound", "params")  # (numbers into each column's distinct values; -1: none)
NO_METRICS = (math.nan,) * len(RATED) + (-1,) * len(CODED)  # (a model row's columns without metrics)
DENSE = {"ints": ("h", "uid", "name", "category", "gpu_count"),
         "flags": ("dur_int", "has_perf_model", "busy_known", "busy_int", "rated", "roofline"),
         "floats": ("dur", "busy")}


class _RowColumns:
    """``build_df_unified_perf_table``'s rows as typed columns appended a block of rows at a time (a few
    numbers a row, not a dict).  The model columns are held only for the rows with a model (``model_row``:
    those rows, in order), a model's result as a number into the distinct results until its rates are made
    over the row's kernel time (:meth:`rate`)."""

    def __init__(self, f: OpsFacts) -> None:
        self.ints = {name: array("q") for name in DENSE["ints"]}
        self.flags = {name: array("b") for name in DENSE["flags"]}
        self.floats = {name: array("d") for name in DENSE["floats"]}
        self.model = {"model_row": array("q"), "result": array("q"), **{name: array("d") for name in RATED},
                      **{name: array("q") for name in CODED}}
        self.values: dict[str, list] = {name: [] for name in (*CODED, "result")}
        self._model_targets = [self.model[name] for name in ("model_row", "result", *RATED, *CODED)]
        self._value_codes: dict[tuple[str, int], int] = {}
        self.gpu = array("q")
        self.names, self._name_codes = list(f.names), {}  # (the trace's names, then the synthetic ops')
        self.categories: list[str] = []
        self._category_codes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ints["h"])

    def name_code(self, name: str) -> int:
        code = self._name_codes.get(name)
        if code is None:
            code = self._name_codes[name] = len(self.names)
            self.names.append(name)
        return code

    def category_codes(self, codes: np.ndarray, categories: list[str]) -> np.ndarray:
        """Rows' categories (``codes`` into ``categories``) as numbers into this table's, the new ones
        numbered in the order the rows first have them."""
        distinct, first = np.unique(codes, return_index=True)
        for category in (categories[code] for code in distinct[np.argsort(first)].tolist()):
            if category not in self._category_codes:
                self._category_codes[category] = len(self.categories)
                self.categories.append(category)
        table = np.array([self._category_codes.get(category, -1) for category in categories] or [-1], dtype=np.int64)
        return table[codes]

    def extend(self, dense: dict[str, np.ndarray], gpu: np.ndarray, model: list[tuple[int, tuple | None, dict | None]],
               ) -> None:
        """A block of rows: the dense columns (by name), their GPU events one row's after another, and
        per row with a model (its position in the block, the model's result or its metrics)."""
        row = len(self)
        for group in (self.ints, self.flags, self.floats):
            for name, column in group.items():
                column.frombytes(np.ascontiguousarray(dense[name], dtype=column.typecode).tobytes())
        self.gpu.frombytes(np.ascontiguousarray(gpu, dtype=np.int64).tobytes())
        entries = [(row + at, self._code("result", result), *(self._model_values(metrics) if metrics else NO_METRICS))
                   for at, result, metrics in model]
        for target, values in zip(self._model_targets, zip(*entries)):
            target.extend(values)

    def _model_values(self, metrics: dict) -> tuple:
        """A model row's model columns (none: absent), in RATED's then CODED's order."""
        return (*(math.nan if (value := metrics.get(column)) is None else value for column in RATED),
                *(self._code(column, metrics.get(column)) for column in CODED))

    def _code(self, column: str, value: object) -> int:
        """A model column's value as a number into its distinct values (by identity: the models' results are
        shared objects; -1: none)."""
        if value is None:
            return -1
        key = (column, id(value))
        code = self._value_codes.get(key)
        if code is None:
            code = self._value_codes[key] = len(self.values[column])
            self.values[column].append(value)  # (held: its id is not reused)
        return code

    def rate(self, tree: OpTree, spec: dict | None) -> OpRows:
        """Each row's kernel time (unless its metrics gave it) and its model's rates over it; the rows as
        :class:`OpRows` (``columns``: numpy), without those whose model declined them."""
        ints = {name: _numbers(column, np.int64) for name, column in self.ints.items()}
        gpu = _numbers(self.gpu, np.int64)
        flags = {name: _numbers(column, np.int8).astype(bool) for name, column in self.flags.items()}
        floats = {name: _numbers(column, np.float64).copy() for name, column in self.floats.items()}
        first = np.cumsum(ints["gpu_count"]) - ints["gpu_count"]
        timed = np.flatnonzero(~flags["busy_known"])
        floats["busy"][timed], flags["busy_int"][timed] = tree.busy_slices(gpu, first[timed], ints["gpu_count"][timed])
        keep = np.ones(len(self), dtype=bool)
        model = self.model
        for slot, (row, result) in enumerate(zip(model["model_row"], model["result"])):
            if result < 0 or flags["busy_known"][row]:
                continue
            try:  # (an op's own model: its rates over that busy time)
                metrics = opsheets.rated(self.values["result"][result], float(floats["busy"][row]),
                                         bool(flags["busy_int"][row]), spec)
            except NotImplementedError:
                keep[row] = False
                continue
            except opsheets.MODEL_FAILURES:
                continue
            flags["rated"][row] = "GFLOPS" in metrics
            flags["roofline"][row] = "Roofline Time (µs)" in metrics
            for column in RATED:
                value = metrics.get(column)
                model[column][slot] = math.nan if value is None else value
            for column in CODED:
                model[column][slot] = self._code(column, metrics.get(column))
        columns = {**ints, **flags, **floats, "gpu": gpu}
        sparse = {name: _numbers(column, np.int64 if column.typecode == "q" else np.float64)
                  for name, column in model.items()}
        if not keep.all():
            held = np.repeat(keep, ints["gpu_count"])
            columns = {name: values[held if name == "gpu" else keep] for name, values in columns.items()}
            kept = keep[sparse["model_row"]]
            sparse = {name: values[kept] for name, values in sparse.items()}
            sparse["model_row"] = (np.cumsum(keep) - 1)[sparse["model_row"]]
        columns["gpu_first"] = np.cumsum(columns["gpu_count"]) - columns["gpu_count"]
        return OpRows(columns["h"], columns["name"], self.names, columns["category"], self.categories,
                      {**columns, **sparse}, self.values)


def _numbers(column: array, dtype: type) -> np.ndarray:
    return np.frombuffer(column, dtype=dtype) if len(column) else np.empty(0, dtype)


def _rows(walk: _Unified) -> OpRows:
    rows = _RowColumns(walk.f)
    held = _collected_rows(walk, rows)
    _synthetic_rows(walk, rows, held)
    del held  # (each step's arrays gone before the next's)
    return rows.rate(walk.tree, walk.spec)


def _collected_rows(walk: _Unified, rows: _RowColumns) -> np.ndarray:
    """The rows of the collected ops, a block at a time; which GPU events they hold."""
    f, tree = walk.f, walk.tree
    collected = walk.collect()
    flat, first, count = walk.link_slices(collected)
    kernels, kernels_first = _kernel_names(f, flat, first, count)
    category, categories = tree.category_codes(collected)
    for lo in range(0, len(collected), ROW_BLOCK):
        walk.settle()
        block = slice(lo, lo + ROW_BLOCK)
        ops, sizes = collected[block], count[block]
        named = int(kernels_first[lo])
        _add_rows(walk, rows, ops, f.h_uid[ops], f.h_name[ops], (category[block], categories),
                  flat[slice_positions(first[block], sizes)], sizes, kernels[named:named + int(sizes.sum())])
    held = np.zeros(len(f.g_ts), dtype=bool)
    held[flat] = True
    return held


def _synthetic_rows(walk: _Unified, rows: _RowColumns, held: np.ndarray) -> None:
    """A synthetic op's row per GPU event no collected op holds, numbered after the trace's events."""
    f, tree = walk.f, walk.tree
    sources, gpus = walk.synthetic(held)
    for lo in range(0, len(sources), ROW_BLOCK):
        walk.settle()
        source, gpu = sources[lo:lo + ROW_BLOCK], gpus[lo:lo + ROW_BLOCK]
        names = [f"{walk.name(h)}->{f.names[g]} (Synthetic Op)" for h, g in zip(source.tolist(), f.g_name[gpu].tolist())]
        categories = [tree.category_of(name, tree.first_kernel(h)) for name, h in zip(names, source.tolist())]
        _add_rows(walk, rows, source, f.events + lo + np.arange(len(source)),
                  np.array([rows.name_code(name) for name in names], dtype=np.int64),
                  (np.arange(len(source)), categories), gpu, np.ones(len(source), dtype=np.int64))


def _kernel_names(f: OpsFacts, flat: np.ndarray, first: np.ndarray, count: np.ndarray,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The names (numbers) of each slice's GPU events (``flat[first[i]:first[i] + count[i]]``) by start
    (ties as listed), as the models read them: the slices' names one after the other, and where each
    slice's begin."""
    placed = np.cumsum(count) - count
    names = np.empty(int(count.sum()), dtype=f.g_name.dtype)
    ends = placed + count
    lo = 0
    while lo < len(count):  # (slices a block of about KERNEL_BLOCK events at a time: its sort's arrays a block's)
        hi = max(lo + 1, int(np.searchsorted(ends, placed[lo] + KERNEL_BLOCK, "right")))
        sizes, start, stop = count[lo:hi], int(placed[lo]), int(ends[hi - 1])
        owner = np.repeat(np.arange(hi - lo), sizes)
        gpu = flat[slice_positions(first[lo:hi], sizes)]
        names[start:stop] = f.g_name[gpu[np.lexsort((f.g_ts[gpu], owner))]]
        lo = hi
    return names, placed


def _add_rows(walk: _Unified, rows: _RowColumns, source: np.ndarray, uid: np.ndarray, name: np.ndarray,
              category: tuple[np.ndarray, list[str]], gpu: np.ndarray, gpu_count: np.ndarray,
              kernels: np.ndarray | None = None) -> None:
    """A block of ``build_df_unified_perf_table``'s rows: per row the host event it copies (``source``:
    its signature, parent, duration), its UID, name (a number into ``rows.names``), category (numbers
    into a list) and GPU events (``gpu``: one row's after another, ``gpu_count`` each). ``kernels``: the
    names of those events by start when the rows are the ops themselves (their models run), None for
    synthetic ops. A row whose model declines it is left out, as TraceLens drops it; an op whose model
    is not here raises :class:`UnknownModel` at the first row that meets it, as TraceLens's walk does."""
    f, tree = walk.f, walk.tree
    width = len(walk.values) + 1
    owns = _outcomes(name.astype(np.int64) * width + f.h_sig[source],
                     lambda key: walk.has_model(rows.names[key // width], key % width))
    soles = _outcomes(tree.parent[source], walk.sole_backward)
    _raise_first(owns, soles)
    own = _per_row(owns, bool)
    sole = _per_row(soles, lambda found: found is not None)
    with_metrics = sole & ~own if kernels is not None else sole  # (a synthetic op with a model takes the sole's)
    codes, categories = category
    codes = np.where(sole & ~own, len(categories) + soles[1], codes)
    categories = [*categories, *(found["category"] if found is not None else "" for found in soles[0])]
    keep = np.ones(len(source), dtype=bool)
    model: list[tuple[int, tuple | None, dict | None]] = []
    if kernels is not None:
        starts = (np.cumsum(gpu_count) - gpu_count).tolist()
        for at in np.flatnonzero(own).tolist():
            h, op = int(source[at]), rows.names[name[at]]
            forward = (opsheets.forward_args(tree, walk.forwards, h, before=False)
                       if op in perfmodels_conv.CACHED_FORWARD else None)
            outcome = opsheets.model_outcome(tree, h, KNOWN.get(op, perfmodels_inductor.triton_compiled),
                                             tuple(kernels[starts[at]:starts[at] + int(gpu_count[at])].tolist()),
                                             walk.values, forward)
            if isinstance(outcome, NotImplementedError):
                keep[at] = False
            elif not isinstance(outcome, BaseException):
                model.append((at, outcome, None))
    model += [(at, None, soles[0][soles[1][at]]) for at in np.flatnonzero(with_metrics).tolist()]
    position = np.cumsum(keep) - 1
    model = [(int(position[at]), result, metrics) for at, result, metrics in sorted(model, key=lambda entry: entry[0])]

    def metric(value_of: Callable[[dict], object], default: object) -> np.ndarray:
        return np.where(with_metrics, _per_row(soles, lambda found: default if found is None else value_of(found)),
                        default)

    dense = {"h": source, "uid": uid, "name": name, "category": codes, "gpu_count": gpu_count,
             "dur_int": f.h_dur_int[source], "has_perf_model": own | sole, "dur": f.h_dur[source],
             "busy_known": metric(lambda found: "busy" in found, False),
             "busy_int": metric(lambda found: bool(found.get("busy_int", False)), False),
             "busy": metric(lambda found: found.get("busy", math.nan), math.nan),
             "rated": metric(lambda found: "GFLOPS" in found, False),
             "roofline": metric(lambda found: "Roofline Time (µs)" in found, False)}
    dense = {column: values[keep] for column, values in dense.items()}
    dense["category"] = rows.category_codes(dense["category"], categories)
    rows.extend(dense, gpu[np.repeat(keep, gpu_count)], model)


def _outcomes(keys: np.ndarray, outcome: Callable[[int], object]) -> tuple[list, np.ndarray]:
    """``outcome`` of each distinct key (or the :class:`UnknownModel` it raised), and each row's number
    into those."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    found: list = []
    for key in distinct.tolist():
        try:
            found.append(outcome(key))
        except UnknownModel as exc:
            found.append(exc)
    return found, inverse.reshape(-1)


def _per_row(outcomes: tuple[list, np.ndarray], value_of: Callable[[object], object]) -> np.ndarray:
    """A value of each row's outcome."""
    found, at = outcomes
    return np.array([value_of(one) for one in found])[at]


def _raise_first(*tests: tuple[list, np.ndarray]) -> None:
    """The :class:`UnknownModel` of the first row whose tests raised one (the first test's in that row)."""
    raised = [_per_row(outcomes, lambda one: isinstance(one, UnknownModel)) for outcomes in tests]
    failing = np.flatnonzero(np.logical_or.reduce(raised))
    if len(failing):
        row = int(failing[0])
        found, at = next(outcomes for outcomes, flags in zip(tests, raised) if flags[row])
        raise found[at[row]]


def _summarize(tree: OpTree, rows: OpRows, settle: Callable[..., None]) -> Table:
    f, columns = tree.f, rows.columns
    groups, keys, _, members = unique_args_groups(f, rows)
    counts = groups.counts()
    modelled = bool(columns["rated"].any())
    with_roofline = bool(columns["roofline"].any())
    stats = {
        "duration": _stats(groups, members, columns["dur"], bool(columns["dur_int"].all())),
        KERNEL_TIME: _stats(groups, members, columns["busy"], bool(columns["busy_int"].all())),
    }
    for column in (*RATES, *(["Pct Roofline"] if with_roofline else [])):
        dense = np.full(len(rows), math.nan)
        dense[columns["model_row"]] = columns[column]
        stats[column] = _stats(groups, members, dense, False)
        del dense
    header = [*UNIQUE_ARGS_KEYS, "ex_UID", "operation_count", "total_duration_us", "mean_duration_us",
              "std_duration_us"]
    if modelled:
        header += [*FIRST, *(["Roofline Bound"] if with_roofline else []), "TB/s_mean", "TB/s_std", "TFLOPS/s_mean",
                   "TFLOPS/s_std"]
    header += [f"{KERNEL_TIME}_mean", f"{KERNEL_TIME}_std", f"{KERNEL_TIME}_sum", "duration_us_median",
               "duration_us_min", "duration_us_max"]
    if modelled:
        header += [f"{rate}_{stat}" for rate in RATES for stat in ("median", "min", "max")]
    if with_roofline:
        header += ["Roofline Time (µs)_first", *[f"Pct Roofline_{stat}" for stat in STATS]]
    header += [f"{KERNEL_TIME}_median", f"{KERNEL_TIME}_min", f"{KERNEL_TIME}_max", "kernel_details_summary",
               "trunc_kernel_details", "perf_params", "has_perf_model", "Percentage (%)", "Cumulative Percentage (%)"]
    # (a row without a model, or whose model failed, has no model column)
    with_model = columns["has_perf_model"] & columns["rated"]
    records = []
    for k, group in enumerate(members):
        if not k % ROW_BLOCK:
            settle()
        first = int(group[0])
        cells = {"ex_UID": int(columns["uid"][first]), "operation_count": int(counts[k])}
        duration = stats["duration"]
        cells.update({"total_duration_us": duration["sum"][k], "mean_duration_us": duration["mean"][k],
                      "std_duration_us": duration["std"][k]})
        for stat in ("median", "min", "max"):
            cells[f"duration_us_{stat}"] = duration[stat][k]
        for column in (KERNEL_TIME, *RATES, "Pct Roofline"):
            for stat, values in stats.get(column, {}).items():
                cells[f"{column}_{stat}"] = values[k]
        slots = _model_slots(rows, group)
        candidates = slots[with_model[columns["model_row"][slots]]]  # (in row order: mostly the first has it)
        for column in (*FIRST, "Roofline Bound", "Roofline Time (µs)"):
            cells[column] = next((value for slot in candidates.tolist()
                                  if _present(value := _value(rows, column, slot))), NA)
        cells["Roofline Time (µs)_first"] = cells["Roofline Time (µs)"]
        summary = kernel_stats_of(f, columns["gpu"], columns["gpu_first"][group], columns["gpu_count"][group])
        params = next((value for slot in slots.tolist() if (value := _value(rows, "params", slot))), None)
        cells.update({"kernel_details_summary": repr(summary), "trunc_kernel_details": truncated(summary),
                      "perf_params": NA if params is None else str(params),
                      "has_perf_model": bool(columns["has_perf_model"][first])})
        records.append((keys[k], cells))
    order = sorted(range(len(records)), key=lambda k: (-records[k][1][f"{KERNEL_TIME}_sum"], records[k][1]["ex_UID"]))
    pct, cumulative = percentages([float(records[k][1][f"{KERNEL_TIME}_sum"]) for k in order])
    table = Table([header])
    for j, k in enumerate(order):
        key, cells = records[k]
        cells.update({"Percentage (%)": pct[j], "Cumulative Percentage (%)": cumulative[j]})
        table.rows.append([*key, *(cells[column] for column in header[len(UNIQUE_ARGS_KEYS):])])
    return table


def _model_slots(rows: OpRows, group: np.ndarray) -> np.ndarray:
    """Where the model columns hold the rows of ``group`` that have them, in row order."""
    model_row = rows.columns["model_row"]
    if not len(model_row):
        return np.empty(0, np.int64)
    slots = np.minimum(np.searchsorted(model_row, group), len(model_row) - 1)
    return slots[model_row[slots] == group]


def _value(rows: OpRows, column: str, slot: int) -> object:
    """A model row's value of a model column (None: absent)."""
    if column in CODED:
        code = int(rows.columns[column][slot])
        return None if code < 0 else rows.values[column][code]
    value = float(rows.columns[column][slot])
    return None if math.isnan(value) else value


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _stats(groups, members: list[np.ndarray], array: np.ndarray, integral: bool) -> dict[str, list]:
    """pandas' grouped sum, mean, median, std (n-1), min and max of a column, missing values skipped."""
    missing = np.isnan(array)
    sums = groups.sums(np.nan_to_num(array)) if not missing.all() else np.zeros(len(members))
    means = opsheets.group_means(groups, array, sums if np.isfinite(array).all() else None)  # (the same sums)
    out: dict[str, list] = {"mean": means, "median": [], "std": [], "min": [], "max": [], "sum": []}
    for k, group in enumerate(members):
        values = array[group]
        present = values[~np.isnan(values)].tolist()
        stats = opsheets.rate_stats(present)
        out["median"].append(stats["median"])
        out["std"].append(stats["std"])
        out["min"].append(cell_number(stats["min"], integral) if present else NA)
        out["max"].append(cell_number(stats["max"], integral) if present else NA)
        out["sum"].append(cell_number(sums[k], integral))
    return out
