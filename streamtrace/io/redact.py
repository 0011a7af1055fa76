"""Redaction on the way out: the hook :class:`~streamtrace.io.writer.TraceWriter`
passes every top-level member and every event text through.

A top-level member is decoded and walked (members are small); it is
re-encoded only when something in it changes, otherwise its raw text goes
out byte for byte.  Event text (compact JSON, one event per line) goes
through the finder's cheap pre-filter; only the lines it flags are decoded,
and only those with a secret are re-encoded.  The writer calls the hook in
output order, in the one process that writes, so pseudonyms are numbered
the same whatever the number of worker processes.
"""
from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable

import orjson

from ..algo.secrets import (
    DEFAULT_SECRETS_RULES_TOML,
    Findings,
    Pseudonyms,
    SecretFinder,
    SecretRules,
    parse_secrets_rules,
    with_patterns,
)
from ..errors import TraceError
from .eventtext import decimal_as_json, dumped_batch, dumps_event, loads_spooled
from .jsonscan import RawMember


@dataclass(frozen=True)
class RedactOptions:
    """What ``--redact`` (and ``redact``) replace: the default rules or a
    TOML file, extra ``NAME=REGEX`` shapes, kinds to pseudonymize."""

    rules: str | None = None
    patterns: tuple[str, ...] = ()
    pseudonymize: tuple[str, ...] = ()


def load_secret_rules(path: str | None, patterns: Iterable[str] = ()) -> SecretRules:
    """The rules in ``path`` (or the defaults) plus ``patterns``."""
    if path is None:
        rules = parse_secrets_rules(DEFAULT_SECRETS_RULES_TOML, "default secret rules")
    else:
        try:
            with open(path, encoding="utf-8") as handle:
                rules = parse_secrets_rules(handle.read(), path)
        except OSError as exc:
            raise TraceError(f"cannot read secret rules: {exc.strerror}", path=path) from None
    return with_patterns(rules, patterns)


def _loads_member(raw: bytes) -> object:
    """A top-level member's value, numbers and NaN-like constants kept as written."""
    return json.loads(raw, parse_float=Decimal, parse_constant=orjson.Fragment)


