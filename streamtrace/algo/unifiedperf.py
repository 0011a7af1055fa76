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

import numpy as np

from . import opsheets, optree, perfmodels_conv, perfmodels_inductor
from .opstables import (
    CPU_OP,
    NA,
    RUNTIME,
    UNIQUE_ARGS_KEYS,
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

    def __init__(self, tree: OpTree, signature_values: list[list], spec: dict | None) -> None:
        self.tree, self.f, self.values, self.spec = tree, tree.f, signature_values, spec
        f, parent = self.f, tree.parent
        count = len(f.h_ts)
        place = np.empty(count, dtype=np.int64)
        place[np.array(tree.order, dtype=np.int64)] = np.arange(count)
        below = np.flatnonzero(tree.in_tree & (parent != optree.NO_PARENT))
        self._child = below[np.lexsort((place[below], parent[below]))]  # children by parent, in the order taken
        parents = parent[self._child]
        self._child_lo = np.searchsorted(parents, np.arange(count), "left")
        self._child_hi = np.searchsorted(parents, np.arange(count), "right")
        self._runs = np.unique(f.link_run)
        self.launch = np.zeros(count, dtype=bool)
        self.launch[self._runs] = True
        self.has_gpu = self._marked_above(np.ones(len(f.link_run), dtype=bool))  # (TraceLens's gpu_events)
        self._gpu: dict[int, list[int]] = {}
        self.communication_below = self._marked_above(np.array(tree.communication + [False])[f.g_name[f.link_gpu]])
        self.forward_of: dict[int, int] = {}
        for forward, backwards in opsheets.backward_ops(tree).items():
            for backward in backwards:
                self.forward_of[backward] = forward
        below_cpu_op = np.zeros(count, dtype=bool)  # (a cpu op among its ancestors)
        placed = np.flatnonzero(parent != optree.NO_PARENT)
        below_cpu_op[placed] = tree.cpu_ops_above(parent[placed]) != optree.NO_PARENT
        order = np.array(tree.order, dtype=np.int64)
        self.roots = order[(tree.in_tree & (f.h_kind == CPU_OP) & ~below_cpu_op)[order]].tolist()
        self._model: dict[int, bool] = {}
        self.forwards = opsheets.cached_forwards(tree, signature_values)
        self._sole: dict[int, dict | None] = {}
        self._owns = self._risky = self._launches = np.zeros(0, dtype=bool)  # (by _prepare)
        self._status_of = np.zeros(0, dtype=np.int8)

    def children(self, h: int) -> list[int]:
        return self._child[self._child_lo[h]:self._child_hi[h]].tolist()

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

    def gather(self, ops: list[int]) -> None:
        """Find the GPU events below each of ``ops`` at once (:meth:`gpu`)."""
        self._gpu.update(self.tree.links_below(np.unique(np.array([h for h in ops if h not in self._gpu],
                                                                   dtype=np.int64)).tolist()))

    def gpu(self, h: int) -> list[int]:
        """The GPU events below ``h`` in TraceLens's order (by launch call, in file order)."""
        if h not in self._gpu:
            self.gather([h])
        return self._gpu[h]

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
        found = self._model.get(h)
        if found is None:
            found = self._model[h] = self.has_model(self.name(h), int(self.f.h_sig[h]))
        return found

    def sole_backward(self, first_parent: int) -> dict | None:
        """The backward metrics of the forward op linked to the autograd
        wrapper within 5 levels above, when the wrapper holds exactly one
        kernel-launching op of the wrapper's function name and the forward
        op's model has backward formulas (``_is_sole_bwd_with_fwd_perf_model``)."""
        if first_parent in self._sole:
            return self._sole[first_parent]
        found = self._sole[first_parent] = self._sole_backward(first_parent)
        return found

    def _sole_backward(self, first_parent: int) -> dict | None:
        f, tree = self.f, self.tree
        wrapper, current = None, first_parent
        for _ in range(5):
            if current == optree.NO_PARENT:
                break
            forward = self.forward_of.get(current)
            if forward is not None and f.h_uid[forward] != 0:
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

    def collect(self) -> list[int]:
        """The ops with a row, in TraceLens's order: its depth-first walk from the roots (a stack here)."""
        self._prepare()
        cpu_op, has_gpu = (self.f.h_kind == CPU_OP).tolist(), self.has_gpu.tolist()
        status = self._status_of.tolist()
        collected: list[int] = []
        visited: set[int] = set()
        stack = self.roots[::-1]
        while stack:
            h = stack.pop()
            if h in visited:
                continue
            visited.add(h)
            if not cpu_op[h] or not has_gpu[h]:
                continue
            if status[h] == 1:
                collected.append(h)
                continue
            if status[h] == -1:
                self.op_has_model(h)  # (raises, where TraceLens's test does)
            stack.extend(reversed(self._visit(h, collected)))
        return collected

    def _visit(self, h: int, collected: list[int]) -> list[int]:
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

    def synthetic(self, collected: list[int]) -> list[tuple[int, int]]:
        """(host event, GPU event) of each GPU event no collected op holds:
        first those with no cpu op above (by their launch call, the call's
        first kernel first), then those with one (with the nearest cpu op)."""
        f, tree = self.f, self.tree
        held = np.zeros(len(f.g_ts), dtype=bool)
        held[np.array([g for h in collected for g in self.gpu(h)], dtype=np.int64)] = True
        by_call: dict[int, list[int]] = {}
        with_cpu_op: list[tuple[int, int]] = []
        communication = np.array(tree.communication + [False])[f.g_name]
        left = np.flatnonzero(~held & ~communication & (f.g_parent != optree.NO_PARENT))
        calls = f.g_parent[left]
        for g, call, cpu_op in zip(left.tolist(), calls.tolist(), tree.cpu_ops_above(calls).tolist()):
            if cpu_op == optree.NO_PARENT:
                by_call.setdefault(call, []).append(g)
            else:
                with_cpu_op.append((cpu_op, g))
        return [(call, g) for call, kernels in by_call.items() for g in kernels] + with_cpu_op


def unified_perf_summary(tree: OpTree, signature_values: list[list], spec: dict | None = None,
                         ) -> tuple[Table | None, list[str]]:
    """The table, or None and a note (no op with GPU work; an op whose model is not here)."""
    walk = _Unified(tree, signature_values, spec)
    try:
        rows = _rows(walk)
    except UnknownModel as exc:
        return None, [exc.note()]
    return (_summarize(tree, rows) if rows else None), []


def _rows(walk: _Unified) -> list[dict]:
    f, tree = walk.f, walk.tree
    collected = walk.collect()
    walk.gather(collected)
    tree.categories(collected)  # (each op's category, found at once)
    gpus = [walk.gpu(h) for h in collected]
    kernels = _kernel_names(f, gpus)
    at = np.array(collected, dtype=np.int64)
    rows = []
    for h, gpu, names, uid, sig, parent, dur, dur_int in zip(
            collected, gpus, kernels, f.h_uid[at].tolist(), f.h_sig[at].tolist(), tree.parent[at].tolist(),
            f.h_dur[at].tolist(), f.h_dur_int[at].tolist()):
        row = _row(walk, (h, sig, parent, dur, dur_int), walk.name(h), tree.category(h), h, gpu, uid, names)
        if row is not None:
            rows.append(row)
    next_uid = f.events
    for source, g in walk.synthetic(collected):
        name = f"{walk.name(source)}->{f.names[f.g_name[g]]} (Synthetic Op)"
        facts = (source, int(f.h_sig[source]), int(tree.parent[source]), float(f.h_dur[source]), f.h_dur_int[source])
        row = _row(walk, facts, name, tree.category_of(name, tree.first_kernel(source)), None, [g], next_uid)
        next_uid += 1
        if row is not None:
            rows.append(row)
    timed = [row for row in rows if "busy" not in row]
    sizes = [len(row["gpu"]) for row in timed]
    gpu = np.array([g for row in timed for g in row["gpu"]], dtype=np.int64)
    busy, integral = tree.busy_many(np.repeat(np.arange(len(timed)), sizes), gpu, len(timed))
    declined = set()
    for row, value, whole in zip(timed, busy.tolist(), integral.tolist()):
        result = row.pop("model", None)
        try:  # (an op's own model: its rates over that busy time)
            row.update(opsheets.rated(result, value, whole, walk.spec) if result is not None else {})
        except NotImplementedError:
            declined.add(id(row))
        except opsheets.MODEL_FAILURES:
            pass
        row.setdefault("busy", value)
        row.setdefault("busy_int", whole)
    return [row for row in rows if id(row) not in declined] if declined else rows


def _kernel_names(f: OpsFacts, gpus: list[list[int]]) -> list[tuple[int, ...]]:
    """The names (numbers) of each list's GPU events by start (ties as listed), as the models read them."""
    sizes = np.array([len(gpu) for gpu in gpus], dtype=np.int64)
    flat = np.fromiter((g for gpu in gpus for g in gpu), dtype=np.int64, count=int(sizes.sum()))
    names = f.g_name[flat[np.lexsort((f.g_ts[flat], np.repeat(np.arange(len(gpus)), sizes)))]].tolist()
    bounds = np.cumsum(sizes).tolist()
    return [tuple(names[end - size:end]) for end, size in zip(bounds, sizes.tolist())]


def _row(walk: _Unified, facts: tuple, name: str, category: str, h: int | None, gpu: list[int], uid: int,
         kernels: tuple[int, ...] = ()) -> dict | None:
    """One row of ``build_df_unified_perf_table`` (``facts``: the host event the row stands for, its
    signature, parent, duration and whether that is an integer; ``h``: the op itself, None for a synthetic
    op copying that event; ``kernels``: the names of ``gpu`` by start); None when the op's model declines it
    (TraceLens drops such a row)."""
    source, sig, parent, dur, dur_int = facts
    own = walk.has_model(name, sig)
    sole = walk.sole_backward(parent)
    if not own and sole is not None:
        category = sole["category"]
    row = {"h": source, "uid": uid, "name": name, "category": category, "dur": dur, "dur_int": bool(dur_int),
           "gpu": gpu, "has_perf_model": own or sole is not None}
    if own and h is not None:  # (the model's result now; its rates by _rows, with all kernel times at once)
        forward = (opsheets.forward_args(walk.tree, walk.forwards, h, before=False)
                   if name in perfmodels_conv.CACHED_FORWARD else None)
        outcome = opsheets.model_outcome(walk.tree, h, KNOWN.get(name, perfmodels_inductor.triton_compiled), kernels,
                                         walk.values, forward)
        if isinstance(outcome, NotImplementedError):
            return None
        if not isinstance(outcome, BaseException):
            row["model"] = outcome
    elif sole is not None:
        row.update({key: value for key, value in sole.items() if key not in ("h", "name", "values", "details")})
    return row


def _summarize(tree: OpTree, rows: list[dict]) -> Table:
    f = tree.f
    groups, keys, _, members = unique_args_groups(f, rows)
    counts = groups.counts()
    modelled = any("GFLOPS" in r for r in rows)
    with_roofline = any("Roofline Time (µs)" in r for r in rows)
    columns = {
        "duration": _stats(groups, members, [r["dur"] for r in rows], all(r["dur_int"] for r in rows)),
        KERNEL_TIME: _stats(groups, members, [r["busy"] for r in rows], all(r["busy_int"] for r in rows)),
    }
    for column in (*RATES, *(["Pct Roofline"] if with_roofline else [])):
        columns[column] = _stats(groups, members, [r.get(column, math.nan) for r in rows], False)
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
    firsts: dict[str, dict[int, int]] = {}  # per column: each group's first row where it is present
    with_model = np.fromiter((row["has_perf_model"] and "GFLOPS" in row for row in rows), dtype=bool, count=len(rows))
    # (a row without a model, or whose model failed, has no model column)
    modelled_members = [np.array(group)[with_model[group]].tolist() for group in members]
    for column in (*FIRST, "Roofline Bound", "Roofline Time (µs)"):
        firsts[column] = {}
        for k, group in enumerate(modelled_members):  # (in row order: mostly the first one has it)
            found = next((i for i in group if _present(rows[i].get(column))), None)
            if found is not None:
                firsts[column][k] = found
    records = []
    for k, group in enumerate(members):
        first = rows[group[0]]
        cells = {"ex_UID": first["uid"], "operation_count": int(counts[k])}
        duration = columns["duration"]
        cells.update({"total_duration_us": duration["sum"][k], "mean_duration_us": duration["mean"][k],
                      "std_duration_us": duration["std"][k]})
        for stat in ("median", "min", "max"):
            cells[f"duration_us_{stat}"] = duration[stat][k]
        for column in (KERNEL_TIME, *RATES, "Pct Roofline"):
            for stat, values in columns.get(column, {}).items():
                cells[f"{column}_{stat}"] = values[k]
        for column in (*FIRST, "Roofline Bound", "Roofline Time (µs)"):
            cells[column] = rows[firsts[column][k]][column] if k in firsts[column] else NA
        cells["Roofline Time (µs)_first"] = cells["Roofline Time (µs)"]
        summary = kernel_stats_of(f, [rows[i]["gpu"] for i in group])
        params = next((rows[i]["params"] for i in group if rows[i].get("params")), None)
        cells.update({"kernel_details_summary": repr(summary), "trunc_kernel_details": truncated(summary),
                      "perf_params": NA if params is None else str(params), "has_perf_model": first["has_perf_model"]})
        records.append((keys[k], cells))
    order = sorted(range(len(records)), key=lambda k: (-records[k][1][f"{KERNEL_TIME}_sum"], records[k][1]["ex_UID"]))
    pct, cumulative = percentages([float(records[k][1][f"{KERNEL_TIME}_sum"]) for k in order])
    table = Table([header])
    for j, k in enumerate(order):
        key, cells = records[k]
        cells.update({"Percentage (%)": pct[j], "Cumulative Percentage (%)": cumulative[j]})
        table.rows.append([*key, *(cells[column] for column in header[len(UNIQUE_ARGS_KEYS):])])
    return table


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _stats(groups, members: list[list[int]], values: list[float], integral: bool) -> dict[str, list]:
    """pandas' grouped sum, mean, median, std (n-1), min and max of a column, missing values skipped."""
    array = np.array(values, dtype=np.float64)
    missing = np.isnan(array)
    sums = groups.sums(np.nan_to_num(array)) if not missing.all() else np.zeros(len(members))
    means = opsheets.group_means(groups, values, sums if np.isfinite(array).all() else None)  # (the same sums)
    out: dict[str, list] = {"mean": means, "median": [], "std": [], "min": [], "max": [], "sum": []}
    for k, group in enumerate(members):
        present = [v for v in array[group].tolist() if not math.isnan(v)]
        stats = opsheets.rate_stats(present)
        out["median"].append(stats["median"])
        out["std"].append(stats["std"])
        out["min"].append(cell_number(stats["min"], integral) if present else NA)
        out["max"].append(cell_number(stats["max"], integral) if present else NA)
        out["sum"].append(cell_number(sums[k], integral))
    return out
