"""TraceLens's models of mixture-of-experts ops (its extension models):
grouped GEMMs (sheet ``GroupedGEMM``), fused and two-stage expert GEMMs
(``MoE_fused``, ``MoE_unfused``), token dispatch and combine
(``MoE_comm``) and the router's top-k and sort kernels (``MoE_aux``).

Grouped GEMM: X [M, K] times G weights [K, N]: FLOPs 2·M·K·N, bytes
(M·K + G·K·N) at the input's size and M·N at the output's (the second
input's dtype).  Expert GEMMs of M tokens, hidden size K, intermediate
size N, top-k experts per token: FLOPs 2·M·K·N·topk per projection (twice
for a gated up projection), bytes the tokens, the weights of the experts a
uniform routing would touch (E·(1 - ((E - topk)/E)^M)) and the output.
Dispatch and combine: no FLOPs, the tokens' bytes, forward and backward.
Router and sort kernels: one FLOP per element of the largest operand,
every operand's bytes.  docs/analyze.md states each model's inputs and
TraceLens's accidents.
"""
from __future__ import annotations

from math import prod

from .perfmodel import PRECISION, broadcast, size_of, spec_of

# TraceLens's MoE table of bytes per element: by the dtype name as written (case matters), with defaults per use
MOE_BYTES = {
    "Float8_e4m3fn": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2": 1, "Float8_e5m2fnuz": 1, "FP8": 1, "FP4": 0.5,
    "BFloat16": 2, "Float16": 2, "Half": 2, "Float32": 4, "Float": 4, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float4_e2m1fn_x2": 0.5, "c10::Half": 2, "c10::Float": 4,
}
Result = tuple[dict, "int | float", "int | float | None", str]


def _dtype_sizes(dtype_list: list) -> tuple[object, object]:
    """A grouped GEMM's input and output sizes: the first dtype's, and the second's (else the first's)."""
    dtype_in = dtype_list[0] if dtype_list else None
    dtype_out = dtype_list[1] if len(dtype_list) > 1 else dtype_in
    size_in = size_of(dtype_in) if dtype_in is not None else None
    size_out = size_of(dtype_out) if dtype_out is not None else size_in
    return size_in, size_out


def _positive_ints(values: object) -> bool:
    return all(isinstance(v, int) and v > 0 for v in values)  # type: ignore[union-attr]


def _pairs(shapes: object) -> list[tuple[int, int]]:
    """Every (rows, cols) pair of positive ints in nested lists (a tensor list's shapes)."""
    found: list[tuple[int, int]] = []
    if isinstance(shapes, (list, tuple)):
        if len(shapes) == 2 and _positive_ints(shapes):
            found.append((shapes[0], shapes[1]))
        else:
            for item in shapes:
                found += _pairs(item)
    return found


def _zipped(dims: object) -> tuple[list, list] | None:
    """The per-group shapes of the inputs' tensor lists, as many of each, or None."""
    if not (isinstance(dims, (list, tuple)) and len(dims) >= 2 and isinstance(dims[0], (list, tuple))
            and isinstance(dims[1], (list, tuple))):
        return None
    lhs, rhs = _pairs(dims[0]), _pairs(dims[1])
    return (lhs, rhs) if lhs and rhs and len(lhs) == len(rhs) else None


def _fixed_k_dims(dims: object) -> tuple[int, int, int, int] | None:
    """M, K, N, G of a fixed-K grouped GEMM: X [M, K] and W [G, K, N] or [G, N, K], else per-group lists."""
    if isinstance(dims, (list, tuple)) and len(dims) >= 2:
        a, b = dims[0], dims[1]
        if (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) >= 2 and len(b) == 3
                and _positive_ints(a[:2]) and _positive_ints(b) and a[1] in (b[1], b[2])):
            m, k = int(a[0]), int(a[1])
            return m, k, int(b[2] if b[1] == k else b[1]), int(b[0])
    zipped = _zipped(dims)
    if zipped is None:
        return None
    lhs, rhs = zipped
    k, n = lhs[0][1], rhs[0][1]
    if not all(a[1] == k and b[0] == k and b[1] == n for a, b in zip(lhs, rhs)):
        return None
    return sum(a[0] for a in lhs), k, n, len(lhs)


