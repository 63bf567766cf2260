"""The attention kernel a GPU runs where the measurement's CPU ran another: one table, with its source.

The activations are measured on the CPU (fake tensors), where torch's SDPA dispatches to
``_scaled_dot_product_flash_attention_for_cpu``; a report about an H100 must name what the H100
runs. torch's CUDA dispatcher (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
``select_sdp_backend``: flash first, then memory-efficient, then math; ``check_flash_attention``'s
dtype check admits only float16 and bfloat16, the memory-efficient kernel float32 too) picks:

| measured on the CPU | compute dtype | on the GPU |
|---|---|---|
| ``_scaled_dot_product_flash_attention_for_cpu`` | bfloat16, float16 | flash attention (``_scaled_dot_product_flash_attention``) |
| ``_scaled_dot_product_flash_attention_for_cpu`` | float32 | memory-efficient attention (``_scaled_dot_product_efficient_attention``) |
| ``_scaled_dot_product_attention_math`` (eager) | any | the same math path |

The CPU kernel and both GPU kernels save the output and a float32 logsumexp of (batch, heads,
seq), O(seq) (docs/activations.md, "Attention kernel"): the bytes measured are the GPU's.
"""

from __future__ import annotations

CPU_FLASH = "_scaled_dot_product_flash_attention_for_cpu"
SOURCE = "torch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, select_sdp_backend"

#: (CPU op, flash-capable dtype) -> what a GPU runs instead: (words, aten op)
GPU_KERNELS = {
    (CPU_FLASH, True): ("flash attention", "_scaled_dot_product_flash_attention"),
    (CPU_FLASH, False): ("memory-efficient attention", "_scaled_dot_product_efficient_attention"),
}
FLASH_DTYPES = frozenset({"bfloat16", "float16"})


def gpu_attention(ops, dtype) -> list[str]:
    """What a GPU runs for the attention ``ops`` measured on the CPU, in words with the aten op:
    ["flash attention (aten._scaled_dot_product_flash_attention)"]; an op with no GPU counterpart
    in ``GPU_KERNELS`` is named as it is (the math path runs the same everywhere)."""
    flash = str(dtype).replace("torch.", "") in FLASH_DTYPES
    out = []
    for op in ops:
        words, gpu = GPU_KERNELS.get((op, flash), (None, op))
        text = f"{words} (aten.{gpu})" if words else f"aten.{gpu}"
        if text not in out:
            out.append(text)
    return out


def attention_note(ops, dtype) -> str:
    """The profile's assumption about the attention kernel: what the GPU runs, in ``dtype``, and why
    the CPU's measurement stands for it; "" when no attention kernel ran."""
    if not ops:
        return ""
    shown = ", ".join(gpu_attention(ops, dtype))
    name = str(dtype).replace("torch.", "")
    cpu = " (measured by its CPU counterpart, which saves the same output and O(seq) logsumexp)" \
        if any(op == CPU_FLASH for op in ops) else ""
    return f"attention kernel on the GPU: {shown} in {name}{cpu}; {SOURCE}"
