"""Accelerators as the step-time model sees them: memory, peak dense FLOPS, bandwidths.

Bottom layer: imports nothing from shardviz. Every figure of ``DEVICES`` comes from a public
vendor datasheet named in ``docs/step-time.md`` (and in each row's ``source``). Figures are
*peaks*; what a step achieves is a fraction of them, ``Efficiency``, whose defaults are named,
documented and meant to be replaced by the user's own measurement.

Units: ``memory`` in bytes; TFLOPS dense (no 2:4 sparsity); bandwidths in GB/s (1e9 bytes/s),
one direction, per GPU, the same convention as ``Mesh.intra_node_gbps`` / ``inter_node_gbps``.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from ..format import format_bytes, parse_size

GiB = 1024**3
MiB = 1024**2

# CPU offload's optimizer step: PyTorch's own CPU Adam steps 1e9 parameters in 1.39 s (ZeRO-Offload,
# Ren et al., USENIX ATC 2021, Table 3, "PT-CPU"): 0.72e9 parameters/s (docs/step-time.md, "Host time")
HOST_ADAMW_GPARAMS_PER_S = 1 / 1.39


def _check_positive(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


def parse_host_memory(value, owner: str = "Mesh.host_memory") -> int | None:
    """The host RAM of one node (bytes or a size such as "2TiB"; None: not known), refused naming ``owner``."""
    if value is None:
        return None
    if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{owner} must be bytes or a size such as '512GiB', got {value!r}")
    size = parse_size(value, owner)
    if size <= 0:
        raise ValueError(f"{owner} must be a positive size such as '512GiB', got {value!r}")
    return int(size)


@dataclass(frozen=True)
class Device:
    """One accelerator. ``sv.Device(name=..., memory="96GiB", bf16_tflops=..., ...)`` for anything
    not in ``DEVICES``; every figure must be positive."""

    name: str
    memory: int | str
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    hbm_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int = 8
    source: str = ""
    host_memory: int | str | None = None  # the host RAM of one node, where a source states it

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Device.name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "memory", parse_size(self.memory, "Device.memory"))
        object.__setattr__(self, "host_memory", parse_host_memory(self.host_memory, "Device.host_memory"))
        for key in ("memory", "bf16_tflops", "fp16_tflops", "fp32_tflops", "hbm_gbps",
                    "intra_node_gbps", "inter_node_gbps", "gpus_per_node"):
            _check_positive("Device", key, getattr(self, key))
        if not isinstance(self.gpus_per_node, int):
            raise ValueError(f"Device.gpus_per_node must be a positive int, got {self.gpus_per_node!r}")

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """Peak dense FLOP/s of the tensor cores in ``dtype`` (bfloat16, float16 or float32)."""
        key = {"bfloat16": "bf16_tflops", "bf16": "bf16_tflops", "float16": "fp16_tflops",
               "fp16": "fp16_tflops", "half": "fp16_tflops", "float32": "fp32_tflops",
               "fp32": "fp32_tflops", "float": "fp32_tflops"}.get(str(dtype).replace("torch.", ""))
        if key is None:
            raise ValueError(f"dtype={dtype!r}: expected bfloat16, float16 or float32")
        return getattr(self, key) * 1e12


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the peaks (0 < x <= 1) and what the software stack adds. Defaults,
    presets (``Efficiency.for_stack``) and their sources: docs/step-time.md, "Efficiencies".

    - ``matmul``: achieved / peak dense FLOP/s of the large matmuls (compute-bound GEMMs);
    - ``collective_bus``: NCCL bus bandwidth / link bandwidth (what nccl-tests calls busbw);
    - ``hbm``: bytes moved / (time x HBM bandwidth): the memory-bound kernels (casts, norms,
      dropout, softmax, the loss, small matmuls such as LoRA's) and the optimizer step;
    - ``attention``: achieved / peak FLOP/s of the fused attention kernels (None: ``matmul``);
    - ``kernel_us``: the least time one kernel takes, its launch included (microseconds; 0: none);
    - ``memory_traffic``: the share of the memory-bound kernels' bytes and launches left after a
      compiler fuses them (1: eager PyTorch, every op its own kernel);
    - ``host_adamw_gparams_per_s``: billions of parameters one rank's CPU AdamW steps per second
      (CPU offload's optimizer step, on the host);
    - ``stack``: the software these figures describe, in words (said in every time's assumptions).
    """

    matmul: float = 0.5
    collective_bus: float = 0.8
    hbm: float = 0.8
    attention: float | None = None
    kernel_us: float = 0.0
    memory_traffic: float = 1.0
    host_adamw_gparams_per_s: float = HOST_ADAMW_GPARAMS_PER_S
    stack: str = "generic"

    def __post_init__(self):
        for name in ("matmul", "collective_bus", "hbm", "attention", "memory_traffic"):
            value = getattr(self, name)
            if value is None and name == "attention":
                continue
            _check_positive("Efficiency", name, value)
            if value > 1:
                raise ValueError(f"Efficiency.{name} is a fraction of the peak, at most 1, got {value!r}")
        _check_positive("Efficiency", "host_adamw_gparams_per_s", self.host_adamw_gparams_per_s)
        k = self.kernel_us
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k < 0:
            raise ValueError(f"Efficiency.kernel_us must be microseconds >= 0, got {k!r}")

    @property
    def attention_fraction(self) -> float:
        return self.matmul if self.attention is None else self.attention

    def describe(self) -> str:
        """The figures in words, for the assumptions of every time."""
        fused = f" ({self.memory_traffic:g} of eager traffic left after fusion)" if self.memory_traffic < 1 else ""
        return (f"stack {self.stack}: matmuls at {self.matmul:g} of peak, attention at {self.attention_fraction:g}, "
                f"memory-bound kernels at {self.hbm:g} of HBM{fused}, at least {self.kernel_us:g} us per kernel, "
                f"collectives at {self.collective_bus:g} of the link bandwidth")

    @classmethod
    def for_stack(cls, stack: str, device=None) -> "Efficiency":
        """The preset of ``stack`` (one of ``STACKS``) on ``device`` (a name or a ``Device``; the
        A100 or H100 family's figures where it belongs to one, else the generic matmul 0.5)."""
        if stack not in STACKS:
            close = difflib.get_close_matches(str(stack), list(STACKS), n=1, cutoff=0.0)
            raise ValueError(f"unknown stack {stack!r}: known stacks are {', '.join(STACKS)}"
                             + (f"; closest: {close[0]!r}" if close else ""))
        family = _family(device)
        chip = _CHIP.get(family, {"matmul": DEFAULT_MATMUL, "attention": None})
        return cls(**chip, **STACKS[stack], stack=stack)


