"""Llama-3.1-70B with FSDP 32 x TP 8 on 256 H100s, batch 16 x 8192, predicted against torchtitan's 2-D run.

Published (torchtitan, pytorch/torchtitan):

- benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: "Llama3 70b on 256 H100s with FSDP=32,
  TP=8, torch.compile, full AC, local batch size 16": vanilla TP 597.3 tokens/s/GPU in bfloat16,
  809.8 with float8 tensorwise (async TP: 652.4 / 942.4);
- benchmarks/llama3_h100_202412_torchtitan.md, Table 4: the same run with torch.compile + Float8,
  829 tokens/s/GPU at 71.9 GiB (2D + AsyncTP: 876 at 67.6 GiB).

Both ran on Grand Teton H100s (HBM2e 96 GB, 2.4 TB/s, 500 W; peak between the SXM's 989 and the
NVL's 835 dense bf16 TFLOPS), 400 Gb/s RDMA per GPU between hosts. The prediction is
``sv.analyze(...).step`` for torchtitan's plan (``tensor_parallel="torchtitan"``: sequence-parallel
norms, sharded embedding and output, loss parallel), every block checkpointed, bf16 parameters,
fp32 reductions, AdamW, the H100's default efficiencies; it is compared with the bfloat16 figure.

What the prediction cannot include: torch.compile's fused kernels (the matmul efficiency is
llm-foundry's eager-FSDP median, not compiled TP), float8 matmuls (the 809.8 / 829 figures:
shardviz prices bf16 tensor cores only), async TP's overlap of TP collectives with matmuls (TP
collectives are put on the critical path), NCCL latency of the small TP messages (bandwidth only),
and sequence parallelism's activation savings on a transformers model (it reads positions off the
embedding's output, so one tensor rank's model runs full sequences: the memory figure is an upper
bound; the step time is not affected).

Run (about a minute: the step is measured under FakeTensorMode on one tensor rank's model):

    .venv/bin/python benchmarks/bench_tp.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402
from shardviz.run.devices import DEVICES, default_efficiency  # noqa: E402

TETON = dataclasses.replace(DEVICES["H100"], name="H100 (Grand Teton, 500 W)", memory="96GB", hbm_gbps=2400)
TETON_LOW = dataclasses.replace(TETON, bf16_tflops=835, fp16_tflops=835)
PUBLISHED_BF16 = 597.3  # tokens/s/GPU, vanilla TP, bfloat16 (asyncTP_llama3_h100_2025-06_torchtitan.md)
PUBLISHED_FLOAT8 = 829  # tokens/s/GPU, Table 4 of llama3_h100_202412_torchtitan.md (71.9 GiB)


def predict(device) -> sv.Analysis:
    model = zoo.build("llama3_70b", lora=False)
    plan = sv.Plan.auto(model, checkpoint="blocks", tensor_parallel="torchtitan")
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=16, seq_len=8192)
    mesh = sv.Mesh(shard=32, tensor=8, device=device, efficiency=default_efficiency("H100"))
    return sv.analyze(model, plan, mesh, training)


def main() -> int:
    t0 = time.perf_counter()
    rows = []
    for device in (TETON, TETON_LOW):
        a = predict(device)
        step = a.step
        rows.append((device.bf16_tflops, step.tokens_per_s, step.step_time_s, step.tensor_comm_s,
                     step.exposed_comm_s, int(a.memory.peak.max())))
    print(f"Llama-3.1-70B, FSDP 32 x TP 8 (torchtitan's plan), 256 H100s, batch 16 x 8192, full AC "
          f"({time.perf_counter() - t0:.0f} s)")
    print("| peak TFLOPS | predicted tokens/s/GPU | vs published bf16 597.3 | step time | TP collectives | exposed FSDP "
          "comm | peak memory (upper bound) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for tflops, tps, step_s, tp_s, exposed, peak in rows:
        print(f"| {tflops:g} | {tps:,.0f} | {100 * (tps / PUBLISHED_BF16 - 1):+.0f} % | {step_s:.1f} s | {tp_s:.1f} s "
              f"| {exposed:.2f} s | {peak / 2**30:.1f} GiB |")
    print(f"(float8 + compile, not predicted: {PUBLISHED_FLOAT8} tokens/s/GPU at 71.9 GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
