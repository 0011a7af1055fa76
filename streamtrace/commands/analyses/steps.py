"""Profiler steps: which steps the run has, and each rank's steps with their GPU time.

Reads: the kept ProfilerStep rows on the CPU (name, category, start,
duration); through the shared sweep, per step (HTA's iteration: a kernel's
is its launch's) its kernels, copies and sets with the trace's own times.
Keeps per rank: per step its number, span on the CPU and four GPU totals.
Combines: the steps of every rank (HTA's profiler steps); each rank's steps,
their start counted from the run's earliest event.
Tables: profiler_steps, step_times (not HTA's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...algo import analysis as hta
from ...algo import sweeps
from ...algo.steps import STEP_CATEGORIES
from .ranks import Chunk
from .spec import Analysis, ChunkView, RankContext, Run, Swept


@dataclass
class StepResult:
    """A rank's HTA profiler steps, its steps on the CPU, and their GPU time."""

    numbers: set  # HTA's profiler steps of this rank
    spans: list  # (number, start, duration) of its steps on the CPU
    times: dict  # step -> (busy, compute, communication, idle)


class StepPart:
    def __init__(self, context: RankContext) -> None:
        self.context = context
        self.step_names = np.array(list(context.frame.step_ids), dtype=np.int64)
        self.spans: dict[int, tuple[float, float]] = {}
        self.numbers: set[int] = set()

    def feed(self, view: ChunkView) -> None:
        chunk = view.chunk
        _add_step_spans(self.spans, self.numbers, chunk[np.isin(chunk.name, self.step_names) & ~view.is_kernel & view.keep],
                        self.context.frame.step_ids, self.context.cats)

    def finish(self, swept: Swept) -> StepResult:
        return StepResult(self.numbers, [(number, start, end - start) for number, (start, end) in sorted(self.spans.items())],
                          _step_times(swept.step_lines))

    def close(self) -> None:
        pass


def _add_step_spans(spans: dict[int, tuple[float, float]], numbers: set[int], rows: Chunk, step_ids: dict,
                    cats: list[str]) -> None:
    """The kept steps' numbers, and per step its span on the CPU: the union of its
    ``user_annotation`` and ``cpu_op`` spans (not the GPU copies, which lag)."""
    for name, cat, start, dur in zip(rows.name.tolist(), rows.cat.tolist(), rows.ts.tolist(), rows.dur.tolist()):
        number = step_ids[name]
        if number is None:
            continue
        numbers.add(number)
        if cats[cat] not in STEP_CATEGORIES:
            continue
        end = start + dur
        known = spans.get(number)
        spans[number] = (start, end) if known is None else (min(known[0], start), max(known[1], end))


def _step_times(lines: dict[int, sweeps.Timeline]) -> dict:
    """Per step (the kernels its launches issued): busy, compute and communication time, idle within their span."""
    out = {}
    for step, line in lines.items():
        t = line.temporal()
        out[step] = (t.kernel_time - t.idle, t.compute, line.lengths[hta.COMMUNICATION], t.idle)
    return out


def profiler_steps(run: Run) -> list[int]:
    """HTA's profiler steps: those of every rank."""
    return sorted({step for result in run.results("steps") for step in result.numbers})


def _combine(run: Run) -> dict[str, list[dict]]:
    base = run.base
    return {
        "profiler_steps": [{"step": step} for step in profiler_steps(run)],
        "step_times": [
            {"rank": r.rank, "step": step, "start(us)": start - base, "duration(us)": duration,
             **dict(zip(("gpu_busy(us)", "compute(us)", "communication(us)", "idle(us)"),
                        result.times.get(step, (0.0, 0.0, 0.0, 0.0))))}
            for r, result in zip(run.ranks, run.results("steps")) for step, start, duration in result.spans],
    }


ANALYSIS = Analysis(
    name="steps",
    tables={"profiler_steps": ("step",),
            "step_times": ("rank", "step", "start(us)", "duration(us)", "gpu_busy(us)", "compute(us)",
                           "communication(us)", "idle(us)")},
    part=StepPart,
    combine=_combine,
    sweeps=frozenset({"steps"}),
)
