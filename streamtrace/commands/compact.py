"""``compact``: CUDA-graph stream compaction, streaming (SPEC 4).

Pass 1 (:class:`CompactIndex`) records GPU slices, GPU annotations, ac2g
endpoints and old-stream thread metadata in typed arrays.  Between the
passes :func:`plan_compaction` packs slices into lanes, maps annotations and
flow endpoints onto lanes, coalesces, builds per-kernel annotation spans and
rank-local PP arrows.  Pass 2 (:class:`CompactPlan`) patches the spooled event
lines and appends the new events.
"""
from __future__ import annotations

import os
import time

from ..engine.jobs import resolve_jobs
from ..engine.passes import IndexResult, emit_pass, index_pass
from ..engine.plan import EmitPlan
from ..io.configfiles import load_rules
from ..io.destinations import Destinations
from ..io.progress import Progress
from ..io.reader import ReadStats
from ..io.redact import RedactOptions, Redactor, pseudonymizes_hosts, redaction_summary
from ..io.sink import SinkSpec, default_output
from ..io.source import InputSource, SourceSpec
from ..io.spool import parked
from ..resources import buffers_from_os, peak_rss_mb
from .compactemit import CompactPlan
from .compactindex import PASS_2_ONLY, CompactIndex
from .compactplan import PLAN_MMAP_THRESHOLD, plan_compaction


def no_slices_notice(stats: ReadStats) -> str:
    """Why nothing was compacted; a salvaged input usually lost its GPU events."""
    notice = "no GPU kernel/memcpy/memset slices: trace passed through unchanged"
    if stats.truncated:
        notice += ("; the input was cut off and --salvage kept its first part, but the profiler writes GPU "
                   "events last, so a cut trace often has none")
    return notice


def compact(
    src: SourceSpec,
    dst: SinkSpec | None = None,
    *,
    rules: str | None = None,
    pp_flows: bool = True,
    strict: bool = False,
    original_stream: bool = True,
    overwrite: bool = False,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Compact GPU streams into semantic lanes (the ``compact`` command); returns the summary.

    ``jobs``: busy processes (see :func:`~streamtrace.engine.jobs.resolve_jobs`);
    ``original_stream``: keep each moved slice's stream as ``args.original_stream``.
    """
    started = time.perf_counter()
    processes = resolve_jobs(jobs)
    chosen_rules = load_rules(rules)
    dst = default_output(src, "_compacted") if dst is None else dst
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        target = destinations.target(dst, compress=compress, level=level, redactor=Redactor.from_options(redact))
        meter = Progress(source.size, enabled=progress)
        with buffers_from_os(PLAN_MMAP_THRESHOLD):  # the index arrays grow by copies, which must not stay resident
            result: IndexResult = index_pass(source, lambda: CompactIndex(chosen_rules), keep_events=True,
                                             spool_dir=spool_dir, salvage=salvage, progress=meter, jobs=processes,
                                             learn_hosts=pseudonymizes_hosts(target.redactor))
        index: CompactIndex = result.visitor  # type: ignore[assignment]
        members = result.stats.header + result.stats.trailer
        try:
            if not index.slice_start:
                plan: EmitPlan = EmitPlan()
                summary = {"notice": no_slices_notice(result.stats), "measured_slices": 0}
            else:
                index.release()  # (pass 1's closures, which hold the arrays to park)
                with parked(index, PASS_2_ONLY, spool_dir):
                    compaction = plan_compaction(index, members, pp_flows=pp_flows, strict=strict,
                                                 original_stream=original_stream, scratch=spool_dir)
                plan = CompactPlan(index, compaction, result.stats.exact_numbers)
                plan.park_runs(spool_dir)
                summary = compaction.summary
        except BaseException:
            result.spool.close()
            raise
        planned = time.perf_counter()
        written = emit_pass(result, plan, target, progress=meter, jobs=processes)
    return destinations.finish({
        **source.describe(),
        "output": target.name,
        **summary,
        "events_read": result.stats.events,
        "events_written": written,
        "read": result.stats.as_dict(),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        **redaction_summary(target.redactor),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })
