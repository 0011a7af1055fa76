"""Credential detection and pseudonyms (pure): which parts of a string, or
of a decoded JSON value, are secrets, and what replaces them.

Most of a trace holds no secret, so the cost that matters is the one of
clean text.  :meth:`SecretFinder.suspicious` looks at JSON text (many events
at once), folded (:data:`FOLDED`), for short literal hints every match
contains, all of them in one pass of an Aho-Corasick automaton in compiled
code (``ahocorasick_rs``, a fifth of a nanosecond per byte).  Where that
library has no wheel, a pure-Python pre-filter does the same: the text is
cut at ``}``; events of one kind differ mostly in their numbers, so the
pieces repeat, a piece already found clean is not looked at again, and the
hints are searched in a small fraction of the bytes (about 2 ns per byte).
Only text that holds a hint is decoded and walked string by string with the
exact regular expressions.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable

try:  # compiled multi-pattern search: wheels for CPython on x86-64 and arm64 (Linux, macOS, Windows)
    from ahocorasick_rs import BytesAhoCorasick, MatchKind
except ImportError:  # pragma: no cover - elsewhere the pure-Python pre-filter (SecretFinder._hinted_in_pieces)
    BytesAhoCorasick = None

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from ..errors import TraceError

DEFAULT_SECRETS_RULES_TOML = r"""# streamtrace secret rules: what `inspect` reports and `redact` / `--redact` replace.
#
# [secret_keys]: a string under a key whose lower-cased name contains one of
#   `key_contains` is a secret as a whole (at any depth below that key), unless
#   it is shorter than `min_length` characters or, lower-cased, one of
#   `benign_values`.
# [[shapes]]: credential shapes searched inside every string, as Python regular
#   expressions; only the matched part is replaced.  `hints`: lower-case texts
#   without digits, one of which every match contains: the pre-filter looks for
#   them before any string is decoded.  A shape without hints is searched in
#   the text of every event (slower).  `only_with`: report the shape only in a
#   string where a shape of that kind is found too.

[secret_keys]
kind = "secret-named-key"
key_contains = ["token", "secret", "password", "passwd", "api_key", "apikey", "api-key",
                "access_key", "accesskey", "access-key", "credential"]
benign_values = ["0", "1", "true", "false", "none", "null", "yes", "no", "unset"]
min_length = 8

[[shapes]]
kind = "huggingface-token"
regex = 'hf_[A-Za-z0-9]{30,}'
hints = ["hf_"]

[[shapes]]
kind = "github-token"
regex = 'gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}'
hints = ["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"]

[[shapes]]
kind = "aws-access-key-id"
regex = '(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])'
hints = ["akia", "asia"]

[[shapes]]
kind = "aws-secret-access-key"
regex = '(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])'
hints = ["akia", "asia"]
only_with = "aws-access-key-id"

[[shapes]]
kind = "openai-key"
regex = '(?<![A-Za-z0-9_-])sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}'
hints = ["sk-"]

[[shapes]]
kind = "slack-token"
regex = 'xox[abposr]-[A-Za-z0-9-]{10,}'
hints = ["xox"]

[[shapes]]
kind = "google-api-key"
regex = 'AIza[0-9A-Za-z_-]{35}'
hints = ["aiza"]

[[shapes]]
kind = "jwt"
regex = 'eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*'
hints = ["eyj"]

[[shapes]]
kind = "private-key"
regex = '-----BEGIN[A-Z ]*PRIVATE KEY-----(?s:.*?)(?:-----END[A-Z ]*PRIVATE KEY-----|\Z)'
hints = ["-----begin"]

