"""``analyze --ops``'s pass-1 collection from a chunk's projected events
(:func:`...io.projection.projected_events` with ``ops``): the columns
:meth:`.ops.OpsCollector.visit` keeps per event, taken a field at a time
over the whole chunk, from the one decoding the index reads too (no event
dict, no second parse).  Op signatures come as their text and are decoded
once per distinct text.  A chunk whose projection could read differently
from its dicts (:func:`accepts_chunk`) goes the dict way.
"""
from __future__ import annotations

from itertools import repeat
from operator import add, and_, attrgetter
from types import SimpleNamespace

import msgspec
import numpy as np
import orjson

from ...algo.opstables import KERNEL
from ...algo.optree import NO_LINK
from ...io.projection import OP_SIGNATURE_ARGS, attribute
from .ops import (
    GPU_CATS,
    HOST_CATS,
    KEYS,
    LINK_HIGH,
    LINK_LOW,
    METADATA,
    NUMBERS,
    RANK_EVIDENCE,
    RUNTIME,
    OpsCollector,
    _key,
    _number,
    _pid_key,
)

_SIGNATURE_ATTRIBUTES = [attribute(key) for key in OP_SIGNATURE_ARGS]
# a category's code: 0 none of these, then python_func, ac2g, the categories whose own args.rank places an
# event but that the ops keep not ("Kernel"), and those they keep (from _FIRST_WANTED)
_KEPT = [*HOST_CATS, *GPU_CATS]
_CODES = {"python_func": 1, "ac2g": 2, **dict.fromkeys(RANK_EVIDENCE - set(_KEPT), 3),
          **{cat: 4 + at for at, cat in enumerate(_KEPT)}}
_FLOW, _FIRST_HOST, _FIRST_GPU = 2, 4, 4 + len(HOST_CATS)
_FLAGS = np.array([0, 2, 0, 0, *(1 if cat == "cpu_op" else 0 for cat in _KEPT)], dtype=np.int8)  # (runs' flags)
_IS_RUNTIME = np.array([False] * 4 + [HOST_CATS.get(cat) == RUNTIME for cat in _KEPT])
_EVIDENCE = np.array([False, False, False, True, *(cat in RANK_EVIDENCE for cat in _KEPT)])
_PLAIN_IDS = {int, type(None)}
_TEXT_OR_NONE = {str, type(None)}
_FLOATS = {int, float}
_CHUNK_FIELDS = [attrgetter(name) for name in ("ph", "pid")]
_CATEGORY, _NAME = attrgetter("cat"), attrgetter("name")
_EVENT_FIELDS = [attrgetter(name) for name in ("ts", "dur", "name", "pid", "tid", "args")]
_HOST_ARG_NAMES = ("correlation", "External_id", "Sequence_number", "kernel")
_GPU_ARG_NAMES = ("correlation", "External_id", "original_stream", "stream")
_HOST_ARGS, _GPU_ARGS = ([attrgetter(name) for name in names] for names in (_HOST_ARG_NAMES, _GPU_ARG_NAMES))
_NO_ARGS = SimpleNamespace(**dict.fromkeys(_HOST_ARG_NAMES + _GPU_ARG_NAMES))  # (an event without args)
_signature_of = attrgetter(*_SIGNATURE_ATTRIBUTES)
_encode = msgspec.json.encode
_NO_SIGNATURE = _encode((None,) * len(_SIGNATURE_ATTRIBUTES))


def accepts_chunk(events: list) -> bool:
    """Whether the projected events read as their dicts would (:func:`chunk_codes`)."""
    return chunk_codes(events) is not None


def chunk_codes(events: list) -> tuple[list, np.ndarray] | None:
    """Each event's category (None where it is no string) and code (:data:`_CODES`), for
    :func:`collect_chunk`; None where the projected events could read otherwise than their dicts: a
    host or GPU event not named by a string (the dict way names one without a name ""), or a launch
    call whose args hold no correlation (the projection reads an absent one and a null one alike)."""
    raw_cats = list(map(_CATEGORY, events))
    cats = raw_cats if set(map(type, raw_cats)) <= _TEXT_OR_NONE else [
        cat if cat.__class__ is str else None for cat in raw_cats]
    codes = np.array(list(map(_CODES.get, cats, repeat(0))), dtype=np.int8)
    kept = np.flatnonzero(codes >= _FIRST_HOST).tolist()
    if kept and set(map(type, map(_NAME, map(events.__getitem__, kept)))) != {str}:
        return None
    runtime = np.flatnonzero(_IS_RUNTIME[codes]).tolist()
    if [at for at in runtime if (args := events[at].args) is not None and args.correlation is None
            and "launch" in events[at].name.lower()]:
        return None
    return cats, codes