def _grouped_spec(args: dict) -> str:
    """TraceLens reads the first dtype afresh (``[None]`` when the key is absent)."""
    return spec_of("matrix", args.get("Input type", [None])[0])


def grouped_gemm(name: str, args: dict, kernels: list[str]) -> Result:
    """``primus_turbo_grouped_gemm`` (raises on shapes it cannot read, or a dtype with no size: no row)."""
    dims = _fixed_k_dims(args.get("Input Dims", []))
    if dims is None:
        raise ValueError(f"grouped GEMM shapes not understood: {args.get('Input Dims')}")
    m, k, n, g = dims
    size_in, size_out = _dtype_sizes(args.get("Input type", []))
    params = {"M": m, "K": k, "N": n, "G": g, "bpe_in": size_in, "bpe_out": size_out}
    moved = (m * k + g * k * n) * size_in + m * n * size_out  # type: ignore[operator]
    return params, 2 * m * k * n, moved, _grouped_spec(args)


def _variable_k_pairs(dims: object) -> list | None:
    """A variable-K grouped GEMM's ((M_i, K_i), (K_i, N_i)) per group: [M, K] and [M, N] as one group, else lists."""
    if isinstance(dims, (list, tuple)) and len(dims) >= 2:
        a, b = dims[0], dims[1]
        if (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == 2 and len(b) == 2
                and _positive_ints(a) and _positive_ints(b)):
            return [((int(a[0]), int(a[1])), (int(a[1]), int(b[1])))]
    zipped = _zipped(dims)
    if zipped is None:
        return None
    lhs, rhs = zipped
    return list(zip(lhs, rhs)) if all(a[1] == b[0] for a, b in zip(lhs, rhs)) else None


def grouped_gemm_variable_k(name: str, args: dict, kernels: list[str]) -> Result:
    """``primus_turbo_grouped_gemm_variable_k``: FLOPs and bytes summed per group (each its own weight)."""
    pairs = _variable_k_pairs(args.get("Input Dims", []))
    if not pairs:
        raise ValueError(f"grouped GEMM shapes not understood: {args.get('Input Dims')}")
    size_in, size_out = _dtype_sizes(args.get("Input type", []))
    params = {"M": sum(a[0] for a, _ in pairs), "K": pairs[0][0][1], "N": pairs[0][1][1], "G": len(pairs),
              "bpe_in": size_in, "bpe_out": size_out, "group_pairs": pairs}
    flops = 0
    for (m, k), (_, n) in pairs:
        flops += 2 * m * k * n
    moved = None
    if size_in is not None and size_out is not None:
        moved = 0
        for (m, k), (_, n) in pairs:
            moved += (m * k + 1 * k * n) * size_in + m * n * size_out
    return params, flops, moved, _grouped_spec(args)


def moe_comm(name: str, args: dict, kernels: list[str]) -> Result:
    """``MoEDispatch``/``MoECombine``: tokens [T, hidden] moved, no FLOPs, no compute spec (also their backward)."""
    dims, types = args.get("Input Dims", []), args.get("Input type", [])
    tokens = dims[0] if dims else []
    count = tokens[0] if len(tokens) >= 1 else None
    hidden = tokens[1] if len(tokens) >= 2 else None
    dtype = types[0] if types else ""
    size = size_of(dtype) if dtype else None
    moved = None if count is None or hidden is None or size is None else count * hidden * size
    return {"num_tokens": count, "hidden_dim": hidden, "bpe": size}, 0, moved, ""


def _active_experts(experts: int, topk: int, tokens: int) -> float:
    """The experts a uniform routing of ``tokens`` tokens to ``topk`` of ``experts`` touches, in expectation."""
    return experts * (1 - ((experts - topk) / experts) ** tokens)