DEFAULT_MATMUL = 0.5
DEFAULT_EFFICIENCY = Efficiency()


# What the part achieves, whatever the stack (docs/step-time.md, "Efficiencies": calibrated on the
# rows of benchmarks/bench_published.py marked "calibration", checked on the others):
# large bf16 GEMMs, and fused attention (FlashAttention-2: 50-73 % of the A100's peak, ~35 % of
# the H100's, per the FlashAttention-2 and -3 papers).
_CHIP = {
    "A100": {"matmul": 0.74, "attention": 0.55},
    "H100": {"matmul": 0.53, "attention": 0.35},  # no 700 W FSDP2 run published: the 500 W fit, a lower bound
    "H100-500W": {"matmul": 0.53, "attention": 0.35},
}
_FAMILY = {"A100-40GB": "A100", "A100-80GB": "A100", "H100": "H100", "H100-PCIe": "H100", "H200": "H100",
           "H100-500W": "H100-500W"}

# What the software adds (docs/step-time.md, "Efficiencies"): per-kernel floor, fusion.
STACKS: dict[str, dict] = {
    # torchtitan, eager: every op its own kernel, torch's fused SDPA, no Python module overhead to speak of
    "torchtitan-eager": {"kernel_us": 4.0, "memory_traffic": 1.0},
    # torchtitan with torch.compile per block: inductor fuses the pointwise chains (norms, rotary, SwiGLU)
    "torchtitan-compile": {"kernel_us": 3.0, "memory_traffic": 0.45},
    # torchtune, eager (compile=False, its default): its own modules, as torchtitan eager
    "torchtune": {"kernel_us": 4.0, "memory_traffic": 1.0},
    # Hugging Face modules (Trainer / accelerate), eager: Python module overhead on every call
    "hf": {"kernel_us": 6.0, "memory_traffic": 1.0},
    # the same with peft adapters: each adapted projection adds dropout, two small matmuls, a scale, an add
    "hf-peft": {"kernel_us": 8.0, "memory_traffic": 1.0},
}


