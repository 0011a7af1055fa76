"""``merge``: per-rank traces into one aligned, rank-correct timeline (SPEC 5, 6).

Phase 1, per input (in ``jobs`` worker processes): the index pass with
:class:`MergeIndex` (compact's index plus the pids and the largest id), then
the rank's compaction plan.  The heavy part (indexes, plan, event spool) is
parked in a temporary file so the coordinating process holds only small
facts.  Between the phases: ranks, PP order, time offsets, fresh pids, one
id multiplier, and every PP arrow.  Phase 2 streams the ranks one after the
other, in PP order, into one output.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Sequence

import orjson

from ..algo.mergeplan import (
    EventRewrite,
    RankFacts,
    check_unique_ranks,
    fresh_pids,
    pp_order,
    process_metadata,
    shared_multiplier,
    time_offsets_ns,
)
from ..algo.pparrows import (
    FLOW_ID_BASE,
    PEER_ABSENT,
    Arrow,
    ArrowMaker,
    Span,
    find_blocks,
    local_arrows,
    send_recv_arrows,
)
from ..algo.ranks import rank_from_file_name
from ..algo.secrets import Findings
from ..engine.executors import TaskRunner, Work, shared_path
from ..engine.jobs import resolve_jobs
from ..errors import TraceError
from ..io.archive import outer_path
from ..io.destinations import Destinations
from ..io.jsonscan import RawMember
from ..io.progress import Progress
from ..io.redact import RedactOptions, Redactor, copy_redactor, pseudonymizes_hosts, redaction_summary, summed_redaction
from ..io.remote import is_url
from ..io.sink import OutputTarget, SinkSpec, remove_quietly
from ..io.writer import TraceWriter
from ..resources import peak_rss_mb
from .batch import staged
from .mergeemit import OutputPlan, assemble_in_store, assembles_in_store, close_output, emit_rank, emit_ranks_in_workers
from .mergerank import PhaseOneOptions, RankIndex, discover_inputs, index_rank, index_rank_in_store, parse_rank_list

STAGE_FILE = re.compile(r"pp_stage\d+\.json(\.gz|\.zst)?")  # merge --per-stage's files
STAGE_SUFFIX = {None: ".json.gz", "gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}


def _merged_output_name(files: list[str], has_pp: bool) -> str:
    directory = os.path.dirname(os.path.abspath(outer_path(files[0])))
    name = "pp_traces_merged_compacted.json.gz" if has_pp else "merged_compacted.json.gz"
    return os.path.join(directory, name)


def merge(
    srcs: Sequence[str | os.PathLike] | str | os.PathLike,
    dst: SinkSpec | None = None,
    *,
    compact: bool = True,
    original_stream: bool = True,
    pp_flows: bool = True,
    jobs: int | str | None = None,
    ranks: str | set[int] | None = None,
    overwrite: bool = False,
    rules: str | None = None,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    dask: str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
    per_stage: bool = False,
) -> dict:
    """Merge per-rank traces into one aligned timeline (the ``merge`` command); returns the summary.

    ``dask``: the address of a Dask scheduler to run the per-rank tasks on
    (default ``$STREAMTRACE_DASK``, else ``jobs`` processes here); it needs a
    ``spool_dir`` that every worker shares: a directory, or a bucket URL
    (``s3://bucket/prefix``) where the tasks keep their files as objects.
    ``per_stage``: ``dst`` is a directory that receives one merge per PP
    stage (see :func:`_per_stage`).
    """
    started = time.perf_counter()
    redactor = Redactor.from_options(redact)
    files = discover_inputs([srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs))
    wanted = parse_rank_list(ranks) if isinstance(ranks, str) else ranks
    if wanted is not None:
        files = [path for path in files if rank_from_file_name(path) in (wanted | {None})]
    if len(files) < 2:
        raise TraceError(f"merge needs at least two rank traces, got {len(files)}")
    destinations = Destinations(files, overwrite=overwrite, summary=summary_file)
    if per_stage:
        if not isinstance(dst, (str, os.PathLike)):
            raise TraceError("--per-stage writes one file per PP stage: give their directory with -o DIR/")
        destinations.directory(dst, writes="--per-stage's files", existing=STAGE_FILE.pattern)
    elif dst is not None:  # refuse a bad output now, not after reading every input
        destinations.check(dst, compress=compress)
    with TaskRunner(resolve_jobs(jobs), dask=dask, spool_dir=spool_dir, progress=progress, objects=True) as runner:
        if runner.distributed:
            files = [shared_path(path) for path in files]
        if per_stage and runner.store is not None:
            raise TraceError("--per-stage's tasks write the stages' files into the output directory: give --spool-dir "
                             "a directory every worker shares, not a bucket URL")
        options = PhaseOneOptions(compact, original_stream, pp_flows, rules, runner.work_dir, salvage, reread_remote,
                                  pseudonymizes_hosts(redactor))
        # every rank's files are in the run's directory (or prefix), removed with it whatever happens
        if runner.store is None:
            indexed = list(runner.ordered(index_rank, [(path, options) for path in files], label="ranks indexed",
                                          work=Work.reading(files)))
        else:
            indexed = list(runner.ordered(index_rank_in_store, [(path, options, runner.store) for path in files],
                                          label="ranks indexed"))
        if wanted is not None:
            for dropped in [entry for entry in indexed if entry.facts.rank not in wanted]:
                _discard(dropped)
            indexed = [entry for entry in indexed if entry.facts.rank in wanted]
            if len(indexed) < 2:
                raise TraceError(f"--ranks leaves {len(indexed)} trace(s); merge needs at least two")
        if per_stage:
            return destinations.finish(_per_stage(indexed, os.fspath(dst), destinations, compress=compress,  # type: ignore[arg-type]
                                                  level=level, pp_flows=pp_flows, runner=runner, redact=redact,
                                                  started=started))
        return destinations.finish(_phase_two(indexed, dst, destinations, compress=compress, level=level,
                                              pp_flows=pp_flows, runner=runner, progress=progress,
                                              started=started, redactor=copy_redactor(redactor, _found(indexed))))


def _found(indexed: list[RankIndex]) -> Findings:
    """What pass 1 found in these ranks' inputs, together: secrets (counted,
    for whether their copy is screened) and host names (for their pseudonyms)."""
    found = Findings()
    for entry in indexed:
        found.absorb(entry.secrets, 0)
    return found


def _discard(entry: RankIndex) -> None:
    """Delete a rank's parked state and its spool now (a rank left out frees its disk before the others' pass 2;
    objects stay until the run's prefix goes)."""
    if is_url(entry.state_path):
        return
    remove_quietly(entry.state_path)
    remove_quietly(entry.spool_path)


