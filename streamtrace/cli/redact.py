"""``streamtrace redact``: options, runner and human report."""
from __future__ import annotations

import argparse
import sys

from ..errors import TraceError
from . import convert
from .batch import is_batch, run_batch
from .options import common_options, output_option, output_options, paragraphs, reading, redaction, secrets_options
from .report import Rows, report, view


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``redact``'s options."""
    cmd = commands.add_parser(
        "redact", help="copy a trace with its credentials replaced, to share it",
        description=paragraphs(
            "One streaming pass: TRACE with every secret replaced by \"<redacted:KIND>\": strings shaped like "
            "credentials (Hugging Face, GitHub, AWS, OpenAI, Slack, Google API keys, JWTs, private key blocks, "
            "passwords in URLs; only the matched part), and whole strings under keys naming a secret (*TOKEN*, "
            "*SECRET*, *PASSWORD*, *API_KEY*, ...) unless short or benign. Events, names, args at any depth, "
            "stack frames and every top-level key are looked at; a top-level key without a secret is copied "
            "byte for byte. 'inspect' reports the same findings by JSON path; every command that writes a "
            "trace takes --redact."),
        epilog="examples:\n  streamtrace redact trace.json.gz                  # -> trace_redacted.json.gz\n"
               "  streamtrace redact trace.json.gz -o share.json.gz --pseudonymize hosts,users,paths\n"
               "  streamtrace redact trace.json.gz --pattern employee_id='EMP-[0-9]{6}'\n"
               "  streamtrace redact --print-secrets-rules > rules.toml   # start from the defaults",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("trace", nargs="*", metavar="TRACE", help="trace file, '-' for stdin (then give -o), or a URL; "
                     "several, a directory or a glob: one task each")
    output_option(cmd, "_redacted")
    cmd.add_argument("--print-secrets-rules", action="store_true", help="print the default secret rules and exit")
    secrets_options(cmd, "redact")
    output_options(cmd, "the output")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..algo.secrets import DEFAULT_SECRETS_RULES_TOML
    from ..commands.redact import redact

    if args.print_secrets_rules:
        sys.stdout.write(DEFAULT_SECRETS_RULES_TOML)
        return
    if not args.trace:
        raise TraceError("give a TRACE to redact (or --print-secrets-rules)")
    chosen = redaction(args)
    options = dict(rules=chosen.rules, patterns=chosen.patterns, pseudonymize=chosen.pseudonymize,
                   compress=args.compress, level=args.level)  # one set for a single run and a batch alike
    if is_batch(args, args.output):
        return run_batch(args, **options)
    summary = redact(args.trace[0], args.output, overwrite=args.overwrite, **options, **reading(args))
    report("redact", summary, args, to_stderr=args.output == "-")


@view("redact")
def rows(summary: dict) -> Rows:
    """Where from and to (redact drops nothing); the redaction rows come with every writing command's."""
    return convert.copy_rows("copied", summary, with_dropped=False)
