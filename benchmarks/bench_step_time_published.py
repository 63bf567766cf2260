"""Predicted vs published FSDP2 throughput (docs/step-time.md, "A first check").

Analytic FLOPs per unit (forward 2 x parameters x tokens, + 4 h q t per token of attention in each
block, backward twice forward, full recomputation = the block's forward), the real comm table of
``sv.analyze``, the device table and ``default_efficiency``; then ``schedule_step``. Replace
``analytic_flops`` by torch's counts (``a.step["flops"]`` per unit) once they are wired in.

    python benchmarks/bench_step_time_published.py
"""

from __future__ import annotations

import shardviz as sv
from shardviz import zoo
from shardviz.devices import DEVICES, default_efficiency
from shardviz.schedule import comm_seconds, schedule_step, step_summary, unit_times

# (label, model builder, (heads, head_dim), device, FSDP ranks, batch, seq, checkpoint, published tokens/s/GPU)
ROWS = [
    ("1: Llama 3.1 8B, 8 x H100, bs 2 (selective op not modelled)", zoo.llama3_8b, (32, 128), "H100", 8, 2, 8192, None, 5762),
    ("2: Llama 3.1 8B, 128 x H100, bs 2 (same)", zoo.llama3_8b, (32, 128), "H100", 128, 2, 8192, None, 5605),
    ("4: Llama 3 8B, 64 x A100, bs 1 (selective op not modelled)", zoo.llama3_8b, (32, 128), "A100-80GB", 64, 1, 8192, None, 2973),
    ("5: Llama 3 70B, 64 x A100, bs 1, full AC", zoo.llama3_70b, (64, 128), "A100-80GB", 64, 1, 8192, "blocks", 331),
]


def analytic_flops(a, plan, heads_dim, tokens: int, seq: int, checkpoint) -> dict:
    heads, head_dim = heads_dim
    sharded = a.params[a.params.status == "sharded"]
    flops = {}
    for unit in plan.units:
        forward = 2 * int(sharded[sharded.unit == unit.name].numel.sum()) * tokens
        block = ".layers." in unit.name
        forward += 4 * heads * head_dim * seq * tokens if block else 0
        forward = 0 if "embed" in unit.name else forward  # a lookup
        flops[unit.name] = {"forward": forward, "backward": 2 * forward, "recompute": forward if checkpoint and block else 0}
    return flops


def predict(build, heads_dim, device, shard, batch, seq, checkpoint) -> dict:
    model = build(lora=False)
    plan = sv.Plan.auto(model, checkpoint=checkpoint)
    a = sv.analyze(model, plan, sv.Mesh(shard=shard, device=device),
                   sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32"))
    tokens = batch * seq
    flops = analytic_flops(a, plan, heads_dim, tokens, seq, checkpoint)
    eff = default_efficiency(device)
    comm_s, _ = comm_seconds(a.comm, eff)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    root = next(u for u in plan.units if u.modules == ("",))
    others = sorted((u for u in plan.units if u is not root), key=lambda u: order[u.modules[0]])
    rows = unit_times([u.name for u in others] + [root.name], flops=flops, comm_s=comm_s, device=DEVICES[device],
                      efficiency=eff, reshard_after_forward={root.name: False})  # every parameter trains
    schedule = schedule_step(rows[:-1], root=rows[-1])
    executed = sum(f["forward"] + f["backward"] + f["recompute"] for f in flops.values())
    model_flops = sum(f["forward"] + f["backward"] for f in flops.values())
    return step_summary(schedule, tokens=tokens, flops=executed, model_flops=model_flops,
                        peak_flops=DEVICES[device].peak_flops())


def main() -> None:
    for label, build, heads_dim, device, shard, batch, seq, checkpoint, published in ROWS:
        s = predict(build, heads_dim, device, shard, batch, seq, checkpoint)
        off = (s["tokens_per_s"] / published - 1) * 100
        print(f"{label}: predicted {s['tokens_per_s']:,.0f} tokens/s/GPU (MFU {s['mfu']:.1%}, exposed "
              f"{s['exposed_comm_s']:.3f} s of {s['step_time_s']:.2f} s), published {published:,} ({off:+.0f} %)")


if __name__ == "__main__":
    main()