class Redactor:
    """Finds secrets in what a trace writer writes, and replaces them
    (``replace`` False: only counts them, for ``inspect`` and the screens of
    copies).  A screen with a ``learner`` (:func:`host_learner`) also learns
    the host names in what it scans, into ``findings.hosts``: pass 1 of a
    copy whose redactor pseudonymizes hosts (see :func:`copy_redactor`)."""

    def __init__(self, finder: SecretFinder, *, replace: bool = True, learner: SecretFinder | None = None) -> None:
        self.finder = finder
        self.replace = replace
        self.learner = learner
        self.findings = Findings()

    @classmethod
    def from_options(cls, options: RedactOptions | bool | None) -> Redactor | None:
        """The redactor a command's ``redact`` argument asks for (None: none)."""
        if not options:
            return None
        if options is True:
            options = RedactOptions()
        rules = load_secret_rules(options.rules, options.patterns)
        return cls(SecretFinder(rules, Pseudonyms(options.pseudonymize)))

    def suspicious(self, text: bytes | memoryview, folded: bytes | None = None) -> bool:
        """Does :meth:`scan_batch` need the events ``text`` encodes?  (The
        cheap test; ``folded`` as for :meth:`SecretFinder.suspicious`.)"""
        return self.finder.suspicious(text, folded) or (
            self.learner is not None and self.learner.suspicious(text, folded))

    def members(self, members: Iterable[RawMember]) -> list[RawMember]:
        """Top-level members, those with a secret re-encoded without it."""
        if self.learner is not None:
            learn_hosts_in_members(self.learner, members, self.findings)
        out = []
        for key, raw in members:
            try:
                value = _loads_member(raw)
                new = self.finder.redact(value, [key], self.findings)
            except RecursionError:
                if not self.finder.suspicious(raw):  # nothing a secret could hide in: kept as it is
                    out.append((key, raw))
                    continue
                raise _too_deep(f"top-level key {key!r}") from None
            out.append((key, raw if new is value or not self.replace else dumps_event(new)))
        return out

    def text(self, text: bytes, first_index: int) -> bytes:
        """Events as compact JSON lines (joined by newlines, with or without
        commas), the first being event ``first_index`` of the output."""
        finder = self.finder
        if not finder.suspicious(text):
            return text
        pieces: list[bytes] = []
        done = index = 0
        counted = 0
        for start, stop in finder.suspicious_lines(text):
            index += text.count(b"\n", counted, start)
            counted = start
            event = loads_spooled(text[start:stop])
            try:
                new = finder.redact(event, ["traceEvents", first_index + index], self.findings)
            except RecursionError:
                raise _too_deep(f"event {first_index + index}") from None
            if new is not event and self.replace:
                pieces += (text[done:start], dumps_event(new))
                done = stop
        if not pieces:
            return text
        pieces.append(text[done:])
        return b"".join(pieces)

    def scan_batch(self, text: bytes | memoryview | None, events: list, first_index: int) -> None:
        """Count the secrets in ``events``, which ``text`` encodes in any
        compact form (None: encode them here).  The pre-filter runs on the
        text; the lines of events are made only when it flags something."""
        try:
            if text is None:
                text = batch_text(events)
            if self.finder.suspicious(text):
                self.text(bytes(dumped_batch(events, first_index)[1]), first_index)
        except TraceError:  # an event nested too deeply to encode: walk every event with a stack
            for number, event in enumerate(events):
                self.finder.find(event, ["traceEvents", first_index + number], self.findings)
            text = None
        if self.learner is not None:
            learn_hosts_in_batch(self.learner, text, events, self.findings)

    def summary(self) -> dict:
        summary: dict = {"secrets_redacted": self.findings.by_kind()}
        if self.finder.pseudonyms is not None:
            summary["pseudonymized"] = self.finder.pseudonyms.counts()
        return summary


def batch_text(events: list) -> bytes:
    """The events as one compact JSON array (raises :class:`TraceError` for
    an event nested too deeply to encode)."""
    try:
        return orjson.dumps(events, default=decimal_as_json)
    except TypeError:  # integers beyond 64 bits (or nesting too deep): the careful way
        return bytes(dumped_batch(events, 0)[0])


def _too_deep(what: str) -> TraceError:
    return TraceError(f"{what} is nested too deeply to check for secrets")


def host_learner() -> SecretFinder:
    """A finder that only learns host names (:meth:`SecretFinder.learn_hosts`):
    its pre-filter looks for the host keys alone."""
    return SecretFinder(parse_secrets_rules("", "host names"), Pseudonyms(("hosts",)))


def learn_hosts_in_batch(learner: SecretFinder, text: bytes | memoryview | None, events: list,
                         findings: Findings) -> None:
    """The host names in ``events`` (``text``: their JSON, for the
    learner's pre-filter, or None), into ``findings.hosts``."""
    if text is None or learner.suspicious(text):
        for event in events:
            learner.learn_hosts(event, findings)


def learn_hosts_in_members(learner: SecretFinder, members: Iterable[RawMember], findings: Findings) -> None:
    """The host names under top-level members (a member may itself be named
    ``hostname``), into ``findings.hosts``."""
    for key, raw in members:
        try:
            learner.learn_hosts({key: _loads_member(raw)}, findings)
        except RecursionError:
            raise _too_deep(f"top-level key {key!r}") from None


def restart_redaction(redactor: Redactor | None) -> None:
    """Forget what a failed attempt found: its output is thrown away."""
    if redactor is not None:
        redactor.findings = Findings()
        if redactor.finder.pseudonyms is not None:
            redactor.finder.pseudonyms.forget()