def _family(device) -> str | None:
    if device is None:
        return None
    name = device.name if isinstance(device, Device) else device_by_name(device).name
    return _FAMILY.get(name)


def stack_of(root_type: str | None, hf: bool) -> str:
    """The stack a model most likely trains with: a peft model -> "hf-peft", another Hugging Face
    model -> "hf", anything else -> "torchtitan-eager" (plain PyTorch modules, eager)."""
    if root_type and root_type.startswith("Peft"):
        return "hf-peft"
    return "hf" if hf else "torchtitan-eager"


def default_efficiency(device, stack: str = "torchtitan-eager") -> Efficiency:
    """``Efficiency.for_stack(stack, device)``: what a step uses when the mesh gives none; a user's
    own ``Efficiency`` always wins."""
    return Efficiency.for_stack(stack, device)

# Memory the fits verdict keeps out of ``device_memory`` (docs/step-time.md, "Memory reserve"):
# the CUDA context with lazy module loading (PyTorch PR 86509 measured 287 MB; cuBLAS/cuDNN
# workspaces on top) and NCCL's communicator buffers (NCCL_BUFFSIZE = 4 MiB per channel and peer).
CUDA_CONTEXT_BYTES = 512 * MiB
NCCL_BUFFER_BYTES = 512 * MiB
MEMORY_RESERVE_BYTES = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES


def usable_memory(device_memory: int, reserve: int = MEMORY_RESERVE_BYTES) -> int:
    """What tensors may use of ``device_memory`` bytes once the CUDA context and NCCL are set up."""
    if device_memory is None or device_memory <= 0:
        raise ValueError(f"device_memory must be a positive number of bytes, got {device_memory!r}")
    if reserve < 0:
        raise ValueError(f"memory_reserve must be >= 0 bytes, got {reserve!r}")
    return max(int(device_memory) - int(reserve), 0)


def usable_text(device_memory: int, reserve: int = MEMORY_RESERVE_BYTES) -> str:
    """The limit, short: "79.00 GiB usable" ("80.00 GiB" with no reserve)."""
    if not reserve:
        return format_bytes(device_memory)
    return f"{format_bytes(usable_memory(device_memory, reserve))} usable"


def limit_text(device_memory: int, reserve: int = MEMORY_RESERVE_BYTES) -> str:
    """The limit as every verdict names it: "79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)"."""
    if not reserve:
        return format_bytes(device_memory)
    return f"{usable_text(device_memory, reserve)} ({format_bytes(device_memory)} − {format_bytes(reserve)} reserve)"


# The safety margin every fits verdict keeps below the usable memory (docs/cost-model.md, "Safety
# margin"): a plan whose judged peak lands inside it is "tight", not "fits". 5 % of the usable
# memory: the reserved/active spread torchtitan's published FSDP2 logs show between runs of one
# model that the allocator model does not explain (docs/cost-model.md), at least the issue's 5 %.
SAFETY_MARGIN = 0.05