def collect_chunk(c: OpsCollector, events: list, coded: tuple[list, np.ndarray] | None = None) -> None:
    """A chunk's events into the collector's columns (:func:`accepts_chunk` said yes; ``coded``: its
    :func:`chunk_codes`, when at hand), as its ``visit`` of each event's dict would."""
    first_uid = c.events
    c.events += len(events)
    if not events:
        return
    cats, codes = chunk_codes(events) if coded is None else coded
    phases, pids = (list(map(getter, events)) for getter in _CHUNK_FIELDS)
    owns = None  # (each event's own args.rank, -1 none; None: no event has one)
    evidence = np.flatnonzero(_EVIDENCE[codes]).tolist()
    ranks = [None if args is None else args.rank for args in [events[at].args for at in evidence]]
    if set(map(type, ranks)) - {type(None)}:
        owns = [-1] * len(events)
        for at, rank in zip(evidence, ranks):
            if rank.__class__ is int and rank >= 0:
                owns[at] = rank
    starts, numbers = _runs(c, pids, owns)
    run_of = np.repeat(np.array(numbers, dtype=np.int64), np.diff(np.append(starts, len(events))))
    flags = np.bitwise_or.reduceat(_FLAGS[codes], starts)
    run_flags = c.runs.arrays["flags"]
    for at in np.flatnonzero(flags).tolist():
        run_flags[numbers[at]] |= int(flags[at])
    if "M" in phases:
        for at in [at for at, ph in enumerate(phases) if ph == "M"]:
            _metadata(c, events[at])
    flows = np.flatnonzero(codes == _FLOW).tolist()
    if flows:
        _flows(c, events, flows, run_of)
    annotation_cats = {cat for cat in set(cats) if cat is not None and c.is_annotation(cat)}
    if annotation_cats:
        _annotations(c, events, [at for at, cat in enumerate(cats) if cat in annotation_cats], run_of)
    for first, last, take in ((_FIRST_HOST, _FIRST_GPU, _host), (_FIRST_GPU, len(_FLAGS), _gpu)):
        chosen = np.flatnonzero((codes >= first) & (codes < last)).tolist()
        if chosen:
            timed = _timed(c, events, chosen, run_of)
            if timed is not None:
                take(c, events, [cats[at] for at in timed[0]], *timed, first_uid)
    c.spill_if_full()


def _timed(c: OpsCollector, events: list, chosen: list[int], run_of: np.ndarray) -> tuple | None:
    """The events with a numeric ts and dur (the others counted, per run), with their fields: places,
    runs, ts, dur, name numbers and args; None if none."""
    at = chosen
    chosen_events = list(map(events.__getitem__, chosen))
    ts, dur, names, pids, tids, args = (list(map(getter, chosen_events)) for getter in _EVENT_FIELDS)
    ts, dur = _numbers(ts), _numbers(dur)
    if None in ts or None in dur:
        untimed = c.runs.arrays["untimed"]
        timed = []
        for k, (start, length) in enumerate(zip(ts, dur)):
            if start is None or length is None:
                untimed[int(run_of[chosen[k]])] += 1
            else:
                timed.append(k)
        if not timed:
            return None
        at, ts, dur, names, pids, tids, args = ([column[k] for k in timed] for column in (
            chosen, ts, dur, names, pids, tids, args))
    known = c.names
    name_ids = [known.setdefault(name, len(known)) for name in names]
    return at, _places(c, pids, tids), run_of[at].tolist(), ts, dur, name_ids, names, args


def _annotations(c: OpsCollector, events: list, chosen: list[int], run_of: np.ndarray) -> None:
    """The annotations' columns, a field at a time, as :meth:`.ops.OpsCollector.annotate` keeps each
    (one without a numeric ts or dur left out: it encloses nothing)."""
    chosen_events = list(map(events.__getitem__, chosen))
    ts, dur, names = (list(map(getter, chosen_events)) for getter in _EVENT_FIELDS[:3])
    ts, dur, runs = _numbers(ts), _numbers(dur), run_of[chosen].tolist()
    if None in ts or None in dur:
        kept = [k for k, (start, length) in enumerate(zip(ts, dur)) if start is not None and length is not None]
        ts, dur, names, runs = ([column[k] for k in kept] for column in (ts, dur, names, runs))
    _append(c.annotations.arrays, (("ts", ts), ("end", list(map(add, ts, dur))), ("name", list(map(c._name, names))),
                                   ("run", runs)))