[[shapes]]
kind = "url-password"
regex = '(?<=://)[^\s/:@"]+:[^\s/@"]+(?=@)'
hints = ["://"]
"""

MARKER = "<redacted:{}>"
_MARKER = re.compile(r"<redacted:[A-Za-z0-9_.-]+>")
_PSEUDONYM = re.compile(r"(?:host|user|path)-[0-9]+")
FOLDED = bytes(57 if 48 <= byte <= 57 else byte + 32 if 65 <= byte <= 90 else byte for byte in range(256))
"""A ``bytes.translate`` table: ASCII letters lower-cased and every digit as
``9``, other bytes kept.  Hints hold no digit, so the folded text holds a
hint where the lower-cased text does, and events that differ only in their
numbers' digits fold alike; the same copy shows the number shapes the
projection's exactness test looks for (:func:`streamtrace.io.projection.read_alike`),
so a chunk is translated once for both."""


def fold(text: bytes) -> bytes:
    """``text`` translated by :data:`FOLDED`: the one copy of a chunk that the
    screen (:meth:`SecretFinder.suspicious`) and the exactness tests of
    :mod:`streamtrace.io.projection` and :mod:`streamtrace.io.reader` read."""
    return text.translate(FOLDED)

_ANCHORS = re.compile(r"(?<!\\)[$^]|\\[AZbB]")
PSEUDONYM_KINDS = ("hosts", "users", "paths")
MAX_PSEUDONYMS = 1_000_000  # distinct values per kind: bounds memory on hostile input
MAX_PATHS = 100  # JSON paths kept per kind in a summary (all are counted)
SCREEN_WINDOW = 1 << 16  # bytes of folded text split at once by the screen's pre-filter
CLEAN_CACHE_BYTES = 32 << 20  # pieces remembered as clean, at most (then forgotten, and relearned)

_HOST_KEYS = frozenset({"host", "hostname", "host_name", "nodename", "node_name", "master_addr", "hostaddr"})
_USER_KEYS = frozenset({"user", "username", "user_name", "logname"})
_HOME_USER = re.compile(r"(?<=/home/)[^/\s\"'():,]+|(?<=/Users/)[^/\s\"'():,]+|(?<=\\Users\\)[^\\\s\"'():,]+")
_HOME_PATH = re.compile(r"(?:/home|/Users|/root)/[^\s\"'():,]*/")
_URL_HOST = re.compile(r"(?<=://)(?:[^\s/@\"]*@)?([^\s/:@\"\[\]]+)")
_PSEUDONYM_HINTS = {
    "hosts": ("host", "node_name", "nodename", "master_addr", "://"),
    "users": ("/home/", "/users/", "\\users", "\"user", "\"logname"),
    "paths": ("/home/", "/users/", "/root/"),
}


@dataclass(frozen=True)
class Shape:
    kind: str
    regex: re.Pattern[str]
    hints: tuple[str, ...]
    only_with: str | None = None


@dataclass(frozen=True)
class SecretRules:
    """What counts as a secret (parsed from TOML, plus ``--pattern`` shapes)."""

    key_kind: str
    key_contains: tuple[str, ...]
    benign_values: frozenset[str]
    min_length: int
    shapes: tuple[Shape, ...]


def parse_secrets_rules(text: str, source: str = "secret rules") -> SecretRules:
    """Rules from TOML text; a bad file is a one-line :class:`TraceError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TraceError(f"not valid TOML: {exc}", path=source) from None
    keys = data.get("secret_keys", {})
    if not isinstance(keys, dict) or set(keys) - {"kind", "key_contains", "benign_values", "min_length"}:
        raise TraceError("[secret_keys] allows kind, key_contains, benign_values, min_length", path=source)
    contains, benign = keys.get("key_contains", []), keys.get("benign_values", [])
    if not _strings(contains) or not _strings(benign):
        raise TraceError("[secret_keys] key_contains and benign_values must be lists of strings", path=source)
    min_length = keys.get("min_length", 8)
    if type(min_length) is not int or min_length < 0:
        raise TraceError("[secret_keys] min_length must be a non-negative integer", path=source)
    shapes = []
    for number, shape in enumerate(data.get("shapes", []), 1):
        if not isinstance(shape, dict) or set(shape) - {"kind", "regex", "hints", "only_with"}:
            raise TraceError(f"shape {number}: allowed keys are kind, regex, hints, only_with", path=source)
        hints = shape.get("hints", [])
        if not _strings(hints) or any(not hint or _unusable_hint(hint) for hint in hints):
            raise TraceError(f"shape {number}: hints must be non-empty strings without digits or braces",
                             path=source)
        only_with = shape.get("only_with")
        if only_with is not None and not isinstance(only_with, str):
            raise TraceError(f"shape {number}: only_with must be a kind", path=source)
        shapes.append(make_shape(shape.get("kind"), shape.get("regex"), tuple(hint.lower() for hint in hints),
                                 only_with, f"{source}: shape {number}"))
    return SecretRules(str(keys.get("kind", "secret-named-key")), tuple(word.lower() for word in contains),
                       frozenset(value.lower() for value in benign), min_length, tuple(shapes))


def make_shape(kind: object, regex: object, hints: tuple[str, ...] = (), only_with: str | None = None,
               where: str = "--pattern") -> Shape:
    """A checked shape: a kind usable in a marker, a regex that compiles."""
    if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", kind):
        raise TraceError(f"{where}: kind must be letters, digits, '_', '.' or '-', got {kind!r}")
    if not isinstance(regex, str) or not regex:
        raise TraceError(f"{where}: regex must be a non-empty string")
    try:
        return Shape(kind, re.compile(regex), hints, only_with)
    except re.error as exc:
        raise TraceError(f"{where}: bad regular expression {regex!r}: {exc}") from None


def with_patterns(rules: SecretRules, patterns: Iterable[str]) -> SecretRules:
    """``rules`` plus ``NAME=REGEX`` shapes from the command line."""
    extra = []
    for pattern in patterns:
        name, equals, regex = pattern.partition("=")
        if not equals:
            raise TraceError(f"--pattern {pattern!r}: expected NAME=REGEX")
        extra.append(make_shape(name, regex))
    return SecretRules(rules.key_kind, rules.key_contains, rules.benign_values, rules.min_length,
                       rules.shapes + tuple(extra))


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _unusable_hint(hint: str) -> bool:
    """Digits are folded to ``9`` and ``}`` cuts the text before hints are searched."""
    return any(char.isdigit() or char == "}" for char in hint)


def format_path(parts: Iterable[object]) -> str:
    """``metadata.env.HF_TOKEN``, ``traceEvents[12].args.stack[3]``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass
class Findings:
    """Secrets found: counted by kind, the first paths of each kind kept."""

    counts: dict[str, int] = field(default_factory=dict)
    paths: dict[str, list[tuple]] = field(default_factory=dict)  # as path parts, formatted in by_kind
    hosts: dict[str, str] = field(default_factory=dict)  # host names learned (:meth:`SecretFinder.learn_hosts`)

    def add(self, kind: str, path: list[object]) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        kept = self.paths.setdefault(kind, [])
        if len(kept) < MAX_PATHS:
            kept.append(tuple(path))

    def absorb(self, other: "Findings", first_event: int) -> None:
        """Add what was found in a part of the events whose first is event
        ``first_event`` (the part numbers its events from 0)."""
        for kind, count in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + count
            kept = self.paths.setdefault(kind, [])
            for path in other.paths[kind][:MAX_PATHS - len(kept)]:
                if path[:1] == ("traceEvents",) and len(path) > 1:
                    path = (path[0], path[1] + first_event, *path[2:])
                kept.append(path)
        for lowered, host in other.hosts.items():
            self.learn_host(lowered, host)

    def learn_host(self, lowered: str, host: str) -> None:
        """Remember a host name (lower-cased, and as first seen)."""
        if lowered not in self.hosts:
            if len(self.hosts) >= MAX_PSEUDONYMS:
                raise TraceError(f"more than {MAX_PSEUDONYMS} distinct hosts to pseudonymize")
            self.hosts[lowered] = host

    def by_kind(self) -> dict[str, dict]:
        return {kind: {"count": self.counts[kind], "paths": [format_path(path) for path in self.paths[kind]]}
                for kind in sorted(self.counts)}


class Pseudonyms:
    """Stable stand-ins (``host-1``, ``user-2``, ``path-3``), numbered in the
    order values are first met, so one writer's output is the same whatever
    produced its events."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        unknown = self.kinds - set(PSEUDONYM_KINDS)
        if unknown:
            raise TraceError(f"--pseudonymize: unknown kind {sorted(unknown)[0]!r}; choose from "
                             f"{', '.join(PSEUDONYM_KINDS)}")
        self.names: dict[str, dict[str, str]] = {kind: {} for kind in self.kinds}

    def of(self, kind: str, value: str) -> str:
        if _PSEUDONYM.fullmatch(value):
            return value
        names = self.names[kind]
        name = names.get(value)
        if name is None:
            if len(names) >= MAX_PSEUDONYMS:
                raise TraceError(f"more than {MAX_PSEUDONYMS} distinct {kind} to pseudonymize")
            name = names[value] = f"{kind[:-1]}-{len(names) + 1}"
        return name

    def forget(self) -> None:
        self.names = {kind: {} for kind in self.kinds}

    def counts(self) -> dict[str, int]:
        return {kind: len(self.names[kind]) for kind in sorted(self.kinds)}


class SecretFinder:
    """Finds (and replaces) secrets per :class:`SecretRules`, and optionally
    pseudonymizes hosts, users and paths."""

    def __init__(self, rules: SecretRules, pseudonyms: Pseudonyms | None = None) -> None:
        self.rules = rules
        self.pseudonyms = pseudonyms if pseudonyms is not None and pseudonyms.kinds else None
        hints = {hint for shape in rules.shapes for hint in shape.hints} | set(rules.key_contains)
        for kind in self.pseudonyms.kinds if self.pseudonyms else ():
            hints.update(_PSEUDONYM_HINTS[kind])
        self._needles = tuple(sorted(hint.encode() for hint in hints))
        self._clean: set[bytes] = set()
        self._clean_bytes = 0
        self._locate = re.compile(b"|".join(re.escape(needle) for needle in self._needles)) if hints else None
        self._hosts: dict[str, str] = {}  # host names known (lower-cased) -> as first seen
        self._host_token: re.Pattern[str] | None = None
        unhinted = [shape.regex for shape in rules.shapes if not shape.hints]
        self._unhinted = tuple(unhinted)
        self.every_event = any(_ANCHORS.search(regex.pattern) for regex in unhinted)
        self._secret_key = re.compile("|".join(map(re.escape, rules.key_contains))).search \
            if rules.key_contains else (lambda key: None)

    # -- the pre-filter, on compact JSON text --------------------------------

    def suspicious(self, text: bytes | memoryview, folded: bytes | None = None) -> bool:
        """Might ``text`` (compact JSON of events) hold a secret, or something
        to pseudonymize?  False only when no string in it can.  ``folded``:
        ``text`` translated by :data:`FOLDED`, when the caller has it."""
        if self.every_event:
            return True
        if self._needles and self._hinted(fold(bytes(text)) if folded is None else folded):
            return True
        return bool(self._unhinted) and self._unhinted_hit(bytes(text))

    def _hinted(self, folded: bytes) -> bool:
        """Does a hint occur in ``folded`` text?  (No hint holds a digit or ``}``.)"""
        if BytesAhoCorasick is not None:
            return bool(_automaton(self._needles).find_matches_as_indexes(folded))
        return self._hinted_in_pieces(folded)

    def _hinted_in_pieces(self, folded: bytes) -> bool:
        """:meth:`_hinted` without the compiled automaton.  Looked at a window
        of :data:`SCREEN_WINDOW` bytes at a time, each cut at a ``}``: the
        pieces are those of the whole text, and the copies splitting makes
        stay in the processor's cache instead of evicting what the command
        reads next (a whole chunk at once slowed the command's own decoding
        by more than the screen's own time)."""
        start, size = 0, len(folded)
        while start < size:
            end = folded.find(b"}", start + SCREEN_WINDOW) if start + SCREEN_WINDOW < size else -1
            end = size if end < 0 else end
            if self._hinted_window(folded[start:end]):
                return True
            start = end + 1
        return False

    def _hinted_window(self, folded: bytes) -> bool:
        new = set(folded.split(b"}")).difference(self._clean)
        if not new:
            return False
        distinct = b"}".join(new)
        if any(needle in distinct for needle in self._needles):
            return True
        if self._clean_bytes > CLEAN_CACHE_BYTES:
            self._clean.clear()
            self._clean_bytes = 0
        self._clean.update(new)
        self._clean_bytes += len(distinct)
        return False

    def suspicious_lines(self, text: bytes) -> list[tuple[int, int]]:
        """(start, end) of every line of ``text`` (events joined by newlines,
        perhaps after commas) that may hold a secret, in order; call only when
        :meth:`suspicious` said so."""
        if self.every_event:
            return _line_spans(text, _line_starts(text))
        starts: list[int] = []
        if self._locate is not None:
            starts.extend(match.start() for match in self._locate.finditer(text.lower()))
        if self._unhinted:
            starts.extend(self._unhinted_positions(text))
        return _line_spans(text, sorted(starts))

    def _unhinted_hit(self, text: bytes) -> bool:
        decoded = text.decode("utf-8", "replace")
        return b"\\" in text or any(regex.search(decoded) for regex in self._unhinted)

    def _unhinted_positions(self, text: bytes) -> list[int]:
        """Lines an unhinted shape matches in their JSON text, and lines with
        an escape (where the JSON text differs from the string)."""
        positions = []
        at = 0
        for line in text.split(b"\n"):
            if b"\\" in line or any(regex.search(line.decode("utf-8", "replace")) for regex in self._unhinted):
                positions.append(at)
            at += len(line) + 1
        return positions

    # -- the exact check, on decoded values ----------------------------------

    def redact(self, value: object, path: list[object], findings: Findings) -> object:
        """``value`` with every secret replaced by ``<redacted:KIND>`` (and
        pseudonyms in place); the same object when nothing changed.
        ``path`` is where ``value`` is (extended in place while walking)."""
        return self._walk(value, path, findings, None)

    def _walk(self, value: object, path: list[object], findings: Findings, key_kind: str | None) -> object:
        kind = type(value)
        if kind is str:
            return self._string(value, path, findings, key_kind)
        if kind is dict:
            changed = None
            for key, item in value.items():
                path.append(key)
                new = self._walk(item, path, findings, key_kind or self._key_kind(key))
                path.pop()
                if new is not item:
                    if changed is None:
                        changed = dict(value)
                    changed[key] = new
            return value if changed is None else changed
        if kind is list:
            changed_list = None
            for position, item in enumerate(value):
                path.append(position)
                new = self._walk(item, path, findings, key_kind)
                path.pop()
                if new is not item:
                    if changed_list is None:
                        changed_list = list(value)
                    changed_list[position] = new
            return value if changed_list is None else changed_list
        return value

    def _key_kind(self, key: str) -> str | None:
        """What a key says of the strings below it: "secret", "hosts", "users" or nothing."""
        lowered = key.lower()
        if self._secret_key(lowered):
            return "secret"
        if self.pseudonyms is not None:
            if lowered in _HOST_KEYS and "hosts" in self.pseudonyms.kinds:
                return "hosts"
            if lowered in _USER_KEYS and "users" in self.pseudonyms.kinds:
                return "users"
        return None

    def learn_hosts(self, value: object, findings: Findings) -> None:
        """Remember in ``findings`` the strings under host keys (``HOSTNAME``,
        ``host``, ``master_addr``...) anywhere in ``value``: once a value is
        known to be a host name, :meth:`know_hosts` has it pseudonymized
        wherever it appears (``metadata.system.uname.node`` too)."""
        stack: list[tuple[object, bool]] = [(value, False)]
        while stack:
            item, under_host = stack.pop()
            kind = type(item)
            if kind is str:
                if under_host and item and not _MARKER.fullmatch(item) and not _PSEUDONYM.fullmatch(item):
                    findings.learn_host(item.lower(), item)
            elif kind is dict:
                stack.extend((child, under_host or key.lower() in _HOST_KEYS) for key, child in item.items())
            elif kind is list:
                stack.extend((child, under_host) for child in item)

    def know_hosts(self, hosts: dict[str, str]) -> None:
        """Pseudonymize, as whole words in every string, the host names
        learned (:meth:`learn_hosts`: lower-cased -> as first seen); the
        pre-filter then looks for them too (folded: digits as ``9``, so a
        hint may hold digits)."""
        self._hosts = dict(hosts)
        if not self._hosts or self.pseudonyms is None or "hosts" not in self.pseudonyms.kinds:
            return
        names = sorted(self._hosts, key=len, reverse=True)  # the longest first where one holds another
        self._host_token = re.compile(r"(?<![\w.-])(?:" + "|".join(map(re.escape, names)) + r")(?![\w-])",
                                      re.IGNORECASE)
        lowered = {name.encode().lower() for name in names}
        self._needles = tuple(sorted(set(self._needles) | {fold(name) for name in lowered}))
        self._locate = re.compile(b"|".join(re.escape(needle) for needle in sorted(
            {needle for needle in self._needles if b"9" not in needle} | lowered)))  # (on lower-cased text)
        self._clean.clear()
        self._clean_bytes = 0

    def find(self, value: object, path: list[object], findings: Findings) -> None:
        """Record the secrets in ``value`` without replacing them, walking
        with a stack instead of recursion: for values nested deeper than
        Python's recursion allows (``inspect`` reads events of any depth)."""
        stack: list[tuple[object, tuple | None, str | None]] = [(value, (None, path), None)]
        while stack:
            item, where, key_kind = stack.pop()
            kind = type(item)
            if kind is str:
                self._string(item, _unlinked(where), findings, key_kind)
            elif kind is dict:
                stack.extend((child, (where, key), key_kind or self._key_kind(key))
                             for key, child in reversed(item.items()))
            elif kind is list:
                stack.extend((child, (where, n), key_kind) for n, child in reversed(list(enumerate(item))))

    def _string(self, text: str, path: list[object], findings: Findings, key_kind: str | None) -> str:
        if key_kind == "secret" and not self._benign(text):
            findings.add(self.rules.key_kind, path)
            return MARKER.format(self.rules.key_kind)
        if key_kind in ("hosts", "users") and text and not _MARKER.fullmatch(text):
            return self.pseudonyms.of(key_kind, text)
        spans = self._shape_spans(text)
        for kind in (spans and dict.fromkeys(kind for _, _, kind in spans)) or ():
            findings.add(kind, path)
        if spans:
            text = _replace(text, [(start, end, MARKER.format(kind)) for start, end, kind in spans])
        if self.pseudonyms is not None:
            text = self._pseudonymize(text)
        return text

    def _benign(self, text: str) -> bool:
        return (len(text) < self.rules.min_length or text.lower() in self.rules.benign_values
                or _MARKER.fullmatch(text) is not None)

    def _shape_spans(self, text: str) -> list[tuple[int, int, str]]:
        """Non-overlapping (start, end, kind) of the shapes in ``text``; where
        matches overlap, the earlier (then the longer) wins.  A match touching
        a marker of an earlier redaction is none (redacting is idempotent)."""
        found: list[tuple[int, int, str]] = []
        kinds: set[str] = set()
        markers = [match.span() for match in _MARKER.finditer(text)] if "<redacted:" in text else []
        for shape in self.rules.shapes:
            if shape.only_with is not None and shape.only_with not in kinds:
                continue
            for match in shape.regex.finditer(text):
                start, end = match.span()
                if end > start and not any(start < stop and end > begin for begin, stop in markers):
                    found.append((start, end, shape.kind))
                    kinds.add(shape.kind)
        if len(found) < 2:
            return found
        found.sort(key=lambda span: (span[0], -span[1]))
        kept = [found[0]]
        for span in found[1:]:
            if span[0] >= kept[-1][1]:
                kept.append(span)
        return kept

    def _pseudonymize(self, text: str) -> str:
        pseudonyms = self.pseudonyms
        kinds = pseudonyms.kinds
        if "paths" in kinds and "/" in text:
            text = _HOME_PATH.sub(lambda match: "/" + pseudonyms.of("paths", match.group()[:-1]) + "/", text)
        if "users" in kinds and ("/" in text or "\\" in text):
            text = _HOME_USER.sub(lambda match: pseudonyms.of("users", match.group()), text)
        if "hosts" in kinds and "://" in text:
            text = _sub_group(_URL_HOST, text, lambda host: pseudonyms.of("hosts", host))
        if self._host_token is not None:
            text = self._host_token.sub(lambda match: pseudonyms.of("hosts", self._hosts[match.group().lower()]), text)
        return text


@lru_cache(maxsize=16)
def _automaton(needles: tuple[bytes, ...]) -> "BytesAhoCorasick":
    """One automaton per set of hints, built where it is used (a finder sent
    to a worker or a Dask task carries only its hints).  Leftmost-first
    matching is the kind the library speeds up with its SIMD pre-filter;
    which hint is reported does not matter, only whether one occurs."""
    return BytesAhoCorasick(list(needles), matchkind=MatchKind.LeftmostFirst)


def _unlinked(where: tuple) -> list[object]:
    """A path kept as (parent, part) links, as a list (the root link holds the starting path)."""
    parts: list[object] = []
    while where[0] is not None:
        where, part = where
        parts.append(part)
    parts.extend(reversed(where[1]))
    return parts[::-1]


def _replace(text: str, spans: list[tuple[int, int, str]]) -> str:
    parts, at = [], 0
    for start, end, new in spans:
        parts.append(text[at:start])
        parts.append(new)
        at = end
    parts.append(text[at:])
    return "".join(parts)


def _sub_group(regex: re.Pattern[str], text: str, rename: Callable[[str], str]) -> str:
    """Replace group 1 of every match of ``regex`` in ``text``."""
    spans = [(match.start(1), match.end(1), rename(match.group(1))) for match in regex.finditer(text)
             if not _MARKER.fullmatch(match.group(1))]
    return _replace(text, spans) if spans else text


def _line_starts(text: bytes) -> Iterable[int]:
    at = 0
    while at < len(text):
        yield at
        at = text.find(b"\n", at) + 1 or len(text)


def _line_spans(text: bytes, positions: Iterable[int]) -> list[tuple[int, int]]:
    """The lines of ``text`` holding the (sorted) ``positions``.  A line
    excludes the comma that may end it."""
    spans = []
    end = -1
    for position in positions:
        if position < end:
            continue
        start = text.rfind(b"\n", 0, position) + 1
        end = text.find(b"\n", position)
        if end < 0:
            end = len(text)
        stop = end - 1 if end > start and text[end - 1] == 0x2C else end
        spans.append((start, stop))
        end += 1
    return spans
