"""The step is simulated once: the replay through the caching allocator (``step.reserved``) is the
step simulation (``step.simulation``) with the tensors traced, so its peak, moment and collectives
are the plain simulation's, for every kind of plan and training, and ``a.costs.step`` is that result."""

from __future__ import annotations

import functools

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.step.allocator import CachingAllocator
from shardviz.step.reserved import TensorReplay
from shardviz.step.simulation import StepSimulation


@functools.lru_cache(maxsize=None)
def tiny():
    return zoo.tiny_llama_lora()


@functools.lru_cache(maxsize=None)
def tiny_without_lora():
    return zoo.tiny_llama_lora(lora=False)


@functools.lru_cache(maxsize=None)
def llama3_8b():
    return zoo.llama3_8b()


def blocks(m):
    return [u.modules[0] for u in sv.Plan.auto(m).units if ".layers." in u.modules[0]]


ACTS = dict(batch_size=2, seq_len=64)
CASES = {
    "blocks": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(8), sv.Training(**ACTS)),
    "checkpointed": (tiny, lambda m: sv.Plan.auto(m, checkpoint="blocks"), sv.Mesh(8), sv.Training(**ACTS)),
    "every 2": (tiny, lambda m: sv.Plan.auto(m, checkpoint="every 2"), sv.Mesh(8), sv.Training(**ACTS)),
    "selective": (tiny, lambda m: sv.Plan.auto(m, checkpoint="selective"), sv.Mesh(8), sv.Training(**ACTS)),
    "torchtitan root": (tiny, lambda m: sv.Plan.auto(m).with_units([sv.Unit(b) for b in blocks(m)] + [""]),
                        sv.Mesh(8), sv.Training(batch_size=4, seq_len=256)),
    # the embedding's gradients after every block's backward: the replay leaves the blocks' level out
    # (TensorReplay.own_span), the step's peak counts it
    "torchtitan root, no LoRA": (tiny_without_lora, lambda m: sv.Plan.auto(m).with_units([sv.Unit(b) for b in blocks(m)] + [""]),
                                 sv.Mesh(8), sv.Training(batch_size=4, seq_len=256)),
    "nested, no root": (tiny, lambda m: sv.Plan.auto(m).without_unit(""), sv.Mesh(8), sv.Training(**ACTS)),
    "grad accum": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(8), sv.Training(grad_accum=3, **ACTS)),
    "accum, sync every": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(8),
                          sv.Training(grad_accum=4, sync_every_microbatch=True, reduce_dtype="float32", **ACTS)),
    "mixed precision accum": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(8),
                              sv.Training(param_dtype="bfloat16", reduce_dtype="float32", grad_accum=2, **ACTS)),
    "offload": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(8), sv.Training(offload=True, **ACTS)),
    "HSDP": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(4, replicate=2), sv.Training(**ACTS)),
    "int reshard": (tiny, lambda m: sv.Plan.auto(m).with_unit_options(blocks(m)[0], reshard_after_forward=2)
                    .with_unit_options(blocks(m)[1], reshard_after_forward=False), sv.Mesh(8), sv.Training(**ACTS)),
    "one rank": (tiny, lambda m: sv.Plan.auto(m), sv.Mesh(1), sv.Training(**ACTS)),
    "averaging outside": (tiny, lambda m: sv.Plan.auto(m, lora="separate"), sv.Mesh(8),
                          sv.Training(sync_outside_fsdp=True, **ACTS)),
    "no activations": (tiny, lambda m: sv.Plan.auto(m, lora="ignored"), sv.Mesh(8), sv.Training()),
    "llama3_8b": (llama3_8b, lambda m: sv.Plan.auto(m), sv.Mesh(64, device="H100"),
                  sv.Training(param_dtype="bfloat16", reduce_dtype="float32")),
}


class Recording:
    """Records every moment the step observes (what the peak is the largest of)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen = []

    def observe(self, phase, k, *, act=(0, None), **alive):
        self.seen.append((phase, k, act, alive))
        super().observe(phase, k, act=act, **alive)


class Plain(Recording, StepSimulation):
    pass


class Traced(Recording, StepSimulation):
    """The step with its tensors replayed: the allocator is an option of the one simulation."""

    def __init__(self, *args, allocator, **kw):
        super().__init__(*args, tensors=TensorReplay(allocator), **kw)


@pytest.mark.parametrize("case", CASES)
def test_the_traced_step_is_the_plain_step(case):
    model, plan, mesh, training = CASES[case]
    m = model()
    a = sv.analyze(m, plan(m), mesh, training, strict=False)
    inputs = a.costs.replay_inputs
    plain, traced = Plain(*inputs), Traced(*inputs, allocator=CachingAllocator())
    result = plain.run()
    assert traced.run() == result and a.costs.step == result
    assert traced.seen == plain.seen  # every moment, not only the largest
    assert result.peak > 0 and len(result.collectives) >= (mesh.shard > 1) * len(a.costs.units)
