"""The torchrun harness of ``test_codegen_torchrun.py`` (and ``tests/compat/``): exported code trains.

Test side (the project's venv): ``make_jobs`` exports each layout of the zoo's tiny Llama+LoRA to a
file, ``launch`` runs ``torchrun --nproc_per_node=N`` on this very file (the ``__main__`` part is the
worker), ``check_results`` reads the verdicts. In one launch, every job (a layout) is applied to a
fresh model with the exported ``apply_fsdp`` and checked on every rank:

- every parameter's placement and local shape equal ``sv.analyze``'s prediction;
- the LoRA weights that FSDP does not shard were made different per rank before ``apply_fsdp``
  and are equal to rank 0's after it (the broadcast);
- after ``STEPS`` SGD steps (momentum 0.9) on different data per rank, every trainable parameter is bitwise
  identical on all ranks and matches a single-process reference trained on the combined batch
  within ``ATOL``/``RTOL`` (float32; the only difference is the order of the float sums);
- the exported code issues exactly one all-reduce per step (the flattened gradient average),
  never one per parameter;
- with a checkpointed plan (``checkpoint="blocks"``), the blocks are wrapped in torch's
  ``checkpoint_wrapper`` and recomputed in backward (a block's MLP runs twice per step), and the
  weights still match the same reference, i.e. the gradients of the plan without checkpointing.

The same worker runs under torch 2.6 for the ``compat`` test (tests/compat/), so it needs only
torch, transformers, peft and shardviz's engine (no pytest).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
STEPS = 3
LR = 0.5
MOMENTUM = 0.9
# SGD with momentum, not Adam: Adam is invariant to the scale of the gradient (a sum where a mean
# belongs would pass) and amplifies float noise in gradients near zero into steps of +-lr.
ATOL = 1e-6  # absolute, float32, on weights of order 0.1
RTOL = 1e-5


# ---------------------------------------------------------------------------
# Test side (the project's venv): export, launch, read the verdicts
# ---------------------------------------------------------------------------
def make_jobs(tmp_path: Path, world: int, torch_version, hsdp: bool, sabotage: bool = False,
              reshard_after_forward=None, fsdp_grad_scale: float = 1.0, checkpoint=None) -> list[dict]:
    """Export each layout to a file; ``reshard_after_forward`` (if not None) is set on every call.

    ``fsdp_grad_scale``: what FSDP's own reduce-scatter multiplies the mean gradient by (1 when it
    averages; the world size where it sums, as torch 2.6's gloo does for ReduceOp.AVG); applied to
    the reference of layouts whose trainable parameters FSDP shards. ``checkpoint``: passed to
    ``Plan.auto`` ("blocks" wraps every block in checkpoint_wrapper)."""
    import shardviz as sv
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    jobs = []
    layouts = [("ignored", sv.Mesh(world)), ("sharded", sv.Mesh(world))]
    if hsdp:
        layouts.append(("ignored", sv.Mesh(shard=world // 2, replicate=2)))
    for lora, mesh in layouts:
        plan = sv.Plan.auto(model, lora=lora, checkpoint=checkpoint)
        if reshard_after_forward is not None:
            plan = sv.Plan([sv.Unit(u.modules, reshard_after_forward=reshard_after_forward) for u in plan.units],
                           plan.ignored, name=f"{plan.name}, reshard_after_forward={reshard_after_forward}",
                           checkpoint=plan.checkpoint)
        name = f"{lora}-{mesh.replicate}x{mesh.shard}" + ("-checkpointed" if checkpoint else "")
        code = tmp_path / f"apply_{name.replace('-', '_')}.py"
        code.write_text(sv.export_code(model, plan, mesh=mesh, torch_version=torch_version))
        plan_file = tmp_path / f"plan_{name}.json"
        plan_file.write_text(plan.to_json())
        jobs.append({"name": name, "code": str(code), "plan": str(plan_file),
                     "shard": mesh.shard, "replicate": mesh.replicate,
                     "reference_grad_scale": fsdp_grad_scale if lora == "sharded" else 1.0})
    if sabotage:
        # The control: the same code with its gradient averaging switched off must fail the checks.
        jobs.append(dict(jobs[0], name="sabotaged-" + jobs[0]["name"], sabotage=True))
    return jobs


def launch(python: str, nproc: int, jobs: list[dict], out: Path, timeout: int = 240) -> list[dict]:
    spec = out / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE), "--jobs", str(spec), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(out))
    results = [json.loads(p.read_text()) for p in sorted(out.glob("result-rank*.json"))]
    if proc.returncode != 0 or len(results) != nproc:
        raise AssertionError(
            f"torchrun exited {proc.returncode} with {len(results)}/{nproc} results\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return results


def check_results(results: list[dict], jobs: list[dict]) -> None:
    for res in results:
        for job in jobs:
            r = res["jobs"][job["name"]]
            if job.get("sabotage"):
                # without the all-reduce each rank trains its own adapter: the checks must see it
                assert not r["identical_across_ranks"], job["name"]
                assert r["max_abs_diff_vs_reference"] > 1000 * ATOL, (job["name"], r)
                assert r["exported_all_reduces"] == 0
                continue
            assert r["layout_mismatches"] == [], (job["name"], res["rank"], r["layout_mismatches"][:5])
            assert r["n_checked"] > 0
            assert r["broadcast_ok"], (job["name"], res["rank"])
            assert r["identical_across_ranks"], (job["name"], res["rank"])
            assert r["max_abs_diff_vs_reference"] <= ATOL + RTOL * r["max_abs_reference"], (job["name"], r)
            assert r["trained"], (job["name"], "LoRA weights did not move")
            expected = STEPS if job["name"].startswith("ignored") else 0
            assert r["exported_all_reduces"] == expected, (job["name"], r["exported_all_reduces"])
            checkpointed = job["name"].endswith("-checkpointed")
            assert r["checkpoint_wrappers"] == (2 if checkpointed else 0), (job["name"], r)
            # a checkpointed block runs its forward again in backward
            assert r["block_forwards_per_step"] == (2 if checkpointed else 1), (job["name"], r)


# ---------------------------------------------------------------------------
# Worker side (runs under torchrun, possibly with another torch)
# ---------------------------------------------------------------------------
class _CountingDist:
    """Stands in for ``torch.distributed`` inside the exported module: counts its all-reduces."""

    def __init__(self, dist):
        self._dist = dist
        self.all_reduces = 0

    def all_reduce(self, *args, **kwargs):
        self.all_reduces += 1
        return self._dist.all_reduce(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._dist, name)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain(name: str) -> str:
    """A parameter's name as the unwrapped model spells it (checkpoint_wrapper inserts a level)."""
    return name.replace("._checkpoint_wrapped_module", "")


