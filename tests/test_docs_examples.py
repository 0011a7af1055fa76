"""The shell examples of README.md and docs/*.md, run as written.

Convention (CONTRIBUTING.md says the same):

* Every fenced ```sh block is run with bash (``set -euo pipefail``) in a
  fresh temporary directory, with the directory of ``sys.executable`` (the
  venv's ``streamtrace`` and ``python3``) first on PATH.  Shell blocks must
  be tagged ``sh``: a ``bash``, ``shell`` or ``console`` block fails the test.
* A block that cannot run here (a bucket, a cluster, a multi-GB benchmark)
  carries ``<!-- not run: REASON -->`` on the line before its opening fence.
  It is still checked: ``bash -n`` syntax, and its streamtrace commands
  against the command-line parser.
* README.md's two set-up blocks (``pip install ...``) are skipped: CI
  (``.ci/run``) runs exactly those lines.
* The example inputs, put into the directory before each block:

  ``trace.json.gz``      rank 0 of a 4-rank pipeline-parallel run made by
                         :mod:`streamtrace.synth` (CUDA-graph replays over 32
                         streams, NCCL, PP annotations)
  ``ranks/``             ``rank0_trace.json.gz`` ... ``rank3_trace.json.gz``
                         of that run
  ``merged.json.gz``     the same 4 ranks in one file, correlation ids
                         colliding (as merging tools write them)
  ``truncated.json.gz``  ``trace.json.gz`` cut off halfway through its gzip
                         stream
  ``dlrm/``              the 8 real DLRM ranks of ``dlrm_8ranks`` in the
                         shared traces (tensorboard file names)

* A comment at the end of a command line states what that line promises,
  and the test checks it after the block ran (exit status 0 is always
  required):

  ``# writes PATH``  PATH exists; a trace (``.json``, ``.json.gz``,
                     ``.json.zst``) is read by ``streamtrace.inspect`` and
                     has events (a ``.json`` file may instead be a JSON
                     summary), a ``.csv`` starts with one of ``attribute``'s
                     or ``analyze``'s headers, a ``.toml`` parses as compaction rules, a
                     ``.parquet`` file has rows, a PATH
                     ending in ``/`` is a directory holding traces
  ``# prints JSON``  the line's standard output is one or more JSON documents
  ``# prints CSV``   the line's standard output starts with an ``attribute``
                     header
  ``# prints text``  the line's standard output is not empty

  Every block that runs must promise something.
* Every ``streamtrace`` command in any block, run or not, must be accepted
  by the real command-line parser: the flags the documentation shows exist.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from conftest import TRACES

import streamtrace
from streamtrace.algo.rules import parse_rules
from streamtrace.algo.tracediff import diff_columns
from streamtrace.cli import build_parser
from streamtrace.commands.analyze import COLUMNS as TABLE_COLUMNS
from streamtrace.commands.attribute import COLUMNS, GROUP_COLUMNS
from streamtrace.commands.merge import _merged_output_name
from streamtrace.synth import SynthConfig, write_traces

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP_COMMANDS = ["pip install . && streamtrace demo", "pip install '.[dev,cloud]' && python -m pytest -q"]
README_LIMIT = 12_000
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*\S.*-->\s*$")
SHELL_TAGS = {"bash", "shell", "console", "zsh", "shell-session"}
PROMISE = re.compile(r"\s#\s*(writes|prints)\s+(\S.*?)\s*$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
HEADERS = {",".join(COLUMNS), ",".join(GROUP_COLUMNS), *(",".join(columns) for columns in TABLE_COLUMNS.values()),
           ",".join(diff_columns()), "category,name"}
TRACE_SUFFIXES = (".json", ".json.gz", ".json.zst")
MARK = "@@docs-example-line-{}@@"
BLOCK_TIMEOUT = 120


@dataclass
class Command:
    """One logical command line of a block (continuations and heredoc joined)."""

    text: str
    promises: list[tuple[str, str]]


@dataclass
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    tag: str
    body: str
    not_run: bool

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def is_setup(self) -> bool:
        lines = [line for line in self.body.splitlines() if line.strip()]
        return self.document.name == "README.md" and bool(lines) and all(
            line.startswith("pip install ") for line in lines)

    def commands(self) -> list[Command]:
        found: list[Command] = []
        lines = self.body.splitlines()
        at = 0
        while at < len(lines):
            line = lines[at]
            at += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            text = line
            while text.endswith("\\") and at < len(lines):
                text = text + "\n" + lines[at]
                at += 1
            heredoc = HEREDOC.search(text.split("\n")[-1])
            if heredoc:
                while at < len(lines) and lines[at].strip() != heredoc.group(2):
                    text += "\n" + lines[at]
                    at += 1
                text += "\n" + (lines[at] if at < len(lines) else "")
                at += 1
            first_line = text.split("\n")[0] if heredoc else text.split("\n")[-1]
            promise = PROMISE.search(first_line)
            promises = []
            if promise:
                kind, what = promise.groups()
                promises = [(kind, item.strip()) for item in what.split(",")] if kind == "writes" else [(kind, what)]
            found.append(Command(text, promises))
        return found


def blocks_of(document: Path) -> list[Block]:
    found, lines = [], document.read_text(encoding="utf-8").splitlines()
    at = 0
    while at < len(lines):
        fence = FENCE.match(lines[at])
        if fence is None:
            at += 1
            continue
        start, tag = at, fence.group(1)
        at += 1
        body = []
        while at < len(lines) and not lines[at].startswith("```"):
            body.append(lines[at])
            at += 1
        at += 1
        marked = start > 0 and NOT_RUN.match(lines[start - 1]) is not None
        found.append(Block(document, start + 1, tag, "\n".join(body) + "\n", marked))
    return found


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]
SHELL_BLOCKS = [block for block in ALL_BLOCKS if block.tag == "sh" and not block.is_setup]
RUN_BLOCKS = [block for block in SHELL_BLOCKS if not block.not_run]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The example inputs named in the convention above."""
    made = tmp_path_factory.mktemp("docs-inputs")
    run = tmp_path_factory.mktemp("docs-synth")
    write_traces(SynthConfig(ranks=4, pp_stages=4, microbatches=4, steps=1), run, compress="gz")
    (made / "ranks").mkdir()
    for rank in range(4):
        shutil.copy(run / f"rank{rank}_trace.json.gz", made / "ranks" / f"rank{rank}_trace.json.gz")
    shutil.copy(run / "rank0_trace.json.gz", made / "trace.json.gz")
    shutil.copy(run / "merged_trace.json.gz", made / "merged.json.gz")
    whole = (made / "trace.json.gz").read_bytes()
    (made / "truncated.json.gz").write_bytes(whole[: len(whole) // 2])
    shutil.copytree(TRACES / "dlrm_8ranks", made / "dlrm", copy_function=shutil.copyfile)
    (made / "dlrm").chmod(0o755)  # the shared traces are read-only; the copies need not be
    return made


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    """Where ``streamtrace`` is: beside this interpreter, or a shim that runs ``-m streamtrace``."""
    here = Path(sys.executable).parent
    if shutil.which("streamtrace", path=str(here)):
        return here
    shim_dir = tmp_path_factory.mktemp("docs-bin")
    shim = shim_dir / "streamtrace"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m streamtrace "$@"\n')
    shim.chmod(0o755)
    (shim_dir / "python3").symlink_to(sys.executable)
    return shim_dir


def script_of(block: Block) -> tuple[str, list[Command]]:
    """The block as a bash script that marks where each command's output starts."""
    commands = block.commands()
    parts = ["set -euo pipefail"]
    for number, command in enumerate(commands):
        parts.append(f"printf '\\n%s\\n' {shlex.quote(MARK.format(number))}")
        parts.append(command.text)
    return "\n".join(parts) + "\n", commands


def outputs_by_command(stdout: str, count: int) -> list[str]:
    pieces = re.split(r"\n@@docs-example-line-(\d+)@@\n", stdout)
    found = [""] * count
    for number, text in zip(pieces[1::2], pieces[2::2]):
        found[int(number)] = text
    return found


def json_documents(text: str) -> list:
    decoder, documents, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        document, at = decoder.raw_decode(text, at)
        documents.append(document)
        while at < len(text) and text[at].isspace():
            at += 1
    return documents


def check_written(path: Path, promised: str) -> None:
    assert path.exists(), f"{promised} was promised but not written"
    if promised.endswith("/"):
        assert path.is_dir(), f"{promised} is not a directory"
        traces = [p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES)]
        assert traces, f"{promised} holds no trace"
        for trace in traces:
            check_written(trace, str(trace))
    elif path.name.endswith((".json.gz", ".json.zst")):
        assert streamtrace.inspect(str(path))["events"] > 0, f"{promised} has no events"
    elif path.name.endswith(".json"):
        document = json.loads(path.read_bytes())
        if isinstance(document, list) or "traceEvents" in document:
            assert streamtrace.inspect(str(path))["events"] > 0, f"{promised} has no events"
    elif path.name.endswith((".csv", ".csv.gz")):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            assert handle.readline().rstrip("\r\n") in HEADERS, f"{promised} does not start with a known header"
    elif path.name.endswith(".toml"):
        parse_rules(path.read_text(encoding="utf-8"), promised)
    elif path.name.endswith(".parquet"):
        import pyarrow.parquet

        assert pyarrow.parquet.ParquetFile(path).metadata.num_rows > 0, f"{promised} has no rows"
    else:
        assert path.stat().st_size > 0, f"{promised} is empty"


def check_printed(kind: str, what: str, printed: str, command: str) -> None:
    kind_of_output = what.split()[0].rstrip(":,")
    if kind_of_output == "JSON":
        assert json_documents(printed), f"no JSON printed by: {command}"
    elif kind_of_output == "CSV":
        assert printed.lstrip("\n").split("\n", 1)[0].rstrip("\r") in HEADERS, f"no CSV header printed by: {command}"
    elif kind_of_output == "text":
        assert printed.strip(), f"nothing printed by: {command}"
    else:
        pytest.fail(f"unknown promise '# {kind} {what}' in: {command} (use JSON, CSV or text)")


@pytest.mark.parametrize("block", [block if block.name.startswith("README") else pytest.param(block, marks=pytest.mark.slow)
                                   for block in RUN_BLOCKS], ids=lambda block: block.name)
def test_example_runs(block: Block, inputs: Path, bin_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    shutil.copytree(inputs, work)
    script, commands = script_of(block)
    promises = [promise for command in commands for promise in command.promises]
    assert promises, f"{block.name}: a block that runs must promise something ('# writes PATH' or '# prints JSON')"
    env = dict(os.environ, PATH=str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (
        f"{block.name} failed with exit status {done.returncode}\n--- block\n{block.body}"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
    printed = outputs_by_command(done.stdout, len(commands))
    for number, command in enumerate(commands):
        for kind, what in command.promises:
            if kind == "writes":
                check_written(work / what, what)
            else:
                check_printed(kind, what, printed[number], command.text)


SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "(", ")"})
REDIRECTION = re.compile(r"^[<>&]+$")


def streamtrace_invocations(command: Command) -> list[list[str]]:
    """The argument lists given to ``streamtrace`` in one command line: at
    its start, after a pipe, ``&&`` or ``;``, or after each ``--`` of
    ``scripts/bench.py ... -- streamtrace ... -- streamtrace ...``;
    redirections left out."""
    first = command.text.split("\n")[0]
    text = first if HEREDOC.search(first) else command.text.replace("\\\n", " ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    found: list[list[str]] = []
    current: list[str] | None = None
    previous: str | None = None
    skip_target = False
    for at, token in enumerate(tokens):
        following = tokens[at + 1] if at + 1 < len(tokens) else ""
        if token in SEPARATORS or (token == "--" and following == "streamtrace"):  # bench.py: one command per --
            if current is not None:
                found.append(current)
            current = None
        elif REDIRECTION.match(token):
            skip_target = True
        elif token.isdigit() and REDIRECTION.match(following):
            pass  # the descriptor of "2>"
        elif skip_target:
            skip_target = False
        elif token == "streamtrace" and current is None and (previous is None or previous in SEPARATORS
                                                               or previous == "--"):
            current = []
        elif current is not None:
            current.append(token)
        previous = token
    if current is not None:
        found.append(current)
    return found


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda block: block.name)
def test_example_flags_exist(block: Block) -> None:
    """Every streamtrace command shown parses with the real parser (run or not)."""
    for command in block.commands():
        for args in streamtrace_invocations(command):
            try:
                build_parser().parse_args(args)
            except SystemExit as exc:
                pytest.fail(f"{block.name}: 'streamtrace {shlex.join(args)}' is refused by the parser (exit {exc.code})")
    if block.not_run:
        syntax = subprocess.run(["bash", "-n"], input=block.body, capture_output=True, text=True)
        assert syntax.returncode == 0, f"{block.name}: {syntax.stderr}"


def test_every_shell_block_is_run_or_marked() -> None:
    """No shell example escapes: each is an sh block, and each is run, marked
    not run, or one of README's two set-up blocks."""
    wrong_tag = [block.name for block in ALL_BLOCKS if block.tag in SHELL_TAGS]
    assert not wrong_tag, f"tag shell examples ```sh so that they are run: {wrong_tag}"
    accounted = {block.name for block in RUN_BLOCKS} | {block.name for block in SHELL_BLOCKS if block.not_run}
    setup = [block for block in ALL_BLOCKS if block.tag == "sh" and block.is_setup]
    missing = [block.name for block in ALL_BLOCKS if block.tag == "sh" and block.name not in accounted
               and block not in setup]
    assert not missing, missing
    marked_elsewhere = [block.name for block in ALL_BLOCKS if block.not_run and block.tag != "sh"]
    assert not marked_elsewhere, f"'not run' marks on blocks that are not sh: {marked_elsewhere}"


def test_readme_setup_commands() -> None:
    """The two lines .ci/run runs, and no other line starting with 'pip install '."""
    lines = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if line.startswith("pip install ")]
    assert lines == SETUP_COMMANDS


def test_readme_size() -> None:
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size <= README_LIMIT, f"README.md has {size} characters, more than {README_LIMIT}"


def test_each_recipe_names_the_extra_that_installs_what_it_imports() -> None:
    """A recipe that runs ``python3 -c "import X"`` says which extra brings X;
    the dev extra does not count (it is for the tests, not for users)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    packages = {name: {re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower() for requirement in requirements}
                for name, requirements in extras.items() if name != "dev"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for section in re.split(r"^#{2,3} ", readme, flags=re.MULTILINE):
        for module in re.findall(r"python3 -c \"import (\w+)", section):
            named = [extra for extra, provided in packages.items() if module in provided and f"`{extra}` extra" in section]
            assert named, f"README's recipe '{section.splitlines()[0]}' imports {module}: no extra it names installs it"


def test_readme_shows_every_name_merge_gives_its_output() -> None:
    """Both default names (with PP stages and without, as the DLRM ranks) are
    promised by a README line that runs, so test_example_runs checks them."""
    promised = {Path(what).name for block in RUN_BLOCKS if block.document.name == "README.md"
                for command in block.commands() if command.text.startswith("streamtrace merge ")
                for kind, what in command.promises if kind == "writes"}
    for has_pp in (True, False):
        assert Path(_merged_output_name(["ranks/rank0.json"], has_pp)).name in promised
