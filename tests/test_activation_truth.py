"""The peak with activations against torch: a real training step under the fake process group.

Small real models (Llama + LoRA, Qwen2 + LoRA, GPT-2, Mixtral: a few layers, a batch and sequence
long enough that activations dominate the peak) train one steady-state step with torch's
``fully_shard`` (and ``checkpoint_wrapper`` where the plan checkpoints) under ``FSDPMemTracker``.
The tracker's largest Total over the step (parameters, gradients, optimizer states, FSDP buffers,
activations, temporaries, inputs) must equal ``a.memory.peak`` plus nothing but the deviation
measured and pinned for each case (``DEVIATION``: 0 bytes where shardviz is exact; GIT's known gap
named), and ``a.peak_breakdown()`` must match the tracker's
categories at that peak: the model state to the byte, activations and temporaries by the same pinned
deviation. See ``torch_truth.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import shardviz as sv
from shardviz.format import format_bytes
from torch_truth import breakdown_mismatches, fake_run, tiny_llama, tiny_lora

BATCH, SEQ, VOCAB = 2, 256, 512
FSDP8 = sv.Mesh(shard=8)
HSDP = sv.Mesh(shard=4, replicate=2)


def step(**kw):
    """One micro-batch in the models' own dtypes (no mixed-precision policy), as these cases were
    pinned; since bf16 parameters became the default, GPT-2 checkpointed and GIT differ from torch
    under it by -0.7 % and -0.3 % (not yet traced), so the policy is stated, not defaulted."""
    kw = {"param_dtype": None, "reduce_dtype": None, **kw}
    return sv.Training(batch_size=BATCH, seq_len=SEQ, **kw)


def qwen2_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                         max_position_embeddings=SEQ))
    return get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))


def gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                      bos_token_id=0, eos_token_id=0))


def mixtral(seed: int = 0):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    return MixtralForCausalLM(MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def xlm(seed: int = 0):
    """XLM: it always builds a key/value cache (its checkpointed step fails in torch: test_hf_archs)."""
    from transformers import XLMConfig, XLMWithLMHeadModel

    torch.manual_seed(seed)
    return XLMWithLMHeadModel(XLMConfig(vocab_size=VOCAB, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=SEQ))


def git(seed: int = 0):
    """GIT: image + text, the image a default one of the vision config's size (``image_prefix_inputs``)."""
    from transformers import GitConfig, GitForCausalLM

    torch.manual_seed(seed)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    return GitForCausalLM(GitConfig(vision_config=vision, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=0))


def blt(seed: int = 0):
    """BLT: its untrained entropy model puts every byte in its own patch, shardviz's worst case."""
    from transformers import BltConfig, BltForCausalLM

    torch.manual_seed(seed)

    def local(layers):
        return dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=layers, intermediate_size=128,
                    vocab_size=VOCAB, hidden_size_global=128)

    return BltForCausalLM(BltConfig(
        vocab_size=VOCAB, max_position_embeddings=SEQ, encoder_hash_byte_group_vocab=1000, local_attention_window_len=SEQ,
        patcher_config=local(2), encoder_config=local(1), decoder_config=local(2),
        global_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256)))


def blocks_and_root(model):
    """Plan.auto's blocks and root, without its grouped embedding call: BLT's forward reads
    ``local_encoder.embed_tokens`` before ``local_encoder`` runs, so that call is still sharded."""
    plan = sv.Plan.auto(model)
    return plan.with_units([u for u in plan.units if len(u.modules) == 1])


LLAMA_LORA = functools.partial(tiny_lora, vocab=VOCAB)
LLAMA4 = functools.partial(tiny_llama, vocab=VOCAB, layers=4)  # 4 blocks: "every 2" wraps blocks 1 and 3


def no_cache(build):
    """``build`` with ``config.use_cache = False``, as training scripts set it (the cases without it
    run the step the config runs: a key/value cache kept through the step)."""
    def built():
        model = build()
        model.config.use_cache = False
        return model

    return built


