"""What a trace tells of its CUDA/HIP graph replays, for the ops tables.

A graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``) carries every
kernel of its graph under its one correlation id, so TraceLens counts them
all toward the op around the launch (``CUDAGraph::replay``, or the launch
call itself when no op encloses it).  The ops that launched those kernels
ran earlier, during the graph's capture; a replayed kernel could be given
back to its op only through a link from it to the launch that captured it.
Kineto writes no such link (a replayed kernel carries its graph launch's
correlation, a captured launch no GPU event), so the tables keep
TraceLens's attribution and the report says so, naming how many kernels
and where they went, and whether the trace holds the capture at all.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from . import optree
from .opstables import GRAPH_LAUNCHES, RUNTIME, OpTree

CAPTURE_BEGINS = frozenset({"cudaStreamBeginCapture", "hipStreamBeginCapture", "cudaStreamBeginCaptureToGraph",
                            "hipStreamBeginCaptureToGraph"})
NAMED = 3  # owners named in the note


def graph_notes(tree: OpTree) -> list[str]:
    """One note when the trace replays graphs: their kernels, the ops
    TraceLens's rule gives them to, and why they cannot be given to the
    ops that were captured."""
    f = tree.f
    runtime = f.h_kind == RUNTIME
    graph_names = np.array([name in GRAPH_LAUNCHES for name in f.names] or [False])
    launches = np.flatnonzero(runtime & graph_names[f.h_name])
    if not len(launches):
        return []
    replayed = np.unique(f.link_gpu[np.isin(f.link_run, launches)])
    owners = Counter(f.names[f.h_name[owner]] for owner in tree.launcher_of[replayed].tolist()
                     if owner != optree.NO_PARENT)
    begin_names = np.array([name in CAPTURE_BEGINS for name in f.names] or [False])
    captures = int((runtime & begin_names[f.h_name]).sum())
    launch_names = sorted({f.names[f.h_name[h]] for h in launches.tolist()})
    where = ", ".join(f"{count:,} to {name}" for name, count in owners.most_common(NAMED))
    if len(owners) > NAMED:
        where += f" and {sum(owners.values()) - sum(c for _, c in owners.most_common(NAMED)):,} to other ops"
    held = (f"it holds {captures} graph capture{'s' * (captures != 1)}, but no link from a replayed kernel to "
            "the launch that captured it") if captures else "it holds no capture of those graphs"
    replays = f"{len(launches):,} graph replay{'s' * (len(launches) != 1)}"
    return [f"{len(replayed):,} GPU events ran in {replays} ({', '.join(launch_names)}): which ops launched them the "
            f"trace cannot tell ({held}); they count, as TraceLens counts them, toward the op around each replay, or "
            f"the launch call where no op encloses it ({where or 'none'})"]
