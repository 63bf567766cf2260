"""FLOPs of one training step (``a.flops``, ``a.flop_totals``, ``a.step.flops``, ``ActivationProfile.flops``) against
torch's ``FlopCounterMode`` on the real step of the full model.

The truth: every layer of the model (no reduced copy, no extrapolation), its parameters fake CPU
tensors in the dtype they compute in, ``checkpoint_wrapper`` on the plan's checkpointed modules as
the export applies it (selective ones with the export's policy as its ``context_fn``), one forward + ``loss.backward()`` on the same inputs under ``FakeTensorMode``
and a plain ``FlopCounterMode`` with shardviz's formulas for the ops torch's registry misses on CPU
(flash attention for CPU, ``_grouped_mm``). The step's batch is the ordinary unpadded one
(``patches.hf_plain_batches``, as measured). Totals must match exactly; so must the recomputation
(the checkpointed step's FLOPs less the plain step's).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import shardviz as sv
from shardviz.activations import FLOP_COLUMNS, flop_formulas, measure_activations
from shardviz import export_runtime as rt
from shardviz.activations.patches import hf_plain_batches

BATCH, SEQ, VOCAB, LAYERS = 2, 32, 512, 5


def _config(kind: str):
    import transformers as T

    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 512}
    return {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**common)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**common)),
        "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)),
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, vocab_size=VOCAB,
                                                       n_positions=512)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=LAYERS,
                                                              num_decoder_layers=LAYERS, num_heads=4, decoder_start_token_id=0,
                                                              vocab_size=VOCAB)),
    }[kind]


def build(kind: str) -> nn.Module:
    """A small ``kind`` model on meta with peft LoRA on every linear layer."""
    from peft import LoraConfig, get_peft_model

    with torch.device("meta"):
        model = _config(kind)()
    # the step the counter runs below (use_cache=False); with the config's cache, torch's selective
    # checkpointing raises (SV113, issue 20)
    model.config.use_cache = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))


def truth_flops(model: nn.Module, checkpoint=(), param_dtype=None) -> int:
    """FlopCounterMode's total over one real step of a fake copy of the whole ``model``."""
    from torch._subclasses import FakeTensorMode
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.flop_counter import FlopCounterMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        dtype = param_dtype if param_dtype is not None and t.is_floating_point() else t.dtype
        with fake:
            new = torch.empty(t.shape, dtype=dtype, device="cpu")
        memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    step_model = copy.deepcopy(model, memo)
    selective = set(getattr(checkpoint, "selective", ()))
    for fqn in checkpoint:
        parent, _, name = fqn.rpartition(".")
        holder = step_model.get_submodule(parent)
        if fqn in selective:  # the exported wrapper: torchtitan's selective op policy as its context_fn
            wrapped = rt._checkpoint_wrapped(getattr(holder, name), rt._selective_checkpoint_context)
        else:
            wrapped = checkpoint_wrapper(getattr(holder, name))
        setattr(holder, name, wrapped)
    step_model.train()
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    with fake, hf_plain_batches(), counter:
        ids = torch.zeros((BATCH, SEQ), dtype=torch.long)
        loss = step_model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    return counter.get_total_flops()


# Mixtral computes in bf16: torch's meta kernel sizes only bf16 grouped_mm (what the real step runs).
CASES = {"llama": None, "qwen2": None, "gpt2": None, "mixtral": torch.bfloat16, "t5": None}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[] if k == "llama" else [pytest.mark.slow]) for k in CASES])
def test_step_flops_match_flop_counter(kind):
    model = build(kind)
    dtype = CASES[kind]
    plain_plan = sv.Plan.auto(model, lora="sharded")
    ckpt_plan = sv.Plan.auto(model, lora="sharded", checkpoint="blocks")
    training = sv.Training(batch_size=BATCH, seq_len=SEQ, param_dtype=str(dtype).replace("torch.", "") if dtype else None)
    plain = sv.analyze(model, plain_plan, sv.Mesh(shard=8), training)  # no device: FLOPs, no seconds
    ckpt = sv.analyze(model, ckpt_plan, sv.Mesh(shard=8, device="H100"), training)
    want_plain = truth_flops(model, param_dtype=dtype)
    want_ckpt = truth_flops(model, ckpt_plan.checkpoint, param_dtype=dtype)
    assert want_ckpt > want_plain > 0

    assert plain.flop_totals == {"flops": want_plain, "model_flops": want_plain}
    assert ckpt.flop_totals == {"flops": want_ckpt, "model_flops": want_plain}
    # the step (a.step: what MFU and HFU divide) counts what torch counts, with a device or without
    assert plain.step.step_time_s is None and (plain.step.flops, plain.step.model_flops) == (want_plain, want_plain)
    assert ckpt.step.step_time_s > 0 and (ckpt.step.flops, ckpt.step.model_flops) == (want_ckpt, want_plain)
    assert ckpt.activation_profile.measured_blocks < 2 * LAYERS  # extrapolated, not one copy per layer
    for a, want in ((plain, want_plain), (ckpt, want_ckpt)):
        table = a.flops
        assert list(table.columns) == list(FLOP_COLUMNS)
        assert int(table[list(FLOP_COLUMNS[1:])].to_numpy().sum()) == want
    # recomputation: exactly the checkpointed step's extra FLOPs, all of it in the checkpointed calls
    assert int(ckpt.flops.recompute_flops.sum()) == want_ckpt - want_plain
    assert int(plain.flops.recompute_flops.sum()) == 0
    blocks = {u.name for u in ckpt_plan.units if set(u.modules) & set(ckpt_plan.checkpoint)}
    assert set(ckpt.flops.loc[ckpt.flops.recompute_flops > 0, "unit"]) <= blocks