def _full(p):
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()


def run_job(job: dict, rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor, Replicate, Shard

    import shardviz as sv
    from shardviz import zoo

    plan = sv.Plan.from_json(Path(job["plan"]).read_text())
    mesh = sv.Mesh(shard=job["shard"], replicate=job["replicate"])
    reference = zoo.tiny_llama_lora(seed=0)
    predicted = sv.analyze(reference, plan, mesh)
    ignored = set(plan.ignored)

    model = zoo.tiny_llama_lora(seed=0)
    # Ranks start with different values for the parameters FSDP will not shard: apply_fsdp must
    # broadcast them (FSDP-sharded ones are cut from each rank's own copy, so those stay equal).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ignored:
                p.add_(0.01 * rank)
    block_forwards = []  # the first block's MLP, found before any wrapping renames it
    mlp = model.get_submodule("base_model.model.model.layers.0.mlp")
    mlp.register_forward_pre_hook(lambda *_: block_forwards.append(1))
    exported = _load(job["code"], "apply_" + job["name"].replace("-", "_"))
    counter = _CountingDist(exported.dist)
    exported.dist = counter
    if job.get("sabotage"):
        exported._GradAverager.average = lambda self: None
    model = exported.apply_fsdp(model)  # mesh=None: the exported code makes its own CPU mesh

    # 1. placements and local shapes against the prediction
    want_placements = (
        (Replicate(), Shard(0)) if mesh.is_hsdp else (Shard(0),)
    )
    mismatches, n_checked = [], 0
    for name, p in model.named_parameters(remove_duplicate=False):
        n_checked += 1
        name = _plain(name)
        idx = predicted.tree.param_index[name]
        status = predicted.layout.param_status[idx]
        if isinstance(p, DTensor):
            got = ("sharded", tuple(p.to_local().shape), tuple(p.placements))
        else:
            got = ("whole", tuple(p.shape), ())
        want = (
            ("sharded", predicted.local_shape(name, rank), want_placements)
            if status == "sharded"
            else ("whole", predicted.tree.params[idx].shape, ())
        )
        if got != want:
            mismatches.append([name, str(want), str(got)])

    # 2. the broadcast: every non-sharded trainable parameter equals the reference (rank 0's values)
    ref_params = dict(reference.named_parameters())
    broadcast_ok = all(
        torch.equal(_full(p), ref_params[_plain(n)]) for n, p in model.named_parameters() if not isinstance(p, DTensor)
    )

    # 3. a few steps on different data per rank vs one process on the combined batch
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    ref_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    before = counter.all_reduces
    forwards_before = len(block_forwards)
    for step in range(STEPS):
        batches = [zoo.tiny_batch(seed=1000 * step + r, batch=2, seq=16) for r in range(world)]
        loss = model(**batches[rank]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        combined = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
        ref_loss = reference(**combined).loss * job.get("reference_grad_scale", 1.0)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    all_reduces = counter.all_reduces - before
    block_forwards_per_step = (len(block_forwards) - forwards_before) / STEPS
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrappers = sum(isinstance(m, CheckpointWrapper) for m in model.modules())  # fully_shard renames the class

    trainable = {_plain(n): _full(p) for n, p in model.named_parameters() if p.requires_grad}
    gathered = [None] * world
    dist.all_gather_object(gathered, {n: t.tolist() for n, t in trainable.items()})
    identical = all(g == gathered[0] for g in gathered)
    diffs = [(trainable[n] - ref_params[n].detach()).abs().max().item() for n in trainable]
    initial = dict(zoo.tiny_llama_lora(seed=0).named_parameters())
    trained = any(not torch.equal(trainable[n], initial[n].detach()) for n in trainable if "lora_B" in n)
    return {
        "layout_mismatches": mismatches,
        "n_checked": n_checked,
        "broadcast_ok": bool(broadcast_ok),
        "identical_across_ranks": bool(identical),
        "max_abs_diff_vs_reference": max(diffs),
        "max_abs_reference": max(ref_params[n].detach().abs().max().item() for n in trainable),
        "trained": bool(trained),
        "exported_all_reduces": all_reduces,
        "checkpoint_wrappers": wrappers,
        "block_forwards_per_step": block_forwards_per_step,
        "n_trainable": len(trainable),
        "final_loss": float(loss.detach()),
    }


def _backport_cpu_stream_noops() -> bool:
    """torch < 2.7 cannot run FSDP2 on the CPU: its all-gather calls ``Stream.record_event()``, which
    the CPU stream stub lacks ("'Stream' object has no attribute 'record_event'"). torch 2.7 added
    both methods as no-ops (PR 145935, "Now I can use FSDPv2 on CPU"); add the same no-ops here.
    This touches torch's CPU stub only, never FSDP or the exported code; GPU runs do not need it."""
    import torch

    stream = torch.cpu.Stream
    if hasattr(stream, "record_event") and hasattr(stream, "wait_event"):
        return False
    stream.record_event = lambda self, event=None: None
    stream.wait_event = lambda self, event: None
    return True


def worker(argv=None) -> None:
    import torch
    import torch.distributed as dist

    backported = _backport_cpu_stream_noops()
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    jobs = json.loads(Path(args.jobs).read_text())
    out = {"rank": rank, "world": world, "torch": torch.__version__, "cpu_stream_backport": backported, "jobs": {}}
    for job in jobs:
        out["jobs"][job["name"]] = run_job(job, rank, world)
        dist.barrier()
    Path(args.out, f"result-rank{rank}.json").write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    worker()
