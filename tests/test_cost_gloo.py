"""``a.memory`` and ``a.comm`` against real multi-process runs: gloo, 2 and 4 ranks, tiny Llama + LoRA.

Every rank is a real process (forked) running a real FSDP2 training step on the CPU; collectives
really move data. Each rank reports what ``FSDPMemTracker`` saw and every collective it issued,
and the prediction for that rank must match (bytes exactly, the peak within 10 %).
"""

from __future__ import annotations

import pytest

import shardviz as sv
from torch_truth import comm_mismatches, gloo_run, memory_mismatches, tiny_lora

CASES = {
    "2-ranks-lora-sharded": (sv.Mesh(shard=2), "sharded", sv.Training(), False),
    "2-ranks-lora-ignored": (sv.Mesh(shard=2), "ignored", sv.Training(), False),
    "4-ranks-lora-sharded-bf16": (sv.Mesh(shard=4), "sharded", sv.Training(param_dtype="bfloat16"), True),
    "4-ranks-hsdp-lora-ignored": (sv.Mesh(shard=2, replicate=2), "ignored", sv.Training(), True),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if slow else []) for n, (*_, slow) in CASES.items()]
)
def test_gloo_step_matches_prediction(name):
    mesh, lora, training, _ = CASES[name]
    model = tiny_lora()
    plan = sv.Plan.auto(model, lora=lora)
    analysis = sv.analyze(model, plan, mesh, training)
    truths = gloo_run(tiny_lora, plan, mesh, training)
    assert [t.rank for t in truths] == list(range(mesh.world))
    problems = []
    for truth in truths:
        # real processes: when an asynchronous collective's buffers are freed varies from run to run
        # (seen: 256 bytes on one rank once), so the peak is held within 10 %, the rest to the byte
        problems += memory_mismatches(analysis, truth, exact_peak=False) + comm_mismatches(analysis, truth)
    assert not problems, "\n".join(problems)
    # the step really trained the same model everywhere: one loss on every rank
    assert len({round(t.loss, 6) for t in truths}) == 1
