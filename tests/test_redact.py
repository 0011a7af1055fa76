"""Secrets: found by ``inspect``, removed by ``redact`` and by ``--redact`` on
every command that writes a trace.

The planted trace is a generated one with credentials of every kind placed
in top-level keys before and after ``traceEvents`` (three levels deep and
more), in event names, ``args`` and stack frames, as whole strings and
inside longer ones.  The oracle is written plainly here: it replaces the
planted values it knows (no regular expressions) in the input as loaded
whole by ``json.load``.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import orjson
import pytest
import zstandard
from conftest import REAL_TRACES, ROOT, events_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace.algo import secrets as secrets_module
from streamtrace.algo.secrets import DEFAULT_SECRETS_RULES_TOML, Pseudonyms, SecretFinder, fold, parse_secrets_rules
from streamtrace.errors import TraceError
from streamtrace.io.redact import load_secret_rules
from streamtrace.synth import SynthConfig, write_traces

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
GITHUB_PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
OPENAI = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
GOOGLE = "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PRIVATE_KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
               "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----")
URL_CREDENTIALS = "alice:s3cretPassw0rd"
NAMED = {"HF_TOKEN": HF, "db_password": "correct horse battery staple", "Api_Key": "k-19a7f3e2b4c6d8e0",
         "AWS_SECRET_ACCESS_KEY": AWS_SECRET}

SHAPES = [  # (planted value, kind)
    (HF, "huggingface-token"), (GITHUB, "github-token"), (GITHUB_PAT, "github-token"), (AWS_ID, "aws-access-key-id"),
    (AWS_SECRET, "aws-secret-access-key"), (OPENAI, "openai-key"), (SLACK, "slack-token"),
    (GOOGLE, "google-api-key"), (JWT, "jwt"), (PRIVATE_KEY, "private-key"), (URL_CREDENTIALS, "url-password"),
]
PLANTED = sorted({value for value, _ in SHAPES} | set(NAMED.values()))
BENIGN = {"NCCL_TOKEN_COUNT": "1", "USE_SECRETS": "false", "PASSWORD_FILE": "", "TOKEN_MODE": "none",
          "short_token": "abc1234", "num_tokens": 4096}


def header_members() -> dict:
    return {
        "schemaVersion": 1,
        "metadata": {"system": {"env": {**NAMED, **BENIGN, "PATH": "/usr/bin:/home/alice/bin"},
                                "cmdline": f"python train.py --hub-token {HF} --gh {GITHUB}"}},
    }


def trailer_members() -> dict:
    return {"launcher": {"config": {"remote": f"https://{URL_CREDENTIALS}@git.example.com/repo.git",
                                    "keys": [GOOGLE, {"pem": PRIVATE_KEY}], "note": f"pat {GITHUB_PAT} here"}},
            "displayTimeUnit": "ms"}


def plant_events(events: list[dict]) -> list[dict]:
    """The events with secrets placed in a few of them (copies; the rest untouched)."""
    planted = [dict(event) for event in events]
    cpu = [n for n, event in enumerate(planted) if event.get("cat") == "cpu_op"][:4]
    first, second, third, fourth = cpu
    planted[first]["name"] = f"load_model(key={OPENAI})"
    planted[second]["args"] = {**planted[second].get("args", {}), "cmd": f"curl -H 'Bearer {JWT}' x",
                               "aws": f"{AWS_ID} {AWS_SECRET}", "nested": {"deeper": [{"SLACK_TOKEN": SLACK}]}}
    planted[third]["stack"] = ["/usr/lib/python3.11/runpy.py(196): _run_module_as_main",
                               f"/home/alice/train.py(12): main --token-arg {SLACK} --gh={GITHUB}"]
    planted[fourth]["args"] = {**planted[fourth].get("args", {}), "env": dict(NAMED), "settings": BENIGN}
    return planted


def write_planted(source: Path, destination: Path) -> None:
    """``source`` (a small generated trace) with the secrets planted, keys before and after the events."""
    document = load_json(source)
    header = {**header_members(), **{key: value for key, value in document.items() if key != "traceEvents"}}
    parts = [b"{"]
    for key, value in header.items():
        parts.append(orjson.dumps(key) + b": " + json.dumps(value, indent=1).encode() + b",\n")
    parts.append(b'"traceEvents": [\n')
    parts.append(b",\n".join(orjson.dumps(event) for event in plant_events(events_of(document))))
    parts.append(b"\n]")
    for key, value in trailer_members().items():
        parts.append(b",\n" + orjson.dumps(key) + b": " + orjson.dumps(value))
    parts.append(b"}\n")
    destination.write_bytes(b"".join(parts))


def oracle(value: object, under_named: bool = False) -> object:
    """``value`` with the planted secrets replaced as documented."""
    if isinstance(value, dict):
        return {key: oracle(item, under_named or any(word in key.lower() for word in ("token", "secret",
                "password", "api_key", "access_key"))) for key, item in value.items()}
    if isinstance(value, list):
        return [oracle(item, under_named) for item in value]
    if isinstance(value, str):
        if under_named and len(value) >= 8 and value.lower() not in ("true", "false", "none"):
            return "<redacted:secret-named-key>"
        for planted, kind in SHAPES:
            value = value.replace(planted, f"<redacted:{kind}>")
    return value


def decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(data).read()
    return data


def load_json(path: Path) -> dict:
    """A small trace loaded whole (any compression): the independent reference."""
    return json.loads(decompressed(path))


def assert_no_secret(path: Path) -> None:
    text = decompressed(path)
    for secret in PLANTED:
        assert orjson.dumps(secret)[1:-1] not in text, f"{secret[:12]}... left in {path.name}"
        assert secret.encode() not in text


def write_planted_run(config: SynthConfig, directory: Path) -> dict[str, Path]:
    """A generated run with secrets planted in rank 0, rank 1 and the merged file."""
    write_traces(config, directory / "clean", compress="none")
    files = {}
    for name in ("rank0_trace.json", "rank1_trace.json", "merged_trace.json"):
        files[name] = directory / name
        write_planted(directory / "clean" / name, files[name])
    return files


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Path]:
    """Planted copies of a generated single rank, a second rank and a merged 2-rank file."""
    return write_planted_run(SynthConfig(ranks=2, pp_stages=2, microbatches=2, steps=1, graph_kernels=4,
                                         graph_streams=2), tmp_path_factory.mktemp("planted"))


def expected_paths(document: dict) -> dict[str, set[str]]:
    """Where the secrets are, from the planted document (by walking it plainly)."""
    found: dict[str, set[str]] = {}

    def walk(value: object, path: str, named: bool) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else key,
                     named or any(w in key.lower() for w in ("token", "secret", "password", "api_key", "access_key")))
        elif isinstance(value, list):
            for n, item in enumerate(value):
                walk(item, f"{path}[{n}]", named)
        elif isinstance(value, str):
            if named and len(value) >= 8 and value.lower() not in ("true", "false", "none"):
                found.setdefault("secret-named-key", set()).add(path)
                return
            for secret, kind in SHAPES:
                if secret in value:
                    found.setdefault(kind, set()).add(path)

    for key, value in document.items():
        if key == "traceEvents":
            for n, event in enumerate(value):
                walk(event, f"traceEvents[{n}]", False)
        else:
            walk(value, key, False)
    return found


@pytest.mark.parametrize("jobs", [1, 2])
def test_inspect_finds_every_planted_secret_by_path(planted, jobs, capsys):
    trace = planted["rank0_trace.json"]
    summary = streamtrace.inspect(trace, jobs=jobs)
    found = {kind: set(entry["paths"]) for kind, entry in summary["secrets_found"].items()}
    assert found == expected_paths(load_json(trace))
    assert {kind for _, kind in SHAPES} <= set(found)
    assert sum(entry["count"] for entry in summary["secrets_found"].values()) == sum(map(len, found.values()))
    warning = [text for text in summary["warnings"] if "secret" in text]
    assert len(warning) == 1 and "redact" in warning[0]
    assert capsys.readouterr().err == ""  # the library prints nothing; the CLI shows the warning on stderr
    assert not any(secret in json.dumps(summary) for secret in PLANTED)


def test_inspect_of_the_redacted_trace_finds_nothing(planted, tmp_path):
    out = tmp_path / "clean.json"
    streamtrace.redact(planted["rank0_trace.json"], out)
    assert streamtrace.inspect(out)["secrets_found"] == {}


@pytest.mark.parametrize("output", ["out.json", "out.json.gz", "out.json.zst"])
def test_redact_removes_every_secret_and_changes_nothing_else(planted, tmp_path, output):
    trace = planted["rank0_trace.json"]
    out = tmp_path / output
    summary = streamtrace.redact(trace, out)
    assert_no_secret(out)
    before, after = load_json(trace), load_json(out)
    assert list(after) == list(before)
    assert events_of(after) == oracle(events_of(before))
    for key in before:
        if key != "traceEvents":
            assert after[key] == oracle(before[key]), key
    expected = expected_paths(before)
    redacted = summary["redaction"]["secrets_redacted"]
    assert {kind: entry["count"] for kind, entry in redacted.items()} == {k: len(v) for k, v in expected.items()}


def test_members_without_secrets_are_copied_byte_for_byte(planted, tmp_path):
    trace = planted["rank0_trace.json"]
    out = tmp_path / "out.json"
    streamtrace.redact(trace, out)
    source = trace.read_bytes()
    written = out.read_bytes()
    clean_members = [key for key in load_json(trace) if key not in ("traceEvents", "metadata", "launcher")]
    assert clean_members
    for key in clean_members:
        raw = json.dumps(load_json(trace)[key], indent=1).encode() if key != "displayTimeUnit" else b'"ms"'
        assert raw in source and raw in written, key


WRITERS = {
    "convert": lambda planted, out, **kw: streamtrace.convert(planted["rank0_trace.json"], out, **kw),
    "compact": lambda planted, out, **kw: streamtrace.compact(planted["rank0_trace.json"], out, **kw),
    "relink": lambda planted, out, **kw: streamtrace.relink(planted["merged_trace.json"], out, **kw),
    "merge": lambda planted, out, **kw: streamtrace.merge([planted["rank0_trace.json"],
                                                           planted["rank1_trace.json"]], out, **kw),
}


@pytest.mark.parametrize("name", WRITERS)
def test_every_writing_command_redacts_on_the_way_out(name, planted, tmp_path):
    plain, redacted = tmp_path / "plain.json.gz", tmp_path / "redacted.json.gz"
    WRITERS[name](planted, plain)
    summary = WRITERS[name](planted, redacted, redact=True)
    assert_no_secret(redacted)
    assert summary["redaction"]["secrets_redacted"]
    assert load_json(redacted) == oracle(load_json(plain))


def test_split_redacts_every_file(planted, tmp_path):
    streamtrace.split(planted["merged_trace.json"], tmp_path / "plain", compress="none")
    summary = streamtrace.split(planted["merged_trace.json"], tmp_path / "redacted", compress="zstd", redact=True)
    files = sorted((tmp_path / "redacted").iterdir())
    assert len(files) == 2 and summary["redaction"]["secrets_redacted"]
    for path in files:
        assert_no_secret(path)
        plain = tmp_path / "plain" / path.name.replace(".zst", "")
        assert load_json(path) == oracle(load_json(plain))


def test_the_cli_redacts_and_prints_its_rules(planted, tmp_path):
    out = tmp_path / "cli.json.gz"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "compact", str(planted["rank0_trace.json"]), "-o",
                          str(out), "--redact", "-q"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert_no_secret(out)
    rules = subprocess.run([sys.executable, "-m", "streamtrace", "redact", "--print-secrets-rules"],
                           capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert rules.stdout == DEFAULT_SECRETS_RULES_TOML
    assert parse_secrets_rules(rules.stdout).shapes


@pytest.mark.parametrize("command, inputs", [("compact", ("rank0_trace.json", "rank1_trace.json")),
                                             ("relink", ("merged_trace.json",))])
def test_a_batch_run_redacts_every_output_and_reports_it(command, inputs, planted, tmp_path, capsys):
    """Several inputs (or -o DIR/) run as a batch: every output is redacted as a single run's
    would be, and the report counts what all of them replaced."""
    from streamtrace import cli

    assert cli.main([command, *(str(planted[name]) for name in inputs), "-o", f"{tmp_path / 'out'}/", "--redact",
                     "--json", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    outputs = sorted((tmp_path / "out").iterdir())
    assert len(outputs) == len(inputs)
    for path in outputs:
        assert_no_secret(path)
    singles = [run["redaction"]["secrets_redacted"] for run in summary["runs"]]
    assert summary["redaction"]["secrets_redacted"] and all(singles)
    for kind, found in summary["redaction"]["secrets_redacted"].items():
        assert found["count"] == sum(single[kind]["count"] for single in singles if kind in single)


def test_user_patterns_and_rules_files(planted, tmp_path):
    trace = tmp_path / "employee.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "step EMP-123456 done", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "i", "cat": "x", "name": "quote", "pid": 1, "tid": 1, "ts": 2, "args": {"q": 'say "EMP-654321"'}},
        {"ph": "i", "cat": "x", "name": "anchored", "pid": 1, "tid": 1, "ts": 3, "args": {"id": "ZZ-1"}},
    ]}))
    out = tmp_path / "out.json"
    summary = streamtrace.redact(trace, out, patterns=["employee=EMP-[0-9]{6}", "zz=^ZZ-[0-9]$"])
    events = load_json(out)["traceEvents"]
    assert events[0]["name"] == "step <redacted:employee> done"
    assert events[1]["args"]["q"] == 'say "<redacted:employee>"'
    assert events[2]["args"]["id"] == "<redacted:zz>"
    assert summary["redaction"]["secrets_redacted"]["employee"]["count"] == 2
    rules = tmp_path / "rules.toml"
    rules.write_text('[[shapes]]\nkind = "employee"\nregex = "EMP-[0-9]{6}"\nhints = ["emp-"]\n')
    only_mine = streamtrace.inspect(trace, secrets=streamtrace.RedactOptions(rules=str(rules)))
    assert only_mine["secrets_found"]["employee"]["paths"] == ["traceEvents[0].name", "traceEvents[1].args.q"]
    assert streamtrace.inspect(planted["rank0_trace.json"], secrets=streamtrace.RedactOptions(
        rules=str(rules)))["secrets_found"] == {}


@pytest.mark.parametrize("text, message", [
    ("[[shapes]]\nkind = 'x'\nregex = '('\n", "bad regular expression"),
    ("[[shapes]]\nkind = 'a b'\nregex = 'x'\n", "kind must be"),
    ("[[shapes]]\nkind = 'x'\nregex = 'x1'\nhints = ['x1']\n", "hints must be"),
    ("[secret_keys]\nmin_length = -1\n", "min_length"),
    ("[nonsense", "not valid TOML"),
])
def test_bad_rules_are_refused_in_one_line(text, message, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(text)
    with pytest.raises(TraceError, match=message):
        load_secret_rules(str(rules))


def test_a_pattern_needs_a_name():
    with pytest.raises(TraceError, match="NAME=REGEX"):
        load_secret_rules(None, ["no-equals-sign"])


def test_pseudonyms_are_stable_across_the_file(tmp_path):
    events = [
        {"ph": "X", "cat": "python_function", "name": "/home/alice/proj/train.py(12): main", "pid": 1, "tid": 1,
         "ts": 1, "dur": 1},
        {"ph": "X", "cat": "python_function", "name": "/home/bob/lib/util.py(3): f", "pid": 1, "tid": 1, "ts": 2,
         "dur": 1, "args": {"hostname": "node-a17.cluster", "url": "https://node-a17.cluster:8080/x"}},
        {"ph": "X", "cat": "python_function", "name": "/home/alice/proj/eval.py(5): g", "pid": 1, "tid": 1, "ts": 3,
         "dur": 1, "args": {"USER": "alice", "hostname": "node-b02.cluster"}},
    ]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"host": {"hostname": "node-a17.cluster"}, "traceEvents": events}))
    out = tmp_path / "users.json"
    streamtrace.redact(trace, out, pseudonymize=["users", "hosts"])
    document = load_json(out)
    names = [event["name"] for event in document["traceEvents"]]
    assert names == ["/home/user-1/proj/train.py(12): main", "/home/user-2/lib/util.py(3): f",
                     "/home/user-1/proj/eval.py(5): g"]
    assert document["host"] == {"hostname": "host-1"}
    assert document["traceEvents"][1]["args"] == {"hostname": "host-1", "url": "https://host-1:8080/x"}
    assert document["traceEvents"][2]["args"] == {"USER": "user-1", "hostname": "host-2"}
    paths = tmp_path / "paths.json"
    streamtrace.redact(trace, paths, pseudonymize=["paths"])
    assert [event["name"] for event in load_json(paths)["traceEvents"]] == [
        "/path-1/train.py(12): main", "/path-2/util.py(3): f", "/path-1/eval.py(5): g"]
    with pytest.raises(TraceError, match="unknown kind"):
        streamtrace.redact(trace, tmp_path / "bad.json", pseudonymize=["planets"])


def test_benign_values_under_secret_names_are_kept():
    finder = SecretFinder(load_secret_rules(None), Pseudonyms(()))
    from streamtrace.algo.secrets import Findings

    findings = Findings()
    kept = {"USE_TOKEN": "true", "TOKEN_LEN": "0", "PASSWORD": "", "SECRET_MODE": "None", "api_key": "short",
            "num_tokens": 4096, "token_marker": "<redacted:jwt>"}
    assert finder.redact(kept, [], findings) is kept
    assert findings.counts == {}


_SCREEN_PIECES = [b'{"name":"aten::mm","ts":', b"12", b"7", b'},', b"To", b"KEN", b"ke", b"y", b"api_", b"sk-",
                  b"Pass", b"word", b"}", b"Secret", b"://", b"x", b" ", b'"', b"e9", b"hf_", b"AKIA", b"\xc3\xa9"]


_PRE_FILTERS = ["compiled", "pure-python"]


def _pre_filter(kind: str) -> contextlib.AbstractContextManager:
    """The screen with its compiled automaton (when ``ahocorasick_rs`` is
    installed) or with the pure-Python pre-filter used where it has no wheel."""
    if kind == "compiled":
        pytest.importorskip("ahocorasick_rs")
        return contextlib.nullcontext()
    return mock.patch.object(secrets_module, "BytesAhoCorasick", None)


@pytest.mark.parametrize("pre_filter", _PRE_FILTERS)
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_SCREEN_PIECES), max_size=30), min_size=1, max_size=6))
@example([[b"To", b"7", b"KEN"], [b"Pass", b"}", b"word"], [b"To", b"KEN", b"12"], [b"x", b"To", b"KEN"]])
def test_the_secrets_screen_flags_text_exactly_when_it_holds_a_hint(pre_filter, texts):
    """The screen says suspicious exactly when a hint occurs in the
    lower-cased text: digits split no hint, capitals hide none, and (in the
    pure-Python pre-filter, pieces cut at ``}`` and those already found
    clean skipped) what one text taught the clean cache never hides a hint
    in the next; the caller's folded copy gives the same answers."""
    finder, folding = SecretFinder(load_secret_rules(None), Pseudonyms(())), SecretFinder(load_secret_rules(None))
    needles = [hint.encode() for shape in finder.rules.shapes for hint in shape.hints] \
        + [key.encode() for key in finder.rules.key_contains]
    with _pre_filter(pre_filter):
        for pieces in texts:
            text = b"".join(pieces)
            expected = any(needle in text.lower() for needle in needles)
            assert finder.suspicious(text) is expected
            assert folding.suspicious(memoryview(text), fold(text)) is expected


