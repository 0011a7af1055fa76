"""Option groups several commands share, and the library keywords they become."""
from __future__ import annotations

import argparse
import sys
import textwrap
from typing import TYPE_CHECKING, Callable, Sequence

from ..io.formats import COMPRESSIONS, DEFAULT_LEVEL, LEVELS

if TYPE_CHECKING:
    from ..io.redact import RedactOptions


class CommandParser(argparse.ArgumentParser):
    """A parser that adds a command's costly options only when that command is parsed.

    ``streamtrace --version`` and ``--help`` build every command's parser; options whose
    defaults need a heavy import (synth's come from its generator) are deferred so that
    start-up does not pay for them.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: list[Callable[[argparse.ArgumentParser], None]] = []

    def defer(self, add_options: Callable[[argparse.ArgumentParser], None]) -> None:
        self._deferred.append(add_options)

    def complete(self) -> None:
        """Add the deferred options now (the parser is about to be read or introspected)."""
        while self._deferred:
            self._deferred.pop(0)(self)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        return super().parse_known_args(args, namespace)


def common_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--salvage", action="store_true",
                       help="read a trace cut off mid-array (profiler killed) up to its last complete event")
    group.add_argument("--spool-dir", metavar="DIR",
                       help="directory for temporary spool files (default: the system temp dir)")
    group.add_argument("--reread-remote", action="store_true",
                       help="read a URL input again from the bucket when a second reading is needed, instead of "
                            "keeping a local copy in the spool dir while it is downloaded (the default)")
    group.add_argument("-j", "--jobs", metavar="N",
                       help="busy processes: N, or 'auto' (default: the CPUs this process may use, at most 4; "
                            "$STREAMTRACE_JOBS overrides the default). -j 1 runs in one process; the output is "
                            "the same for every N")
    group.add_argument("--json", action="store_true",
                       help="print the full JSON summary instead of the short human report")
    group.add_argument("--summary", metavar="FILE", help="also write the full JSON summary to FILE")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="no progress on stderr (the report is still printed; errors and warnings too)")
    group.add_argument("--progress", action="store_true",
                       help="a progress bar even when stderr is not a terminal (default there: a line every 10 s)")
    group.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


RANK_RULES = ("args.rank, else the rank a process_name states such as 'RANK 3 - GPU', else --rank-map, "
              "else inference: a GPU pid pairs with the CPU pid that launched its correlation ids before "
              "its GPU events ran, else distributedInfo.rank for a single-rank file")
RANK_MAP_HELP = """\
--rank-map FILE is a JSON object from pid to rank, for pids no other rule
places, e.g. {"4037": 0, "0": 0, "4045": 1, "1": 1}. The summary lists every
pid with its rank and the rule that decided it. A pid that several ranks
claim, with colliding correlation ids, stops the command with an error
instead of guessing."""


def paragraphs(*texts: str) -> str:
    """Descriptions kept readable under RawDescriptionHelpFormatter (which does not wrap)."""
    return "\n\n".join(textwrap.fill(text, 79) if "\n" not in text else text for text in texts)


def output_options(parser: argparse.ArgumentParser, output: str) -> None:
    """--compress, --level and --overwrite of the commands that write one trace."""
    parser.add_argument("--compress", choices=COMPRESSIONS,
                        help=f"output compression (default: from the suffix of {output})")
    level_option(parser)
    parser.add_argument("--overwrite", action="store_true", help=f"replace {output} if it exists")


def output_option(parser: argparse.ArgumentParser, tag: str, *, batch: bool = True) -> None:
    """-o of the commands that write one trace beside their input by default (``<name>{tag}``)."""
    parser.add_argument("-o", "--output", help=f"output path or '-' (default: <name>{tag}.json[.gz|.zst] beside the "
                                               "input, as compressed as it)" +
                                               ("; with several inputs a directory DIR/" if batch else ""))


def drop_cat_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drop-cat", action="append", default=[], metavar="CAT",
                        help="drop events of this category (repeatable), e.g. python_function")


def level_option(parser: argparse.ArgumentParser) -> None:
    ranges = ", ".join(f"{name} {levels.start}-{levels.stop - 1} (default {DEFAULT_LEVEL[name]})"
                       for name, levels in LEVELS.items())
    parser.add_argument("--level", type=int, help=f"compression level: {ranges}")


def original_stream_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-original-stream", action="store_true",
                        help="do not keep each moved slice's CUDA stream as args.original_stream")


def cluster_option(parser: argparse.ArgumentParser) -> None:
    """--dask: the commands that run one task per input (merge's ranks, batch runs)."""
    parser.add_argument("--dask", metavar="ADDRESS",
                        help="run one task per input on the Dask cluster whose scheduler is ADDRESS "
                             "(e.g. tcp://head:8786; default $STREAMTRACE_DASK; needs the 'dask' extra and a "
                             "--spool-dir that every worker shares: a directory, or for merge and analyze a bucket URL "
                             "such as s3://bucket/tmp); -j then does not apply. A single input runs here")


def secrets_options(parser: argparse.ArgumentParser, role: str = "writer") -> None:
    """Secret rules for inspect, redact and (with --redact) every command that writes a trace."""
    group = parser.add_argument_group("secrets" if role == "redact" else "secrets (see 'streamtrace redact --help')")
    if role == "writer":
        group.add_argument("--redact", action="store_true",
                           help="replace credentials in the output by \"<redacted:KIND>\" (as 'redact' does)")
    implies = "; implies --redact" if role == "writer" else ""
    group.add_argument("--secrets-rules", metavar="FILE",
                       help=f"TOML secret rules (see redact --print-secrets-rules){implies}")
    group.add_argument("--pattern", action="append", default=[], metavar="NAME=REGEX",
                       help=f"also treat matches of REGEX as secrets of kind NAME (repeatable){implies}")
    if role != "inspect":
        group.add_argument("--pseudonymize", metavar="KINDS", default="",
                           help=f"also replace these by stable pseudonyms: comma-separated hosts,users,paths{implies}")


def redaction(args: argparse.Namespace) -> RedactOptions | None:
    """What secrets_options asked for; None when a writing command is not to redact."""
    from ..io.redact import RedactOptions

    pseudonymize = tuple(kind for kind in getattr(args, "pseudonymize", "").split(",") if kind)
    if not (getattr(args, "redact", True) or args.secrets_rules or args.pattern or pseudonymize):
        return None
    return RedactOptions(args.secrets_rules, tuple(args.pattern), pseudonymize)


def rank_map_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank-map", metavar="FILE", help="JSON object {pid: rank} for pids no other rule places")


def progress_wanted(args: argparse.Namespace) -> bool | str:
    """A bar on a terminal (or with --progress), a line every 10 s in a log or a pipe, nothing with -q."""
    if args.quiet:
        return False
    return True if args.progress or sys.stderr.isatty() else "lines"


def reading(args: argparse.Namespace) -> dict:
    """The common options' library keywords, which every command takes."""
    return dict(salvage=args.salvage, spool_dir=args.spool_dir, reread_remote=args.reread_remote,
                progress=progress_wanted(args), jobs=args.jobs, summary_file=args.summary)