def _append(columns: dict, values: tuple) -> None:
    """Each (column name, list) pair's list appended to its typed column (``fromlist``: a third of
    ``extend``'s time on a list)."""
    for name, listed in values:
        columns[name].fromlist(listed)


def _args(args: list, getters: list[attrgetter]) -> list[list]:
    """The members of the args the ``getters`` get, a list per member (None where an event has no args)."""
    if None in args:
        args = [_NO_ARGS if one is None else one for one in args]
    return [list(map(getter, args)) for getter in getters]


def _numbers(values: list) -> list:
    """Times as the dict way reads them (None: absent or no number)."""
    if set(map(type, values)) <= {int, float}:
        return values
    return [value if value.__class__ in NUMBERS else _number(value) for value in values]


def _runs(c: OpsCollector, pids: list, owns: list | None) -> tuple[np.ndarray, list[int]]:
    """The runs (of one pid and own rank) the events are counted in: where each starts in the chunk,
    and its number (the first continues the collector's last run where the key is the same);
    ``owns`` None: no event has its own rank."""
    pid = _int64(pids) if set(map(type, pids)) == {int} else None
    if pid is not None:
        changes = pid[1:] != pid[:-1]
        if owns is not None:
            own = np.array(owns, dtype=np.int64)
            changes |= own[1:] != own[:-1]
        starts = [0, *(np.flatnonzero(changes) + 1).tolist()]
        keys = [(pids[start], -1 if owns is None else owns[start]) for start in starts]
    else:
        owns = [-1] * len(pids) if owns is None else owns
        keyed = list(zip(pids, owns))
        starts = [0, *[at for at, (before, key) in enumerate(zip(keyed, keyed[1:]), 1) if key != before]]
        keys = [keyed[start] for start in starts]
    lengths = np.diff(np.append(starts, len(pids))).tolist()
    runs = c.runs.arrays
    counts = runs["count"]
    numbers = []
    if keys[0] == c._last:  # (the run before goes on)
        counts[c._at] += lengths[0]
        numbers.append(c._at)
        new, lengths_new = keys[1:], lengths[1:]
    else:
        new, lengths_new = keys, lengths
    if new:
        pid_keys = c.pid_keys
        first = len(counts)
        runs["pid"].extend([pid_keys.setdefault(_pid_key(pid), len(pid_keys)) for pid, _ in new])
        runs["own"].extend([own for _, own in new])
        counts.extend(lengths_new)
        runs["flags"].extend([0] * len(new))
        runs["untimed"].extend([0] * len(new))
        numbers.extend(range(first, first + len(new)))
        c._last, c._at = new[-1], first + len(new) - 1
    return np.array(starts, dtype=np.int64), numbers


def _int64(values: list[int]) -> np.ndarray | None:
    """Integers as int64; None where one is beyond it."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def _metadata(c: OpsCollector, event: object) -> None:
    name, args = event.name, event.args
    if name.__class__ is str and name in METADATA and args is not None:
        c.metadata[(_key(event.pid), _key(event.tid), name)] = getattr(args, METADATA[name])


def _places(c: OpsCollector, pids: list, tids: list) -> list[int]:
    """Each event's (pid, tid) number, as the dict way numbers them."""
    places = c.places
    if set(map(type, pids)) | set(map(type, tids)) <= {int, str}:
        keys = list(zip(pids, tids))
    else:
        keys = [(pid, tid) if pid.__class__ in KEYS and tid.__class__ in KEYS else (_key(pid), _key(tid))
                for pid, tid in zip(pids, tids)]
    out = list(map(places.get, keys))
    if None in out:
        out = [places.setdefault(key, len(places)) for key in keys]
    return out


def _links(c: OpsCollector, values: list) -> list[int]:
    """Ids as the collector numbers them (the short way when all are plain integers or None)."""
    kinds = set(map(type, values))
    if kinds <= _PLAIN_IDS:
        present = values if type(None) not in kinds else [value for value in values if value is not None]
        if not present or (LINK_LOW < min(present) and max(present) < LINK_HIGH):
            return values if len(present) == len(values) else [NO_LINK if value is None else value for value in values]
    link = c._link
    return [value if value.__class__ is int and LINK_LOW < value < LINK_HIGH else link(value) for value in values]