def _plan_output(indexed: list[RankIndex], pp_flows: bool) -> OutputPlan:
    """Order, clocks, pids, ids and arrows of the merge of ``indexed`` (what ``merge --ranks`` of them decides)."""
    facts = [entry.facts for entry in indexed]
    check_unique_ranks(facts)
    pp_ranks, pipelines, order_source = pp_order(facts)
    offsets, common_base, warnings, alignment = time_offsets_ns(facts)
    order = sorted(range(len(indexed)), key=lambda n: (pp_ranks[n], facts[n].rank))
    pid_maps = dict(zip(order, fresh_pids([facts[n] for n in order])))
    multiplier = shared_multiplier(facts)
    has_pp = any(entry.pp_spans for entry in indexed) or any(fact.pp_group for fact in facts)
    rewrites = {
        n: EventRewrite(facts[n].rank, pid_maps[n], offsets[n],
                        f"PP rank {pp_ranks[n]} | " if has_pp else f"rank {facts[n].rank} | ", multiplier)
        for n in order
    }
    arrows, arrow_counts = _arrows(indexed, rewrites, pp_ranks, pipelines, multiplier) if pp_flows else ([], {})
    first = indexed[order[0]]
    merged_info = {"backend": first.backend, "ranks": [facts[n].rank for n in order], "pp_rank_count": len(order)}
    replacements = {"baseTimeNanoseconds": common_base, "distributedInfo": merged_info,
                    "traceName": "streamtrace merge of " + ", ".join(str(facts[n].rank) for n in order)}
    extras = {n: process_metadata(facts[n], pid_maps[n], pp_ranks[n] if has_pp else None) for n in order}
    return OutputPlan(indexed, order, pp_ranks, order_source, rewrites, extras, offsets, alignment, warnings,
                       multiplier, arrows, arrow_counts, _replace_members(first.header, replacements),
                       _replace_members(first.trailer, replacements, add_missing=first.header), has_pp)


