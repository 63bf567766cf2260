"""``Training(grad_accum=k)`` in the export: ``train_step`` accumulates over k micro-batches and FSDP
reduce-scatters as shardviz predicts (the c10d ops torch dispatches, counted on the fake process group;
``CommDebugMode``'s module tracker trips over peft's hooks, so a plain dispatch mode counts them)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import shardviz as sv
from shardviz import zoo
from exported_code import apply_under_fake_pg

KINDS = {"all_gather": "_allgather_base_", "reduce_scatter": "_reduce_scatter_base_"}


class CountC10d(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            name = func._opname
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("sync_every", [False, True])
def test_train_step_reduces_as_predicted(sync_every):
    model = zoo.tiny_llama_lora()
    plan, mesh = sv.Plan.auto(model, lora="sharded"), sv.Mesh(2)
    training = sv.Training(grad_accum=3, sync_every_microbatch=sync_every)
    predicted = sv.analyze(model, plan, mesh, training).comm.groupby("collective")["count"].sum()
    code = sv.export_code(model, plan, mesh=mesh, training=training)
    assert "GRAD_ACCUM = 3" in code and f"SYNC_EVERY_MICROBATCH = {sync_every}" in code

    def run(m, module):
        optimizer = torch.optim.AdamW(module.optimizer_param_groups(m), lr=1e-3)
        batches = [torch.randint(0, 128, (2, 16)) for _ in range(module.GRAD_ACCUM)]
        with CountC10d() as comm:
            loss = module.train_step(m, optimizer, batches, _loss)
        assert loss > 0
        return comm.counts

    counts = apply_under_fake_pg(code, model, mesh, 0, run)
    for kind, op in KINDS.items():
        assert counts.get(op, 0) == predicted.get(kind, 0), (kind, counts, predicted)


def test_no_accumulation_no_train_step():
    model = zoo.tiny_llama_lora()
    code = sv.export_code(model, sv.Plan.auto(model), mesh=sv.Mesh(2), training=sv.Training())
    assert "def train_step" not in code and "GRAD_ACCUM" not in code