def test_the_screen_searches_with_the_compiled_automaton_when_installed(monkeypatch):
    """Where ``ahocorasick_rs`` is installed the hints are found in one
    compiled pass: the pure-Python pre-filter (ten times slower on clean
    text) is never called."""
    pytest.importorskip("ahocorasick_rs")
    def refuse(self: SecretFinder, folded: bytes) -> bool:
        raise AssertionError("the pure-Python pre-filter ran")
    monkeypatch.setattr(SecretFinder, "_hinted_in_pieces", refuse)
    finder = SecretFinder(load_secret_rules(None))
    assert not finder.suspicious(b'[{"name":"aten::mm","ts":12}]')
    assert finder.suspicious(b'[{"name":"aten::mm","args":{"k":"AKIA' + b"7" * 16 + b'"}}]')


@pytest.mark.parametrize("trace", REAL_TRACES + sorted((REAL_TRACES[0].parent / "dlrm_8ranks").glob("*.json.gz")),
                         ids=lambda p: p.name)
def test_real_traces_hold_no_secret(trace):
    assert streamtrace.inspect(trace)["secrets_found"] == {}


def test_inspect_finds_a_secret_nested_deeper_than_recursion_goes(tmp_path):
    depth = 1015  # past Python's recursion limit, within the reader's nesting limit (1,024)
    trace = tmp_path / "deep.json"
    trace.write_text('{"traceEvents": [{"ph": "i", "cat": "x", "name": "n", "pid": 1, "tid": 1, "ts": 1, '
                     f'"args": {{"a": {"[" * depth}"{HF}"{"]" * depth}}}}}]}}')
    found = streamtrace.inspect(trace)["secrets_found"]
    assert found["huggingface-token"]["count"] == 1
    assert found["huggingface-token"]["paths"] == ["traceEvents[0].args.a" + "[0]" * depth]


