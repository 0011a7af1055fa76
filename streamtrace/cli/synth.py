"""``streamtrace synth``: the generator (streamtrace.synth) with every knob as an option."""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TraceError
from .options import paragraphs
from .report import Rows, counted, listed, report, view

if TYPE_CHECKING:
    from ..synth import SynthConfig

SYNTH_OPTIONS = (  # (group, SynthConfig field, help): each an option named after its field
    ("run shape", "ranks", "world size"),
    ("run shape", "pp_stages", "pipeline stages; ranks must be a multiple"),
    ("run shape", "microbatches", "microbatches per step"),
    ("run shape", "schedule", "PP schedule: 1f1b (F/B), zb (F/I/W), gpipe ('Forward <mb>' names)"),
    ("run shape", "steps", "profiler steps (ignored with --target-mb)"),
    ("content", "graph_streams", "streams a CUDA-graph replay spreads its kernels over"),
    ("content", "graph_kernels", "kernels per graph replay, 0 for none"),
    ("content", "eager_kernels", "eager kernels per PP compute action"),
    ("content", "python_noise", "python_function frames around every cpu_op"),
    ("content", "kernel_annotations", "graph kernels' args.name labels"),
    ("content", "hip", "AMD naming (hipGraphLaunch, hipLaunchKernel, ...)"),
    ("content", "seed", "random seed"),
    ("content", "base_time_ns", "baseTimeNanoseconds of rank 0"),
    ("content", "base_skew_ns", "added to the base time per rank, to test alignment"),
    ("content", "slow_rank", "a straggler: this rank runs --slow-factor times slower (-1: none)"),
    ("content", "slow_factor", "how much slower --slow-rank runs"),
)

SUFFIX_OF = {"none": "none", "gzip": "gz", "zstd": "zst"}
"""--compress as every command spells it -> the generator's name for it."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``synth``: the generator (streamtrace.synth) with every knob as an option."""
    cmd = commands.add_parser(
        "synth", help="write realistic synthetic per-rank traces (and a merged one) with their ground truth",
        description=paragraphs(
            "Write OUTDIR/rank<N>_trace.json[.gz|.zst] for a pipeline-parallel training run of RANKS ranks "
            "(CUDA-graph replays over many streams, eager kernels, NCCL with PP SEND/RECV, PP annotations, "
            "python_function frames), a naive merged_trace.json (colliding correlation ids, as tools that "
            "concatenate ranks write it) and truth.json: what every command should find. Deterministic for a "
            "--seed: for bug reports and benchmarks without real data.",
            "Ranks are split into --pp-stages stages (ranks must be a multiple); every rank file grows with "
            "--steps, or until --target-mb."),
        epilog="examples:\n  streamtrace synth demo/                         # 2 ranks, 2 steps\n"
               "  streamtrace synth big/ --ranks 8 --pp-stages 4 --schedule zb --target-mb 250 --seed 1\n"
               "  streamtrace synth amd/ --hip --compress zstd --no-merged",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("outdir", help="output directory (created if missing)")
    cmd.defer(add_knobs)  # their defaults come from the generator, imported only when synth is parsed
    cmd.set_defaults(run=run, debug=False, summary=None)


def add_knobs(cmd: argparse.ArgumentParser) -> None:
    """One option per generator setting, with the generator's own default and choices."""
    from ..synth import KERNEL_ANNOTATIONS, MERGED_STYLES, SCHEDULES, SynthConfig

    defaults = SynthConfig()
    choices = {"schedule": SCHEDULES, "kernel_annotations": KERNEL_ANNOTATIONS}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for group, name, text in SYNTH_OPTIONS:
        where = groups.setdefault(group, cmd.add_argument_group(group))
        flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
        if type(default) is bool:
            where.add_argument(flag, action="store_true", help=text)
        else:
            where.add_argument(flag, type=type(default), choices=choices.get(name), default=default,
                               help=f"{text} (default %(default)s)")
        if name == "steps":
            where.add_argument("--target-mb", type=float, help="add steps until every rank file is at least this "
                                                                 "many MB (1e6 bytes) uncompressed")
    groups["content"].add_argument("--no-big-ints", action="store_true", help="omit NCCL 'Comms Id' values >= 2**63")
    files = cmd.add_argument_group("files")
    files.add_argument("--compress", choices=tuple(SUFFIX_OF), default="gzip",
                       help="rank file compression (default %(default)s)")
    files.add_argument("--no-merged", action="store_true", help="do not write merged_trace.json[.gz|.zst]")
    files.add_argument("--merged-style", choices=MERGED_STYLES, default="rank-arg",
                       help="how the merged file states ranks: args.rank on events, or process names "
                            "(default %(default)s)")
    files.add_argument("--overwrite", action="store_true",
                       help="replace files of an earlier run in OUTDIR (refused otherwise, before anything is written)")
    files.add_argument("--json", action="store_true", help="print the ground truth summary as JSON")
    files.add_argument("-q", "--quiet", action="store_true", help="accepted as every command accepts it (synth shows "
                                                                    "no progress)")


def run(args: argparse.Namespace) -> None:
    from ..synth import SynthConfig, summary

    config = SynthConfig(**{name: getattr(args, name) for _, name, _ in SYNTH_OPTIONS},
                         target_bytes=None if args.target_mb is None else int(args.target_mb * 1e6),
                         big_ints=not args.no_big_ints)
    try:
        config.validate()
    except ValueError as exc:
        raise TraceError(f"synth: {exc}") from None
    truth = write_whole_run(config, Path(args.outdir), compress=SUFFIX_OF[args.compress], merged=not args.no_merged,
                            merged_style=args.merged_style, overwrite=args.overwrite)
    report("synth", summary(truth), args)


def write_whole_run(config: SynthConfig, outdir: Path, *, compress: str, merged: bool, merged_style: str,
                    overwrite: bool) -> dict:
    """The generator's files in ``outdir``, all or none, by the rules every
    command's files follow: checked before anything is written, made in a
    hidden staging directory inside ``outdir`` and published together."""
    from ..io.destinations import Destinations
    from ..io.sink import publish_all
    from ..synth import TRUTH_FILE, file_names, write_traces

    ranks, links, merged_name = file_names(config, compress, merged)
    names = [*ranks, *links, *([merged_name] if merged_name else []), TRUTH_FILE]
    destinations = Destinations(overwrite=overwrite)
    destinations.directory(outdir, writes="synth's files")
    destinations.claim_all(outdir / name for name in names)
    made = next((directory for directory in reversed([outdir, *outdir.parents]) if not directory.exists()), None)
    outdir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".streamtrace-synth-", dir=outdir))
    try:
        truth = write_traces(config, staging, compress=compress, merged=merged, merged_style=merged_style)
        publish_all([(str(staging / name), str(outdir / name)) for name in names], overwrite)
    except BaseException:
        if made is not None:  # the topmost directory this run made
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return truth


@view("synth")
def rows(truth: dict) -> Rows:
    ranks = truth["ranks"]
    rows = [("wrote", f"{counted(len(ranks), 'rank file')} ({counted(truth['pp_stages'], 'PP stage')}, {truth['schedule']}, "
                      f"{counted(truth['steps'], 'step')}): {listed([rank['file'] for rank in ranks], 3)}"),
            ("events", f"{truth['total_events']:,} in all, {sum(rank['bytes'] for rank in ranks):,} bytes")]
    if truth.get("merged"):
        rows.append(("merged", f"{truth['merged']['file']} ({truth['merged']['events']:,} events, colliding "
                               "correlation ids: try streamtrace relink)"))
    rows.append(("truth", "truth.json: what each command should find"))
    return rows
