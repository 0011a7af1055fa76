"""CUDA/HIP graph replays: which ops the replayed kernels belong to, where
the trace can tell (no I/O).

A graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``) carries every
GPU event of its graph under its one correlation id, so TraceLens counts
them all toward the op around the launch (``CUDAGraph::replay``, or the
launch call itself when no op encloses it); its tables here keep that.  The
ops that launched those kernels ran earlier, while the graph was captured
(between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` on the
capturing thread), their launch calls running no GPU event.  No id links a
replayed kernel to the call that captured it; but where the captured calls
name their kernels (ROCm's ``args.kernel``; Memcpy and Memset calls by
kind), a replay whose GPU events name the same kernels can be paired with
the capture, as TraceLens's experimental capture merge pairs them: in order
when the names agree in order, else per kernel name in order (streams
reorder a graph's kernels).  A replay that matches no capture of the trace
is left as TraceLens has it, and the notes say how many.

The pairs give ``graph_replay_ops``, beyond TraceLens: per captured op
(name and input dims), the replayed GPU events given to it and their time.
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import optree
from .opstables import GRAPH_LAUNCHES, NA, RUNTIME, OpTree, Table

BEGIN, END = "StreamBeginCapture", "StreamEndCapture"
NAMED = 3  # owners named in the note


def _kind(name: str) -> str | None:
    """Memcpy or Memset for a copy or set, by name (ROCm's fill kernels set memory), else None."""
    if "Memcpy" in name:
        return "Memcpy"
    if "Memset" in name or "fillBuffer" in name:
        return "Memset"
    return None


@dataclass
class Capture:
    """One capture window's dispatch calls in call order, and the name each runs (None: not named)."""

    calls: list[int]
    labels: list[str | None]


def captures(tree: OpTree) -> list[Capture]:
    """Each thread's capture windows (from a Begin call's end to the next End call's start),
    with the launch, copy and set calls inside, in time order."""
    f = tree.f
    runtime = np.flatnonzero(f.h_kind == RUNTIME)
    order = runtime[np.lexsort((f.h_ts[runtime], f.h_thread[runtime]))]
    _, firsts = np.unique(f.h_thread[order], return_index=True)
    # (by name number: each name tested once, not each call)
    begin, end, dispatch = (np.array([test(name) for name in f.names] or [False]) for test in (
        lambda name: BEGIN in name, lambda name: END in name, _dispatch))
    found: list[Capture] = []
    for lo, hi in zip(firsts.tolist(), [*firsts[1:].tolist(), len(order)]):
        mine = order[lo:hi]
        names = f.h_name[mine]
        begins = f.h_end[mine[begin[names]]].tolist()
        ends = f.h_ts[mine[end[names]]].tolist()
        starts = f.h_ts[mine]
        for start in begins:  # (each Begin closed by the first End after it: a trace may start inside a capture)
            after = bisect.bisect_left(ends, start)
            if after == len(ends):
                continue
            stop = ends[after]
            inside = mine[int(np.searchsorted(starts, start, "left")):int(np.searchsorted(starts, stop, "right"))]
            calls = inside[(f.h_end[inside] <= stop) & dispatch[f.h_name[inside]]].tolist()
            found.append(Capture(calls, [_call_label(tree, h) for h in calls]))
    return found


def _dispatch(name: str) -> bool:
    return ("Launch" in name or _kind(name) is not None) and name not in GRAPH_LAUNCHES


def _call_label(tree: OpTree, h: int) -> str | None:
    f = tree.f
    kind = _kind(f.names[f.h_name[h]])
    return kind or (f.names[f.h_kernel[h]] if len(f.h_kernel) and f.h_kernel[h] >= 0 else None)


def align(calls: list[str | None], gpu: list[str]) -> list[int] | None:
    """For each replayed GPU event (time order), the captured call it is:
    position by position when the names agree, else per name in order; None
    when the names or their counts differ, or a call is not named."""
    if len(calls) != len(gpu) or None in calls:
        return None
    if calls == gpu:
        return list(range(len(gpu)))
    if Counter(calls) != Counter(gpu):
        return None
    queues: dict[str, list[int]] = {}
    for at, label in enumerate(calls):
        queues.setdefault(label, []).append(at)
    taken: dict[str, int] = Counter()
    paired = []
    for label in gpu:
        paired.append(queues[label][taken[label]])
        taken[label] += 1
    return paired


def replays(tree: OpTree) -> tuple[dict[int, int], list[int], list[Capture]]:
    """The replayed GPU events given back to the call that captured them
    (GPU event -> call), the graph launch calls, and the captures."""
    f = tree.f
    graph_names = np.array([name in GRAPH_LAUNCHES for name in f.names] or [False])
    launches = np.flatnonzero((f.h_kind == RUNTIME) & graph_names[f.h_name]).tolist()
    if not launches:
        return {}, [], []
    found = captures(tree)
    runs = f.link_run  # (by call: each call's links one slice)
    given: dict[int, int] = {}
    for launch in launches if found else ():  # (no capture: nothing to pair)
        lo, hi = int(np.searchsorted(runs, launch, "left")), int(np.searchsorted(runs, launch, "right"))
        gpu = sorted(set(f.link_gpu[lo:hi].tolist()), key=lambda g: (f.g_ts[g], g))
        labels = [_kind(f.names[f.g_name[g]]) or f.names[f.g_name[g]] for g in gpu]
        for capture in found:
            paired = align(capture.labels, labels) if gpu else None
            if paired is not None:
                given.update((g, capture.calls[at]) for g, at in zip(gpu, paired))
                break
    return given, launches, found


def graph_replay_ops(tree: OpTree, given: dict[int, int]) -> Table:
    """Per captured op (the cpu op above the capturing call; name and input
    dims), the replayed GPU events given to it and their summed durations."""
    f = tree.f
    rows: dict[tuple, list] = {}
    calls = np.array(list(given.values()), dtype=np.int64)
    above = tree.cpu_ops_above(calls)
    for g, op in zip(given, np.where(above == optree.NO_PARENT, calls, above).tolist()):
        key = (f.names[f.h_name[op]], f.signatures[f.h_sig[op]][0])
        row = rows.setdefault(key, [set(), 0, 0.0])
        row[0].add(op)
        row[1] += 1
        row[2] += float(f.g_dur[g])
    total = sum(row[2] for row in rows.values())
    table = Table([["name", "Input Dims", "captured_ops", "replayed_gpu_events", "replayed_time_us",
                    "Percentage (%)"]])
    table.rows = sorted(([name, NA if dims is None else dims, len(ops), count, time, time / total * 100 if total else NA]
                         for (name, dims), (ops, count, time) in rows.items()), key=lambda row: (-row[4], row[0]))
    return table


def _owner_names(tree: OpTree, owners: np.ndarray) -> Counter:
    """How many of ``owners`` (host events, ``NO_PARENT`` left out) bear each name, names in the order they
    first come (as a Counter filled one by one orders its ties)."""
    f = tree.f
    ids, first, counts = np.unique(f.h_name[owners[owners != optree.NO_PARENT]], return_index=True,
                                   return_counts=True)
    named: Counter = Counter()
    for at in np.argsort(first, kind="stable").tolist():
        named[f.names[ids[at]]] += int(counts[at])
    return named


def graph_report(tree: OpTree) -> tuple[dict[str, Table], list[str]]:
    """``graph_replay_ops`` when some replay matches a capture, and one note
    when the trace replays graphs: how many GPU events, given to which ops,
    and why the rest stay where TraceLens puts them."""
    given, launches, found = replays(tree)
    if not launches:
        return {}, []
    f = tree.f
    launch_set = np.array(launches)
    replayed_mask = np.zeros(len(f.g_ts), dtype=bool)  # (a mask, not np.unique: linear in the GPU events)
    replayed_mask[f.link_gpu[np.isin(f.link_run, launch_set)]] = True
    replayed = np.flatnonzero(replayed_mask)
    replays_text = (f"{len(replayed):,} GPU events ran in {len(launches):,} graph "
                    f"replay{'s' * (len(launches) != 1)} ({', '.join(sorted({f.names[f.h_name[h]] for h in launches}))})")
    left = replayed[~np.isin(replayed, np.array(list(given), dtype=np.int64))]
    owners = _owner_names(tree, tree.launcher_of[left])
    where = ", ".join(f"{count:,} to {name}" for name, count in owners.most_common(NAMED))
    if len(owners) > NAMED:
        where += f" and {sum(owners.values()) - sum(c for _, c in owners.most_common(NAMED)):,} to other ops"
    as_tracelens = ("they count, as TraceLens counts them, toward the op around each replay, or the launch call "
                    f"where no op encloses it ({where or 'none'})")
    if not given:
        if not found:
            held = "it holds no capture of those graphs"
        elif any(None in capture.labels for capture in found):
            held = (f"it holds {len(found)} graph capture{'s' * (len(found) != 1)}, but the captured launch calls do "
                    "not name their kernels (CUDA's do not: ROCm's args.kernel does)")
        else:
            held = "no capture in it launches the kernels a replay runs"
        return {}, [f"{replays_text}: which ops launched them the trace cannot tell ({held}); {as_tracelens}"]
    note = (f"{replays_text}: {len(given):,} given back to the ops captured, by kernel name "
            "(graph_replay_ops; the other tables keep TraceLens's attribution)")
    if len(left):
        note += f"; {len(left):,} match no capture of the trace: {as_tracelens}"
    return {"graph_replay_ops": graph_replay_ops(tree, given)}, [note]