def _up_flops(p: dict) -> int:
    return 2 * p["num_tokens"] * p["hidden_dim"] * p["inter_dim"] * p["topk"] * (2 if p["gated"] else 1)


def _down_flops(p: dict) -> int:
    return 2 * p["num_tokens"] * p["inter_dim"] * p["hidden_dim"] * p["topk"]


def _up_bytes(p: dict, size_in: float, size_weight: float, size_out: float) -> float:
    m, k, n, topk = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"]
    active = _active_experts(p["num_experts"], topk, m)
    return m * k * size_in + active * (2 if p["gated"] else 1) * k * n * size_weight + m * n * topk * size_out


def _down_bytes(p: dict, size_in: float, size_weight: float, size_out: float) -> float:
    m, k, n, topk = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"]
    active = _active_experts(p["num_experts"], topk, m)
    return m * n * topk * size_in + active * n * k * size_weight + m * k * size_out


def _fused_flops(p: dict) -> int:
    m, k, n, topk = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"]
    return 2 * m * k * n * topk * (2 if p["gated"] else 1) + 0 + 2 * m * k * n * topk + m * k * (2 * topk - 1)


def _fused_bytes(p: dict, size_in: float, size_weight: float, size_out: float) -> float:
    m, k, n, topk = p["num_tokens"], p["hidden_dim"], p["inter_dim"], p["topk"]
    active = _active_experts(p["num_experts"], topk, m)
    return (m * k * size_in + active * n * k * size_weight * (2 if p["gated"] else 1) + active * n * k * size_weight
            + m * k * size_out)


def _expert_shapes(w1: list, w2: list) -> tuple[int, int, int, bool]:
    """Experts, hidden and intermediate sizes from W1 [E, N·(gated+1), K] and W2 [E, K, N] (N unpacked by
    K over W1's packed last dim), and whether the up projection is gated."""
    _, _, _ = w1
    experts, hidden, inter = w2
    inter *= hidden // w1[-1]
    return w1[0], hidden, inter, w1[1] == 2 * inter


def _matrix_spec(p: dict, key: str = "input_dtype") -> str:
    return spec_of("matrix", p.get(key))


def _fused_moe_params(args: dict) -> dict:
    """aiter's ``fused_moe_`` layout: x [M, K], W1, W2, topk weights [M, topk]."""
    dims, types = args["Input Dims"], args["Input type"]
    experts, hidden, inter, gated = _expert_shapes(dims[1], dims[2])
    return {"num_tokens": dims[0][0], "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts,
            "topk": dims[3][1], "gated": gated, "input_dtype": types[0], "weight_dtype": types[1]}


def _sizes_in_weight(p: dict) -> tuple[float, float, float]:
    """Input (default 2), weight (default 1) and output (the input's) sizes."""
    size_in = MOE_BYTES.get(p["input_dtype"], 2)
    return size_in, MOE_BYTES.get(p["weight_dtype"], 1), size_in


