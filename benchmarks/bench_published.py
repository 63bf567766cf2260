"""Predicted against published FSDP2 throughput: the table of docs/step-time.md, "Predicted vs published".

Each row is a published FSDP2 run with its settings (FSDP only, float32 parameters computed in bf16,
fp32 reductions, AdamW); the prediction is ``sv.analyze(...).step`` for the same model, ranks, device,
the cluster's network (``Row.network``), micro-batch and checkpointing (torchtitan's "selective op" is ``checkpoint="selective"``, "selective layer" every
second block in full), with torch's FLOP count, each op's bytes, and the preset of the row's stack
(``sv.Efficiency.for_stack``). Rows marked ``calibration`` fixed the presets' free figures
(``--calibrate`` refits them); the others check them. Run (a few minutes: every model measures a
step under FakeTensorMode):

    .venv/bin/python benchmarks/bench_published.py [--rows 1 3 5] [--calibrate]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import NamedTuple

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402
from shardviz.run.devices import Efficiency  # noqa: E402

GiB = 1024**3
TITAN_2024 = ("torchtitan docs/performance.md (2024, 64 A100)",
              "https://github.com/pytorch/torchtitan/blob/041336434916bdc0f88c1f89fda176fd3c2092e4/docs/performance.md")
TITAN_H100 = ("torchtitan benchmarks/llama3_h100_202412 (Grand Teton H100, 500 W)",
              "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md")

# The 2024 A100 runs were on AWS: torchtitan's multinode_trainer.slurm at the same commit is "optimized
# for AWS with EFA" ("Enable for A100": FI_PROVIDER=efa); AWS's A100 80GB node (p4de.24xlarge, as
# p4d) has 400 Gbps of EFA, 4 NICs of 100 Gbps ("Amazon EC2 P4d instances deep dive", AWS blog,
# 2020; SkyPilot's AWS EFA example: 4 EFA on p4d/p4de), not a DGX's 8 x 200 Gb/s HDR. NCCL reaches
# 340 of its 400 Gbps in all_reduce tests (stas00/ml-engineering, network/README.md, "EFA v1 0.4 Tbps
# (effective 340 Gbps for all_reduce tests) (P4 AWS instances)"): the bus fraction of these rows.
AWS_P4DE = {"mesh": {"nics_per_node": 4, "nic_gbps": 12.5}, "collective_bus": 340 / 400}
GRAND_TETON = {"mesh": {}, "collective_bus": None}  # the device's default: one NIC per GPU, the default bus

LLAMA2 = {  # config.json fields of meta-llama/Llama-2-13b-hf and Llama-2-70b-hf (shapes only, written by hand)
    "13b": {"hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
            "intermediate_size": 13824},
    "70b": {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "intermediate_size": 28672},
}


class Row(NamedTuple):
    n: int
    model: str
    device: str
    ranks: int
    batch: int
    seq: int
    checkpoint: str | None
    stack: str
    published: float  # tokens/s per GPU
    memory_gib: float | None  # published memory per GPU (torchtitan logs the caching allocator's max reserved)
    calibration: bool  # used to fit the stack's figures (else a check)
    source: tuple
    note: str = ""
    network: dict = GRAND_TETON  # the cluster's NICs (Mesh fields) and NCCL's bus fraction on them


ROWS = [
    Row(1, "llama3_8b", "A100-80GB", 64, 1, 8192, "every 2", "torchtitan-eager", 2904, None, False, TITAN_2024,
        "selective layer", network=AWS_P4DE),
    Row(2, "llama3_8b", "A100-80GB", 64, 1, 8192, "selective", "torchtitan-eager", 2973, None, True, TITAN_2024,
        "selective op", network=AWS_P4DE),
    Row(3, "llama3_70b", "A100-80GB", 64, 1, 8192, "blocks", "torchtitan-eager", 331, None, False, TITAN_2024, network=AWS_P4DE),
    Row(4, "llama2_13b", "A100-80GB", 64, 2, 4096, None, "torchtitan-eager", 2162, None, True, TITAN_2024, network=AWS_P4DE),
    Row(5, "llama2_13b", "A100-80GB", 64, 2, 4096, "every 2", "torchtitan-eager", 1914, None, False, TITAN_2024,
        "selective layer", network=AWS_P4DE),
    Row(6, "llama2_13b", "A100-80GB", 64, 2, 4096, "selective", "torchtitan-eager", 1904, None, False, TITAN_2024,
        "selective op", network=AWS_P4DE),
    Row(7, "llama2_70b", "A100-80GB", 64, 1, 4096, "selective", "torchtitan-eager", 355, None, False, TITAN_2024,
        "selective op", network=AWS_P4DE),
    Row(8, "llama2_70b", "A100-80GB", 64, 2, 4096, "blocks", "torchtitan-eager", 353, None, False, TITAN_2024, network=AWS_P4DE),
    Row(9, "llama3_8b", "H100-500W", 8, 2, 8192, "selective", "torchtitan-eager", 5762, 82.4, True, TITAN_H100,
        "Table 1"),
    Row(10, "llama3_8b", "H100-500W", 128, 2, 8192, "selective", "torchtitan-eager", 5605, 67.0, False, TITAN_H100,
        "Table 3"),
    Row(11, "llama3_8b", "H100-500W", 8, 2, 8192, "selective", "torchtitan-compile", 6667, 77.0, True, TITAN_H100,
        "Table 1, torch.compile"),
    Row(12, "llama3_8b", "H100-500W", 128, 2, 8192, "selective", "torchtitan-compile", 6514, 62.0, False,
        TITAN_H100, "Table 3, torch.compile"),
]


def llama2(size: str):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "hidden_act": "silu", "use_cache": False, **LLAMA2[size]}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config))
        return sv.load_model(path)


_MODELS: dict = {}


def torchtitan_weights(model):
    """``model`` with float32 parameters, as torchtitan trains: its models are built in the default
    dtype (float32) and ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``
    casts only what is all-gathered (torchtitan's parallelize_llama; its docs/fsdp.md), so the
    sharded parameters, their gradients and AdamW's states are float32. (The Hugging Face configs
    say bfloat16, which halves all three.)"""
    return model.float()


def build(name: str):
    if name not in _MODELS:
        model = llama2(name.split("_")[1]) if name.startswith("llama2_") else zoo.build(name, lora=False)
        model.config.use_cache = False  # training, as torchtitan's models (which have no cache)
        _MODELS[name] = torchtitan_weights(model)
    return _MODELS[name]


def torchtitan_plan(model, checkpoint):
    """torchtitan's layout (``parallelize_llama`` at both commits the rows ran: 0413364 and 9dec370):
    ``fully_shard`` on each transformer block, the last one with ``reshard_after_forward=False``
    ("FSDP would prefetch it immediately"), then on the whole model, so the root call holds the
    embedding, the final norm and the output projection (``Plan.auto`` gives those calls of their
    own). Checkpointing as ``Plan.auto`` places it."""
    blocks = [f"model.layers.{name}" for name, _ in model.model.layers.named_children()]
    units = [sv.Unit(b, reshard_after_forward=i < len(blocks) - 1) for i, b in enumerate(blocks)] + [""]
    return sv.Plan.auto(model, checkpoint=checkpoint).with_units(units)


def analyze(row: Row, efficiency: Efficiency):
    model = build(row.model)
    plan = torchtitan_plan(model, row.checkpoint)
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=row.batch,
                           seq_len=row.seq)
    bus = row.network["collective_bus"]
    efficiency = dataclasses.replace(efficiency, collective_bus=bus) if bus else efficiency
    mesh = sv.Mesh(shard=row.ranks, device=row.device, efficiency=efficiency, **row.network["mesh"])
    return sv.analyze(model, plan, mesh, training)


def predict(row: Row, efficiency: Efficiency | None = None) -> dict:
    t0 = time.perf_counter()
    a = analyze(row, efficiency or Efficiency.for_stack(row.stack, row.device))
    step = a.step
    return {"row": row, "predicted": step.tokens_per_s, "mfu": step.mfu, "step_time_s": step.step_time_s,
            "exposed_comm_s": step.exposed_comm_s, "reason": step.reason,
            "allocated_gib": int(a.memory.peak.max()) / GiB, "seconds": time.perf_counter() - t0}


def off_by(predicted: float, published: float) -> str:
    return f"{100 * (predicted / published - 1):+.0f} %"


def markdown(results: list[dict]) -> str:
    lines = ["| # | model | device | ranks | batch x seq | checkpointing | stack | use | published tokens/s/GPU "
             "| predicted | off by | predicted MFU | step (exposed comm) | published memory (reserved) "
             "| predicted allocated peak | source |",
             "|---|---|---|---:|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in results:
        row = r["row"]
        head = (f"| {row.n} | {row.model} | {row.device} | {row.ranks} | {row.batch} x {row.seq} "
                f"| {row.checkpoint or 'none'}{' (' + row.note + ')' if row.note else ''} | {row.stack} "
                f"| {'calibration' if row.calibration else 'check'} | {row.published:,}")
        if r["predicted"] is None:
            lines.append(f"{head} | – | – | – | – | – | – | {r['reason']} |")
            continue
        memory = f"{row.memory_gib:.1f} GiB" if row.memory_gib else "–"
        lines.append(f"{head} | {r['predicted']:,.0f} | {off_by(r['predicted'], row.published)} "
                     f"| {100 * r['mfu']:.1f} % | {r['step_time_s']:.2f} s ({r['exposed_comm_s']:.3f} s) | {memory} "
                     f"| {r['allocated_gib']:.1f} GiB | [{row.source[0]}]({row.source[1]}) |")
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    """The check rows' errors: what the calibration did not see."""
    checks = [r for r in results if not r["row"].calibration and r["predicted"] is not None]
    if not checks:
        return ""
    errors = [100 * (r["predicted"] / r["row"].published - 1) for r in checks]
    worst = max(errors, key=abs)
    return (f"check rows: {len(checks)}, tokens/s off by {min(errors):+.1f} % to {max(errors):+.1f} % "
            f"(worst {worst:+.1f} %, mean |error| {sum(map(abs, errors)) / len(errors):.1f} %)")