def safety_margin_bytes(margin, usable: int, owner: str = "Mesh.safety_margin") -> int:
    """``margin`` as bytes of ``usable``: a fraction 0 <= x < 1 of it ("5%" too), or a size
    (bytes, "4GiB"). Anything else: a ValueError naming ``owner``."""
    if isinstance(margin, str) and margin.strip().endswith("%"):
        try:
            margin = float(margin.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"{owner}={margin!r}: expected a percentage such as '5%'") from None
        if not 0 <= margin < 1:
            raise ValueError(f"{owner} as a percentage must be in [0%, 100%), got {margin * 100:g}%")
    if isinstance(margin, float):
        if not (math.isfinite(margin) and 0 <= margin < 1):
            raise ValueError(f"{owner} as a fraction of usable memory must be in [0, 1), got {margin!r} "
                             "(a size such as '4GiB' for bytes)")
        return int(margin * usable)
    if isinstance(margin, bool):
        raise ValueError(f"{owner} must be a fraction (0.05), a percentage ('5%') or a size ('4GiB'), got {margin!r}")
    value = parse_size(margin, owner)
    if value < 0:
        raise ValueError(f"{owner} must be >= 0, got {margin!r}")
    return int(value)


def check_fit_settings(safety_margin, expandable_segments, judge) -> None:
    """``Mesh``'s fit settings, refused naming the field: ``safety_margin`` (a fraction of the usable
    memory, "5%" or a size; default ``SAFETY_MARGIN``: a peak inside it is "tight", not "fits");
    ``expandable_segments`` (the run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
    PyTorch's default is False; the reserved peak is modelled for it); ``judge``: "reserved" (the
    caching allocator's reserved peak, what runs out; default) or "allocated" (``a.memory.peak``,
    the bytes tensors hold: for another allocator, or to reason about the tensors alone)."""
    safety_margin_bytes(safety_margin, 1 << 40)
    if not isinstance(expandable_segments, bool):
        raise ValueError(f"Mesh.expandable_segments must be True or False, got {expandable_segments!r}")
    if judge not in ("reserved", "allocated"):
        raise ValueError(f"Mesh.judge must be 'reserved' or 'allocated', got {judge!r}")


def allocator_text(expandable_segments: bool) -> str:
    """The allocator setting as the verdicts name it."""
    return "expandable_segments:True" if expandable_segments else "caching allocator defaults (no expandable segments)"


def margin_text(margin) -> str:
    """The safety margin as the verdicts name it: "5 % safety margin" or "4.00 GiB safety margin"."""
    if isinstance(margin, float):
        return f"{100 * margin:g} % safety margin"
    if isinstance(margin, str) and margin.strip().endswith("%"):
        return f"{margin.strip()[:-1].strip()} % safety margin"
    return f"{format_bytes(parse_size(margin, 'safety_margin'))} safety margin"