def fused_1stage(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_fused_1stage``: output at the input's size."""
    p = _fused_moe_params(args)
    return p, _fused_flops(p), _fused_bytes(p, *_sizes_in_weight(p)), _matrix_spec(p)


def flydsl_stage(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_flydsl_stage1``/``2``: the up or down projection of the parent ``fused_moe_``'s shapes; the compute
    spec the weights' dtype."""
    p = _fused_moe_params(args)
    if name.endswith("stage1"):
        return p, _up_flops(p), _up_bytes(p, *_sizes_in_weight(p)), _matrix_spec(p, "weight_dtype")
    return p, _down_flops(p), _down_bytes(p, *_sizes_in_weight(p)), _matrix_spec(p, "weight_dtype")


def fused_blockscale(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_fused_blockscale`` (``aiter::fmoe_g1u1``, ``fmoe_fp8_blockscale_g1u1``): out [M, K], x,
    W1, W2; topk the ninth concrete input.  *Accident kept:* a bf16 input counts as fp8 compute."""
    dims = args["Input Dims"]
    experts, hidden, inter, gated = _expert_shapes(dims[2], dims[3])
    concrete = args.get("Concrete Inputs", [])
    if len(concrete) <= 8 or not concrete[8]:
        raise ValueError("no topk among the concrete inputs")
    topk = int(concrete[8])
    types = args.get("Input type", [])
    p = {"num_tokens": dims[0][0], "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts, "topk": topk,
         "gated": gated, "input_dtype": types[1], "weight_dtype": types[2], "output_dtype": types[0]}
    moved = _fused_bytes(p, MOE_BYTES.get(p["input_dtype"], 1), MOE_BYTES.get(p["weight_dtype"], 1),
                         MOE_BYTES.get(p["output_dtype"], 2))
    dtype = p["input_dtype"]
    precision = ("fp8" if dtype in ("fp8", "bf16") else PRECISION.get(dtype.lower())) if dtype else None
    return p, _fused_flops(p), moved, f"matrix_{precision}" if precision else ""


def _stage_sizes(p: dict) -> tuple[float, float, float]:
    """A CK-tile stage's input, weight and output sizes (defaults 2, 1, 2)."""
    return MOE_BYTES.get(p["input_dtype"], 2), MOE_BYTES.get(p["weight_dtype"], 1), MOE_BYTES.get(p["output_dtype"], 2)


def cktile_up(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_unfused_up`` (``moe_cktile2stages_gemm1_ck``): x [M, K], W1 [E, ., .], out [M, topk, N]."""
    dims, types = args["Input Dims"], args["Input type"]
    tokens, hidden = dims[0]
    experts, _, _ = dims[1]
    _, topk, inter = dims[2]
    p = {"num_tokens": tokens, "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts, "topk": topk,
         "gated": dims[1][1] == 2 * inter, "input_dtype": types[0], "weight_dtype": types[1],
         "output_dtype": types[2]}
    return p, _up_flops(p), _up_bytes(p, *_stage_sizes(p)), _matrix_spec(p)


def cktile_down(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_unfused_down`` (``moe_cktile2stages_gemm2_ck``): x [M, topk, N], W2 [E, K, .], out [M, K]."""
    dims, types = args["Input Dims"], args["Input type"]
    tokens, topk, inter = dims[0]
    experts, hidden, _ = dims[1]
    p = {"num_tokens": tokens, "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts, "topk": topk,
         "input_dtype": types[0], "weight_dtype": types[1], "output_dtype": types[2]}
    return p, _down_flops(p), _down_bytes(p, *_stage_sizes(p)), _matrix_spec(p)


def ck_stage1(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_ck_stage1`` (``aiter::ck_moe_stage1``): x [M, .], W1, W2 [E, K, N], out [M, topk, N] seventh."""
    dims, types = args["Input Dims"], args["Input type"]
    experts, hidden, inter = dims[2]
    inter *= hidden // dims[1][-1]
    p = {"num_tokens": dims[0][0], "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts,
         "topk": dims[6][1], "gated": dims[1][1] == 2 * inter, "input_dtype": types[0], "weight_dtype": types[1]}
    size_in = MOE_BYTES.get(p["input_dtype"], 2)
    return p, _up_flops(p), _up_bytes(p, size_in, MOE_BYTES.get(p["weight_dtype"], 1), size_in), _matrix_spec(p)


def ck_stage2(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_aiter_ck_stage2`` (``aiter::ck_moe_stage2``): x [M, topk, N], W1, W2 [E, K, .]; the weight dtype W2's."""
    dims, types = args["Input Dims"], args["Input type"]
    tokens, topk, inter = dims[0]
    w1 = dims[1]
    experts, hidden, _ = dims[2]
    inter *= hidden // w1[-1] if w1 else 1
    p = {"num_tokens": tokens, "hidden_dim": hidden, "inter_dim": inter, "num_experts": experts, "topk": topk,
         "input_dtype": types[0], "weight_dtype": types[2]}
    size_in = MOE_BYTES.get(p["input_dtype"], 2)
    return p, _down_flops(p), _down_bytes(p, size_in, MOE_BYTES.get(p["weight_dtype"], 1), size_in), _matrix_spec(p)


def triton_grouped_gemm(name: str, args: dict, kernels: list[str]) -> Result:
    """``moe_triton_invoke_grouped_gemm`` (SGLang's ``invoke_fused_moe_kernel``): A, B [E, N, K], ...,
    topk_ids [M, topk] ninth; one grouped GEMM of M·topk rows; the compute spec the weights' dtype."""
    dims, types = args["Input Dims"], args.get("Input type", [])
    if len(dims) < 9 or len(dims[1]) != 3 or len(dims[8]) != 2:
        raise ValueError("invoke_fused_moe_kernel's shapes not understood")
    experts, n, k = dims[1]
    tokens, topk = dims[8]
    dtype_in = types[0] if len(types) > 0 else None
    p = {"m_work": tokens * topk, "num_tokens": tokens, "topk": topk, "N": n, "K": k, "num_experts": experts,
         "input_dtype": dtype_in, "weight_dtype": types[1] if len(types) > 1 else None,
         "output_dtype": types[3] if len(types) > 3 and types[3] else dtype_in}
    active = experts * (1 - ((experts - topk) / experts) ** tokens) if experts > 0 else 0
    moved = (p["m_work"] * k * MOE_BYTES.get(dtype_in, 2) + active * n * k * MOE_BYTES.get(p["weight_dtype"], 1)
             + p["m_work"] * n * MOE_BYTES.get(p["output_dtype"], 2))
    return p, 2 * p["m_work"] * n * k, moved, _matrix_spec(p, "weight_dtype")


def _operands(dims: list, types: list) -> list[tuple[tuple, object]]:
    """Every input with a shape of ints, with its dtype (None past the dtypes)."""
    return [(tuple(shape), types[i] if i < len(types) else None) for i, shape in enumerate(dims)
            if shape and all(isinstance(d, int) for d in shape)]


def _elementwise_aux(operands: list[tuple[tuple, object]]) -> Result:
    flops = max(prod(shape) for shape, _ in operands) if operands else 0
    moved = 0
    for shape, dtype in operands:
        size = size_of(dtype)
        if size is not None:
            moved += prod(shape) * size
    spec = spec_of("vector", max(operands, key=lambda o: prod(o[0]))[1]) if operands else ""
    return {"operands": operands}, flops, moved if moved > 0 else None, spec


def grouped_topk(name: str, args: dict, kernels: list[str]) -> Result:
    """``BiasedGroupedTopk`` (``aiter::biased_grouped_topk_hip``): its shapes must be recorded."""
    return _elementwise_aux(_operands(args["Input Dims"], args.get("Input type", [])))


def moe_sort(name: str, args: dict, kernels: list[str]) -> Result:
    """``MoeSortScatterGather`` (``aiter::moe_sorting_fwd``, ``mxfp4_moe_sort_hip``)."""
    return _elementwise_aux(_operands(args.get("Input Dims", []), args.get("Input type", [])))


def topk_softplus(name: str, args: dict, kernels: list[str]) -> Result:
    """``topk_softplus(topk_weights [M, topk], topk_ids, gating_output [M, E], ...)``: 6 FLOPs per logit;
    the logits read, a 4-byte bias per expert, 4-byte weights and ids written."""
    dims = args["Input Dims"]
    types = args.get("Input type", []) or []
    m, experts = dims[2][0], dims[2][1]
    topk = dims[0][1]
    p = {"M": m, "n": 1, "C": experts, "E": experts, "topk": topk,
         "dtype_in": types[2] if len(types) > 2 else "c10::BFloat16"}
    size = size_of(p["dtype_in"])
    moved = None if size is None else m * experts * size + experts * 4 + m * topk * 4 + m * topk * 4
    return p, 6 * m * experts, moved, spec_of("vector", p["dtype_in"])


def append_shared_experts(name: str, args: dict, kernels: list[str]) -> Result:
    """SGLang's ``fused_append_shared_experts(ids [M, topk], weights [M, topk])``: one FLOP per id, both
    read and written (4 bytes an element for a dtype with no size); the compute spec the weights'."""
    dims, types = args["Input Dims"], args["Input type"]
    ids = tuple(dims[0])
    weights = tuple(dims[1]) if len(dims) > 1 and dims[1] else ids
    dtype_ids = types[0] if types else "int"
    dtype_weights = types[1] if len(types) > 1 else "float"
    params = {"shape_in1": ids, "shape_in2": weights, "dtype_in1_in2_out": (dtype_ids, dtype_weights, dtype_weights),
              "stride_input1": None, "stride_input2": None, "stride_output": None}
    broadcast(ids, weights)
    size_ids, size_weights = size_of(dtype_ids), size_of(dtype_weights)
    moved = 2 * (prod(ids) * (size_ids or 4) + prod(weights) * (size_weights or 4))
    return params, prod(ids), moved, spec_of("vector", dtype_weights)


GROUPED_GEMM_MODELS = {
    **dict.fromkeys(("primus_turbo::grouped_gemm", "primus_turbo::grouped_gemm_impl",
                     "primus_turbo_cpp_extension::grouped_gemm", "primus_turbo_cpp_extension::ck_grouped_gemm"),
                    grouped_gemm),
    **dict.fromkeys(("primus_turbo::grouped_gemm_variable_k", "primus_turbo::grouped_gemm_variable_k_impl",
                     "primus_turbo_cpp_extension::grouped_gemm_variable_k",
                     "primus_turbo_cpp_extension::ck_grouped_gemm_variable_k"), grouped_gemm_variable_k),
}
COMM_MODELS = {"MoEDispatch": moe_comm, "MoECombine": moe_comm}
FUSED_MODELS = {"pseudo_op::moe_aiter_fused_1stage": fused_1stage, "aiter::fmoe_fp8_blockscale_g1u1": fused_blockscale,
                "aiter::fmoe_g1u1": fused_blockscale}
UNFUSED_MODELS = {"aiter::moe_cktile2stages_gemm1_ck": cktile_up, "aiter::moe_cktile2stages_gemm2_ck": cktile_down,
                  "aiter::ck_moe_stage1": ck_stage1, "aiter::ck_moe_stage2": ck_stage2,
                  "sglang_profiler::fused_moe_triton_kernels_invoke_fused_moe_kernel": triton_grouped_gemm,
                  "pseudo_op::moe_flydsl_stage1": flydsl_stage, "pseudo_op::moe_flydsl_stage2": flydsl_stage}
# the MoE_unfused sheet's other ops: pseudo ops TraceLens makes only with --enable_pseudo_ops, whose models read
# the arguments its pseudo-op pass writes on them (``MoE topk``, ``MoE GEMM gated``), which the reading does not keep
UNFUSED_SHEET_OPS_BEYOND_MODELS = ("pseudo_op::moe_gptq_awq_down", "pseudo_op::moe_gptq_awq_up",
                                   "pseudo_op::moe_triton_unfused_down", "pseudo_op::moe_triton_unfused_up")
AUX_MODELS = {"aiter::biased_grouped_topk_hip": grouped_topk, "aiter::moe_sorting_fwd": moe_sort,
              "aiter::mxfp4_moe_sort_hip": moe_sort, "aiter::topk_softplus": topk_softplus,
              "sglang_profiler::fused_moe_triton_kernels_fused_append_shared_experts": append_shared_experts}
# sheet -> op name -> model; the sheets are split (_fwd, _bwd); dispatch and combine alone have backward formulas
MODELS = {"GroupedGEMM": GROUPED_GEMM_MODELS, "MoE_fused": FUSED_MODELS, "MoE_unfused": UNFUSED_MODELS,
          "MoE_aux": AUX_MODELS, "MoE_comm": COMM_MODELS}
BACKWARD_MODELS = COMM_MODELS