def copy_screen(learn_hosts: bool = False) -> Redactor:
    """What looks at a copy written without ``--redact``: a redactor that
    only counts, with the default rules (those ``inspect`` applies).
    ``learn_hosts``: it also learns the host names of what it scans."""
    return Redactor(SecretFinder(load_secret_rules(None)), replace=False,
                    learner=host_learner() if learn_hosts else None)


def pseudonymizes_hosts(redactor: Redactor | None) -> bool:
    """Does ``redactor`` replace host names?  Then the input's are learned
    first (pass 1, or a reading of its own), and replaced wherever they appear."""
    if redactor is None or not redactor.replace or redactor.finder.pseudonyms is None:
        return False
    return "hosts" in redactor.finder.pseudonyms.kinds


def copy_redactor(redactor: Redactor | None, found: Findings) -> Redactor | None:
    """The redactor a copy is written through, given what the screen of
    pass 1 found in its input (``found``): the command's own, knowing the
    host names learned; else, when the input holds secrets, one that counts
    those the copy holds.  With a clean input the copy is clean too, and
    nothing is looked at."""
    if redactor is None:
        return copy_screen() if found.counts else None
    if found.hosts:
        redactor.finder.know_hosts(found.hosts)
    return redactor


def redaction_summary(redactor: Redactor | None) -> dict:
    """The summary entry of a command that wrote through ``redactor``:
    what it replaced, or (a :func:`copy_screen`) the secrets it copied."""
    if redactor is None:
        return {}
    return {"redaction": redactor.summary()} if redactor.replace else copied_secrets(redactor.findings)


def summed_redaction(summaries: list[dict]) -> dict:
    """The ``redaction`` and ``secrets_copied`` entries of several outputs'
    summaries (a batch's runs, ``merge --per-stage``'s stages) added up,
    for the summary of the whole run: its warning is then given once."""
    entries = [summary["redaction"] for summary in summaries if "redaction" in summary]
    copied = [summary["secrets_copied"] for summary in summaries if "secrets_copied" in summary]
    summed_copies = {"secrets_copied": summed_kinds(copied)} if copied else {}
    if not entries:
        return summed_copies
    summed: dict = {"secrets_redacted": summed_kinds([entry["secrets_redacted"] for entry in entries])}
    if any("pseudonymized" in entry for entry in entries):
        summed["pseudonymized"] = dict(sum((Counter(entry.get("pseudonymized", {})) for entry in entries), Counter()))
    return {"redaction": summed, **summed_copies}


def summed_kinds(entries: list[dict]) -> dict:
    """Secrets by kind (a count and paths) of several outputs, added up."""
    found: dict[str, dict] = {}
    for entry in entries:
        for kind, seen in entry.items():
            mine = found.setdefault(kind, {"count": 0, "paths": []})
            mine["count"] += seen["count"]
            mine["paths"].extend(path for path in seen["paths"] if path not in mine["paths"])
    return dict(sorted(found.items()))


def screen_csv(screen: Redactor, text: bytes, first_row: int) -> None:
    """Count the secrets in CSV rows (``text``, the first being data row
    ``first_row``, numbered from 0): paths are ``rows[ROW][COLUMN]``."""
    if not screen.finder.suspicious(text):
        return
    for number, row in enumerate(csv.reader(io.StringIO(text.decode("utf-8", "replace")))):
        screen.finder.find(row, ["rows", first_row + number], screen.findings)


def copied_secrets(findings: Findings) -> dict:
    """``secrets_copied`` (by kind: a count and the first JSON paths, never
    a value) when an output holds secrets; :func:`copied_secrets_warning`
    is then added to the summary's warnings."""
    return {"secrets_copied": findings.by_kind()} if findings.counts else {}


def copied_secrets_warning(copied: dict) -> str:
    """The one line saying a copy holds secrets, of which kinds, and what to do."""
    kinds = ", ".join(f"{kind} {entry['count']:,}" for kind, entry in copied.items())
    total = sum(entry["count"] for entry in copied.values())
    return (f"the output holds {total:,} secret(s) copied from the input ({kinds}); "
            f"run again with --redact to replace them")
