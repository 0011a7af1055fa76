"""A copy that holds secrets says so: every command that writes events or
members of its input screens what it writes (without ``--redact``) and
warns once, in one line naming the kinds and ``--redact``, with the same
in its summary (``secrets_copied``).

The input is a small generated rank with a Hugging Face token planted where
TraceLens's public H100 trace has one (``metadata.system.env.HF_TOKEN``) and
in one event's args; the expected paths are found by walking the output as
loaded whole by ``json.load``.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import ROOT, events_of

import streamtrace
from streamtrace.engine import parseproc
from streamtrace.synth import SynthConfig, write_traces

TOKEN = "hf_" + "Zy8Xw7Vu6Ts5Rq4Po3Nm2Lk1Ji0HgFeDcBa9"
WARNING = "secret(s) copied from the input ("


def plant(source: Path, destination: Path) -> None:
    """``source`` with the token at metadata.system.env.HF_TOKEN and in the args of its first cpu_op."""
    document = json.loads(source.read_bytes())
    events = events_of(document)
    first = next(n for n, event in enumerate(events) if event.get("cat") == "cpu_op")
    events[first] = {**events[first], "args": {**events[first].get("args", {}), "cmd": f"login --token {TOKEN}"}}
    document = {"metadata": {"system": {"env": {"HF_TOKEN": TOKEN, "HOME": "/root"}}},
                **{key: value for key, value in document.items() if key != "traceEvents"}, "traceEvents": events}
    destination.write_bytes(orjson.dumps(document))


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("copied")
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=2, steps=2, graph_kernels=4, graph_streams=2),
                 directory / "clean", compress="none")
    files = {"clean": directory / "clean" / "rank0_trace.json"}
    for name in ("rank0_trace.json", "rank1_trace.json", "merged_trace.json"):
        files[name] = directory / name
        plant(directory / "clean" / name, files[name])
    return files


def token_paths(path: Path) -> list[str]:
    """Where the output holds the token, walked plainly (event paths by output position)."""
    found = []

    def walk(value: object, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            for n, item in enumerate(value):
                walk(item, f"{where}[{n}]")
        elif isinstance(value, str) and TOKEN in value:
            found.append(where)

    walk(json.loads(path.read_bytes()), "")
    return found


def assert_warned(summary: dict, outputs: list[Path]) -> None:
    """The summary names every copied token, by path, and warns once."""
    copied = summary["secrets_copied"]
    expected = [where for output in outputs for where in token_paths(output)]
    assert expected and set(copied) <= {"huggingface-token", "secret-named-key"}
    assert sum(entry["count"] for entry in copied.values()) == len(expected)
    warnings = [text for text in summary["warnings"] if "secret" in text]
    assert len(warnings) == 1 and WARNING in warnings[0] and "--redact" in warnings[0] and "\n" not in warnings[0]
    assert all(kind in warnings[0] for kind in copied)
    assert TOKEN not in json.dumps(summary)


WRITERS = {
    "convert": lambda t, out, **kw: streamtrace.convert(t["rank0_trace.json"], out / "c.json", **kw),
    "compact": lambda t, out, **kw: streamtrace.compact(t["rank0_trace.json"], out / "c.json", **kw),
    "relink": lambda t, out, **kw: streamtrace.relink(t["merged_trace.json"], out / "r.json", **kw),
    "slice": lambda t, out, **kw: streamtrace.slice_trace(t["rank0_trace.json"], out / "s.json", **kw),
    "merge": lambda t, out, **kw: streamtrace.merge([t["rank0_trace.json"], t["rank1_trace.json"]], out / "m.json",
                                                    **kw),
    "split": lambda t, out, **kw: streamtrace.split(t["merged_trace.json"], out, compress="none", **kw),
    "merge --per-stage": lambda t, out, **kw: streamtrace.merge([t["rank0_trace.json"], t["rank1_trace.json"]], out,
                                                                per_stage=True, compress="none", **kw),
}


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", WRITERS)
def test_every_copy_of_a_secret_is_counted_and_warned_of(name, jobs, traces, tmp_path, monkeypatch):
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # -j 2: pass-1 workers (or the parsing child) on this small file
    summary = WRITERS[name](traces, tmp_path, jobs=jobs)
    assert_warned(summary, sorted(tmp_path.iterdir()))


@pytest.mark.parametrize("name", WRITERS)
def test_a_redacted_copy_warns_of_nothing(name, traces, tmp_path):
    summary = WRITERS[name](traces, tmp_path, redact=True)
    assert "secrets_copied" not in summary and not any("secret" in text for text in summary.get("warnings", ()))
    assert not any(token_paths(path) for path in tmp_path.iterdir())


def test_a_clean_copy_warns_of_nothing(traces, tmp_path):
    summary = streamtrace.compact(traces["clean"], tmp_path / "c.json", jobs=2)
    assert "secrets_copied" not in summary and not any("secret" in text for text in summary.get("warnings", ()))


def test_a_slice_without_the_event_counts_only_the_members(traces, tmp_path):
    """What is counted is what is written: a window without the planted event copies only the metadata's token."""
    summary = streamtrace.slice_trace(traces["rank0_trace.json"], tmp_path / "s.json", steps="1")
    assert token_paths(tmp_path / "s.json") == ["metadata.system.env.HF_TOKEN"]
    assert_warned(summary, [tmp_path / "s.json"])


