"""How long measuring a step's activations takes (shardviz.activations.measure_activations).

Llama-3-70B + LoRA (meta, 80 layers) at batch 1 / seq 8192, bf16 compute, LoRA kept whole in fp32:
cold (first measurement: reduced copy, fake forward+backward under MemTracker, extrapolation),
warm (same question again: cache), and a toggle (checkpoint a middle block: the measurement is
reused, only the extrapolation runs, when the step keeps no key/value cache), plus a fully
checkpointed plan. The zoo's configs keep ``use_cache=True`` (transformers' default), so these
steps hold the cache (issue 20: still the reduced copy, the cache spliced per block); the same cold
measurement with ``use_cache=False`` is timed next to it. The tree walk is timed apart (callers
that already have a ModelTree pass it). Not a test: numbers depend on the load.
``--stages``: instead, the stages that make a profile out of a kept measurement (what an edit that
needs no new measurement pays: one block's checkpoint in a step without a key/value cache), each
the fastest of 5 (``docs/benchmarks.md``, issue 37).
Run: .venv/bin/python benchmarks/bench_activations.py [--model llama3_70b] [--seq 8192] [--stages]
     .venv/bin/python benchmarks/bench_activations.py --model llama3_8b --seq 2048   # issue 20's timing
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore")

from shardviz import zoo  # noqa: E402
from shardviz.activations import clear_cache, measure_activations  # noqa: E402
from shardviz.format import format_bytes  # noqa: E402
from shardviz.model.tree import ModelTree  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def fastest(fn, repeats: int = 5) -> float:
    return min(timed(fn)[0] for _ in range(repeats))


def stages(model, batch: int, seq: int) -> None:
    """``--stages``: each stage of ``measure._profile`` on the measurement an edit reuses."""
    from shardviz.activations import measure
    from shardviz.activations.flops import cost_subtrees, flop_index, module_sums
    from shardviz.activations.profile import event_index, last_in_subtree, module_stats
    from shardviz.activations.splice import block_saved, splice

    seen = {}
    real = measure._profile
    measure._profile = lambda *args: seen.update(args=args) or real(*args)
    try:
        base = measure_activations(model, batch, seq, use_cache=False)
        measure_activations(model, batch, seq, use_cache=False, checkpoint=[base.blocks[1]])
    finally:
        measure._profile = real
    tree, request, listed, lists, m, moe = seen["args"]
    timeline = splice(m.events, lists, m.kv_release)
    idx = event_index(timeline)
    ends = last_in_subtree(idx)
    saved = block_saved(m.events, lists)
    profile = real(*seen["args"])
    rows = [("splice", lambda: splice(m.events, lists, m.kv_release)), ("event_index", lambda: event_index(timeline)),
            ("last_in_subtree", lambda: last_in_subtree(idx)),
            ("module_stats", lambda: module_stats(timeline, idx, ends, set(request.checkpoint), saved)),
            ("module_sums", lambda: module_sums(timeline, ends)), ("cost subtrees", lambda: cost_subtrees(profile)),
            ("FLOP index", lambda: flop_index(profile)), ("the whole profile", lambda: real(*seen["args"]))]
    print(f"{len(timeline):,} events, {len(profile.modules):,} modules; the fastest of 5:")
    for name, fn in rows:
        print(f"  {name:<20}{1000 * fastest(fn):8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3_70b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--stages", action="store_true", help="the stages of a profile made from a kept measurement")
    args = ap.parse_args()
    if args.stages:
        stages(zoo.build(args.model, lora=True), args.batch, args.seq)
        return

    t_build, model = timed(lambda: zoo.build(args.model, lora=True))
    t_tree, tree = timed(lambda: ModelTree(model))
    lora = {p.fqn for p in tree.params if p.role == "lora"}
    kw = {"param_dtype": "bfloat16", "whole_params": lora, "tree": tree}
    clear_cache()
    t_cold, prof = timed(lambda: measure_activations(model, args.batch, args.seq, **kw))
    t_warm, _ = timed(lambda: measure_activations(model, args.batch, args.seq, **kw))
    clear_cache()
    t_no_cache, no_cache = timed(lambda: measure_activations(model, args.batch, args.seq, use_cache=False, **kw))
    middle = prof.blocks[len(prof.blocks) // 2]
    t_toggle, one = timed(lambda: measure_activations(model, args.batch, args.seq, checkpoint=[middle], **kw))
    t_all, ck = timed(lambda: measure_activations(model, args.batch, args.seq, checkpoint=prof.blocks, **kw))

    print(f"{args.model} + LoRA, batch {args.batch}, seq {args.seq}, bf16 compute, LoRA whole in fp32")
    print(f"  build (meta)            {t_build:7.2f} s   (not part of the measurement)")
    print(f"  ModelTree walk          {t_tree:7.2f} s   (skipped when the caller passes tree=)")
    print(f"  cold measurement        {t_cold:7.2f} s   ({prof.measured_blocks} block copies run for {len(prof.blocks)} blocks, "
          f"use_cache={model.config.use_cache}: the config's)")
    print(f"  cold, use_cache=False   {t_no_cache:7.2f} s   ({no_cache.measured_blocks} block copies; peak "
          f"{format_bytes(no_cache.peak_bytes)}, with the config's {format_bytes(prof.peak_bytes)})")
    print(f"  warm (cached)           {t_warm:7.3f} s")
    print(f"  toggle one checkpoint   {t_toggle:7.3f} s   (measurement reused without a cache; with one, the "
          "variants the plan has are run)")
    print(f"  all blocks checkpointed {t_all:7.3f} s")
    b = prof.at(middle)
    print(f"  peak activations        {format_bytes(prof.peak_bytes)} ({prof.peak[1]}, at {prof.peak[2] or 'root'})")
    print(f"  per block saved         {format_bytes(b.saved)}, checkpointed {format_bytes(ck.at(middle).saved)}")
    print(f"  one block checkpointed  {format_bytes(one.peak_bytes)}; all {format_bytes(ck.peak_bytes)}")
    print(f"  attention kernel        {', '.join(prof.attention) or 'none seen'}")


if __name__ == "__main__":
    main()