def _flows(c: OpsCollector, events: list, flows: list[int], run_of: np.ndarray) -> None:
    starts = [at for at in flows if events[at].ph == "s"]
    ends = [at for at in flows if events[at].ph == "f"]
    for columns, chosen in ((c.flow_starts.arrays, starts), (c.flow_ends.arrays, ends)):
        _append(columns, (("id", _links(c, [events[at].id for at in chosen])), ("run", run_of[chosen].tolist())))
    c.flow_ends.arrays["place"].fromlist(_places(c, [events[at].pid for at in ends], [events[at].tid for at in ends]))


def _host(c: OpsCollector, events: list, cats: list, at: list[int], places: list[int], runs: list[int], ts: list, dur: list,
          name_ids: list[int], names: list, args: list, first_uid: int) -> None:
    kinds = list(map(HOST_CATS.__getitem__, cats))
    corrs, exts, seqs, kernels = _args(args, _HOST_ARGS)
    launch = [-1] * len(kinds)  # (see OpsCollector.host)
    if RUNTIME in kinds:
        named = c._launch_names  # (whether a name is a launch call's, asked once per name)
        for number, name in zip(name_ids, names):
            if number not in named:
                named[number] = "launch" in name.lower()
        launch = [(0 if corr is not None else 1) if kind == RUNTIME and named[number] else -1
                  for kind, number, corr in zip(kinds, name_ids, corrs)]
    _append(c.host.arrays, (
            ("thread", places), ("ts", ts), ("end", list(map(add, ts, dur))), ("kind", kinds), ("name", name_ids),
            ("sig", _signatures(c, args)), ("uid", list(map(first_uid.__add__, at))), ("corr", _links(c, corrs)),
            ("ext", _links(c, exts)), ("seq", _links(c, seqs)),
            ("kernel", [-1] * len(kernels) if kernels.count(None) == len(kernels) else
             [c._name(kernel) if kernel.__class__ is str else -1 for kernel in kernels]), ("run", runs),
            ("launch", launch), ("dur", dur), ("dur_int", _are_ints(dur)),
            ("driver", [cat == "cuda_driver" for cat in cats] if "cuda_driver" in cats else [False] * len(cats))))


def _are_ints(values: list) -> list[bool]:
    """Whether each value is an int (a bool is not), at once where all or none are."""
    kinds = set(map(type, values))
    if int not in kinds or kinds == {int}:
        return [int in kinds] * len(values)
    return [value.__class__ is int for value in values]


def _signatures(c: OpsCollector, args: list) -> list[int]:
    """Each host event's signature number: its argument lists as one text (absent and null alike:
    None either way), decoded once per distinct text."""
    known = c.signature_of_raw
    texts = [_NO_SIGNATURE if one is None else _encode(_signature_of(one)) for one in args]
    out = [known.get(text) for text in texts]
    if None in out:
        for at in [at for at, number in enumerate(out) if number is None]:
            number = known.get(texts[at])
            if number is None:
                number = known[texts[at]] = c._signature(orjson.loads(texts[at]))
            out[at] = number
    return out


def _gpu(c: OpsCollector, events: list, cats: list, at: list[int], places: list[int], runs: list[int], ts: list, dur: list,
         name_ids: list[int], names: list, args: list, first_uid: int) -> None:
    gpu_cats = list(map(GPU_CATS.__getitem__, cats))
    corrs, exts, originals, streams = _args(args, _GPU_ARGS)
    if originals.count(None) != len(originals):
        streams = [stream if original is None else original for original, stream in zip(originals, streams)]
    if not set(map(type, streams)) <= _FLOATS:  # (else as they are: a typed float column takes ints as float() does)
        streams = [float(stream) if stream.__class__ in NUMBERS else np.nan for stream in streams]
    dur_int = _are_ints(dur)
    _append(c.gpu.arrays, (
            ("ts", ts), ("end", list(map(add, ts, dur))), ("dur", dur), ("integral", list(map(and_, _are_ints(ts), dur_int))),
            ("cat", gpu_cats), ("name", name_ids), ("stream", streams), ("dur_int", dur_int), ("place", places),
            ("corr", _links(c, corrs)), ("ext", _links(c, exts)), ("run", runs)))
    wanted = set(filter(c.collectives.wanted, set(names)))  # (a kernel's name asked once per chunk)
    for k in [] if not wanted else [k for k, (cat, name) in enumerate(zip(gpu_cats, names)) if cat == KERNEL and name in wanted]:
        c.collectives.add_projected([events[at[k]]], lambda _pid, slot=runs[k]: slot)
