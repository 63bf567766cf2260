"""``a.memory`` and ``a.comm`` against torch: a real training step under the fake process group.

Each case builds a real tiny Llama (+ peft LoRA), applies the plan with torch's ``fully_shard`` on
one rank of an 8-rank fake world (FSDP 8, or HSDP 2x4), and trains: forward, backward, optimizer
step. ``FSDPMemTracker`` gives the sharded parameter, sharded gradient and optimizer-state bytes
and the state peak, which must equal the prediction to the byte (the peak: but for the one
deviation ``PEAK_OFFSET`` pins to its byte); a dispatch mode records every collective, which must
equal ``a.comm`` call by call. See ``torch_truth.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch

import shardviz as sv
from torch_truth import comm_mismatches, fake_run, memory_mismatches, tiny_gpt2, tiny_llama, tiny_lora, tiny_mixtral

FSDP8 = sv.Mesh(shard=8)
HSDP = sv.Mesh(shard=4, replicate=2)
BF16 = sv.Training(param_dtype="bfloat16", reduce_dtype="float32")


def plain(**fields) -> sv.Training:
    """A training without the default mixed-precision policy where ``fields`` set none: the torch
    step of the cases below runs each parameter in its own dtype (``fully_shard`` without ``mp_policy``)."""
    return sv.Training(**{"param_dtype": None, "reduce_dtype": None, **fields})


def auto(lora):
    return lambda model: sv.Plan.auto(model, lora=lora)


def blocks_with(lora, **options):
    """The auto plan with ``options`` on every decoder block's call."""

    def make(model):
        plan = sv.Plan.auto(model, lora=lora)
        for unit in plan.units:
            name = unit.modules[0]
            if name.split(".")[-2:-1] == ["layers"]:
                plan = plan.with_unit_options(name, **options)
        return plan

    return make


def head_with(lora, **options):
    """The auto plan with ``options`` on the [norm, lm_head] call only."""

    def make(model):
        plan = sv.Plan.auto(model, lora=lora)
        head = next(u for u in plan.units if u.is_grouped)
        return plan.with_unit_options(head.modules[0], **options)

    return make


def blocks_and_root(model):
    """Each block, then the root (embeddings, final norm and lm_head stay in the root's call)."""
    layers = [m for m, _ in model.named_modules() if m.rsplit(".", 1)[0].endswith("layers") and m[-1].isdigit()]
    return sv.Plan(layers + [""])


def no_root(model):
    """Blocks only: every block is its own FSDP root (own communication context, kept unsharded
    after forward), embeddings, norm and lm_head stay unmanaged."""
    return sv.Plan(blocks_and_root(model).units[:-1])


def nested(inner):
    """A call on ``inner`` of every block, nested in a call on the block, then the root: the
    parent's backward runs around the nested call's."""

    def make(model):
        blocks = [m for m, _ in model.named_modules()
                  if m.rpartition(".")[2].isdigit() and m.rpartition(".")[0].endswith(("layers", ".h"))]
        return sv.Plan([f"{b}.{inner}" for b in blocks] + blocks + [""])

    return make


UNEVEN = functools.partial(tiny_lora, r=6, vocab=100)  # 100 rows and r=6 do not divide by 8
BF16_BASE = functools.partial(tiny_lora, dtype=torch.bfloat16)  # bf16 base + fp32 LoRA: uint8 all-gathers
FULL = functools.partial(tiny_llama, vocab=100)  # full fine-tuning, uneven embeddings

def gpt2_lora():
    """GPT-2 with peft LoRA on its Conv1D layers (``c_attn``, ``c_proj``, ``c_fc``), base frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(tiny_gpt2(), LoraConfig(r=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True))


def auto_with_nested(inner, lora):
    """The auto plan (its grouped call ``[wte, ln_f, lm_head]`` included) plus a call on ``inner``
    of every block, nested in the block's call."""

    def make(model):
        plan = sv.Plan.auto(model, lora=lora)
        blocks = [m for m, _ in model.named_modules() if m.rpartition(".")[2].isdigit() and m.rpartition(".")[0].endswith(".h")]
        return sv.Plan([f"{b}.{inner}" for b in blocks] + list(plan.units), ignored=plan.ignored)

    return make