@pytest.mark.parametrize("output", ["all.parquet", "last.parquet"])
def test_a_parquet_copy_warns_too(output, traces, tmp_path):
    if output == "all.parquet":
        summary = streamtrace.convert(traces["rank0_trace.json"], tmp_path / output)
    else:
        summary = streamtrace.slice_trace(traces["rank0_trace.json"], tmp_path / output, steps="0")
    assert summary["secrets_copied"]["huggingface-token"]["count"] >= 1
    assert sum(WARNING in text for text in summary["warnings"]) == 1


def test_the_cli_warns_once_on_stderr(traces, tmp_path):
    run = subprocess.run([sys.executable, "-m", "streamtrace", "compact", str(traces["rank0_trace.json"]), "-o",
                          str(tmp_path / "c.json"), "--json", "-q"], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if "secret" in line]
    assert len(lines) == 1 and WARNING in lines[0] and "--redact" in lines[0]
    assert json.loads(run.stdout)["secrets_copied"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_host_name_is_pseudonymized_wherever_it_appears(jobs, tmp_path, monkeypatch):
    """``HOSTNAME`` says ``gpu-node-07`` is a host: ``uname.node`` (before it), an event's free text (before
    any event names it) and a key after the events get the same pseudonym; other words stay."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # -j 2: the parsing child screens what the writer looks at
    host, other = "gpu-node-07", "Login-Node-2"
    trace = tmp_path / "hosts.json"
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"rendezvous on {host}:29500", "pid": 1, "tid": 1, "ts": 1,
         "dur": 1, "args": {"log": f"/scratch/{host}/run1 via {other.lower()}.example.org"}},
        {"ph": "X", "cat": "cpu_op", "name": "gpu-node-070 gpu-node-07x not-gpu-node-07", "pid": 1, "tid": 1,
         "ts": 2, "dur": 1},
        {"ph": "i", "cat": "cpu_op", "name": "store", "pid": 1, "tid": 1, "ts": 3, "args": {"master_addr": other}},
    ]
    document = {"metadata": {"system": {"uname": {"node": host, "sysname": "Linux"},
                                        "env": {"HOSTNAME": host, "SHELL": "/bin/bash"}}},
                "traceEvents": events, "launcher": {"where": f"{host.upper()}.cluster"}}
    trace.write_text(json.dumps(document))
    out = tmp_path / "out.json"
    streamtrace.redact(trace, out, pseudonymize=["hosts"], jobs=jobs)
    text = out.read_text()
    rest = text.lower().replace(events[1]["name"], "")  # (that name holds the host name only inside longer words)
    assert host not in rest and other.lower() not in rest
    written = json.loads(text)
    system = written["metadata"]["system"]
    names = {system["env"]["HOSTNAME"], system["uname"]["node"]}
    assert len(names) == 1 and names.pop().startswith("host-")
    pseudonym = system["env"]["HOSTNAME"]
    first, second, third = written["traceEvents"]
    assert first["name"] == f"rendezvous on {pseudonym}:29500"
    assert first["args"]["log"].startswith(f"/scratch/{pseudonym}/run1 via host-")
    assert second["name"] == "gpu-node-070 gpu-node-07x not-gpu-node-07"  # not the name as a whole word: kept
    assert third["args"]["master_addr"].startswith("host-") and third["args"]["master_addr"] != pseudonym
    assert written["launcher"]["where"] == f"{pseudonym}.cluster"
    assert system["uname"]["sysname"] == "Linux" and system["env"]["SHELL"] == "/bin/bash"


@pytest.mark.parametrize("group_by", [None, "op"])
def test_attribute_counts_the_secrets_its_csv_copies(group_by, traces, tmp_path):
    """attribute copies names, not args: a token in a kernel's and a cpu op's name is counted per CSV cell."""
    document = json.loads(traces["clean"].read_bytes())
    events = events_of(document)
    kernel = next(n for n, event in enumerate(events) if event.get("cat") == "kernel")
    events[kernel] = {**events[kernel], "name": f"gemm {TOKEN}"}
    ops = [n for n, event in enumerate(events) if event.get("cat") == "cpu_op"]
    for n in ops:
        events[n] = {**events[n], "name": f"{events[n]['name']} ({TOKEN})"}
    trace = tmp_path / "names.json"
    trace.write_bytes(orjson.dumps(document))
    out = tmp_path / "a.csv"
    summary = streamtrace.attribute(trace, out, group_by=group_by)
    with open(out, newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row if TOKEN in cell]
    assert cells and summary["secrets_copied"]["huggingface-token"]["count"] == len(cells)
    assert sum(WARNING in text for text in summary["warnings"]) == 1
    clean = streamtrace.attribute(traces["clean"], tmp_path / "clean.csv", group_by=group_by)
    assert "secrets_copied" not in clean


def test_a_batch_adds_up_what_its_outputs_copied_and_warns_once(traces, tmp_path):
    summary = streamtrace.batch("compact", [traces["rank0_trace.json"], traces["rank1_trace.json"]], tmp_path / "out")
    outputs = sorted((tmp_path / "out").iterdir())
    assert len(outputs) == 2 and all(run["secrets_copied"] for run in summary["runs"])
    assert_warned(summary, outputs)


HOST = "gpu-node-07"


def plant_host(source: Path, destination: Path) -> None:
    """``source`` with HOST as ``HOSTNAME`` and ``uname.node`` in its metadata, and in the free text and a
    path in the args of its first cpu_op."""
    document = json.loads(source.read_bytes())
    events = events_of(document)
    first = next(n for n, event in enumerate(events) if event.get("cat") == "cpu_op")
    events[first] = {**events[first], "args": {**events[first].get("args", {}), "log": f"rendezvous on {HOST}:29500",
                                               "file": f"/scratch/{HOST}/run1/log.txt"}}
    document = {"metadata": {"system": {"uname": {"node": HOST, "sysname": "Linux"}, "env": {"HOSTNAME": HOST}}},
                **{key: value for key, value in document.items() if key != "traceEvents"}, "traceEvents": events}
    destination.write_bytes(orjson.dumps(document))


@pytest.fixture(scope="module")
def hosts(traces, tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("hosts")
    files = {}
    for name in ("rank0_trace.json", "rank1_trace.json", "merged_trace.json"):
        files[name] = directory / name
        plant_host(traces["clean"].parent / name, files[name])
    return files


def host_pseudonyms(path: Path) -> tuple[set[str], list[str]]:
    """The stand-ins the output has for HOST in each planted place (HOSTNAME, uname.node, the free text and
    the path), and the planted texts (written plainly: ``json.load`` and a walk)."""
    document = json.loads(path.read_bytes())
    system = document["metadata"]["system"]
    names = {system["env"]["HOSTNAME"], system["uname"]["node"]}
    planted = []
    for event in events_of(document):
        args = event.get("args", {})
        if "log" in args and "file" in args:
            planted.append(args["log"])
            names.add(args["log"].removeprefix("rendezvous on ").removesuffix(":29500"))
            names.add(args["file"].split("/")[2])
    return names, planted


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", [*WRITERS, "slice --each-step"])
def test_every_command_pseudonymizes_a_host_name_wherever_it_appears(name, jobs, hosts, tmp_path, monkeypatch):
    """``--pseudonymize hosts`` learns the host names before writing (in pass 1, or a reading of its own)
    and replaces each as a whole word in every string: every output gives HOST, wherever it appears, the
    pseudonym ``redact`` gives it, and holds HOST nowhere."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # -j 2: pass-1 workers (or the parsing child) on this small file
    options = streamtrace.RedactOptions(pseudonymize=("hosts",))
    expected = host_pseudonyms(Path(streamtrace.redact(hosts["rank0_trace.json"], tmp_path / "redacted.json",
                                                       pseudonymize=["hosts"])["output"]))[0]
    assert len(expected) == 1 and next(iter(expected)).startswith("host-")
    out = tmp_path / "out"
    out.mkdir()
    if name == "slice --each-step":
        streamtrace.slice_trace(hosts["rank0_trace.json"], out, each_step=True, compress="none", jobs=jobs,
                                redact=options)
    else:
        WRITERS[name](hosts, out, jobs=jobs, redact=options)
    outputs = sorted(out.iterdir())
    planted = 0
    for output in outputs:
        assert HOST not in output.read_text().lower(), output.name
        names, texts = host_pseudonyms(output)
        assert names == expected, output.name
        planted += len(texts)
    assert planted >= 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_host_names_are_learned_in_the_ordinary_reading_too(jobs, hosts, tmp_path, monkeypatch):
    """An integer beyond 64 bits sends pass 1 to the ordinary reading (with -j 2, a parsing child that flags
    the batches to look at): the host names are learned there as well."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    document = json.loads(hosts["rank0_trace.json"].read_bytes())
    events_of(document)[0].setdefault("args", {})["sequence"] = 2**70
    trace = tmp_path / "bigint.json"
    trace.write_text(json.dumps(document))
    calls = []
    monkeypatch.setattr(parseproc, "parse_in_child", lambda *args, real=parseproc.parse_in_child, **kwargs:
                        calls.append(1) or real(*args, **kwargs))
    out = tmp_path / "c.json"
    streamtrace.compact(trace, out, jobs=jobs, redact=streamtrace.RedactOptions(pseudonymize=("hosts",)))
    assert bool(calls) == (jobs == 2)
    assert HOST not in out.read_text().lower()
    names, planted = host_pseudonyms(out)
    assert len(names) == 1 and next(iter(names)).startswith("host-") and len(planted) == 1