class MemoryFit(NamedTuple):
    """The one fits verdict of one run on one device: every surface (the CLI, the report, the
    Inspector, SV201, the search, compare, the exported code's header) reads this record and its
    words, never the peak again. ``verdict``: "fits" when the judged peak keeps the safety margin
    below ``usable`` (``device_memory`` less ``reserve``), "tight" when it is inside the margin,
    "over" above ``usable``. ``fits``: not over (fits or tight: torch may run it); ``margin`` =
    usable − judged (negative: over by that). ``judged`` is the figure the verdict judges, named by
    ``judged_name``: the caching allocator's reserved peak (the default) or the allocated peak
    (``Mesh(judge="allocated")``); ``allocated`` and ``reserved`` are both peaks, for context."""

    fits: bool
    margin: int
    usable: int
    device_memory: int
    reserve: int
    text: str  # the limit in words (``limit_text``)
    verdict: str = "fits"  # fits | tight | over
    safety: int = 0  # the safety margin, bytes
    assumed: str = ""  # what the verdict assumes, in words: the peak judged, the allocator, the margin
    judged: int = 0  # the bytes judged against ``usable``
    judged_name: str = "reserved peak"  # "reserved peak" | "allocated peak"
    allocated: int = 0  # the allocated peak (``a.memory.peak``)
    reserved: int = 0  # the reserved peak (``a.memory.reserved_peak``)
    host: int = 0  # CPU offload's host RAM per node (the worst rank's ``cpu_peak`` x its ranks); 0: nothing offloaded
    host_memory: int | None = None  # the host RAM of one node (``Mesh.host_memory``); None: not given
    host_ranks: int = 0  # the ranks one node's host RAM serves

    @property
    def host_over(self) -> bool:
        """Something is offloaded and a node's host RAM cannot hold it."""
        return self.host > 0 and self.host_memory is not None and self.host > self.host_memory

    @property
    def host_text(self) -> str:
        """The host's part of the verdict ("" with nothing offloaded): "host RAM 134.50 GiB per node of
        2.00 TiB", "... exceeds 128.00 GiB by 6.50 GiB", or the need with no host limit given."""
        if self.host <= 0:
            return ""
        each = format_bytes(self.host // max(self.host_ranks, 1))
        return f"host RAM {format_bytes(self.host)} per node ({self.host_ranks} ranks x {each}){self.host_limit_text}"

    @property
    def host_limit_text(self) -> str:
        """The host's judgement alone: " of 2.00 TiB, 1.87 TiB to spare", " exceeds 128.00 GiB by 6.50 GiB",
        ", no host limit given (...): not judged"; "" with nothing offloaded."""
        if self.host <= 0:
            return ""
        if self.host_memory is None:
            return ", no host limit given (Mesh(host_memory=...), --host-memory): not judged"
        if self.host_over:
            return f" exceeds {format_bytes(self.host_memory)} by {format_bytes(self.host - self.host_memory)}"
        return f" of {format_bytes(self.host_memory)}, {format_bytes(self.host_memory - self.host)} to spare"

    @property
    def tight(self) -> bool:
        return self.verdict == "tight"

    @property
    def word(self) -> str:
        """ "fits", "tight" or "does not fit"."""
        return {"over": "does not fit"}.get(self.verdict, self.verdict)

    @property
    def fraction(self) -> float | None:
        """The judged peak over the usable memory; None when the reserve takes the whole device."""
        return self.judged / self.usable if self.usable > 0 else None

    @property
    def spare_text(self) -> str:
        """The device's spare bytes: "10.99 GiB to spare", "over by 380.00 MiB", "501 MiB to spare, inside the 3.95 GiB safety margin"."""
        if self.margin < 0:
            return f"over by {format_bytes(-self.margin)}"
        inside = f", inside the {format_bytes(self.safety)} safety margin" if self.tight else ""
        return f"{format_bytes(self.margin)} to spare{inside}"

    @property
    def headline(self) -> str:
        """The verdict in one line, the same on every surface: "does not fit: reserved peak 79.37 GiB
        exceeds 79.00 GiB usable by 380.00 MiB (allocated 68.01 GiB)", "fits: reserved peak 68.01 GiB
        of 79.00 GiB usable, 10.99 GiB to spare (allocated 60.20 GiB)"; with anything offloaded, the
        host's part after it (``host_text``), or first when only the host is over."""
        other = ("allocated", self.allocated) if self.judged_name == "reserved peak" else ("reserved", self.reserved)
        judged, usable = format_bytes(self.judged), format_bytes(self.usable)
        if self.usable <= 0:
            head = (f"does not fit: the {format_bytes(self.reserve)} reserve leaves nothing of "
                    f"{format_bytes(self.device_memory)} for the {self.judged_name} {judged}")
        elif self.margin < 0:
            head = f"does not fit: {self.judged_name} {judged} exceeds {usable} usable by {format_bytes(-self.margin)}"
        elif self.host_over:  # the device holds it, the host does not: the host's part first
            return (f"does not fit: {self.host_text}; device {self.judged_name} {judged} of {usable} usable, "
                    f"{self.spare_text} ({other[0]} {format_bytes(other[1])})")
        else:
            head = f"{self.word}: {self.judged_name} {judged} of {usable} usable, {self.spare_text}"
        host = f"; {self.host_text}" if self.host > 0 else ""
        return f"{head} ({other[0]} {format_bytes(other[1])}){host}"

    @property
    def words(self) -> str:
        """The verdict and what it assumes: the headline, then the peak judged, the allocator, the margin."""
        return f"{self.headline}; {self.assumed}" if self.assumed else self.headline


def memory_fit(peak: int, reserved: int, device_memory: int | None, reserve: int = MEMORY_RESERVE_BYTES,
               safety_margin=SAFETY_MARGIN, judge: str = "reserved", allocator: str = "", host: int = 0,
               host_memory: int | None = None, host_ranks: int = 0) -> MemoryFit | None:
    """Does the run fit a device of ``device_memory`` bytes keeping ``reserve`` out and
    ``safety_margin`` (``safety_margin_bytes``) to spare? ``peak`` is the allocated peak,
    ``reserved`` the caching allocator's reserved peak (``step.allocator``): both are always given,
    so no caller can judge the wrong one by leaving one out; ``judge`` says which decides
    ("reserved": the larger of the two, as the allocator never reserves less than it hands out).
    The one fits verdict; None when no device memory is given. ``allocator``: the allocator setting
    in words, for ``assumed``. ``host``: CPU offload's host RAM per node (0: nothing offloaded), for
    ``host_ranks`` ranks, judged against ``host_memory`` (None: not judged, and the headline says so):
    over the host's RAM is "over" whatever the device says. Nothing offloaded: the host fields keep
    their defaults, the record is the one without offload."""
    if device_memory is None:
        return None
    if judge not in ("reserved", "allocated"):
        raise ValueError(f"judge must be 'reserved' or 'allocated', got {judge!r}")
    usable = usable_memory(device_memory, reserve)
    judged = max(int(reserved), int(peak)) if judge == "reserved" else int(peak)
    safety = safety_margin_bytes(safety_margin, usable)
    spare = usable - judged
    verdict = "over" if spare < 0 else "tight" if spare < safety else "fits"
    if int(host) > 0 and host_memory is not None and int(host) > int(host_memory):
        verdict = "over"
    name = f"{judge} peak"
    assumed = ", ".join(x for x in (f"{name} judged", allocator if judge == "reserved" else "",
                                    margin_text(safety_margin)) if x)
    return MemoryFit(verdict != "over", spare, usable, int(device_memory), int(reserve),
                     limit_text(device_memory, reserve), verdict, safety, assumed, judged, name, int(peak), int(reserved),
                     *((int(host), None if host_memory is None else int(host_memory), int(host_ranks)) if host > 0 else ()))


# Sources (full URLs and the page each figure is read from in docs/step-time.md).
_NV_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_NV_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_TITAN_H100 = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"
_NV_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NV_B200 = "https://www.nvidia.com/en-us/data-center/hgx/"
_AMD_MI300X = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
_NV_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_AWS_A10G = "https://aws.amazon.com/ec2/instance-types/g5/"
_NV_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_NV_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"  # RTX 3090, NVLink
_NV_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"  # host: AWS g6.48xlarge, 8 x L4
# Host RAM of one node (``Device.host_memory``), only where a source states it: the DGX systems' "System
# Memory", 16 or 32 64 GB DIMMs, so binary TiB. DGX A100: 1 TB (320 GB model, 40 GB GPUs), 2 TB (640 GB
# model, 80 GB GPUs); DGX H100 / H200: 2 TB. Another vendor's server with these GPUs may have less: pass
# Mesh(host_memory=...) (--host-memory) for yours.
#   _DGX_A100: https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html
#   _DGX_H100: https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html
#   (these two user-guide pages were cited from memory; the 2 TB of 8-GPU H100 / H200 nodes is also what
#   MLCommons' submitted systems state: "host_memory_capacity": "2 TB", "32x 64GB" for
#   https://github.com/mlcommons/inference_results_v4.1/blob/main/closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json
#   and https://github.com/mlcommons/inference_results_v3.1/blob/main/closed/Dell/systems/XE9680_H100_SXM_80GBx8_TRT.json)
TiB = 1024**4

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("A100-40GB", 40 * GiB, 312, 312, 19.5, 1555, 300, 25, 8, _NV_A100, host_memory=1 * TiB),  # host: _DGX_A100
    Device("A100-80GB", 80 * GiB, 312, 312, 19.5, 2039, 300, 25, 8, _NV_A100, host_memory=2 * TiB),  # host: _DGX_A100
    Device("H100", 80 * GiB, 989, 989, 67, 3350, 450, 50, 8, _NV_H100, host_memory=2 * TiB),  # host: _DGX_H100
    Device("H100-PCIe", 80 * GiB, 756, 756, 51, 2000, 64, 25, 8, _NV_H100),
    # Meta's Grand Teton H100s: SXM with 96 GB HBM2e at 2.4 TB/s, capped at 500 W (torchtitan's
    # benchmarks/llama3_h100_202412_torchtitan.md); the SXM datasheet's peak kept (the cap lowers
    # the clock to somewhere between the SXM's and the NVL's peak, its value unpublished): the
    # achieved fraction of it is this part's own (_CHIP)
    Device("H100-500W", 96 * GiB, 989, 989, 67, 2400, 450, 50, 8, _TITAN_H100),
    Device("H200", 141 * GiB, 989, 989, 67, 4800, 450, 50, 8, _NV_H200, host_memory=2 * TiB),  # host: _DGX_H100
    Device("B200", 180 * GiB, 2250, 2250, 80, 8000, 900, 50, 8, _NV_B200),
    Device("MI300X", 192 * GiB, 1307.4, 1307.4, 163.4, 5300, 448, 50, 8, _AMD_MI300X),
    Device("L40S", 48 * GiB, 362.05, 362.05, 91.6, 864, 32, 12.5, 8, _NV_L40S),
    Device("A10G", 24 * GiB, 70, 70, 35, 600, 32, 1.5625, 8, _AWS_A10G, host_memory=768 * GiB),  # g5.48xlarge
    Device("L4", 24 * GiB, 121, 121, 30.3, 300, 32, 1.5625, 8, _NV_L4, host_memory=768 * GiB),  # g6.48xlarge
    Device("RTX-4090", 24 * GiB, 165.2, 165.2, 82.6, 1008, 32, 1.5625, 8, _NV_ADA),
    Device("RTX-3090", 24 * GiB, 71, 71, 35.6, 936, 32, 1.5625, 8, _NV_GA102),
    Device("RTX-3090-NVLink", 24 * GiB, 71, 71, 35.6, 936, 56.25, 1.5625, 2, _NV_GA102),  # two cards, one bridge
)}

