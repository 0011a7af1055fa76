"""TraceLens's models of vLLM's, SGLang's and aiter's custom collectives
(sheet ``CustomCollective``): the memory each GPU reads and writes, no
compute spec.

All-reduce (``_C_custom_ar::all_reduce``, quick-reduce, SGLang's
registered ones; inp the second input): no FLOPs, the input read and the
output written at its size.  Reduce-scatter and all-gather: the input and
the output (shard or gathered) at the input's size.  aiter's fused
all-reduce + residual add + RMS norm: FLOPs one per element for the add and
RMS norm's (integer rows, 2 per element for the weight), bytes input,
residual and weight read, the residual and output written.  A dtype with
no size gives no row.
"""
from __future__ import annotations

from math import prod

from .perfmodel import size_of

Result = tuple[dict, int, int, str]


def _input(args: dict, at: int) -> tuple[tuple, object, tuple]:
    return tuple(args["Input Dims"][at]), args["Input type"][at], tuple(args["Input Strides"][at])


def fused_allreduce_rmsnorm(name: str, args: dict, kernels: list[str]) -> Result:
    """``fused_allreduce_rmsnorm(ptr, reg, inp, res_inp, res_out, out, w, eps, ...)`` and the Python wrapper's
    ``fused_allreduce_rmsnorm_(inp, res_inp, w, eps, ...)``."""
    at, weight = (0, 2) if name.endswith("_") else (2, 6)
    shape, dtype, stride = _input(args, at)
    params = {"op_shape": shape, "dtype_in": dtype, "stride_input": stride,
              "num_channels": args["Input Dims"][weight][0]}
    count, channels, size = prod(shape), params["num_channels"], size_of(dtype)
    flops = count + ((count // channels) * (2 * channels + 2) + count * 2)
    return params, flops, 2 * count * size + channels * size + 2 * count * size, ""


def all_reduce(name: str, args: dict, kernels: list[str]) -> Result:
    shape, dtype, stride = _input(args, 1)
    return {"op_shape": shape, "dtype_in": dtype, "stride_input": stride}, 0, 2 * prod(shape) * size_of(dtype), ""


def scatter_or_gather(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``reduce_scatter(fa, inp, out)`` and ``all_gather_reg(fa, inp, out)``."""
    shape, dtype, stride = _input(args, 1)
    out = tuple(args["Input Dims"][2])
    params = {"op_shape": shape, "out_shape": out, "dtype_in": dtype, "stride_input": stride}
    return params, 0, (prod(shape) + prod(out)) * size_of(dtype), ""


def reg_all_gather(name: str, args: dict, kernels: list[str]) -> Result:
    """SGLang's ``reg_all_gather_into_tensor(out, inp, fa)``."""
    out, shape, dtype = tuple(args["Input Dims"][0]), tuple(args["Input Dims"][1]), args["Input type"][0]
    params = {"out_shape": out, "op_shape": shape, "dtype_in": dtype}
    size = size_of(dtype)
    return params, 0, (prod(shape) + prod(out)) * size, ""


MODELS = {
    **dict.fromkeys(("aiter::fused_allreduce_rmsnorm", "aiter::fused_allreduce_rmsnorm_"), fused_allreduce_rmsnorm),
    **dict.fromkeys(("_C_custom_ar::all_reduce", "_C_custom_ar::qr_all_reduce", "sgl_kernel::all_reduce_reg",
                     "sgl_kernel::qr_all_reduce"), all_reduce),
    **dict.fromkeys(("aiter::reduce_scatter", "aiter::all_gather_reg"), scatter_or_gather),
    "sglang::reg_all_gather_into_tensor": reg_all_gather,
}
