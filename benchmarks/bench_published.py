"""Predicted against published FSDP2 throughput: the table of docs/step-time.md, "Predicted vs published".

Each row is a published torchtitan run (FSDP only, bf16 parameters, fp32 reductions, AdamW); the
prediction is ``sv.analyze(...).step`` for the same model, ranks, device, micro-batch and
checkpointing (torchtitan's "selective op" is ``checkpoint="selective"``), with torch's FLOP count and
the default efficiencies. Rows 1-2 ran on Grand Teton H100s capped at 500 W, whose peak torchtitan
puts between the SXM's 989 and the NVL's 835 dense bf16 TFLOPS: they are predicted at both ends.
Run (under a minute: every row measures a step under FakeTensorMode):

    .venv/bin/python benchmarks/bench_published.py [--rows 1 3 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402
from shardviz.devices import DEVICES, default_efficiency  # noqa: E402

# Grand Teton's H100s (rows 1-2): HBM2e 96 GB at 2.4 TB/s, 500 W; the SXM peak is kept, as torchtitan's MFU does
TETON = dataclasses.replace(DEVICES["H100"], name="H100 (Grand Teton, 500 W)", memory="96GB", hbm_gbps=2400)
# the low end of torchtitan's footnote: the H100 NVL's dense bf16 peak (835 TFLOPS, NVIDIA's H100 datasheet)
TETON_LOW = dataclasses.replace(TETON, bf16_tflops=835, fp16_tflops=835)
A100 = "A100-80GB"

LLAMA2 = {  # config.json fields of meta-llama/Llama-2-13b-hf and Llama-2-70b-hf (shapes only, written by hand)
    "13b": {"hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
            "intermediate_size": 13824},
    "70b": {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "intermediate_size": 28672},
}

# (row, model, device, ranks, batch, seq, checkpoint, published tokens/s/GPU, published MFU or None, note)
ROWS = [
    (1, "llama3_8b", TETON, 8, 2, 8192, "selective", 5762, None, "selective op"),
    (2, "llama3_8b", TETON, 128, 2, 8192, "selective", 5605, None, "selective op"),
    (3, "llama3_8b", A100, 64, 1, 8192, "every 2", 2904, 0.568, "selective layer = every 2nd block in full"),
    (4, "llama3_8b", A100, 64, 1, 8192, "selective", 2973, 0.582, "selective op"),
    (5, "llama3_70b", A100, 64, 1, 8192, "blocks", 331, 0.517, ""),
    (6, "llama2_13b", A100, 64, 2, 4096, None, 2162, 0.611, ""),
    (7, "llama2_70b", A100, 64, 2, 4096, "blocks", 353, 0.505, ""),
]


def llama2(size: str):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "hidden_act": "silu", **LLAMA2[size]}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config))
        return sv.load_model(path)


def build(name: str):
    if name.startswith("llama2_"):
        return llama2(name.split("_")[1])
    return zoo.build(name, lora=False)


def predict(row) -> dict:
    n, name, device, ranks, batch, seq, checkpoint, published, published_mfu, note = row
    model = build(name)
    plan = sv.Plan.auto(model, checkpoint=checkpoint)
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=batch, seq_len=seq)
    t0 = time.perf_counter()
    step = step_on(model, plan, ranks, device, training)
    low = step_on(model, plan, ranks, TETON_LOW, training)["tokens_per_s"] if device is TETON else None
    return {"row": n, "model": name, "device": device if isinstance(device, str) else device.name, "ranks": ranks,
            "batch": f"{batch} x {seq}", "predicted_low": low,
            "checkpoint": checkpoint or "none", "published": published, "published_mfu": published_mfu,
            "predicted": step["tokens_per_s"], "mfu": step["mfu"], "step_time_s": step["step_time_s"],
            "exposed_comm_s": step["exposed_comm_s"], "reason": step["reason"], "note": note,
            "seconds": time.perf_counter() - t0}


def step_on(model, plan, ranks, device, training) -> dict:
    efficiency = default_efficiency("H100" if device in (TETON, TETON_LOW) else device)  # Grand Teton: the H100's
    return sv.analyze(model, plan, sv.Mesh(shard=ranks, device=device, efficiency=efficiency), training).step


def off_by(predicted: float, published: float) -> str:
    return f"{100 * (predicted / published - 1):+.0f} %"


def markdown(results: list[dict]) -> str:
    lines = ["| # | model | device | ranks | batch x seq | checkpointing | published tokens/s/GPU | predicted | off by "
             "| predicted MFU | step time (exposed comm) | note |",
             "|---|---|---|---:|---|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        if r["predicted"] is None:
            lines.append(f"| {r['row']} | {r['model']} | {r['device']} | {r['ranks']} | {r['batch']} | {r['checkpoint']} "
                         f"| {r['published']:,} | – | – | – | – | {r['reason']} |")
            continue
        low = ""
        if r["predicted_low"] is not None:
            low = f"; at 835 TFLOPS: {r['predicted_low']:,.0f} ({off_by(r['predicted_low'], r['published'])})"
        lines.append(
            f"| {r['row']} | {r['model']} | {r['device']} | {r['ranks']} | {r['batch']} | {r['checkpoint']} "
            f"| {r['published']:,} | {r['predicted']:,.0f} | {off_by(r['predicted'], r['published'])} "
            f"| {100 * r['mfu']:.1f} % | {r['step_time_s']:.2f} s ({r['exposed_comm_s']:.3f} s) | {r['note']}{low} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[r[0] for r in ROWS])
    args = parser.parse_args(argv)
    results = []
    for row in ROWS:
        if row[0] in args.rows:
            results.append(predict(row))
            print(f"row {row[0]}: {results[-1]['seconds']:.1f} s", file=sys.stderr)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