_ALIASES = {"H100-SXM": "H100", "H100-SXM5": "H100", "H200-SXM": "H200", "A100": "A100-80GB",
            "A100-SXM-80GB": "A100-80GB", "A100-SXM-40GB": "A100-40GB", "RTX4090": "RTX-4090",
            "4090": "RTX-4090", "RTX3090": "RTX-3090",
            "3090": "RTX-3090", "MI300": "MI300X", "GEFORCE-RTX-3090": "RTX-3090", "GEFORCE-RTX-4090": "RTX-4090", "H100-GRAND-TETON": "H100-500W"}


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


# Words of a vendor's or nvidia-smi's spelling that do not tell two rows apart ("NVIDIA H100 80GB
# HBM3", "A100-SXM4-80GB", "AMD Instinct MI300X"): dropped before the lookup.
_NOISE = re.compile(r"^(NVIDIA|AMD|INSTINCT|TESLA|SXM\d?|HBM\d?E?)$")
_MEMORY_SUFFIX = re.compile(r"^(.+?)-?(\d+)GB$")


def _spellings(name: str) -> list[str]:
    """The keys ``name`` may be read as: itself, then without the vendor's noise words, then without
    a trailing memory size ("H100-80GB" -> "H100", kept with the size to check it)."""
    key = _key(name)
    plain = "-".join(w for w in key.split("-") if w and not _NOISE.match(w))
    return [k for k in dict.fromkeys((key, plain)) if k]