def auto(lora="sharded", checkpoint=None):
    return lambda model: sv.Plan.auto(model, lora=lora, checkpoint=checkpoint)


def every2_rest_selective(model):
    """torchtitan's selective layer option ("every 2": blocks 1, 3 in full), the other blocks with its
    selective op policy."""
    plan = sv.Plan.auto(model, checkpoint="every 2")
    rest = [b for b in sv.Plan.auto(model, checkpoint="blocks").checkpoint if b not in plan.checkpoint]
    return plan.with_checkpoint(rest, "selective")


# name: (model builder, plan maker, mesh, training, rank, slow)
CASES = {
    "llama-lora-sharded": (LLAMA_LORA, auto("sharded"), FSDP8, step(), 0, False),
    "llama-lora-sharded-ckpt": (LLAMA_LORA, auto("sharded", "blocks"), FSDP8, step(), 0, False),
    "llama4-every2-ckpt": (LLAMA4, auto(checkpoint="every 2"), FSDP8, step(), 0, False),
    "llama-lora-sharded-sac": (no_cache(LLAMA_LORA), auto("sharded", "selective"), FSDP8, step(), 0, False),
    "llama4-every2-rest-sac": (no_cache(LLAMA4), every2_rest_selective, FSDP8, step(), 0, False),
    "llama-lora-ignored-hsdp": (LLAMA_LORA, auto("ignored"), HSDP, step(), 5, False),
    "llama-lora-ignored-hsdp-ckpt": (LLAMA_LORA, auto("ignored", "blocks"), HSDP, step(), 5, False),
    "llama-lora-ignored-bf16": (LLAMA_LORA, auto("ignored"), FSDP8, step(param_dtype="bfloat16"), 0, True),
    "llama-lora-sharded-bf16-ckpt": (LLAMA_LORA, auto("sharded", "blocks"), FSDP8,
                                     step(param_dtype="bfloat16", reduce_dtype="float32"), 0, True),
    "qwen2-lora-sharded": (qwen2_lora, auto("sharded"), FSDP8, step(), 0, True),
    "qwen2-lora-ignored-ckpt-hsdp": (qwen2_lora, auto("ignored", "blocks"), HSDP, step(), 0, True),
    "qwen2-lora-sharded-sac": (no_cache(qwen2_lora), auto("sharded", "selective"), FSDP8, step(), 0, True),
    "gpt2-full": (gpt2, auto(), FSDP8, step(), 0, False),
    "gpt2-full-ckpt": (gpt2, auto(checkpoint="blocks"), FSDP8, step(), 0, True),
    "gpt2-full-sac": (no_cache(gpt2), auto(checkpoint="selective"), FSDP8, step(), 0, True),
    "mixtral-full": (mixtral, auto(), FSDP8, step(), 0, True),
    "mixtral-full-ckpt": (mixtral, auto(checkpoint="blocks"), FSDP8, step(), 0, True),
    "xlm-full": (xlm, auto(), FSDP8, step(), 0, True),
    "git-full": (git, auto(), FSDP8, step(), 0, True),
    # BLT's own forward fails with its config's use_cache=True (its DynamicCache reads a num_hidden_layers
    # BltConfig lacks, in transformers 5.24, on real tensors too): trained as its users must, without it
    "blt-full": (no_cache(blt), blocks_and_root, FSDP8, step(), 0, True),
}