# name: (model builder, plan maker, mesh, training, ranks, slow)
CASES = {
    "lora-sharded": (tiny_lora, auto("sharded"), FSDP8, plain(), (0, 7), False),
    "lora-ignored": (tiny_lora, auto("ignored"), FSDP8, plain(), (0,), False),
    "lora-separate": (tiny_lora, auto("separate"), FSDP8, plain(), (0,), True),
    "hsdp-lora-sharded": (tiny_lora, auto("sharded"), HSDP, plain(), (7,), False),
    "hsdp-lora-ignored": (tiny_lora, auto("ignored"), HSDP, plain(), (5,), False),
    "reshard-false": (tiny_lora, blocks_with("sharded", reshard_after_forward=False), FSDP8, plain(), (0,), False),
    "reshard-int": (tiny_lora, blocks_with("sharded", reshard_after_forward=4), FSDP8, plain(), (7,), False),
    "hsdp-reshard-false": (tiny_lora, blocks_with("ignored", reshard_after_forward=False), HSDP, plain(), (6,), True),
    "hsdp-bf16-lora-sharded": (tiny_lora, auto("sharded"), HSDP, BF16, (2,), True),
    "hsdp-reshard-int": (tiny_lora, blocks_with("ignored", reshard_after_forward=2), HSDP, plain(), (0,), False),
    "bf16-lora-sharded": (tiny_lora, auto("sharded"), FSDP8, BF16, (0,), False),
    "bf16-lora-ignored-hsdp": (tiny_lora, auto("ignored"), HSDP, plain(param_dtype="bfloat16"), (3,), False),
    "bf16-unit-override": (tiny_lora, head_with("sharded", param_dtype="float32"), FSDP8, BF16, (0,), True),
    "uneven-lora": (UNEVEN, auto("sharded"), FSDP8, plain(), (7,), False),
    "uneven-full-finetune": (FULL, lambda m: sv.Plan.auto(m), FSDP8, plain(), (0, 7), True),
    "blocks-and-root": (tiny_lora, blocks_and_root, FSDP8, plain(), (0,), True),
    "no-gradient-sync": (tiny_lora, auto("ignored"), FSDP8, plain(sync_outside_fsdp=False), (0,), True),
    "no-root-call": (tiny_lora, no_root, FSDP8, plain(), (0,), False),
    "mixed-dtypes-uint8": (BF16_BASE, auto("sharded"), FSDP8, plain(), (0,), False),
    "hsdp-shard-1": (tiny_lora, auto("sharded"), sv.Mesh(shard=1, replicate=4), plain(), (0,), True),
    "sgd-momentum": (tiny_lora, auto("sharded"), FSDP8, plain(optimizer="sgd_momentum"), (0,), True),
    "sgd": (tiny_lora, auto("ignored"), FSDP8, plain(optimizer="sgd"), (0,), True),
    "adam-uneven": (UNEVEN, auto("sharded"), FSDP8, plain(optimizer="adam"), (0, 7), True),
    "gpt2-nested-attn": (tiny_gpt2, nested("attn"), FSDP8, plain(), (0,), False),
    "mixtral-nested-experts": (tiny_mixtral, nested("mlp.experts"), FSDP8, plain(), (0,), False),
    "gpt2-lora-nested-attn": (gpt2_lora, auto_with_nested("attn", "sharded"), sv.Mesh(shard=4), plain(), (0, 3), False),
    "gpt2-lora-ignored-nested-attn": (gpt2_lora, auto_with_nested("attn", "ignored"), sv.Mesh(shard=4), plain(), (0,), True),
    "fused-adamw": (tiny_lora, auto("ignored"), FSDP8, plain(fused=True), (0,), True),
    # gradient accumulation: no sync but on the last micro-batch (unsharded gradients kept), kept in
    # fp32 when they are bf16 (the reduce dtype), synced on every micro-batch, with whole gradients
    "grad-accum-3": (tiny_lora, auto("sharded"), FSDP8, plain(grad_accum=3), (0,), False),
    "grad-accum-bf16-hsdp": (tiny_lora, auto("sharded"), HSDP, plain(param_dtype="bfloat16", reduce_dtype="float32",
                                                                          grad_accum=2), (5,), False),
    "grad-accum-sync-every": (tiny_lora, auto("sharded"), FSDP8, plain(grad_accum=3, sync_every_microbatch=True),
                              (0,), False),
    "grad-accum-ignored": (tiny_lora, auto("ignored"), FSDP8, plain(grad_accum=2), (0,), True),
    "grad-accum-full-finetune": (FULL, lambda m: sv.Plan.auto(m), FSDP8, plain(grad_accum=4), (7,), True),
}
# The peak equals torch's to the byte except where docs/cost-model.md (Validation) says why not,
# by exactly this many bytes (predicted - torch): a shard group of one rank issues no
# reduce-scatter op, so the tracker never re-files the reduce-scatter input that foreach_reduce
# allocates (one block's LoRA gradients, 8192 fp32) from Temp: +4.07 %.
PEAK_OFFSET = {"hsdp-shard-1": 32768}


def _params():
    for name, (build, make_plan, mesh, training, ranks, slow) in CASES.items():
        for rank in ranks:
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(name, rank, id=f"{name}-rank{rank}", marks=marks)


@functools.lru_cache(maxsize=None)
def _case(name):
    build, make_plan, mesh, training, _, _ = CASES[name]
    model = build()
    plan = make_plan(model)
    return build, plan, mesh, training, sv.analyze(model, plan, mesh, training)


@pytest.mark.parametrize("name, rank", list(_params()))
def test_step_matches_torch(name, rank):
    build, plan, mesh, training, analysis = _case(name)
    truth = fake_run(build, plan, mesh, training, rank)
    problems = memory_mismatches(analysis, truth, peak_offset=PEAK_OFFSET.get(name, 0)) + comm_mismatches(analysis, truth)
    assert not problems, "\n".join(problems)


def test_int_reshard_gathers_over_the_smaller_group_in_backward():
    _, plan, mesh, training, analysis = _case("reshard-int")
    comm = analysis.comm
    blocks = comm[comm["unit"].str.contains("layers")]
    backward = blocks[(blocks.collective == "all_gather") & (blocks.phase == "backward")]
    assert set(backward.group) == {"post_forward"} and set(backward.group_size) == {4}
    forward = blocks[(blocks.collective == "all_gather") & (blocks.phase == "forward")]
    assert set(forward.group_size) == {8}


def test_no_gradient_sync_means_no_all_reduce():
    *_, analysis = _case("no-gradient-sync")
    assert not (analysis.comm.collective == "all_reduce").any()
    *_, synced = _case("lora-ignored")
    row = synced.comm[synced.comm.collective == "all_reduce"]
    assert len(row) == 1 and row.iloc[0].unit is None and row.iloc[0].group_size == 8


def test_mixed_dtypes_gather_as_bytes():
    *_, analysis = _case("mixed-dtypes-uint8")
    gathers = analysis.comm[analysis.comm.collective == "all_gather"]
    blocks = gathers[gathers.unit.str.contains("layers")]
    assert set(blocks.dtype) == {"uint8"}  # bf16 base + fp32 LoRA in one call
    assert set(gathers[~gathers.unit.str.contains("layers")].dtype) == {"bfloat16"}
