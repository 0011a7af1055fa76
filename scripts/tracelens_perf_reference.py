"""Make the reference tables for ``analyze --ops``: TraceLens's PyTorch perf
report, as ``TraceLens_generate_perf_report_pytorch`` writes it, for the shared
traces and generated ones (a synth rank; a hand-built trace of attention,
convolution and norm ops with their shapes, scripts/model_ops_trace.py; one of
the ops of TraceLens's extension models, scripts/extension_ops_trace.py; vLLM's
attention under user annotations, scripts/annotated_attention_trace.py).

TraceLens is not on the package index: install it from its source
(AMD-AGI/TraceLens) in a separate virtualenv and point ``--tracelens`` at its
report command.  Each case's CSVs land gzipped in
``tests/reference/tracelens_perf/<case>/<stem>.csv.gz`` (byte for byte what
TraceLens wrote, compressed), with ``op_categories.json`` (TraceLens's op-name
-> category registry, which the tests compare with streamtrace's),
``op_sheets.json`` (its performance-model sheets -> op names), ``aten_ops.json``
(the PyTorch operator names it cuts Inductor kernel names into) and
``VERSIONS.json`` (what made them).

    python scripts/tracelens_perf_reference.py \
        --tracelens /work/tlvenv/bin/TraceLens_generate_perf_report_pytorch
"""
from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile

import annotated_attention_trace
import extension_ops_trace
import model_ops_trace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACES = os.path.join(ROOT, "..", "shared", "traces")
OUT = os.path.join(ROOT, "tests", "reference", "tracelens_perf")

# case -> trace under the shared traces (None: a generated trace, GENERATED below)
CASES = {
    "kineto_small": "kineto_small.json",
    "mi250_minitoy": "mi250_minitoy.json.gz",
    "b200_eager": "b200_eager.json.gz",
    "nccl_rank0": "nccl_rank0.json.gz",
    "vllm_graph_mi300": "vllm_decode_graph_replay_mi300.json.gz",
    "sglang_qwen3": "sglang_decode_qwen3.json.gz",
    "mi210_gpu_only": "mi210_gpu_only.json.gz",
    "dlrm_worker0": "dlrm_8ranks/worker0_step_12.1694128201545.pt.trace.json.gz",
    "synth_rank0": None,
    "model_ops": None,
    "odd_ops": None,
    "extension_ops": None,
    "annotated_attention": None,
}
# cases run again with a GPU spec (TraceLens's arch JSON: its roofline columns), the spec a test fixture
SPEC_CASES = {"mi250_minitoy_spec": "mi250_minitoy", "b200_eager_spec": "b200_eager", "model_ops_spec": "model_ops",
              "extension_ops_spec": "extension_ops"}
SPEC = os.path.join(OUT, "spec_fixture.json")
# The generated case: synth is deterministic for a seed; no python_function
# frames (TraceLens's kernel tables refuse traces with a Python stack).
SYNTH_ARGS = ["--ranks", "2", "--pp-stages", "2", "--steps", "2", "--python-noise", "0", "--graph-kernels", "8",
              "--graph-streams", "4", "--eager-kernels", "6", "--no-merged", "--compress", "none", "--seed", "3"]
REPORT_FLAGS = ["--enable_kernel_summary", "--short_kernel_study"]

DUMP_REGISTRY = """
import json, sys
from TraceLens.PerfModel.torch_op_mapping import OP_CATEGORY_REGISTRY
json.dump(dict(sorted(OP_CATEGORY_REGISTRY.items())), sys.stdout, indent=0)
"""
DUMP_SHEETS = """
import json, sys
from TraceLens.PerfModel.torch_op_mapping import build_sheet_category_to_op_names, op_to_perf_model_class_map
sheets = build_sheet_category_to_op_names(op_to_perf_model_class_map)
json.dump({sheet: sorted(names) for sheet, names in sorted(sheets.items())}, sys.stdout, indent=0)
"""
DUMP_ATEN_OPS = """
import json, sys
from TraceLens.PerfModel._known_aten_ops import KNOWN_OPS
json.dump(sorted(KNOWN_OPS), sys.stdout, indent=0)
"""
VERSIONS = """
import json, sys, importlib.metadata as m
json.dump({p: m.version(p) for p in ("TraceLens", "pandas", "numpy")} | {"python": sys.version.split()[0]}, sys.stdout)
"""