# predicted peak - torch's, in bytes, measured with torch 2.13 / transformers 5.24 (deterministic
# under the fake process group). Every deviation is in activations and temporaries. The step is the
# one the config runs (issue 20): these configs keep use_cache=True, so both sides hold the key/value
# cache, and shardviz measures it on the reduced copy, each block's cache spliced in (docs/activations.md,
# use_cache; the same peaks as a measurement of the whole model). torch's tracker sees the step's
# input ids as shardviz's step holds them (``fake_run(..., fresh_inputs=True)``: made for the forward,
# dropped when it returns, kept only where autograd saves them): the +4 KiB once pinned for Mixtral,
# BLT and the 4-layer Llama were those 2 x 256 int64 ids, which the harness's default step makes
# before the tracker starts and the tracker never saw.
DEVIATION = {
    "llama-lora-sharded": 0,
    "llama-lora-sharded-ckpt": 0,
    "llama-lora-ignored-hsdp": 0,
    "llama-lora-ignored-hsdp-ckpt": 0,
    "llama-lora-ignored-bf16": 0,
    "llama-lora-sharded-bf16-ckpt": 0,
    "qwen2-lora-sharded": 0,
    "qwen2-lora-ignored-ckpt-hsdp": 0,
    "gpt2-full": 0,
    # GPT-2 checkpointed: exact once a module forward runs between two owners of gradients (its MLP's
    # activation) counts with the later one's (it was -0.51 %, then -65792 B)
    "gpt2-full-ckpt": 0,
    "mixtral-full": 0,
    "mixtral-full-ckpt": 0,
    # "every 2": blocks 1 and 3 of 4 checkpointed
    "llama4-every2-ckpt": 0,
    # selective op checkpointing (issue 18), the export's policy on both sides, use_cache=False (torch
    # raises with the cache, see test_selective_checkpointing_with_use_cache_is_an_error_as_in_torch):
    # exact on Llama, Qwen2 and the mixed case (blocks 1, 3 full, 0, 2 selective). GPT-2's
    # projections are addmm and its attention eager (bmm), none of which torchtitan's policy saves:
    # its selective step is its fully checkpointed one, byte for byte (torch's peak too)
    "llama-lora-sharded-sac": 0,
    "llama4-every2-rest-sac": 0,
    "qwen2-lora-sharded-sac": 0,
    "gpt2-full-sac": 0,
    # the architectures that measure since issue 20. XLM exact. BLT exact (measured on the whole model:
    # its decoder indexes its cross-attention list by layer). GIT -0.49 % with its config's cache (the
    # copy runs only the plan's block variants then; without the cache its extra checkpointed copy kept
    # the (batch, 1, seq, seq) mask alive: +2.2 %): at torch's peak one all-gather output (133888 B) is
    # still alive that the model has freed, so the breakdown is left out
    "xlm-full": 0,
    "git-full": -109312,
    "blt-full": 0,
}
# Cases whose peak is another moment than torch's (see DEVIATION): the breakdown differs by kind.
BREAKDOWN_OFF = {"git-full"}


def deviation(name: str) -> int:
    if name not in DEVIATION:
        pytest.fail(f"{name}: measure its deviation from torch's peak and pin it in DEVIATION")
    return DEVIATION[name]


@functools.lru_cache(maxsize=None)
def _case(name):
    build, make_plan, mesh, training, rank, _ = CASES[name]
    model = build()
    plan = make_plan(model)
    return build, plan, mesh, training, rank, sv.analyze(model, plan, mesh, training)


@functools.lru_cache(maxsize=None)
def _truth(name):
    build, plan, mesh, training, rank, _ = _case(name)
    return fake_run(build, plan, mesh, training, rank, fresh_inputs=True)


def _marks(name, slow):
    return [pytest.mark.slow] if slow else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n, c[-1])) for n, c in CASES.items()])
def test_peak_with_activations_matches_torch(name):
    build, plan, mesh, training, rank, analysis = _case(name)
    truth = _truth(name)
    row = analysis.memory.iloc[rank]
    predicted = int(row.peak + row.cpu_optimizer)  # a CPU-only run keeps Adam's step scalars with the states
    torch_peak = truth.peak_snap["Total"]
    assert row.activations > 0.5 * row.peak, "the case should be dominated by activations"
    assert predicted - torch_peak == deviation(name), (
        f"predicted {predicted}, torch {torch_peak}: {predicted - torch_peak:+d} B ({predicted / torch_peak - 1:+.3%}), "
        f"pinned {deviation(name):+d}; predicted {analysis.peak_breakdown(rank)}; torch {truth.peak_snap}")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=_marks(n, c[-1])) for n, c in CASES.items() if n not in BREAKDOWN_OFF])