def _lookup_table() -> dict[str, Device]:
    table = {_key(k): v for k, v in DEVICES.items()}
    table.update({_key(alias): DEVICES[target] for alias, target in _ALIASES.items()})
    return table


def device_by_name(name: str) -> Device:
    """The ``DEVICES`` row called ``name``: case, spaces and underscores ignored, a few aliases such
    as "H100-SXM", and the vendors' spellings ("H100-80GB", "A100 40GB", "NVIDIA H100 80GB HBM3",
    "MI300X"): a trailing memory size must be the row's. Unknown: a ValueError listing the known
    names and the closest one."""
    if not isinstance(name, str):
        raise ValueError(f"device must be a name from {sorted(DEVICES)} or an sv.Device, got {name!r}")
    table = _lookup_table()
    spellings = _spellings(name)
    for key in spellings:
        if key in table:
            return table[key]
    for key in spellings:
        sized = _MEMORY_SUFFIX.match(key)
        base = table.get(sized.group(1).rstrip("-")) if sized else None
        if base is not None and base.memory == int(sized.group(2)) * GiB:
            return base
    stem = _MEMORY_SUFFIX.match(spellings[-1])
    close = difflib.get_close_matches(stem.group(1).rstrip("-") if stem else spellings[-1], list(table), n=1, cutoff=0.0)
    hint = f"; closest: {table[close[0]].name!r}" if close else ""
    raise ValueError(f"unknown device {name!r}: known devices are {', '.join(DEVICES)}{hint} "
                     "(or pass sv.Device(...) with your own figures)")