def _phase_two(indexed: list[RankIndex], dst: SinkSpec | None, destinations: Destinations, *, compress: str | None,
               level: int | None, pp_flows: bool, runner: TaskRunner, progress: bool | str | None,
               started: float, redactor: Redactor | None = None) -> dict:
    plan = _plan_output(indexed, pp_flows)
    dst = _merged_output_name([entry.facts.path for entry in indexed], plan.has_pp) if dst is None else dst
    target = destinations.target(dst, compress=compress, level=level, redactor=redactor)
    pass2_started = time.perf_counter()
    assembly = None
    if assembles_in_store(runner, target):
        written, assembly = assemble_in_store(plan, target, runner)
    else:
        with target.open() as out:
            writer = TraceWriter(out, plan.header, target.redactor)
            work = Work("pass 2", "events", plan.rank_events())
            if runner.inline:
                meter = Progress(None, enabled=progress)
                calls = plan.rank_calls()
                for done, call in enumerate(calls):
                    emit_rank(*call, writer, work.share(meter, done, f"ranks written: {done}/{len(calls)}"))
                    meter.count("ranks written", done + 1, len(calls))
                meter.done()
            elif runner.store is None:
                emit_ranks_in_workers(plan.rank_calls(runner.work_dir), writer, runner, work)
            else:
                emit_ranks_in_workers(plan.object_calls(runner.store), writer, runner)
            close_output(writer, plan.arrow_lines(), plan.trailer)
        written = writer.events_written
    return {**_output_summary(plan, target.name, written, pass2_started), "assembled_in_store": assembly,
            **redaction_summary(redactor), "wall_seconds": round(time.perf_counter() - started, 3),
            "peak_rss_mb": peak_rss_mb()}


def _output_summary(plan: OutputPlan, output: str, written: int, pass2_started: float) -> dict:
    indexed, order, pp_ranks = plan.indexed, plan.order, plan.pp_ranks
    facts = [entry.facts for entry in indexed]
    return {
        "input": [fact.path for fact in facts],
        "output": output,
        "ranks": len(indexed),
        "events_read": sum(entry.events for entry in indexed),
        "events_written": written,
        "time_alignment": plan.alignment,
        "time_offsets_us": {str(facts[n].rank): plan.offsets[n] / 1000 for n in range(len(indexed))},
        "pp_order": plan.order_source,
        "pp_ranks": [{"pp_rank": pp_ranks[n], "global_rank": facts[n].rank, "file": facts[n].path,
                      "rank_from": indexed[n].rank_source} for n in order],
        "id_multiplier": plan.multiplier,
        **plan.arrow_counts,
        "pp_ranks_not_merged": sorted({rank for fact in facts for rank in fact.pp_group or ()}
                                      - {fact.rank for fact in facts}),
        "per_rank_compaction": {str(facts[n].rank): indexed[n].compaction_summary for n in order},
        "warnings": plan.warnings,
        "read": {str(facts[n].rank): indexed[n].read for n in order},
        "pass1_seconds": {str(facts[n].rank): indexed[n].pass1_seconds for n in order},
        "plan_seconds": {str(facts[n].rank): indexed[n].plan_seconds for n in order},
        "pass2_seconds": round(time.perf_counter() - pass2_started, 3),
    }


