"""``streamtrace synth``: the generator (streamtrace.synth) with every knob as an option."""
from __future__ import annotations

import argparse

from ..errors import TraceError
from ..io.formats import COMPRESSIONS
from .options import paragraphs
from .report import Rows, counted, listed, report, view

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
    ("content", "collectives", "collective args as PyTorch writes them: record_param_comms ops, one name per process "
                               "group, sizes by collective, an all_to_allv per step with uneven per-rank splits; "
                               "a group's collectives run in order, and wait for --slow-rank"),
    ("files", "layout", "event text: compact JSON an event a line, or Kineto's own layout (an event over "
                        "indented lines, spaces after colons)"),
)

def add_parser(commands: argparse._SubParsersAction) -> None:
    """``synth``: the generator (streamtrace.synth) with every knob as an option."""
    cmd = commands.add_parser(
        "synth", help="write realistic synthetic per-rank traces (and a merged one) with their ground truth",
        description=paragraphs(
            "Write OUTDIR/rank<N>_trace.json[.gz|.zst] for a pipeline-parallel training run of RANKS ranks "
            "(CUDA-graph replays over many streams, eager kernels, NCCL with PP SEND/RECV, PP annotations, "
            "python_function frames), a naive merged_trace.json[.gz|.zst] (colliding correlation ids, as tools "
            "that concatenate ranks write it), truth.json (what every command should find) and each rank's "
            "launch-to-kernel links as truth_links_rank<N>.csv. Deterministic for a "
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
    cmd.set_defaults(run=run)


def add_knobs(cmd: argparse.ArgumentParser) -> None:
    """One option per generator setting, with the generator's own default and choices."""
    from ..synth import KERNEL_ANNOTATIONS, LAYOUTS, MERGED_STYLES, SCHEDULES, SynthConfig

    defaults = SynthConfig()
    choices = {"schedule": SCHEDULES, "kernel_annotations": KERNEL_ANNOTATIONS, "layout": LAYOUTS}
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
    files = groups["files"]
    files.add_argument("--compress", choices=COMPRESSIONS, default="gzip",
                       help="rank file compression (default %(default)s)")
    files.add_argument("--no-merged", action="store_true", help="do not write merged_trace.json[.gz|.zst]")
    files.add_argument("--merged-style", choices=MERGED_STYLES, default="rank-arg",
                       help="how the merged file states ranks: args.rank on events, process names ('RANK 3 - "
                            "GPU'), or not at all (the inference's test) (default %(default)s)")
    files.add_argument("--overwrite", action="store_true",
                       help="replace files of an earlier run in OUTDIR (refused otherwise, before anything is written)")
    files.add_argument("--json", action="store_true", help="print the ground truth summary as JSON")
    files.add_argument("-q", "--quiet", action="store_true", help="accepted as every command accepts it (synth shows "
                                                                    "no progress)")
    files.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def run(args: argparse.Namespace) -> None:
    from ..commands.synth import synthesize
    from ..synth import SynthConfig, summary

    if args.target_mb is not None and not 0 < args.target_mb < 1e9:
        raise TraceError(f"synth: --target-mb must be a positive number of MB below 1e9, not {args.target_mb}")
    config = SynthConfig(**{name: getattr(args, name) for _, name, _ in SYNTH_OPTIONS},
                         target_bytes=None if args.target_mb is None else int(args.target_mb * 1e6),
                         big_ints=not args.no_big_ints)
    truth = synthesize(args.outdir, config, compress=args.compress, merged=not args.no_merged,
                       merged_style=args.merged_style, overwrite=args.overwrite)
    report("synth", summary(truth), args)


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
