"""Write ``docs/comparison.md``: LoRA ignored vs sharded vs separate on Llama 3.1 8B and 70B + LoRA.

For each model (meta device, LoRA r=16 on every linear layer, from ``shardviz.zoo``), each mesh
(8 and 64 ranks) and each LoRA layout of ``sv.Plan.auto``, the table gives what ``sv.analyze``
predicts per rank (parameters, gradients, optimizer states, peak) and per step (bytes the
collectives move, bytes each rank sends, and the time those sends take on the links below).
Every figure comes from ``a.memory`` / ``a.comm``; nothing is typed in. Run:

    .venv/bin/python benchmarks/bench_table.py            # writes docs/comparison.md and prints it
    .venv/bin/python benchmarks/bench_table.py --stdout   # print only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import shardviz as sv
from shardviz import zoo
from shardviz.run.mesh import worst_rank

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "comparison.md"
MODELS = (("Llama-3.1-8B + LoRA", zoo.llama3_8b), ("Llama-3.1-70B + LoRA", zoo.llama3_70b))
RANKS = (8, 64)
LAYOUTS = ("ignored", "sharded", "separate")
# What the figures assume: AdamW, bf16 compute with fp32 gradient reduction, 8 GPUs per node,
# NVLink inside a node and one 400 Gb/s NIC per GPU across nodes.
TRAINING = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")
RANKS_PER_NODE, INTRA_GBPS, INTER_GBPS = 8, 450.0, 50.0


def gib(n) -> str:
    return f"{n / 2**30:.2f}"


def rows():
    for label, build in MODELS:
        tree = sv.ModelTree(build(lora=True))
        trainable = sum(p.numel for p in tree.params if p.requires_grad)
        for ranks in RANKS:
            mesh = sv.Mesh(shard=ranks, ranks_per_node=RANKS_PER_NODE, intra_node_gbps=INTRA_GBPS,
                           inter_node_gbps=INTER_GBPS)
            for lora in LAYOUTS:
                a = sv.analyze(tree, sv.Plan.auto(tree, lora=lora), mesh, TRAINING)
                mem, comm = a.memory, a.comm
                worst = worst_rank(mem)
                yield {
                    "model": label,
                    "trainable": trainable,
                    "ranks": ranks,
                    "LoRA": lora,
                    "calls": len(a.plan.units),
                    "params": int(mem["params"].max()),
                    "grads": int(mem["grads"].max()),
                    "optimizer": int(mem["optimizer"].max()),
                    "optimizer_min": int(mem["optimizer"].min()),
                    "peak": int(mem.at[worst, "peak"]),
                    "peak_where": f"{mem.at[worst, 'peak_phase']}",
                    "collectives": int(comm["count"].sum()),
                    "bytes": int((comm["bytes"] * comm["count"]).sum()),
                    "sent": int((comm["sent_bytes"] * comm["count"]).sum()),
                    "time": float(comm.attrs["time_per_step_s"]),
                }


# Does it fit? Llama-3.1-70B + LoRA, one sequence of 8192 tokens per rank, activations measured.
# On H100s (sv.Mesh(device="H100"): 80 GiB, 450 GB/s NVLink, 50 GB/s per GPU across nodes): the step time too.
FIT_MODEL, FIT_BATCH, FIT_SEQ, DEVICE = ("Llama-3.1-70B + LoRA", zoo.llama3_70b), 1, 8192, "H100"


def fit_rows():
    label, build = FIT_MODEL
    model = build(lora=True)
    tree = sv.ModelTree(model)
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32",
                           batch_size=FIT_BATCH, seq_len=FIT_SEQ)
    for ranks in RANKS:
        mesh = sv.Mesh(shard=ranks, device=DEVICE)
        for lora in ("ignored", "sharded"):
            for checkpoint in (None, "blocks"):
                a = sv.analyze(tree, sv.Plan.auto(tree, lora=lora, checkpoint=checkpoint), mesh, training)
                mem = a.memory
                worst = worst_rank(mem)
                yield {
                    "model": label, "ranks": ranks, "LoRA": lora, "checkpoint": checkpoint or "none",
                    "state": int(mem.at[worst, "peak"] - mem.at[worst, "activations"]) if mem.at[worst, "activations"] else None,
                    "activations": int(mem.at[worst, "activations"]),
                    "peak": int(mem.at[worst, "peak"]),
                    "where": f"{mem.at[worst, 'peak_phase']}" + (f" ({mem.at[worst, 'peak_module'] or '<root>'})"
                                                                  if mem.at[worst, "peak_module"] is not None else ""),
                    "reserved": int(mem.at[worst, "reserved_peak"]),
                    "verdict": a.fit.verdict,  # the reserved peak, the reserve and the safety margin (Analysis.fit)
                    **{k: getattr(a.step, k) for k in ("step_time_s", "tokens_per_s", "mfu", "exposed_comm_s")},
                }


def fit_markdown(table: list[dict]) -> list[str]:
    lines = [
        "",
        f"### Does it fit, and how fast? {FIT_MODEL[0]}, batch {FIT_BATCH} x sequence {FIT_SEQ} per rank, {DEVICE}",
        "",
        "The same plans with `sv.Training(batch_size=1, seq_len=8192)`: the peak now includes the activations "
        "and temporaries of one training step, measured by torch (a real forward and backward under "
        "`FakeTensorMode`, see docs/activations.md), with and without `checkpoint_wrapper` on every block "
        "(`sv.Plan.auto(model, lora=..., checkpoint='blocks')`). *activations*: the activation bytes alive at the "
        "peak; *rest*: everything else alive then (parameters, gradients, optimizer states, FSDP buffers). "
        f"On `sv.Mesh(shard=..., device=\"{DEVICE}\")` (80 GiB; 450 GB/s inside a node of 8, 8 NICs of 50 GB/s per "
        f"node across nodes): *reserved*: what the caching allocator reserves at that peak (`a.memory.reserved_peak`, "
        "docs/cost-model.md); *fits*: the reserved peak keeps the 5 % safety margin within "
        f"{sv.Mesh(1, device=DEVICE).limit_text} (`a.fit`; *tight*: inside the margin), the reserve being "
        "the CUDA context and NCCL's buffers (`Mesh.memory_reserve`); *step*, *tokens/s* (per GPU) and *MFU* are "
        "`a.step`: each op of the step timed by its roofline (torch's FLOP count, its bytes, a kernel floor), "
        "FSDP2's overlap of compute and collectives, the optimizer step, at the preset of the model's stack "
        "(`hf-peft` for a peft model, docs/step-time.md); *exposed*: the communication compute waits for. The "
        "key/value cache: Llama 3.1's config keeps `use_cache=True`; the plans without checkpointing run with it, "
        "the checkpointed ones without it, as Hugging Face's gradient checkpointing turns it off "
        "(`Training(use_cache=None)`, docs/activations.md, use_cache).",
        "",
        "| model | ranks | LoRA | checkpoint | rest | activations | peak | reserved | peak in | fits | step | tokens/s | MFU | exposed |",
        "|---|---:|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in table:
        rest = r["peak"] - r["activations"]
        lines.append(f"| {r['model']} | {r['ranks']} | {r['LoRA']} | {r['checkpoint']} | {gib(rest)} | "
                     f"{gib(r['activations'])} | {gib(r['peak'])} | {gib(r['reserved'])} | {r['where']} | "
                     f"{ {'fits': 'yes', 'tight': 'tight', 'over': 'no'}[r['verdict']]} | "
                     f"{r['step_time_s']:.2f} s | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f} % | {r['exposed_comm_s']:.2f} s |")
    return lines


def markdown(table: list[dict], fits: list[dict] | None = None) -> str:
    lines = [
        "<!-- generated by benchmarks/bench_table.py; do not edit by hand -->",
        "## LoRA ignored vs sharded vs separate: memory per rank and traffic per step",
        "",
        f"Predicted by `sv.analyze` (shardviz {sv.__version__}, FSDP2 rules of torch {torch.__version__.split('+')[0]}) "
        "for Llama 3.1 8B and 70B with peft LoRA r=16 on every linear layer (base bf16 and frozen, "
        "adapters fp32 and trainable), `sv.Plan.auto(model, lora=...)`: one `fully_shard` call per decoder "
        "block, the embeddings, `[norm, lm_head]` and the root; *ignored*: the adapters listed in "
        "`ignored_params` (whole on every rank, their gradients averaged by one all-reduce per step as the "
        "exported code does); *sharded*: the adapters inside their block's call; *separate*: one call per "
        "adapter module. Training: AdamW, `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`. "
        "Bytes in GiB per rank (the worst rank where ranks differ); no batch is given, so the peak is the model "
        "state's (parameters, gradients, optimizer states, FSDP buffers; the next table adds activations). "
        f"Traffic: every collective's full buffer summed over one step, what each rank sends with ring "
        f"algorithms, and the time those sends take at {INTRA_GBPS:g} GB/s inside a node of {RANKS_PER_NODE} "
        f"and {INTER_GBPS:g} GB/s across nodes, collectives one after another (no overlap with compute).",
        "",
        "| model | ranks | LoRA | calls | params | grads | optimizer | peak | collectives / step | moved / step | sent / rank / step | comm time / step |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table:
        opt = gib(r["optimizer"]) if r["optimizer"] == r["optimizer_min"] else f"{gib(r['optimizer_min'])}-{gib(r['optimizer'])}"
        lines.append(
            f"| {r['model']} | {r['ranks']} | {r['LoRA']} | {r['calls']} | {gib(r['params'])} | {gib(r['grads'])} | "
            f"{opt} | {gib(r['peak'])} | {r['collectives']} | {gib(r['bytes'])} | {gib(r['sent'])} | {r['time']:.3f} s |"
        )
    lines += [
        "",
        "Reading it: keeping LoRA *ignored* costs every rank the whole adapters, their gradients and their "
        "AdamW states (the optimizer column does not shrink with more ranks), but saves one reduce-scatter "
        "per block and replaces them with a single all-reduce; *sharded* divides all of that by the number "
        "of ranks; *separate* adds two all-gathers per adapter per step (forward and backward) for no "
        "memory gain over *sharded*. Where a range is shown, later ranks hold fewer rows of the LoRA "
        "matrices (r=16 rows shard unevenly over 64 ranks) while every rank still allocates the padded shards.",
        "",
        "<sub>Columns: `a.memory` (params, grads, optimizer, peak) and `a.comm` (count, bytes, sent_bytes, time_s); "
        "formulas in docs/cost-model.md.</sub>",
    ]
    if fits:
        lines += fit_markdown(fits)
        lines += ["", "<sub>Columns: `a.memory` (activations, peak, reserved_peak, peak_phase, peak_module) on the "
                  "worst rank, `a.fit` (fits); `a.step` (step_time_s, tokens_per_s, mfu, exposed_comm_s).</sub>"]
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdout", action="store_true", help="print the table, do not write docs/comparison.md")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = list(rows())
    text = markdown(table, list(fit_rows()))
    print(text)
    print(f"{len(table)} analyses in {time.perf_counter() - start:.1f} s, building the meta models included",
          file=sys.stderr)
    if not args.stdout:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
