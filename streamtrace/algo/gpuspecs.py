"""Built-in GPU specs for the ops sheets' roofline, and picking one from a
trace's ``deviceProperties`` (no I/O).

TraceLens draws its roofline only when given an arch JSON (it ships
measured "max achievable" figures for MI300X and MI325X).  Here each GPU
carries the vendor's published peak figures, dense (no 2:4 sparsity), in
TraceLens's keys (``matrix_bf16``, ``vector_fp32``, ... TFLOP/s, and
``mem_bw_gbps``), each entry with the document it comes from.  A key the
vendor's documents do not state is left out: an op of that compute spec
gets no roofline rather than a guessed one.

Conventions (docs/analyze.md):

- ``matrix_fp32`` on NVIDIA is the FP32 (CUDA core) peak, not TF32:
  PyTorch keeps float32 matmuls off TF32 by default; a run that allows it
  gets a truer roofline from ``--gpu-spec``.
- NVIDIA datasheets state Tensor Core figures with sparsity; the dense
  figure is half of it.
- MI250X and MI250 are two GCDs a module and PyTorch sees each GCD as one
  device: their entries are half the module's figures.
- Peaks are theoretical: a share of roofline against them reads lower than
  against TraceLens's measured figures.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's peaks and where they are published."""

    name: str
    mem_bw_gbps: float
    peaks: Mapping[str, float]  # TraceLens's compute spec -> TFLOP/s
    document: str
    url: str
    note: str = ""  # how the figures were derived from the document

    def arch(self) -> dict:
        """The spec in TraceLens's arch JSON form (with its source)."""
        return {"name": self.name, "mem_bw_gbps": self.mem_bw_gbps, "max_achievable_tflops": dict(self.peaks),
                "source": f"{self.document}, {self.url}" + (f" ({self.note})" if self.note else "")}


@dataclass(frozen=True)
class _Rule:
    """Which devices an entry is: a name pattern and, where names do not
    tell the variant, the compute units or memory."""

    spec: GpuSpec
    pattern: str  # searched in the device name, case-insensitive
    sms: int | None = None  # numSms (CUs on AMD) when stated
    min_gib: float = 0.0
    max_gib: float = float("inf")
    nominal_gb: float | None = None  # the memory of the variant whose bandwidth the entry gives, where others exist


def _nvidia_tensor(sparse_fp16: float, sparse_fp8: float | None, fp64_tensor: float, fp32: float, fp64: float,
                   ) -> dict[str, float]:
    """The keys of a Hopper datasheet: Tensor Core figures stated with sparsity, halved."""
    peaks = {"matrix_fp16": sparse_fp16 / 2, "matrix_bf16": sparse_fp16 / 2, "matrix_fp64": fp64_tensor,
             "matrix_fp32": fp32, "vector_fp32": fp32, "vector_fp64": fp64}
    if sparse_fp8 is not None:
        peaks.update(matrix_fp8=sparse_fp8 / 2, matrix_int8=sparse_fp8 / 2)
    return peaks


