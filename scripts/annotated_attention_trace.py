"""A small hand-built Kineto trace of vLLM's ``unified_attention_with_output``
under user annotations, for TraceLens's rule of which annotation its
attention model reads (the first by start time that encloses the op, GPU
ones too, ties in event order): one annotation, two nested ones, a GPU one
starting before a CPU one, none (one ending with the op, one starting
after it), two starting together, a native vLLM annotation (no query and
key sums) and one of no query tokens.  scripts/tracelens_perf_reference.py
makes TraceLens's CSVs for it; tests/test_ops.py compares analyze --ops.

    python scripts/annotated_attention_trace.py OUT.json
"""
from __future__ import annotations

import sys

from model_ops_trace import BF16, NONE, Trace, _tensor, dump

OP = "vllm::unified_attention_with_output"
KERNEL = "fmhaSm100aKernel_QkvBfloat16OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext"
FP8 = "c10::Float8_e4m3fn"


def vllm(tokens: int, context: tuple[int, ...], generation: tuple[int, ...]) -> str:
    """vLLM's detailed annotation: (requests, sq, sk, sqsq, sqsk) of the context and generation requests."""
    def sums(values: tuple[int, ...]) -> str:
        return "(sq{}sk{}sqsq{}sqsk{})".format(*values[1:])
    return f"execute_{tokens}_context_{context[0]}{sums(context)}_generation_{generation[0]}{sums(generation)}"


def attention(tokens: int, kv_dtype: str = BF16) -> list[tuple]:
    """``unified_attention_with_output(q [T, 8, 64], k [T, 2, 64], v, out [T, 8, 64], layer, ...)``."""
    return [_tensor([tokens, 8, 64], BF16), _tensor([tokens, 2, 64], kv_dtype), _tensor([tokens, 2, 64], kv_dtype),
            _tensor([tokens, 8, 64], BF16), NONE, NONE, NONE]


# each op: its start, its tokens and K/V dtype, and the annotations around it, in event order:
# (category, name, start, duration); the op lasts 10 us
CASES = [
    (100.0, 64, FP8, [("user_annotation", vllm(64, (2, 64, 192, 2048, 6144), (0, 0, 0, 0, 0)), 95.0, 20.0)]),
    (200.0, 36, BF16, [("user_annotation", vllm(36, (1, 32, 32, 1024, 1024), (4, 4, 4096, 4, 4096)), 190.0, 40.0),
                       ("user_annotation", vllm(36, (1, 32, 96, 1024, 3072), (0, 0, 0, 0, 0)), 198.0, 15.0)]),
    (300.0, 18, BF16, [("user_annotation", "prefill[bs=1 tok=18 ctx=[18] sqsq=324 sqsk=324 sk=18]", 299.0, 20.0),
                       ("gpu_user_annotation", "step[MIXED bs=3 c=1 g=2 c_sq=16 c_sk=48 c_sqsq=256 c_sqsk=768 "
                        "g_sq=2 g_sk=900 g_sqsq=2 g_sqsk=900]", 295.0, 30.0)]),
    (400.0, 8, BF16, [("user_annotation", vllm(8, (1, 8, 8, 64, 64), (0, 0, 0, 0, 0)), 395.0, 15.0),
                      ("gpu_user_annotation", vllm(8, (1, 8, 8, 64, 64), (0, 0, 0, 0, 0)), 401.0, 30.0)]),
    (500.0, 8, BF16, [("user_annotation", "decode[bs=8 tok=8 d=8 sqsq=8 sqsk=16384 sk=16384]", 495.0, 30.0),
                      ("user_annotation", vllm(8, (0, 0, 0, 0, 0), (8, 8, 4096, 8, 4096)), 495.0, 30.0)]),
    (600.0, 888, BF16, [("user_annotation", "execute_context_1(888)_generation_0(0)", 590.0, 30.0)]),
    (700.0, 4, BF16, [("user_annotation", vllm(4, (0, 0, 0, 0, 0), (0, 0, 0, 0, 0)), 690.0, 30.0)]),
]


def build() -> dict:
    trace = Trace()
    for start, tokens, kv_dtype, around in CASES:
        for cat, name, ts, dur in around:
            pid, tid = (0, 7) if cat.startswith("gpu_") else (1, 1)
            trace.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur})
        trace.op(1, start, OP, attention(tokens, kv_dtype), [(KERNEL, 12.0)])
    return {"traceEvents": trace.events}


def write(path: str) -> str:
    return dump(build(), path)


if __name__ == "__main__":
    write(sys.argv[1])