def mesh_defaults(mesh) -> dict:
    """What ``Mesh`` fills in: the device (a ``Device``); where the fields are None, the device's
    memory, GPUs per node and bandwidths (without one: 8 ranks per node); then the NICs: one per
    GPU at ``inter_node_gbps`` (a DGX), or the node's network split over the ``nics_per_node`` given."""
    device = as_device(mesh.device)
    out = {"device": device}
    defaults = {"ranks_per_node": 8}
    if device is not None:
        defaults = {"device_memory": device.memory, "ranks_per_node": device.gpus_per_node,
                    "intra_node_gbps": device.intra_node_gbps, "inter_node_gbps": device.inter_node_gbps,
                    "host_memory": device.host_memory}
    for key, value in defaults.items():
        out[key] = value if getattr(mesh, key) is None else getattr(mesh, key)
    out["host_memory"] = parse_host_memory(out.get("host_memory", mesh.host_memory), "Mesh.host_memory")
    nics, gbps, inter, rpn = mesh.nics_per_node, mesh.nic_gbps, out.get("inter_node_gbps", mesh.inter_node_gbps), out["ranks_per_node"]
    if nics is not None and (isinstance(nics, bool) or not isinstance(nics, int) or nics < 1):
        raise ValueError(f"Mesh.nics_per_node must be a positive int, got {nics!r}")
    if gbps is not None:
        _check_positive("Mesh", "nic_gbps", gbps)
    if isinstance(rpn, int) and not isinstance(rpn, bool) and rpn >= 1:  # else the Mesh refuses ranks_per_node
        nics = rpn if nics is None else nics
        if gbps is None and inter is not None:
            gbps = inter * rpn / nics  # the node's network, per NIC
    out.update(nics_per_node=nics, nic_gbps=gbps)
    return out


def as_device(device) -> Device | None:
    """None, a ``Device`` or a name from ``DEVICES`` -> a ``Device`` (or None)."""
    if device is None or isinstance(device, Device):
        return device
    return device_by_name(device)
