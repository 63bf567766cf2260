"""End to end: an exported 2-D plan (FSDP 2 x TP 2) trains under ``torchrun`` (4 processes, gloo, CPU).

The worker (the ``__main__`` part of this file) applies the exported ``apply_fsdp`` (``apply_tp`` on
``mesh["tp"]``, then ``fully_shard`` on ``mesh["dp_shard"]``) to a tiny Llama, checks every
parameter's local shape against ``sv.analyze``, trains ``STEPS`` SGD steps where each
data-parallel rank has its own batch (the two tensor ranks of a group share theirs), and compares
the full parameters (``DTensor.full_tensor()``) with a single-process model trained on the
combined batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
STEPS = 3
ATOL, RTOL = 1e-5, 1e-4
SHARD, TENSOR = 2, 2


def build():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        use_cache=False))


def batch_of(dp_rank: int):
    import torch

    g = torch.Generator().manual_seed(100 + dp_rank)
    return torch.randint(0, 128, (2, 16), generator=g)


def reference() -> dict:
    """One process, the data-parallel ranks' batches as one (the mean loss over them is FSDP's average)."""
    import torch

    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = torch.cat([batch_of(r) for r in range(SHARD)])
    for _ in range(STEPS):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}


def worker(code: str, plan_json: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import shardviz as sv

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    namespace: dict = {"__name__": "exported"}
    exec(compile(Path(code).read_text(), code, "exec"), namespace)
    model = namespace["apply_fsdp"](build())
    mesh = sv.Mesh(shard=SHARD, tensor=TENSOR)
    a = sv.analyze(build(), sv.Plan.from_json(Path(plan_json).read_text()), mesh)
    shapes = [n for n, p in model.named_parameters() if tuple(p.to_local().shape) != a.local_shape(n, rank)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = batch_of(mesh.coords(rank)[1])  # the tensor ranks of one data-parallel rank train one batch
    for _ in range(STEPS):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}
    ref = reference()
    diff = max(float((full[n] - ref[n]).abs().max()) for n in ref)
    scale = max(float(ref[n].abs().max()) for n in ref)
    moved = max(float((ref[n] - p.detach()).abs().max()) for n, p in build().named_parameters())
    Path(out, f"result-rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "shape_mismatches": shapes, "max_abs_diff": diff, "max_abs_reference": scale,
         "reference_moved": moved, "n_params": len(full)}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_exported_2d_plan_trains_under_torchrun(tmp_path):
    import shardviz as sv

    plan = sv.Plan.auto(build(), tensor_parallel=True)
    mesh = sv.Mesh(shard=SHARD, tensor=TENSOR)
    code = tmp_path / "apply_2d.py"
    code.write_text(sv.export_code(build(), plan, mesh=mesh))
    assert 'apply_tp(model, mesh["tp"])' in code.read_text() and 'mesh = mesh["dp_shard"]' in code.read_text()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={SHARD * TENSOR}",
           str(HERE), "--code", str(code), "--plan", str(plan_file), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=str(tmp_path))
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-rank*.json"))]
    assert proc.returncode == 0 and len(results) == SHARD * TENSOR, proc.stderr[-6000:]
    for r in results:
        assert r["shape_mismatches"] == [], r
        assert r["reference_moved"] > 1e-3  # the step trains
        assert r["max_abs_diff"] <= ATOL + RTOL * r["max_abs_reference"], r


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--code")
    parser.add_argument("--plan")
    parser.add_argument("--out")
    args = parser.parse_args()
    worker(args.code, args.plan, args.out)