def _per_stage(indexed: list[RankIndex], directory: str, destinations: Destinations, *, compress: str | None,
               level: int | None, pp_flows: bool, runner: TaskRunner, redact: RedactOptions | bool | None,
               started: float) -> dict:
    """One merged file per PP stage, written at once by as many tasks.

    Each stage's file is what ``merge --ranks`` of that stage's ranks writes
    (its own clock base, pids, ids and arrows); the SEND->RECV arrows that
    join two stages have no file to live in and are counted instead (from
    the plan of the whole merge).  The files are written into a hidden
    folder in ``directory`` and appear together, or none does.
    """
    stages = _stages([entry.facts for entry in indexed])
    whole = _plan_output(indexed, pp_flows)
    finals = {stage: os.path.join(directory, f"pp_stage{stage}{STAGE_SUFFIX[compress]}") for stage in stages}
    for stage, final in finals.items():
        destinations.claim(final, compress=compress, role=f"file of PP stage {stage}")
    plans = {stage: _plan_output([indexed[n] for n in members], pp_flows) for stage, members in stages.items()}
    pass2_started = time.perf_counter()
    with staged(list(finals.values()), destinations.overwrite) as paths:
        jobs = [_StageWrite(path, compress, level, redact, _found(plan.indexed), plan.rank_calls(), plan.header, plan.trailer,
                            list(plan.arrow_lines())) for path, plan in zip(paths, plans.values())]
        written = list(runner.ordered(_write_stage, [(job,) for job in jobs], label="stages written"))
    per_stage = [{"pp_stage": stage, **_output_summary(plans[stage], finals[stage], events, pass2_started), **redaction}
                 for stage, (events, redaction) in zip(plans, written)]
    summed = {key: sum(entry[key] for entry in per_stage) for key in whole.arrow_counts}
    return {
        **_output_summary(whole, "", sum(entry["events_written"] for entry in per_stage), pass2_started),
        **summed,
        "output": list(finals.values()),
        "time_offsets_us": {rank: offset for entry in per_stage for rank, offset in entry["time_offsets_us"].items()},
        **({"pp_cross_stage_arrows": sum(1 for arrow in whole.arrows if arrow[5] != arrow[6])} if pp_flows else {}),
        "stages": per_stage,
        **summed_redaction(per_stage),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }


def _stages(facts: list[RankFacts]) -> dict[int, list[int]]:
    """Input positions by PP stage (each rank's index in its PP process
    group), stages in order; refused when the ranks have no stages."""
    pp_ranks, pipelines, _ = pp_order(facts)
    if pipelines[0] is None:
        without = [fact.rank for fact in facts if fact.pp_group is None or fact.rank not in fact.pp_group]
        raise TraceError(f"--per-stage needs every rank's PP stage (its PP process group in distributedInfo); "
                         f"{len(without)} of the {len(facts)} ranks have none (global ranks "
                         f"{', '.join(map(str, sorted(without)[:8]))}{', ...' if len(without) > 8 else ''}): "
                         "merge them without --per-stage")
    if max(len(pipeline) for pipeline in pipelines) < 2:
        raise TraceError(f"--per-stage: the {len(facts)} ranks have no pipeline stages (PP process groups of one "
                         "rank); merge them without --per-stage")
    stages: dict[int, list[int]] = {}
    for n in sorted(range(len(facts)), key=pp_ranks.__getitem__):
        stages.setdefault(pp_ranks[n], []).append(n)
    return stages