def synth_trace(work: str) -> str:
    """The generated case's rank-0 trace, made in ``work``."""
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", work, *SYNTH_ARGS, "-q"], check=True,
                   env={**os.environ, "PYTHONPATH": ROOT})
    return os.path.join(work, "rank0_trace.json")


def model_ops(work: str) -> str:
    """The hand-built trace of ops with shapes TraceLens models (attention, convolution, norms), made in ``work``."""
    return model_ops_trace.write(os.path.join(work, "model_ops.json"))


def odd_ops(work: str) -> str:
    """The hand-built trace of modelled ops called with odd argument lists, made in ``work``."""
    return model_ops_trace.write(os.path.join(work, "odd_ops.json"), odd=True)


def extension_ops(work: str) -> str:
    """The hand-built trace of ops TraceLens's extension models cover (grouped GEMMs, MoE, inference attention,
    fused convolutions ...), made in ``work``."""
    return extension_ops_trace.write(os.path.join(work, "extension_ops.json"))


def annotated_attention(work: str) -> str:
    """The hand-built trace of vLLM's attention op under user annotations, made in ``work``."""
    return annotated_attention_trace.write(os.path.join(work, "annotated_attention.json"))


GENERATED = {"synth_rank0": synth_trace, "model_ops": model_ops, "odd_ops": odd_ops,
             "extension_ops": extension_ops, "annotated_attention": annotated_attention}


def trace_of(case: str, work: str) -> str:
    """A case's trace (a spec case's: its base case's), made in ``work`` when it is a generated one."""
    base = SPEC_CASES.get(case, case)
    return GENERATED[base](work) if CASES[base] is None else os.path.join(TRACES, CASES[base])


def run_case(report: str, trace: str, dest: str, extra: tuple = ()) -> list[str]:
    """TraceLens's CSVs for ``trace``, gzipped into ``dest``; their stems."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([report, "--profile_json_path", trace, "--output_csvs_dir", tmp, *REPORT_FLAGS, *extra],
                       check=True, stdout=subprocess.DEVNULL)
        os.makedirs(dest, exist_ok=True)
        stems = sorted(name[:-4] for name in os.listdir(tmp) if name.endswith(".csv"))
        for stem in stems:
            with open(os.path.join(tmp, stem + ".csv"), "rb") as src:
                data = src.read()
            with gzip.GzipFile(os.path.join(dest, stem + ".csv.gz"), "wb", mtime=0) as out:
                out.write(data)
    return stems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracelens", required=True, help="TraceLens_generate_perf_report_pytorch of a TraceLens install")
    parser.add_argument("--cases", nargs="*", default=[*CASES, *SPEC_CASES], help="which cases (default all)")
    args = parser.parse_args()
    python = os.path.join(os.path.dirname(args.tracelens), "python")
    os.makedirs(OUT, exist_ok=True)
    for name, code in (("op_categories.json", DUMP_REGISTRY), ("op_sheets.json", DUMP_SHEETS),
                       ("aten_ops.json", DUMP_ATEN_OPS),
                       ("VERSIONS.json", VERSIONS)):
        text = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout
        with open(os.path.join(OUT, name), "w") as out:
            out.write(text + "\n")
    with tempfile.TemporaryDirectory() as work:
        for case in args.cases:
            extra = ("--gpu_arch_json_path", SPEC) if case in SPEC_CASES else ()
            stems = run_case(args.tracelens, trace_of(case, work), os.path.join(OUT, case), extra)
            print(f"{case}: {', '.join(stems)}")


if __name__ == "__main__":
    main()