# ---------------------------------------------------------------------------
# Calibration: one figure per (stack, part), fitted on the calibration rows only
# ---------------------------------------------------------------------------
FITS = [  # (stack, device, the Efficiency field fitted, its bounds)
    ("torchtitan-eager", "A100-80GB", "matmul", (0.3, 1.0)),
    ("torchtitan-eager", "H100-500W", "matmul", (0.3, 1.0)),
    ("torchtitan-compile", "H100-500W", "memory_traffic", (0.05, 1.0)),
]


def fit(stack: str, device: str, field: str, bounds: tuple, rows: list[Row]) -> float | None:
    """The value of ``field`` that makes the calibration rows of (stack, device) right on average
    (geometric mean of predicted / published = 1), by bisection (throughput rises with ``matmul``
    and falls with ``memory_traffic``)."""
    chosen = [r for r in rows if r.calibration and r.stack == stack and r.device == device]
    if not chosen:
        return None
    base = Efficiency.for_stack(stack, device)

    def log_error(value: float) -> float:
        eff = dataclasses.replace(base, **{field: value})
        return sum(math.log(predict(r, eff)["predicted"] / r.published) for r in chosen) / len(chosen)

    lo, hi = bounds
    rising = field != "memory_traffic"
    for _ in range(14):
        mid = (lo + hi) / 2
        if (log_error(mid) < 0) == rising:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[r.n for r in ROWS])
    parser.add_argument("--calibrate", action="store_true", help="refit the presets' figures on the calibration rows")
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if r.n in args.rows]
    if args.calibrate:
        for stack, device, field, bounds in FITS:
            value = fit(stack, device, field, bounds, rows)
            if value is not None:
                print(f"{stack} on {device}: {field} = {value:.3f}")
        return 0
    results = []
    for row in rows:
        results.append(predict(row))
        print(f"row {row.n}: {results[-1]['seconds']:.1f} s", file=sys.stderr)
    print(markdown(results))
    print()
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