@pytest.mark.parametrize("kind", [pytest.param("llama"), pytest.param("qwen2", marks=pytest.mark.slow)])
def test_selective_checkpointing_flops_match_flop_counter(kind):
    """Selective checkpointing (issue 18): the recomputation is what the policy does not save (every
    second mm and the ops outside torchtitan's save list), as FlopCounterMode counts it on the real
    step; less than full checkpointing recomputes."""
    model = build(kind)
    training = sv.Training(batch_size=BATCH, seq_len=SEQ)
    plan = sv.Plan.auto(model, lora="sharded", checkpoint="selective")
    a = sv.analyze(model, plan, sv.Mesh(shard=8), training)
    want_plain = truth_flops(model)
    want = truth_flops(model, plan.checkpoint)
    want_full = truth_flops(model, sv.Plan.auto(model, checkpoint="blocks").checkpoint)
    assert want_plain < want < want_full
    assert a.flop_totals == {"flops": want, "model_flops": want_plain}
    assert int(a.flops.recompute_flops.sum()) == want - want_plain
    assert int(a.flops[list(FLOP_COLUMNS[1:])].to_numpy().sum()) == want
    assert a.activation_profile.measured_blocks < 2 * LAYERS


def test_flops_per_unit_in_forward_order_and_blocks_alike():
    model = build("llama")
    plan = sv.Plan.auto(model, lora="sharded")
    a = sv.analyze(model, plan, sv.Mesh(shard=8), sv.Training(batch_size=BATCH, seq_len=SEQ))
    table = a.flops
    assert sorted(table.unit) == sorted(u.name for u in plan.units)  # one row per call, nothing outside
    blocks = a.activation_profile.blocks
    rows = table.set_index("unit")
    assert list(table.unit).index(blocks[0]) < list(table.unit).index(blocks[-1])
    assert table.unit.iloc[-1] == rows.index[-1] and table.unit.iloc[0] != blocks[0]  # the embeddings' call first
    per_block = rows.loc[blocks[1:], ["forward_flops", "backward_flops"]]
    assert (per_block.forward_flops > 0).all() and per_block.nunique().max() == 1  # every block the same
    assert (per_block.backward_flops > per_block.forward_flops).all()
    # but the first: its input (frozen embeddings) needs no gradient, nor do its frozen base layers' inputs
    first = rows.loc[blocks[0]]
    assert first.forward_flops == per_block.forward_flops.iloc[0]
    assert first.backward_flops < per_block.backward_flops.iloc[0]


def test_profile_flops_per_module():
    model = build("llama")
    profile = measure_activations(model, BATCH, SEQ)
    q = profile.module_flops["base_model.model.model.layers.2.self_attn.q_proj.base_layer"]
    assert q.forward == 2 * BATCH * SEQ * 64 * 64  # one (tokens x 64) @ (64 x 64) matmul
    assert q.backward == q.forward  # frozen base weight: only the input gradient
    assert profile.model_flops == profile.flops


def test_no_batch_means_no_flops():
    model = build("llama")
    a = sv.analyze(model, sv.Plan.auto(model, lora="sharded"), sv.Mesh(shard=8))
    assert a.flops.empty and list(a.flops.columns) == list(FLOP_COLUMNS)
    assert a.flop_totals == {"flops": 0, "model_flops": 0}


def _llama_step(counter_mode):
    """One forward + backward of a small fake llama under ``counter_mode``."""
    from torch._subclasses import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = _config("llama")()
    with fake, counter_mode:
        ids = torch.zeros((BATCH, SEQ), dtype=torch.long)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()


def test_measuring_counter_counts_each_op_as_flop_counter_mode():
    """The measuring pass's counter (``flops.flop_counter``) runs an op that does not decompose
    without trying to decompose it: per op, the same FLOPs as torch's ``FlopCounterMode``; the
    decomposition tried only for the ops that have one (it used to push the mode for every op)."""
    from torch.utils.flop_counter import FlopCounterMode

    from shardviz.activations.flops import flop_counter

    truth = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    _llama_step(truth)
    tried = []
    ours = flop_counter()
    original = torch._ops.OpOverload.decompose
    torch._ops.OpOverload.decompose = lambda op, *a, **k: tried.append(op) or original(op, *a, **k)
    try:
        _llama_step(ours)
    finally:
        torch._ops.OpOverload.decompose = original
    assert ours.flop_counts["Global"] == truth.flop_counts["Global"] and ours.get_total_flops() > 0
    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    assert all(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), implicit) or implicit in op.py_kernels
               for op in tried)