def test_inspect_reads_the_input_text_of_a_batch_when_it_has_no_escape(tmp_path):
    from streamtrace.io.reader import ReadMode, TraceReader
    from streamtrace.io.source import InputSource

    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{n}", "pid": 1, "tid": 1, "ts": n, "dur": 1,
               "args": {"note": f"uses {GOOGLE}" if n == 7 else "plain"}} for n in range(20)]
    trace = tmp_path / "plain.json"
    trace.write_text(json.dumps({"traceEvents": events}, indent=2))
    with InputSource(str(trace)) as source:
        reader = TraceReader(source.open(), ReadMode())
        texts = [reader.batch_text for _ in reader.batches()]
    assert texts and None not in texts and any(GOOGLE.encode() in text for text in texts)
    found = streamtrace.inspect(trace, jobs=1)["secrets_found"]
    assert found == {"google-api-key": {"count": 1, "paths": ["traceEvents[7].args.note"]}}


@pytest.mark.parametrize("offset", range(0, 48, 5))
def test_the_screen_finds_a_hint_wherever_its_windows_are_cut(offset, monkeypatch):
    """The pre-filter splits the text a window at a time, each cut at a ``}``: a
    token placed at any distance from a window's end is still seen, and the
    same events without it are still clean (windows of 64 bytes here)."""
    monkeypatch.setattr(secrets_module, "SCREEN_WINDOW", 64)
    monkeypatch.setattr(secrets_module, "BytesAhoCorasick", None)  # the windows are the pure-Python pre-filter's
    clean = b",".join(b'{"name": "kernel %d", "args": {"a": "%s"}}' % (n, b"x" * (n % 50)) for n in range(40))
    token = b"hf_" + b"A1" * 20
    events = b'[%s, {"name": "%s%s", "args": {}}, %s]' % (clean, b"y" * offset, token, clean)
    finder = SecretFinder(load_secret_rules(None))
    assert not finder.suspicious(b"[%s, %s]" % (clean, clean))
    assert SecretFinder(load_secret_rules(None)).suspicious(events)