def test_peak_breakdown_with_activations_matches_torch(name):
    """``a.peak_breakdown()`` against the tracker's categories at its peak: the model state to the
    byte, activations and temporaries by the case's pinned deviation."""
    *_, rank, analysis = _case(name)
    truth = _truth(name)
    problems = breakdown_mismatches(analysis, truth, rank, activations=True, slack=deviation(name))
    assert not problems, "\n".join(problems) + f"\npredicted {analysis.peak_breakdown(rank)}\ntorch {truth.peak_snap}"


@pytest.mark.parametrize("plain, checkpointed", [
    ("llama-lora-sharded", "llama-lora-sharded-ckpt"),
    ("llama-lora-ignored-hsdp", "llama-lora-ignored-hsdp-ckpt"),
])
def test_checkpointing_lowers_the_predicted_activations(plain, checkpointed):
    *_, a = _case(plain)
    *_, b = _case(checkpointed)
    assert int(b.memory.activations.max()) < int(a.memory.activations.max())
    saved = b.activations.set_index("fqn")
    blocks = saved[saved.block]
    assert len(blocks) and (blocks.saved_checkpointed < blocks.saved_plain).all()


def test_no_batch_means_model_state_only():
    *_, a = _case("llama-lora-sharded")
    model = LLAMA_LORA()
    state_only = sv.analyze(model, sv.Plan.auto(model), FSDP8, sv.Training())
    assert (state_only.memory.activations == 0).all()
    assert int(state_only.memory.peak.max()) < int(a.memory.peak.max())


# -- findings that follow from activations -----------------------------------------------------------
def test_use_cache_with_checkpointing_is_a_finding():
    """Issue 24: with checkpointing the step runs without the cache unless the training asks for it
    (Hugging Face's rule under gradient checkpointing); asked for, SV113 says what it keeps."""
    model = LLAMA_LORA()
    ckpt = sv.Plan.auto(model, checkpoint="blocks")
    assert model.config.use_cache  # transformers' default for causal LMs
    codes = lambda plan, **kw: [f.code for f in sv.analyze(model, plan, FSDP8, sv.Training(**kw)).findings]  # noqa: E731
    assert "SV113" in codes(ckpt, use_cache=True) and "SV113" not in codes(ckpt)
    assert "SV113" not in codes(sv.Plan.auto(model))
    assert not sv.analyze(model, ckpt, FSDP8).use_cache and sv.analyze(model, sv.Plan.auto(model), FSDP8).use_cache
    model.config.use_cache = False
    assert "SV113" not in codes(ckpt) and not sv.analyze(model, sv.Plan.auto(model), FSDP8).use_cache


# the deviation of the same cases run with use_cache=False on both sides (the pins before issue 20).
# Plain Llama and Mixtral without the cache: +2,048 B, the step's cache_position (int64, seq): the
# copy's checkpointed block, kept to toggle to (reduced._representatives), holds its inputs to its
# backward, when the real plain step has freed it (+32 KiB on Llama-3-8B at 4096). Without that copy
# these are exact, but XLM's plain step is then 6.8 % over: not changed yet, pinned here
NO_CACHE_DEVIATION = {"llama-lora-sharded-ckpt": 0, "llama-lora-ignored-hsdp-ckpt": 0, "gpt2-full": 0,
                      "gpt2-full-ckpt": 0, "llama-lora-sharded": 2048, "llama-lora-ignored-hsdp": 2048,
                      "mixtral-full": 2048}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n, CASES[n][-1])) for n in NO_CACHE_DEVIATION])
