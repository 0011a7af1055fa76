"""Command line: a thin layer that parses flags and prints library summaries.

One module per command holds its options (``add_parser``), its runner
(``run``, which calls the library) and its human report (``@view``);
:mod:`.options` and :mod:`.report` hold what several commands share. This
module builds the parser from :data:`COMMANDS` and dispatches.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Callable, Sequence

from .. import __version__
from ..errors import TraceError
from ..resources import STOPS_REQUESTED
from . import analyze, attribute, compact, convert, demo, diff, inspect, merge, redact, relink, slicing, split, sql, synth
from .options import CommandParser
from .signals import Terminated, install_signal_handlers, interrupted

COMMANDS = (inspect, convert, redact, compact, merge, relink, split, slicing, attribute, analyze, diff, sql, synth, demo)
"""The command modules, in the order ``streamtrace --help`` lists them."""

EPILOG = """\
Inputs are paths, '-' for stdin (as the only input), or URLs (https://,
s3://, gs://; extras 'http', 's3', 'gcs' or 'cloud' for all three),
downloaded once (--reread-remote reads them again instead). A directory or
a glob stands for its trace files: commands that take several inputs run
one task each (-o DIR/); slice and split read one trace. Outputs may be
paths, '-', s3:// or gs:// URLs. gzip and zstd inputs are recognised by
their magic bytes.
Outputs are written to a temporary file (or upload) made final at the end,
so a failed run never leaves a partial file or object. Errors print one line
and exit with status 1; a mistake in the options prints the command's usage
and exits with status 2.
"""


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every command's deferred options included (for introspection)."""
    parser, commands = _parsers()
    for command in commands.values():
        command.complete()
    return parser


def _parsers() -> tuple[CommandParser, dict[str, CommandParser]]:
    """The parser, and each command's own (which reports a mistake with that command's usage)."""
    parser = CommandParser(
        prog="streamtrace",
        description="Bounded-memory tools for huge PyTorch profiler (Kineto) traces.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"streamtrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser, commands.choices


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's options; shell completion answers here when the shell asks (argcomplete)."""
    if "_ARGCOMPLETE" in os.environ:  # the shell's TAB: answer and exit (imported only then: start-up stays quick)
        import argcomplete

        argcomplete.autocomplete(build_parser())
    parser, commands = _parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a report may name the command that made it
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    install_signal_handlers()
    _quiet_dask(args.debug)
    run: Callable[[argparse.Namespace], None] = args.run
    try:
        run(args)
    except KeyboardInterrupt as exc:
        return interrupted(STOPS_REQUESTED[0] if STOPS_REQUESTED else
                            signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except TraceError as exc:
        if STOPS_REQUESTED:  # the run failed because it was being stopped (a worker the signal ended)
            return interrupted(STOPS_REQUESTED[0])
        if args.debug:
            raise
        print(f"streamtrace: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except OSError as exc:
        if STOPS_REQUESTED:
            return interrupted(STOPS_REQUESTED[0])
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"streamtrace: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _quiet_dask(debug: bool) -> None:
    """Keep distributed's INFO log (a closed connection's traceback, after a failed --dask task) off stderr.

    Set before distributed is imported (it is, lazily, by --dask), and only by the command line: a library
    caller keeps its own logging. The user's own DASK_LOGGING__DISTRIBUTED, and --debug, keep the INFO lines.
    """
    if not debug:
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")


def _silence_stdout() -> None:
    """The reader closed the pipe: keep Python from failing again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
