"""How fast the engine is, against torch's own fully_shard on the same plan.

For each model: the tree walk alone, a cold `analyze` (a fresh model object, so the walk is
included, plus the params/units tables), `analyze` on a cached tree, torch's `fully_shard` for
the same plan under the fake process group (on a meta copy, the copy not timed), the ratio
cold analyze / torch, and re-analysing after one unit is added or removed on the cached tree
(what a widget toggle costs), and the Inspector's change of plan in CPU time
(``--change-of-plan`` for that alone, without and with the findings, ``--stages`` for each stage's time,
``--profile`` to cProfile it, ``--against /work/main`` to time another checkout's code first). Run: .venv/bin/python benchmarks/bench_analyze.py [--models llama3_70b ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy  # noqa: E402


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def bench(name: str, world: int, layout: str) -> dict:
    model = zoo.build(name, lora=True)
    mesh = sv.Mesh(world)
    walk, _ = best_of(lambda: sv.ModelTree(model), repeat=5)
    # for scale: torch's own traversals, names only (the walk also finds identities, ties, roles, buffers)
    torch_walk, _ = best_of(lambda: (list(model.named_modules()), list(model.named_parameters())), repeat=5)
    tree = sv.ModelTree(model)
    plan = sv.Plan.auto(tree, lora=layout)

    # Cold: what a user's first `sv.analyze(model, plan)` costs on a model object never seen
    # before (each repeat gets its own fresh model, built untimed).
    cold_times = []
    for _ in range(3):
        fresh = zoo.build(name, lora=True)
        t0 = time.perf_counter()
        a = sv.analyze(fresh, plan, mesh)
        a.params, a.units  # noqa: B018 - build the tables too
        cold_times.append(time.perf_counter() - t0)
        del fresh, a
    cold_s = min(cold_times)

    def full():
        a = sv.analyze(tree, plan, mesh)
        a.params, a.units  # noqa: B018 - build the tables too

    analyze_s, _ = best_of(full, repeat=3)
    engine_s, _ = best_of(lambda: sv.analyze(tree, plan, mesh), repeat=5)

    def costs():
        a = sv.analyze(tree, plan, mesh)
        a.memory, a.comm, a.findings  # noqa: B018 - what the widget recomputes on every toggle

    cost_s, _ = best_of(costs, repeat=5)

    order = sv.analyze(tree, plan, mesh).layout.order  # so that only fully_shard itself is timed
    torch_times = []
    for _ in range(2):
        copy_ = meta_copy(model)
        with fake_process_group(0, world):
            dmesh = device_mesh(mesh)
            t0 = time.perf_counter()
            apply_plan(copy_, plan, dmesh, order=order)
            torch_times.append(time.perf_counter() - t0)
    torch_s = min(torch_times)

    # One toggle: remove a block's unit, add it back (each re-analysed on the cached tree).
    block = plan.units[len(plan.units) // 2].modules[0]
    smaller = plan.without_unit(block)
    toggle_remove, med_remove = best_of(lambda: sv.analyze(tree, smaller, mesh), repeat=10)
    toggle_add, med_add = best_of(lambda: sv.analyze(tree, smaller.with_unit(block), mesh), repeat=10)
    return {
        "model": f"{name} + LoRA ({layout})", "world": world, "modules": tree.n_modules,
        "params": len(tree.params), "units": len(plan.units),
        "walk_ms": walk * 1e3, "torch_walk_ms": torch_walk * 1e3, "cold_ms": cold_s * 1e3, "analyze_ms": analyze_s * 1e3, "engine_ms": engine_s * 1e3,
        "costs_ms": cost_s * 1e3, "torch_ms": torch_s * 1e3, "cold_ratio": cold_s / torch_s,
        "toggle_ms": max(toggle_remove, toggle_add) * 1e3, "toggle_median_ms": max(med_remove, med_add) * 1e3,
    }


def bench_change_of_plan(name: str = "llama3_70b", world: int = 64, repeat: int = 21, profile: bool = False,
                         stages: bool = False, findings: bool = False) -> float:
    """The Inspector's change of plan (issue 25, target 5 ms): one block's call removed, the new plan
    analysed on the cached tree up to the model-state numbers (``a.memory``, ``a.comm``; no
    activations), and with ``findings`` its findings too (issue 36, target 10 ms). CPU time
    (``time.process_time``), median over ``repeat`` edits, each of another block (no plan seen
    twice, so no cache keyed on the plan helps), so that the load matters less."""
    model = zoo.build(name, lora=True)  # kept alive, as the Inspector keeps it (a step of it orders the walk)
    tree = sv.ModelTree(model)
    mesh = sv.Mesh(world)
    plan = sv.Plan.auto(tree, lora="sharded")
    blocks = [u.modules[0] for u in plan.units if u.modules[0]][: repeat + 1]
    plans = [plan.without_unit(b) for b in blocks]  # the edit itself is not timed, only what follows it

    def change(p):
        a = sv.analyze(tree, p, mesh, strict=False)
        a.memory, a.comm  # noqa: B018 - what the Inspector redraws after an edit
        if findings:
            a.findings  # noqa: B018 - and the findings it lists

    change(plans[0])  # warm: the tree's cached arrays
    times = []
    for p in plans[1:]:
        t0 = time.process_time()
        change(p)
        times.append(time.process_time() - t0)
    median = statistics.median(times)
    what, target = ("analyze + memory + comm + findings", 10) if findings else ("analyze + memory + comm", 5)
    print(f"change of plan: {name}+LoRA, {world} ranks, one block's call removed: {what} "
          f"{median * 1e3:.2f} ms CPU (median of {len(times)}, min {min(times) * 1e3:.2f}; target {target} ms)")
    if stages:
        stage_times(lambda: [change(p) for p in plans[1:]])
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for p in plans[1:]:
            change(p)
        prof.disable()
        pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("ROWS", 25)))
    return median


def stage_times(run, rounds: int = 3) -> None:
    """CPU time of each stage of a change of plan (the layout, each input of ``step.cost_model``,
    the traced step, the two tables), minimum and median over ``rounds`` calls of ``run``."""
    from shardviz import analysis
    from shardviz.step import model

    times: dict[str, list[float]] = {}

    def timed(module, name):
        fn = getattr(module, name)

        def wrapper(*args, **kw):
            t0 = time.process_time()
            out = fn(*args, **kw)
            times.setdefault(name, []).append(time.process_time() - t0)
            return out
        setattr(module, name, wrapper)
        return fn

    stages = [(analysis, "Layout"), (analysis, "memory_table"), (analysis, "step_collectives"), (analysis, "comm_table")] + [
        (model, n) for n in ("sharded_params", "whole_params", "build_calls", "optimizer_state",
                             "resident_state", "replayed_step")]
    originals = [(module, name, timed(module, name)) for module, name in stages]
    try:
        for _ in range(rounds):
            run()
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    for name, ts in times.items():
        print(f"  {name:16s} min {min(ts) * 1e3:6.3f} ms  median {statistics.median(ts) * 1e3:6.3f} ms  ({len(ts)} calls)")


def bench_activations(name: str = "llama3_70b", world: int = 64, batch: int = 1, seq: int = 8192) -> None:
    """The time to add activations (issue targets: under 3 s cold, under 20 ms for a change of plan or a
    checkpoint toggle at the same batch and sequence) on a cached tree."""
    from shardviz.activations import clear_cache

    model = zoo.build(name, lora=True)
    tree = sv.ModelTree(model)
    mesh = sv.Mesh(world)
    training = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=batch, seq_len=seq)
    plan = sv.Plan.auto(tree, lora="sharded")
    clear_cache()
    t0 = time.perf_counter()
    a = sv.analyze(tree, plan, mesh, training)
    a.memory
    cold = time.perf_counter() - t0
    state_only = best_of(lambda: sv.analyze(tree, plan, mesh, sv.Training(param_dtype="bfloat16")).memory, 3)[0]
    block = plan.units[1].modules[0]
    change, _ = best_of(lambda: sv.analyze(tree, plan.without_unit(block), mesh, training).memory, 3)
    ckpt = plan.with_checkpoint([block])
    t0 = time.perf_counter()
    sv.analyze(tree, ckpt, mesh, training).memory
    ckpt_first = time.perf_counter() - t0
    ckpt_again, _ = best_of(lambda: sv.analyze(tree, ckpt, mesh, training).memory, 3)
    print(f"\nactivations: {name}+LoRA, {world} ranks, batch {batch}, seq {seq}, bf16: cold analyze with activations "
          f"{cold:.2f} s (target < 3 s; model state only {state_only * 1e3:.0f} ms); change of plan "
          f"{change * 1e3:.1f} ms (target < 20 ms); checkpoint one block: first {ckpt_first * 1e3:.0f} ms, "
          f"again {ckpt_again * 1e3:.1f} ms; peak {a.memory.peak.max() / 2**30:.2f} GiB of which activations "
          f"{a.memory.activations.max() / 2**30:.2f} GiB")


def bench_step(name: str = "llama3_70b", world: int = 64, batch: int = 1, seq: int = 8192) -> None:
    """The time to add the step-time model (a.step: schedule + FLOPs + comm + optimizer, issue 17 targets: under
    10 % of the activation measurement cold, under 20 ms for a change of plan) on a cached tree, H100s."""
    from shardviz.activations import clear_cache

    model = zoo.build(name, lora=True)  # kept alive: the activations are measured by running it
    tree = sv.ModelTree(model)
    mesh = sv.Mesh(world, device="H100")
    training = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=batch, seq_len=seq)
    plan = sv.Plan.auto(tree, lora="sharded")
    clear_cache()
    t0 = time.perf_counter()
    a = sv.analyze(tree, plan, mesh, training)
    a.memory, a.comm  # noqa: B018 - the activation measurement and the tables the step reads
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    step = a.step
    cold_step = time.perf_counter() - t0
    block = plan.units[1].modules[0]

    def changed():
        b = sv.analyze(tree, plan.without_unit(block), mesh, training)
        b.memory, b.comm  # noqa: B018
        t0 = time.perf_counter()
        b.step  # noqa: B018
        return time.perf_counter() - t0

    change = min(changed() for _ in range(5))
    print(f"\nstep time: {name}+LoRA, {world} x H100, batch {batch}, seq {seq}: cold analyze with activations "
          f"{cold:.2f} s, then a.step {cold_step * 1e3:.1f} ms ({100 * cold_step / cold:.1f} % of it, target < 10 %); "
          f"change of plan: a.step {change * 1e3:.1f} ms (target < 20 ms); step {step.step_time_s:.2f} s, "
          f"{step.tokens_per_s:,.0f} tokens/s per rank, MFU {100 * step.mfu:.1f} %")


def against(checkout: str, world: int) -> None:
    """The change of plan (with and without findings) on the shardviz of ``checkout``, printed first."""
    import subprocess
    import sys

    code = ("import sys; sys.path[:0] = sys.argv[1:3]; import bench_analyze as b, shardviz\n"
            "print('shardviz from', shardviz.__file__)\n"
            "for f in (False, True): b.bench_change_of_plan(world=int(sys.argv[3]), findings=f)")
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"before ({checkout}):", flush=True)
    subprocess.run([sys.executable, "-c", code, os.path.abspath(checkout), here, str(world)], check=True,
                   env=dict(os.environ, PYTHONPATH=os.path.abspath(checkout)), cwd=checkout)
    print(f"after ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}):", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["llama3_70b", "largest_moe"])
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--lora", default="sharded", choices=["sharded", "ignored", "separate"])
    parser.add_argument("--no-activations", action="store_true", help="skip the activations timing")
    parser.add_argument("--change-of-plan", action="store_true",
                        help="only the Inspector's change of plan on llama3_70b (CPU time)")
    parser.add_argument("--profile", action="store_true", help="with --change-of-plan: cProfile it")
    parser.add_argument("--stages", action="store_true", help="with --change-of-plan: each stage's CPU time")
    parser.add_argument("--against", metavar="DIR", help="with --change-of-plan: first the same on the shardviz "
                        "of another checkout (e.g. /work/main), in a subprocess: before and after in one run")
    args = parser.parse_args()
    if args.change_of_plan:
        if args.against:
            against(args.against, args.world)
        for findings in (False, True):
            bench_change_of_plan(world=args.world, profile=args.profile and findings, stages=args.stages and findings,
                                 findings=findings)
        return
    names = [zoo.LARGEST_MOE if m == "largest_moe" else m for m in args.models]
    rows = [bench(n, args.world, args.lora) for n in names]
    header = ("model", "world", "modules", "params", "units", "walk_ms", "torch_walk_ms", "cold_ms", "analyze_ms", "engine_ms",
              "costs_ms", "torch_ms", "cold_ratio", "toggle_ms", "toggle_median_ms")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(f"{r[h]:.2f}" if isinstance(r[h], float) else str(r[h]) for h in header))
    print("\nwalk_ms: sv.ModelTree(model) alone; torch_walk_ms: list(named_modules()) + list(named_parameters()), "
          "for scale; cold_ms: sv.analyze on a fresh model object (walk included) + params/units "
          "tables; analyze_ms: the same on a cached tree; engine_ms: the layout alone; costs_ms: analyze + memory + comm + "
          "findings; cold_ratio = cold analyze / torch's fully_shard (target <= 0.10); toggle_ms: best re-analysis after "
          "one unit is removed or added (target <= 20 ms on 70B)")
    print()
    bench_change_of_plan(world=args.world)
    bench_change_of_plan(world=args.world, findings=True)
    if not args.no_activations:
        bench_activations()
        bench_step()


if __name__ == "__main__":
    main()