def test_use_cache_false_saves_what_torch_saves(name):
    """Issue 20: the config keeps use_cache=True, so the predicted step holds the key/value cache
    (``test_peak_with_activations_matches_torch`` checks that peak against torch's), and SV113 says
    how many bytes use_cache=False saves: torch's own difference between the two steps, up to the
    pinned deviations (GPT-2 without checkpointing: nothing, in torch too, and no finding)."""
    build, plan, mesh, training, rank, a = _case(name)
    assert build().config.use_cache  # transformers' default for causal LMs
    if plan.checkpoint:  # checkpointed, the step runs without the cache unless asked (issue 24): ask
        training = dataclasses.replace(training, use_cache=True)
        a = sv.analyze(build(), plan, mesh, training)
    without = a.without_kv_cache()
    saved = int(a.memory.peak.max()) - int(without.memory.peak.max())
    torch_without = fake_run(build, plan, mesh, training, rank, use_cache=False, fresh_inputs=True).peak_snap["Total"]
    row = without.memory.iloc[rank]
    assert int(row.peak + row.cpu_optimizer) - torch_without == NO_CACHE_DEVIATION[name]
    torch_with = fake_run(build, plan, mesh, training, rank, use_cache=True, fresh_inputs=True) if plan.checkpoint else _truth(name)
    torch_saved = torch_with.peak_snap["Total"] - torch_without
    assert saved - torch_saved == deviation(name) - NO_CACHE_DEVIATION[name], (saved, torch_saved)
    findings = [f for f in a.findings if f.code == "SV113"]
    if saved <= 0:
        assert not findings
        return
    assert findings[0].severity == "warning"
    assert f"use_cache=False saves {format_bytes(saved)} ({saved:,} bytes)" in findings[0].message


def test_selective_checkpointing_with_use_cache_is_an_error_as_in_torch():
    """Selective checkpointing in a step that keeps the key/value cache: torch raises in backward (the
    recomputation fills the cache again), so shardviz says SV113 (error) and prices the step without
    the cache (issue 24: it used to raise PlanError), which is also the default step with checkpointing."""
    plan = sv.Plan.auto(LLAMA_LORA(), checkpoint="selective")
    a = sv.analyze(LLAMA_LORA(), plan, FSDP8, step(use_cache=True))
    assert int(a.memory.peak.max()) == int(sv.analyze(LLAMA_LORA(), plan, FSDP8, step()).memory.peak.max())
    assert [f.severity for f in a.findings if f.code == "SV113"] == ["error"]
    assert any("priced without" in x for x in a.activation_profile.assumptions)
    with pytest.raises(RuntimeError, match="not found in storage"):
        fake_run(LLAMA_LORA, plan, FSDP8, step(), 0, use_cache=True)


def test_memory_finding_names_the_cheapest_change_that_fits():
    model = LLAMA_LORA()
    training = step()
    ignored = sv.Plan.auto(model, lora="ignored")

    def peak(plan, mesh=FSDP8, t=training):
        return int(sv.analyze(model, plan, mesh, t).memory.peak.max())

    base, sharded = peak(ignored), peak(sv.Plan.auto(model, lora="sharded"))
    checkpointed = peak(sv.Plan.auto(model, lora="ignored", checkpoint="blocks"))
    assert sharded < base and checkpointed < base
    # room for LoRA sharded: that is the cheapest fix, though checkpointing would fit too
    judged = {"memory_reserve": 0, "judge": "allocated", "safety_margin": 0.0}  # the allocated peaks above, exactly
    fix = next(f for f in sv.analyze(model, ignored, sv.Mesh(8, device_memory=max(sharded, checkpointed), **judged),
                                     training).findings if f.code == "SV201").fix
    assert fix.startswith("cheapest fix: shard the LoRA adapters") and "checkpoint every block" in fix
    # room only for checkpointing (activations dominate: sharding the adapters saves far less)
    assert checkpointed < sharded
    fix = next(f for f in sv.analyze(model, ignored, sv.Mesh(8, device_memory=checkpointed, **judged), training).findings
               if f.code == "SV201").fix
    assert fix.startswith("cheapest fix: checkpoint every block") and f"peak {format_bytes(checkpointed)}" in fix