V100_DOC = ("NVIDIA V100 Tensor Core GPU datasheet",
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
A100_DOC = ("NVIDIA A100 Tensor Core GPU datasheet; non-Tensor FP16/BF16 from the NVIDIA A100 Tensor Core GPU "
            "Architecture whitepaper",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, "
            "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf")
H100_DOC = ("NVIDIA H100 Tensor Core GPU datasheet; non-Tensor FP16/BF16 from the NVIDIA H100 Tensor Core GPU "
            "Architecture whitepaper",
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet, "
            "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper")
H200_DOC = ("NVIDIA H200 Tensor Core GPU datasheet",
            "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446")
B200_DOC = ("NVIDIA HGX platform specifications (HGX B200, 8 GPUs)", "https://www.nvidia.com/en-us/data-center/hgx/")
MI200_DOC = "https://www.amd.com/en/products/accelerators/instinct/mi200/{}.html"
MI300X_DOC = ("AMD Instinct MI300X Accelerator data sheet",
              "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
              "amd-instinct-mi300x-data-sheet.pdf")
MI325X_DOC = ("AMD Instinct MI325X Accelerator data sheet",
              "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/product-briefs/"
              "instinct-mi325x-datasheet.pdf")
MI355X_DOC = ("AMD Instinct MI355X GPU specifications", "https://www.amd.com/en/products/accelerators/instinct/mi350/"
              "mi355x.html")
HALVED = "Tensor Core figures are the datasheet's with sparsity, halved"
PER_GCD = "one GCD, as PyTorch sees it: half the module's figures"
CDNA3 = {"matrix_fp16": 1307.4, "matrix_bf16": 1307.4, "matrix_fp8": 2614.9, "matrix_int8": 2614.9,
         "matrix_fp32": 163.4, "matrix_fp64": 163.4, "vector_fp32": 163.4, "vector_fp64": 81.7}


def _mi200(name: str, page: str, matrix16: float, matrix32: float, vector: float, bandwidth: float,
           halve: bool) -> GpuSpec:
    """A CDNA2 entry (per GCD when ``halve``: the module's figures over two)."""
    share = 0.5 if halve else 1.0
    peaks = {"matrix_fp16": matrix16, "matrix_bf16": matrix16, "matrix_int8": matrix16, "matrix_fp32": matrix32,
             "matrix_fp64": matrix32, "vector_fp32": vector, "vector_fp64": vector}
    return GpuSpec(name, bandwidth * share, {key: value * share for key, value in peaks.items()},
                   f"AMD Instinct {page.upper()} Accelerator specifications", MI200_DOC.format(page),
                   PER_GCD if halve else "")


H100_SXM = GpuSpec("NVIDIA H100 SXM5", 3350, {**_nvidia_tensor(1979, 3958, 67, 67, 34), "vector_fp16": 133.8,
                                              "vector_bf16": 133.8}, *H100_DOC, HALVED)
H100_PCIE = GpuSpec("NVIDIA H100 PCIe", 2000, {**_nvidia_tensor(1513, 3026, 51, 51, 26), "vector_fp16": 102.4,
                                                "vector_bf16": 102.4}, *H100_DOC, HALVED)
A100_PEAKS = {"matrix_fp16": 312, "matrix_bf16": 312, "matrix_int8": 624, "matrix_fp64": 19.5, "matrix_fp32": 19.5,
              "vector_fp32": 19.5, "vector_fp64": 9.7, "vector_fp16": 78, "vector_bf16": 39}
V100_SXM = {"matrix_fp16": 125, "matrix_fp32": 15.7, "matrix_fp64": 7.8, "vector_fp32": 15.7, "vector_fp64": 7.8}
RULES: tuple[_Rule, ...] = (
    _Rule(GpuSpec("NVIDIA V100S PCIe", 1134, {"matrix_fp16": 130, "matrix_fp32": 16.4, "matrix_fp64": 8.2,
                                              "vector_fp32": 16.4, "vector_fp64": 8.2}, *V100_DOC), r"V100S"),
    _Rule(GpuSpec("NVIDIA V100 PCIe", 900, {"matrix_fp16": 112, "matrix_fp32": 14, "matrix_fp64": 7,
                                            "vector_fp32": 14, "vector_fp64": 7}, *V100_DOC), r"V100.*PCI"),
    _Rule(GpuSpec("NVIDIA V100 SXM2", 900, V100_SXM, *V100_DOC), r"V100"),
    _Rule(GpuSpec("NVIDIA A100 40GB", 1555, A100_PEAKS, *A100_DOC), r"A100", max_gib=60),
    _Rule(GpuSpec("NVIDIA A100 80GB PCIe", 1935, A100_PEAKS, *A100_DOC), r"A100.*PCI", min_gib=60),
    _Rule(GpuSpec("NVIDIA A100 80GB SXM", 2039, A100_PEAKS, *A100_DOC), r"A100", min_gib=60),
    _Rule(GpuSpec("NVIDIA H100 NVL", 3900, _nvidia_tensor(1671, 3341, 60, 60, 30), *H100_DOC, HALVED), r"H100 NVL"),
    _Rule(H100_PCIE, r"H100.*PCI"),
    _Rule(H100_SXM, r"H100", sms=132, nominal_gb=80),
    _Rule(H100_PCIE, r"H100", sms=114),
    _Rule(GpuSpec("NVIDIA H200 NVL", 4800, _nvidia_tensor(1671, 3341, 60, 60, 30), *H200_DOC, HALVED), r"H200 NVL"),
    _Rule(GpuSpec("NVIDIA H200 SXM", 4800, _nvidia_tensor(1979, 3958, 67, 67, 34), *H200_DOC, HALVED), r"H200"),
    _Rule(GpuSpec("NVIDIA B200 (HGX)", 8000, {"matrix_fp16": 2250, "matrix_bf16": 2250, "matrix_fp8": 4500,
                                              "matrix_int8": 4500, "matrix_fp4": 9000}, *B200_DOC,
                  "the 8-GPU dense figures over 8; FP32 and FP64 left out"), r"B200"),
    _Rule(_mi200("AMD Instinct MI250X (one GCD)", "mi250x", 383, 95.7, 47.9, 3200, True), r"MI250X", sms=110),
    _Rule(_mi200("AMD Instinct MI250 (one GCD)", "mi250", 362.1, 90.5, 45.3, 3200, True), r"MI250", sms=104),
    _Rule(_mi200("AMD Instinct MI210", "mi210", 181, 45.3, 22.6, 1600, False), r"MI210"),
    _Rule(GpuSpec("AMD Instinct MI300X", 5300, CDNA3, *MI300X_DOC), r"MI300X"),
    _Rule(GpuSpec("AMD Instinct MI325X", 6000, CDNA3, *MI325X_DOC), r"MI325X"),
    _Rule(GpuSpec("AMD Instinct MI355X", 8000, {"matrix_fp16": 2516.6, "matrix_bf16": 2516.6, "matrix_fp8": 5033.2,
                                                "matrix_int8": 5033.2, "matrix_fp4": 10066.3, "matrix_fp32": 157.3,
                                                "matrix_fp64": 78.6, "vector_fp32": 157.3, "vector_fp64": 78.6},
                  *MI355X_DOC), r"MI355X"),
)
BY_NAME = {rule.spec.name: rule.spec for rule in RULES}
# AMD devices ROCm names generically ("", "AMD Radeon Graphics"): (arch, CUs, memory GiB range) -> entry
BY_PROPERTIES = (("gfx942", 304, 0, 224, "AMD Instinct MI300X"), ("gfx942", 304, 224, float("inf"), "AMD Instinct MI325X"),
                 ("gfx90a", 110, 0, float("inf"), "AMD Instinct MI250X (one GCD)"))
ARCH_OF_COMPUTE = {(9, 4): "gfx942", (9, 0): "gfx90a", (9, 5): "gfx950"}


@dataclass(frozen=True)
class Device:
    """What a deviceProperties entry says of a GPU."""

    name: str
    sms: int | None = None
    gib: float | None = None
    arch: str | None = None  # gcnArchName's head (AMD), else from compute capability on a 64-wide warp GPU

    @classmethod
    def of(cls, entry: Mapping) -> Device:
        name = entry.get("name")
        sms, memory = entry.get("numSms"), entry.get("totalGlobalMem")
        arch = entry.get("gcnArchName")
        if isinstance(arch, str) and arch:
            arch = arch.split(":")[0]
        elif entry.get("warpSize") == 64:
            arch = ARCH_OF_COMPUTE.get((entry.get("computeMajor"), entry.get("computeMinor")))
        else:
            arch = None
        return cls(name.strip() if isinstance(name, str) else "", sms if _whole(sms) else None,
                   memory / GIB if _whole(memory) else None, arch)

    def words(self) -> str:
        facts = [f"{self.sms} {'CUs' if self.arch else 'SMs'}" if self.sms is not None else "",
                 f"{self.gib:.0f} GiB" if self.gib is not None else "", self.arch or ""]
        return f"{self.name or '(no name)'!r} ({', '.join(fact for fact in facts if fact)})"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Identified:
    """The spec picked for a trace, or None and why not; ``how``: the words saying which and why."""

    spec: GpuSpec | None
    how: str


def _match(device: Device) -> tuple[GpuSpec | None, str]:
    for rule in RULES:
        if not re.search(rule.pattern, device.name, re.IGNORECASE):
            continue
        if rule.sms is not None and device.sms is not None and device.sms != rule.sms:
            continue
        if device.gib is not None and not rule.min_gib <= device.gib < rule.max_gib:
            continue
        how = f"by its name {device.words()}"
        if rule.nominal_gb and device.gib is not None and abs(device.gib * GIB / 1e9 - rule.nominal_gb) > 0.1 * rule.nominal_gb:
            how += (f"; its memory is not the {rule.nominal_gb:.0f} GB of the variant whose bandwidth this is "
                    "(--gpu-spec gives the right one)")
        return rule.spec, how
    for arch, sms, low, high, name in BY_PROPERTIES:
        if device.arch == arch and device.sms == sms and device.gib is not None and low <= device.gib < high:
            return BY_NAME[name], f"by its properties {device.words()}, the {name}'s"
    return None, f"{device.words()} is no GPU of the built-in table"


def identify(device_properties: object) -> Identified:
    """The built-in spec of the GPU a trace's ``deviceProperties`` lists
    (every entry must name the same one), or None with the reason."""
    entries = [entry for entry in device_properties if isinstance(entry, Mapping)] \
        if isinstance(device_properties, list) else []
    if not entries:
        return Identified(None, "the trace has no deviceProperties")
    devices = tuple(dict.fromkeys(Device.of(entry) for entry in entries))
    found = [_match(device) for device in devices]
    specs = {spec.name if spec else None for spec, _ in found}
    if len(specs) > 1:
        listed = "; ".join(how for _, how in found)
        return Identified(None, f"deviceProperties lists different GPUs ({listed})")
    spec, how = found[0]
    if spec is None and devices[0].arch == "gfx90a" and devices[0].sms == 104:
        how += " (an MI210 or one GCD of an MI250 have 104 CUs: the name does not tell which)"
    return Identified(spec, how)
