"""How long ``sv.search`` takes against one cold ``analyze`` with activations, and whether its choice fits.

Llama-3.1-70B + LoRA (meta, no download) on 64 ranks of 80 GiB, micro-batch 1 x 8192, AdamW with
bf16 parameters and fp32 reduction. Cold analyze: a fresh model object (the tree walk and the
activation measurement included), ``a.memory`` built. The search: another fresh model, every cache
emptied, over all its candidates. Then the chosen plan is analysed again on a fresh model: it must fit.
Target (issue 18): >= 200 plans in <= 10 x one cold analyze.
Run: .venv/bin/python benchmarks/bench_search.py [--model llama3_70b] [--world 64] [--seq 8192]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import activations, analysis, zoo  # noqa: E402


def mesh_for(world: int, memory: str) -> sv.Mesh:
    kw = {"device": "H100"} if "device" in {f.name for f in dataclasses.fields(sv.Mesh)} else {}
    return sv.Mesh(shard=world, device_memory=memory, **kw)


def cold():
    """Empty the activation caches (each model also starts cold: they are kept per model)."""
    activations.clear_cache()
    getattr(analysis, "_PROFILES", {}).clear()  # the analysis-level cache, where it still exists


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_70b")
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--memory", default="80GiB")
    args = ap.parse_args(argv)
    mesh = mesh_for(args.world, args.memory)
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32",
                           batch_size=args.batch, seq_len=args.seq)

    cold()
    model = zoo.build(args.model, lora=True)
    t0 = time.perf_counter()
    a = sv.analyze(model, sv.Plan.auto(model, lora="sharded", checkpoint="blocks"), mesh, training)
    a.memory  # noqa: B018 - the measurement and the memory table
    cold_s = time.perf_counter() - t0
    del a, model

    cold()
    model = zoo.build(args.model, lora=True)
    t0 = time.perf_counter()
    s = sv.search(model, mesh=mesh, training=training)
    search_s = time.perf_counter() - t0
    del model

    print(f"{args.model} + LoRA, {args.world} ranks x {args.memory}, micro-batch {args.batch} x {args.seq}")
    print(f"cold analyze with activations: {cold_s:.2f} s")
    print(f"search: {search_s:.2f} s over {s.n_candidates} plans ({s.n_analysed} analyses, the rest pruned) "
          f"= {search_s / cold_s:.1f} x one cold analyze (target <= 10 x, >= 200 plans)")
    print(s.note)
    print(s.formatted().head(12).to_string())
    if s.best is None:
        print("nothing fits")
        return 1
    cold()
    fresh = zoo.build(args.model, lora=True)
    again = sv.analyze(fresh, s.best, s.best_mesh, s.best_training or training)
    peak = int(again.memory.peak.max())
    ok = peak <= mesh.device_memory
    print(f"chosen: {s.best.name} on {s.best_mesh}; re-analysed: peak {sv.cost.format_bytes(peak)} "
          f"{'fits' if ok else 'DOES NOT FIT'} in {args.memory}")
    return 0 if ok and s.n_candidates >= 200 and search_s <= 10 * cold_s else 1


if __name__ == "__main__":
    raise SystemExit(main())
