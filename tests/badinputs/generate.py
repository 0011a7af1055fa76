"""Damaged traces, generated from one small valid Kineto-like trace.

Each :class:`BadInput` is the kind of file users bring from crashed jobs,
half-copied buckets and old profiler versions.  The bytes are built here (not
committed), so every case says in code what damage it carries.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from typing import Callable

import zstandard

KERNEL_INDEX = 3
"""Position of the first GPU kernel in :func:`base_events` (errors name it)."""
CPU_OP_INDEX = 1


def base_events() -> list[dict]:
    """A small coherent trace: metadata, a CPU op, a launch, kernels, an
    annotation and an ac2g flow pair."""
    return [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 101, "ts": 10.5, "dur": 20.25,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": 12.0,
         "dur": 3.0, "args": {"correlation": 42, "External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 20.0, "dur": 5.5,
         "args": {"stream": 7, "correlation": 42, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "relu_kernel", "pid": 0, "tid": 8, "ts": 22.0, "dur": 2.0,
         "args": {"stream": 8, "correlation": 43, "device": 0}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "PP:0F0", "pid": 0, "tid": 7, "ts": 19.0, "dur": 8.0,
         "args": {}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 42, "pid": 100, "tid": 101, "ts": 12.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 42, "pid": 0, "tid": 7, "ts": 20.0, "bp": "e"},
        {"ph": "i", "cat": "user_annotation", "name": "Record Window End", "pid": "", "tid": "", "ts": 40.0,
         "s": "t"},
    ]


def trace_bytes(events: list[dict] | None = None, *, rank: int = 0) -> bytes:
    """The object form as Kineto writes it: some keys before, some after traceEvents."""
    events = base_events() if events is None else events
    head = json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1767189312000000000})[:-1]
    tail = json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceName": f"rank{rank}"})[1:]
    body = ",\n".join(json.dumps(event) for event in events)
    return f'{head}, "traceEvents": [\n{body}\n], {tail}\n'.encode()


def _with(index: int, change: Callable[[dict], None]) -> bytes:
    """The base trace with event ``index`` changed in place."""
    events = base_events()
    change(events[index])
    return trace_bytes(events)


def _without(index: int, key: str) -> bytes:
    return _with(index, lambda event: event.pop(key))


def _replace_once(old: bytes, new: bytes) -> bytes:
    data = trace_bytes()
    assert data.count(old) == 1, old
    return data.replace(old, new)


def _corrupt_gzip_crc() -> bytes:
    data = bytearray(gzip.compress(trace_bytes(), mtime=0))
    data[-8] ^= 0xFF  # the CRC32 of the uncompressed data sits in the last 8 bytes, before ISIZE
    return bytes(data)


def _corrupt_zstd() -> bytes:
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(trace_bytes(base_events() * 50)))
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(byte ^ 0xA5 for byte in data[middle:middle + 4])
    return bytes(data)


def _corrupt_deflate() -> bytes:
    """Damage inside the deflate blocks (isal and zlib report it differently from a bad CRC)."""
    data = bytearray(gzip.compress(trace_bytes(base_events() * 50), mtime=0))
    data[12:20] = b"\xff" * 8
    return bytes(data)


def _cut_half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def nested(levels: int, kind: str) -> str:
    """A JSON value ``levels`` deep: arrays ``[[...]]`` or objects ``{"a":{"a":...}}``."""
    if kind == "arrays":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


DEEP_PLACES = {
    "event": b'"name": "relu_kernel"',  # a field of the kernel event itself
    "args": b'"correlation": 43, "device": 0',  # inside the kernel's args
    "top": b'"schemaVersion": 1',  # a top-level key before traceEvents
    "end": b'"traceName": "rank0"',  # a top-level key after traceEvents
}
DEEP_LEVELS = (10**3, 10**4, 10**5, 10**6)


def _deep(levels: int, kind: str, place: str) -> bytes:
    """The base trace with a value ``levels`` deep added after the anchor of ``place``."""
    anchor = DEEP_PLACES[place]
    return _replace_once(anchor, anchor + f', "deep": {nested(levels, kind)}'.encode())


def _truncated_object() -> bytes:
    data = trace_bytes()
    return data[: data.index(b'"relu_kernel"') + 5]


def _truncated_array() -> bytes:
    events = base_events()
    data = ("[\n" + ",\n".join(json.dumps(event) for event in events)).encode()
    return data[: data.index(b'"relu_kernel"') + 5]


@dataclass(frozen=True)
class BadInput:
    """One damaged file: its name on disk and how to build its bytes."""

    name: str
    damage: str
    build: Callable[[], bytes]
    suffix: str = ".json"

    @property
    def filename(self) -> str:
        return f"{self.name}{self.suffix}"


BAD_INPUTS: tuple[BadInput, ...] = (
    BadInput("truncated_gzip", "gzip stream cut in half", lambda: _cut_half(gzip.compress(trace_bytes())),
             ".json.gz"),
    BadInput("truncated_zstd", "zstd frame cut in half",
             lambda: _cut_half(zstandard.ZstdCompressor().compress(trace_bytes())), ".json.zst"),
    BadInput("corrupt_gzip_crc", "gzip CRC32 does not match the data", _corrupt_gzip_crc, ".json.gz"),
    BadInput("corrupt_zstd", "damaged bytes in a zstd frame with a checksum (as the zstd tool writes)",
             _corrupt_zstd, ".json.zst"),
    BadInput("corrupt_gzip_deflate", "damaged deflate blocks in a gzip stream", _corrupt_deflate, ".json.gz"),
    BadInput("empty", "zero bytes", lambda: b""),
    BadInput("whitespace_only", "only blanks and newlines", lambda: b" \n\t\r\n  \n"),
    BadInput("not_json", "plain text", lambda: b"this is the profiler's log, not a trace\n"),
    BadInput("top_level_number", "a JSON number at top level", lambda: b"42\n"),
    BadInput("top_level_string", "a JSON string at top level", lambda: b'"traceEvents"\n'),
    BadInput("top_level_null", "JSON null at top level", lambda: b"null\n"),
    BadInput("no_trace_events", "an object without traceEvents",
             lambda: b'{"schemaVersion": 1, "deviceProperties": [], "traceName": "x"}\n'),
    BadInput("trace_events_not_list", "traceEvents is an object",
             lambda: b'{"schemaVersion": 1, "traceEvents": {"0": {"ph": "X", "ts": 1}}}\n'),
    BadInput("top_level_value_malformed", "a top-level value before traceEvents with a missing ':'",
             lambda: _replace_once(b'"schemaVersion": 1', b'"schemaVersion": 1, "deviceProperties": [{"id" 7}]')),
    BadInput("top_level_value_control_chars", "a raw newline in a top-level string before traceEvents",
             lambda: _replace_once(b'"schemaVersion": 1', b'"schemaVersion": 1, "note": "two\nlines"')),
    BadInput("trailing_garbage", "text after the top-level object", lambda: trace_bytes() + b"} garbage\n"),
    BadInput("event_not_object", "the third event is a number",
             lambda: trace_bytes(base_events()[:2] + [5] + base_events()[2:])),  # type: ignore[list-item]
    BadInput("key_fields_not_scalar", "a CPU op whose pid is a list and tid an object",
             lambda: _with(CPU_OP_INDEX, lambda e: e.update(pid=[100], tid={"thread": 101}))),
    BadInput("missing_ph", "a kernel and a CPU op without ph",
             lambda: trace_bytes([{k: v for k, v in e.items() if k != "ph" or n not in (CPU_OP_INDEX, KERNEL_INDEX)}
                                  for n, e in enumerate(base_events())])),
    BadInput("missing_ts_gpu_slice", "a kernel without ts", lambda: _without(KERNEL_INDEX, "ts")),
    BadInput("missing_ts_cpu_op", "a CPU op without ts", lambda: _without(CPU_OP_INDEX, "ts")),
    BadInput("missing_pid_gpu_slice", "a kernel without pid", lambda: _without(KERNEL_INDEX, "pid")),
    BadInput("missing_pid_cpu_op", "a CPU op without pid", lambda: _without(CPU_OP_INDEX, "pid")),
    BadInput("ts_string_gpu_slice", 'a kernel with "ts": "20.0"',
             lambda: _with(KERNEL_INDEX, lambda e: e.update(ts="20.0"))),
    BadInput("ts_string_cpu_op", 'a CPU op with "ts": "12.5"',
             lambda: _with(CPU_OP_INDEX, lambda e: e.update(ts="12.5"))),
    BadInput("negative_dur_gpu_slice", "a kernel with dur -5.5",
             lambda: _with(KERNEL_INDEX, lambda e: e.update(dur=-5.5))),
    BadInput("negative_dur_cpu_op", "a CPU op with dur -1",
             lambda: _with(CPU_OP_INDEX, lambda e: e.update(dur=-1))),
    BadInput("nan_literal", "NaN as a dur (Python's json.dumps writes it)",
             lambda: _replace_once(b'"dur": 5.5', b'"dur": NaN')),
    BadInput("infinity_literal", "Infinity as a ts", lambda: _replace_once(b'"ts": 22.0', b'"ts": Infinity')),
    BadInput("int_beyond_64_bits", "NCCL Comms Id 2^64 + 1 and a 30-digit integer on a kernel and an annotation",
             lambda: _replace_once(b'"correlation": 43, "device": 0}',
                                   b'"correlation": 43, "device": 0, "Comms Id": 18446744073709551617, '
                                   b'"seq": 123456789012345678901234567890}').replace(
                 b'"dur": 8.0, "args": {}', b'"dur": 8.0, "args": {"Comms Id": 18446744073709551618}')),
    BadInput("invalid_utf8", "bytes that are not UTF-8 in a kernel name",
             lambda: _replace_once(b'"gemm_kernel"', b'"gemm_\xff\xfe_kernel\xc3"')),
    BadInput("raw_control_chars", "a raw newline, tab and \\x01 inside a name",
             lambda: _replace_once(b'"aten::mm"', b'"aten::mm\n\t\x01(x)"')),
    BadInput("duplicate_keys", "an event with ts twice and a top-level key twice",
             lambda: _replace_once(b'"ts": 22.0', b'"ts": 21.0, "ts": 22.0').replace(
                 b'"schemaVersion": 1', b'"schemaVersion": 1, "schemaVersion": 2')),
    BadInput("string_10mb", "a 10 MB kernel name",
             lambda: _replace_once(b'"relu_kernel"', b'"relu_' + b"x" * (10 << 20) + b'"')),
    *(BadInput(f"deep_{kind}_{place}_1e{len(str(levels)) - 1}", f"{levels:,} nested {kind} in the {place} place",
               lambda levels=levels, kind=kind, place=place: _deep(levels, kind, place))
      for place in ("event", "args", "top") for kind in ("arrays", "objects") for levels in DEEP_LEVELS),
    BadInput("deep_arrays_end_1e6", "1,000,000 nested arrays in a top-level key after traceEvents",
             lambda: _deep(10**6, "arrays", "end")),
    BadInput("truncated_object_form", "object form cut inside an event", _truncated_object),
    BadInput("truncated_array_form", "bare array cut inside an event", _truncated_array),
)

BY_NAME = {case.name: case for case in BAD_INPUTS}


def good_rank1_trace() -> bytes:
    """A small valid second rank, for commands that need two inputs (merge)."""
    return trace_bytes(rank=1)