@dataclass(frozen=True)
class _StageWrite:
    """What a task needs to write one stage's file alone: the ranks' pass 2
    calls, the merged header and trailer, the arrows as event lines."""

    path: str
    compress: str | None
    level: int | None
    redact: RedactOptions | bool | None
    found: Findings  # what pass 1 found in the stage's ranks
    ranks: list[tuple]
    header: list[RawMember]
    trailer: list[RawMember]
    arrows: list[bytes]


def _write_stage(job: _StageWrite) -> tuple[int, dict]:
    """One stage's file (a task); returns its events written and its redaction summary.

    The task can run again (Dask reruns a task whose worker died): it keeps
    the ranks' states and spools, and replaces a file an earlier attempt left."""
    target = OutputTarget(job.path, overwrite=True, compress=job.compress, level=job.level,
                          redactor=copy_redactor(Redactor.from_options(job.redact), job.found))
    with target.open() as out:
        writer = TraceWriter(out, job.header, target.redactor)
        for call in job.ranks:
            emit_rank(*call, writer, keep=True)
        close_output(writer, job.arrows, job.trailer)
    return writer.events_written, redaction_summary(target.redactor)


def _arrows(indexed: list[RankIndex], rewrites: dict, pp_ranks: list[int], pipelines: list[object],
            multiplier: int) -> tuple[list[Arrow], dict]:
    """Every PP arrow, on the merged pids and clock, with ids above all rank ids."""
    spans, compute_tracks, unshard_tracks, pp_rank_of, pipeline_of = [], set(), set(), {}, {}
    for n, entry in enumerate(indexed):
        rewrite = rewrites[n]
        move = rewrite.pid_map.get
        for span in entry.pp_spans:
            spans.append(Span(move(span.pid, span.pid), span.tid, span.name, rewrite.shift_us(span.start),
                              rewrite.shift_us(span.end)))
        compute, unshard = entry.pp_tracks
        compute_tracks.update((move(pid, pid), tid) for pid, tid in compute)
        unshard_tracks.update((move(pid, pid), tid) for pid, tid in unshard)
        pp_rank_of.update((new_pid, pp_ranks[n]) for new_pid in rewrite.pid_map.values())
        pipeline_of.update((new_pid, pipelines[n]) for new_pid in rewrite.pid_map.values())
    first_id = max(FLOW_ID_BASE, (max(entry.facts.rank for entry in indexed) + 2) * multiplier)
    maker = ArrowMaker(pp_rank_of, next_id=first_id)
    blocks = find_blocks(spans, compute_tracks, unshard_tracks)
    send_recv_arrows(blocks, maker, pipeline_of)
    local_arrows(blocks, maker)
    counts = {
        "pp_send_recv_pairs": maker.pairs["pp_send_recv"],
        "pp_send_recv_unmatched": maker.unmatched["pp_send_recv"],
        "pp_send_recv_peer_stage_absent": maker.unmatched[PEER_ABSENT],
        "pp_compute_dependency_pairs": maker.pairs["pp_compute_dependency"],
        "pp_compute_dependency_unmatched": maker.unmatched["pp_compute_dependency"],
        "pp_unshard_compute_pairs": maker.pairs["pp_unshard_dependency"],
        "pp_unshard_compute_unmatched": maker.unmatched["pp_unshard_dependency"],
    }
    return maker.arrows, counts


def _replace_members(members: list[RawMember], replacements: dict, *, add_missing: list[RawMember] | None = None
                     ) -> list[RawMember]:
    """Top-level members with the merge's values; keys found in neither the
    header nor the trailer are added to the trailer."""
    out = []
    for key, raw in members:
        if key in replacements:
            value = replacements[key]
            out.append((key, b"null" if value is None else orjson.dumps(value)))
        else:
            out.append((key, raw))
    if add_missing is not None:
        present = {key for key, _ in members} | {key for key, _ in add_missing}
        out.extend((key, orjson.dumps(value)) for key, value in replacements.items()
                   if key not in present and value is not None)
    return out
