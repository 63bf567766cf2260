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
from dataclasses import dataclass, fields
from typing import NamedTuple

from .format import format_bytes, parse_size

GiB = 1024**3
MiB = 1024**2

def _check_positive(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


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

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Device.name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "memory", parse_size(self.memory, "Device.memory"))
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
    """Achieved fractions of the peaks (0 < x <= 1). Defaults and their sources: docs/step-time.md.

    - ``matmul``: FLOPs of the step / (time computing x peak dense FLOPS): matmuls, attention and
      the memory-bound kernels between them together;
    - ``collective_bus``: NCCL bus bandwidth / link bandwidth (what nccl-tests calls busbw);
    - ``hbm``: bytes moved / (time x HBM bandwidth), for the optimizer step.
    """

    matmul: float = 0.5
    collective_bus: float = 0.8
    hbm: float = 0.8

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            _check_positive("Efficiency", f.name, value)
            if value > 1:
                raise ValueError(f"Efficiency.{f.name} is a fraction of the peak, at most 1, got {value!r}")


DEFAULT_EFFICIENCY = Efficiency()

# Achieved compute fraction where a published training benchmark gives one for the part, taken
# from runs that are not among the ones docs/step-time.md predicts: the median HFU (FLOPs executed,
# recomputation included, over time x peak) of llm-foundry's MPT benchmarks of 7B-70B models
# (FSDP, bf16, flash attention; scripts/train/benchmarking/README.md): H100 0.48 over 22 runs,
# A100-80GB 0.72 over 13. HFU includes exposed communication, so these are lower bounds.
MEASURED_MATMUL_EFFICIENCY = {"A100-40GB": 0.72, "A100-80GB": 0.72, "H100": 0.48, "H100-PCIe": 0.48, "H200": 0.48}


def default_efficiency(device) -> Efficiency:
    """``DEFAULT_EFFICIENCY`` with the measured matmul efficiency of ``device`` (a ``Device`` or a
    name) where ``MEASURED_MATMUL_EFFICIENCY`` has one; a user's own ``Efficiency`` always wins."""
    name = device.name if isinstance(device, Device) else device_by_name(device).name
    matmul = MEASURED_MATMUL_EFFICIENCY.get(name, DEFAULT_EFFICIENCY.matmul)
    return Efficiency(matmul=matmul, collective_bus=DEFAULT_EFFICIENCY.collective_bus, hbm=DEFAULT_EFFICIENCY.hbm)

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


class MemoryFit(NamedTuple):
    """The fits verdict of one peak on one device: ``fits`` when the peak is at most ``usable``
    (``device_memory`` less ``reserve``); ``margin`` = usable − peak (negative: over by that)."""

    fits: bool
    margin: int
    usable: int
    device_memory: int
    reserve: int
    text: str  # the limit in words (``limit_text``)


def memory_fit(peak: int, device_memory: int | None, reserve: int = MEMORY_RESERVE_BYTES) -> MemoryFit | None:
    """Does ``peak`` bytes fit a device of ``device_memory`` bytes keeping ``reserve`` out? The one
    fits verdict (compare, search, SV201, the charts); None when no device memory is given."""
    if device_memory is None:
        return None
    usable = usable_memory(device_memory, reserve)
    return MemoryFit(int(peak) <= usable, usable - int(peak), usable, int(device_memory), int(reserve),
                     limit_text(device_memory, reserve))


# Sources (full URLs and the page each figure is read from in docs/step-time.md).
_NV_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_NV_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_NV_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NV_B200 = "https://www.nvidia.com/en-us/data-center/hgx/"
_AMD_MI300X = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
_NV_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_AWS_A10G = "https://aws.amazon.com/ec2/instance-types/g5/"
_NV_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("A100-40GB", 40 * GiB, 312, 312, 19.5, 1555, 300, 25, 8, _NV_A100),
    Device("A100-80GB", 80 * GiB, 312, 312, 19.5, 2039, 300, 25, 8, _NV_A100),
    Device("H100", 80 * GiB, 989, 989, 67, 3350, 450, 50, 8, _NV_H100),
    Device("H100-PCIe", 80 * GiB, 756, 756, 51, 2000, 64, 25, 8, _NV_H100),
    Device("H200", 141 * GiB, 989, 989, 67, 4800, 450, 50, 8, _NV_H200),
    Device("B200", 180 * GiB, 2250, 2250, 80, 8000, 900, 50, 8, _NV_B200),
    Device("MI300X", 192 * GiB, 1307.4, 1307.4, 163.4, 5300, 448, 50, 8, _AMD_MI300X),
    Device("L40S", 48 * GiB, 362.05, 362.05, 91.6, 864, 32, 12.5, 8, _NV_L40S),
    Device("A10G", 24 * GiB, 70, 70, 35, 600, 32, 1.5625, 8, _AWS_A10G),
    Device("RTX-4090", 24 * GiB, 165.2, 165.2, 82.6, 1008, 32, 1.5625, 8, _NV_ADA),
)}

_ALIASES = {"H100-SXM": "H100", "H100-SXM5": "H100", "H200-SXM": "H200", "A100": "A100-80GB",
            "A100-SXM-80GB": "A100-80GB", "A100-SXM-40GB": "A100-40GB", "RTX4090": "RTX-4090",
            "4090": "RTX-4090", "MI300": "MI300X"}


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


def as_device(device) -> Device | None:
    """None, a ``Device`` or a name from ``DEVICES`` -> a ``Device`` (or None)."""
    if device is None or isinstance(device, Device):
        return device
    return device_by_name(device)
