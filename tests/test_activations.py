"""Activation measurement (shardviz.activations) against torch's own count of a real step.

The truth is a real forward+backward of the FULL model (every block, real tensors, no fake
tensors, no reduced copy, no extrapolation) under torch's ``MemTracker``: activation bytes
(activations + temporaries + other) at each module's pre/post forward and pre backward, as
MemTracker snapshots them, and the highest activation level over the step.
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch import nn

from shardviz import activations as A
from shardviz.activations import measure as M
from shardviz.activations import measure_cache
from shardviz.activations import measure_activations

BATCH, SEQ, VOCAB, LAYERS = 2, 256, 512, 3


# ---------------------------------------------------------------------------
# Ground truth: the real step of the full model under torch's MemTracker
# ---------------------------------------------------------------------------
def _truth_tracker():
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    act = (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)

    class _Nop:
        def remove(self):
            pass

    class ActPeak(MemTracker):
        """MemTracker that also keeps the highest activation level (its own peak is the total's)."""

        def __init__(self):
            super().__init__()
            self.act_peak = 0
            self.act_peak_at = ("forward", "")  # phase, innermost module running ("" = the root)

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            level = sum(s[k] for s in self._curr_mem_snap.values() for k in act)
            if level > self.act_peak:
                self.act_peak = level
                running = [n.partition(".")[2] for n in self._mod_tracker.parents if n != "Global"]
                inner = max(running, key=lambda n: (n.count(".") + bool(n), n), default="")
                self.act_peak_at = ("backward" if self._mod_tracker.is_bw else "forward", inner)

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # torch's helper hooks frozen parameters too, which torch refuses: skip those
            for p in module.parameters():
                if not p.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(p, (_Nop(), _Nop()))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return ActPeak, act


def real_step(model: nn.Module, inputs=None, seq: int = SEQ, at: bool = False):
    """(activation peak, {fqn: {pre_fw, post_fw, pre_bw}}) of one real step of ``model``; with
    ``at``, also (phase, innermost module) where the activations peaked."""
    from torch.distributed._tools.mem_tracker import _ModState

    ActPeak, act = _truth_tracker()
    model.train()
    tracker = ActPeak()
    tracker.track_external(model)
    torch.manual_seed(0)
    with tracker:
        if inputs is None:
            ids = torch.randint(0, VOCAB, (BATCH, seq))
            out = model(input_ids=ids, labels=ids)  # the config's use_cache: what shardviz measures
        else:
            args, kwargs = inputs(BATCH, seq)
            out = model(*args, **kwargs)
        loss = out.loss if hasattr(out, "loss") else out.sum()
        del out
        loss.backward()
        del loss

    def level(snaps, state):
        if state not in snaps or not snaps[state]:
            return None
        return sum(s.get(k, 0) for s in snaps[state][0].values() for k in act)

    names = {id(m): n for n, m in model.named_modules()}
    per_module = {}
    for mod, stats in tracker.memory_tracking.items():
        if id(mod) not in names:  # a function run as a module outside the model (transformers 5.25 with kernels)
            continue
        fqn = names[id(mod)].replace("._checkpoint_wrapped_module", "").replace("_checkpoint_wrapped_module", "")
        if fqn in per_module:  # a checkpoint wrapper and the module it wraps: keep the outer one
            continue
        per_module[fqn] = {k: level(stats.snapshots, s) for k, s in
                           (("pre_fw", _ModState.PRE_FW), ("post_fw", _ModState.POST_FW), ("pre_bw", _ModState.PRE_BW))}
    if at:
        return tracker.act_peak, per_module, tracker.act_peak_at
    return tracker.act_peak, per_module


# ---------------------------------------------------------------------------
# Models (real, tiny, CPU; activations dominate: hidden 64, seq 256, vocab 512)
# ---------------------------------------------------------------------------
def build(kind: str, layers: int = LAYERS, lora: bool = False) -> nn.Module:
    import transformers as T

    torch.manual_seed(0)
    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 512}
    if kind == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(**common))
    elif kind == "qwen2":
        model = T.Qwen2ForCausalLM(T.Qwen2Config(**common))
    elif kind == "mixtral":
        model = T.MixtralForCausalLM(T.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))
    elif kind == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=VOCAB, n_positions=512))
    elif kind == "bart":
        model = T.BartForConditionalGeneration(T.BartConfig(
            d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=512))
    else:
        raise ValueError(kind)
    if lora:
        import warnings

        from peft import LoraConfig, get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    return model


def wrap_checkpoint(model: nn.Module, fqns) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
    )

    for fqn in fqns:
        parent, _, name = fqn.rpartition(".")
        holder = model.get_submodule(parent)
        setattr(holder, name, checkpoint_wrapper(getattr(holder, name)))
    return model


def close(mine, truth, scale, tol=0.01):
    return abs(mine - truth) <= tol * scale


def check_against_truth(profile, peak, truth, tol=0.01):
    """Peak within ``tol``; every block's levels within ``tol`` of the peak; the saved bytes of the
    blocks in the middle (the extrapolated ones) within ``tol`` of their own size."""
    assert close(profile.peak_bytes, peak, peak, tol), (profile.peak, peak)
    assert len(profile.blocks) >= 2
    for fqn in profile.blocks:
        got, want = profile.at(fqn), truth[fqn]
        for k in ("pre_fw", "post_fw", "pre_bw"):
            assert want[k] is not None and getattr(got, k) is not None, (fqn, k)
            assert close(getattr(got, k), want[k], peak, tol), (fqn, k, getattr(got, k), want[k])
    by_list: dict[str, list[str]] = {}
    for fqn in profile.blocks:
        by_list.setdefault(fqn.rpartition(".")[0], []).append(fqn)
    for blocks in by_list.values():
        for a, b in itertools.pairwise(blocks[1:]):
            want = truth[b]["pre_fw"] - truth[a]["pre_fw"]
            assert close(profile.at(a).saved, want, want, tol), (a, profile.at(a).saved, want)


# ---------------------------------------------------------------------------
# Agreement with the real step
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2", "mixtral", "bart"])
def test_matches_real_step(kind):
    model = build(kind)
    profile = measure_activations(model, BATCH, SEQ)
    assert profile.measured_blocks <= 3 * (2 if kind == "bart" else 1)  # not one per layer
    peak, truth, at = real_step(model, at=True)
    check_against_truth(profile, peak, truth)
    assert profile.peak[1:] == at  # phase and innermost module where the real step's activations peak


def test_more_layers_extrapolate():
    """5 real layers against the same 3 measured copies (2 in the config's step, which keeps the
    key/value cache: the variants the plan has, kvcache): extrapolation, not a per-layer run."""
    model = build("llama", layers=5, lora=True)
    assert measure_activations(model, BATCH, SEQ, use_cache=False).measured_blocks == 3
    profile = measure_activations(model, BATCH, SEQ)
    assert profile.measured_blocks == 2
    peak, truth = real_step(model)
    check_against_truth(profile, peak, truth)


def test_bf16_compute_with_fp32_lora_matches_real_step():
    """param_dtype bf16 with the LoRA adapters kept whole in fp32: measured on the fp32 model, the
    truth is the real model with its base weights cast to bf16 (what FSDP computes with)."""
    model = build("llama", lora=True)
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    profile = measure_activations(model, BATCH, SEQ, param_dtype="bfloat16", whole_params=lora)
    fp32 = measure_activations(model, BATCH, SEQ)
    assert profile.peak_bytes < fp32.peak_bytes
    block = profile.blocks[1]
    assert profile.at(block).saved < fp32.at(block).saved
    real = copy.deepcopy(model)
    for name, p in real.named_parameters():
        if name not in lora:
            p.data = p.data.to(torch.bfloat16)
    peak, truth = real_step(real)
    check_against_truth(profile, peak, truth)


def test_bf16_lora_sharded_casts_adapters_too():
    """LoRA sharded: FSDP casts the adapters to bf16 as well, so peft's fp32 input casts vanish."""
    model = build("llama", lora=True)
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    whole = measure_activations(model, BATCH, SEQ, param_dtype="bfloat16", whole_params=lora)
    sharded = measure_activations(model, BATCH, SEQ, param_dtype="bfloat16")
    block = whole.blocks[1]
    assert sharded.at(block).saved < whole.at(block).saved
    # the truth: the real model with every parameter, adapters included, in bf16 (what FSDP computes with)
    peak, truth = real_step(copy.deepcopy(model).to(torch.bfloat16))
    check_against_truth(sharded, peak, truth)


def test_checkpointing_matches_real_step_and_saves_less():
    model = build("llama", lora=True)
    plain = measure_activations(model, BATCH, SEQ)
    blocks = plain.blocks
    ckpt = measure_activations(model, BATCH, SEQ, checkpoint=blocks)
    middle = blocks[1]
    assert ckpt.at(middle).checkpointed and not plain.at(middle).checkpointed
    assert ckpt.at(middle).saved * 4 < plain.at(middle).saved
    # without a key/value cache, with and without checkpointing come from the same measured copies
    plain_nc, ckpt_nc = (measure_activations(model, BATCH, SEQ, checkpoint=c, use_cache=False) for c in ((), blocks))
    assert plain_nc.at(middle).saved_checkpointed == ckpt_nc.at(middle).saved
    assert ckpt_nc.at(middle).saved_plain == plain_nc.at(middle).saved
    assert ckpt.peak_bytes < plain.peak_bytes
    peak, truth = real_step(wrap_checkpoint(copy.deepcopy(model), blocks))
    check_against_truth(ckpt, peak, truth)


def test_mixed_checkpointing_matches_and_reuses_the_measurement(monkeypatch):
    model = build("llama", layers=4, lora=True)
    model.config.use_cache = False  # the measurement is reused only in a step without a key/value cache
    calls = []
    real = M.measure_copy
    monkeypatch.setattr(M, "measure_copy", lambda *a, **k: calls.append(1) or real(*a, **k))
    A.clear_cache()
    plain = measure_activations(model, BATCH, SEQ)
    one = measure_activations(model, BATCH, SEQ, checkpoint=[plain.blocks[1]])
    two = measure_activations(model, BATCH, SEQ, checkpoint=plain.blocks[1:3])
    assert len(calls) == 1  # toggling checkpointing of middle blocks reuses the measurement
    assert two.peak_bytes < one.peak_bytes < plain.peak_bytes
    peak, truth = real_step(wrap_checkpoint(copy.deepcopy(model), [plain.blocks[1]]))
    check_against_truth(one, peak, truth)
    # the config's step keeps the cache: plain blocks around a checkpointed one (kvcache, splice)
    model.config.use_cache = True
    for ckpt in ([plain.blocks[1]], plain.blocks[1:3]):
        peak, truth = real_step(wrap_checkpoint(copy.deepcopy(model), ckpt))
        check_against_truth(measure_activations(model, BATCH, SEQ, checkpoint=ckpt), peak, truth)


def test_submodule_checkpointing_matches_real_step():
    model = build("llama", lora=False)
    mlps = [f"model.layers.{i}.mlp" for i in range(LAYERS)]
    profile = measure_activations(model, BATCH, SEQ, checkpoint=mlps)
    plain = measure_activations(model, BATCH, SEQ)
    assert profile.at("model.layers.1").saved < plain.at("model.layers.1").saved
    assert profile.at("model.layers.1.mlp").checkpointed
    peak, truth = real_step(wrap_checkpoint(copy.deepcopy(model), mlps))
    check_against_truth(profile, peak, truth)


def test_loss_upcast_to_fp32_is_caught():
    """The HF loss upcasts the (batch, seq, vocab) logits to fp32: in bf16 the step's peak is
    above that tensor, in the backward of the loss (at the root)."""
    model = build("llama")
    profile = measure_activations(model, BATCH, SEQ, param_dtype="bfloat16")
    fp32_logits = BATCH * SEQ * VOCAB * 4
    lm_head = profile.at("lm_head")
    assert lm_head.post_fw - lm_head.pre_fw == BATCH * SEQ * VOCAB * 2  # bf16 logits
    root = profile.at("")
    assert root.post_fw - lm_head.post_fw >= fp32_logits  # fp32 log-probs saved by the loss
    assert profile.peak_bytes >= root.post_fw


# ---------------------------------------------------------------------------
# Any module, given example inputs
# ---------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, d=64, n=4):
        super().__init__()
        self.proj = nn.Linear(16, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.proj(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def tower_inputs(batch, seq):
    return (torch.randn(batch, seq, 16),), {}


def test_example_inputs_for_any_module():
    torch.manual_seed(0)
    model = Tower()
    profile = measure_activations(model, BATCH, SEQ, example_inputs=tower_inputs)
    assert profile.blocks == [f"blocks.{i}" for i in range(4)]
    peak, truth = real_step(model, tower_inputs)
    check_against_truth(profile, peak, truth)


class IndexedTower(Tower):
    """A forward that addresses its blocks by position (as hybrid models index per-layer lists):
    the one-block-per-kind copy cannot run it, the whole model can."""

    def forward(self, x):
        h = self.proj(x)
        for i in range(4):
            h = self.blocks[i](h)
        return self.head(h)


def test_a_model_the_reduced_copy_cannot_run_is_measured_whole():
    torch.manual_seed(0)
    model = IndexedTower()
    profile = measure_activations(model, BATCH, SEQ, example_inputs=tower_inputs)
    assert any("measured on the whole model" in a and "IndexError" in a for a in profile.assumptions)
    peak, truth = real_step(model, tower_inputs)
    check_against_truth(profile, peak, truth)


def test_a_model_nothing_can_run_names_itself():
    class Broken(Tower):
        def forward(self, x):
            raise RuntimeError("needs pixel_values")

    with pytest.raises(ValueError, match="activations of Broken could not be measured.*needs pixel_values"):
        measure_activations(Broken(), BATCH, SEQ, example_inputs=tower_inputs)


# ---------------------------------------------------------------------------
# MoE routing, meta models, the user's model, the API
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_moe_eager_routing_is_sized_by_balanced_assumption():
    """The eager experts loop (nonzero / where on the routing mask) cannot be sized by fake
    tensors: it runs under the balanced-routing assumption, and matches the real step of the eager
    model (its real routing) within the usual 1 %."""
    model = build("mixtral")
    model.config._experts_implementation = "eager"
    eager = measure_activations(model, BATCH, SEQ)
    assert any("balanced routing" in a for a in eager.assumptions)
    peak, truth = real_step(model)
    check_against_truth(eager, peak, truth)


@pytest.mark.slow
def test_moe_with_one_module_per_expert_runs():
    """NLLB-MoE picks its expert module by the value of a routing index (f"expert_{idx}") and
    casts its router with ``.to(dtype)`` in forward: both run on fake tensors."""
    import transformers as T

    torch.manual_seed(0)
    config = T.NllbMoeConfig(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2, decoder_layers=2,
                             encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=VOCAB, num_experts=4,
                             expert_capacity=64, encoder_sparse_step=2, decoder_sparse_step=2,
                             max_position_embeddings=512)
    model = T.NllbMoeForConditionalGeneration(config)
    profile = measure_activations(model, BATCH, 64)
    assert any("balanced routing" in a for a in profile.assumptions)
    peak, truth = real_step(model, seq=64)
    check_against_truth(profile, peak, truth)


def test_meta_model_measures_like_the_real_one():
    import transformers as T

    config = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
    with torch.device("meta"):
        meta = T.LlamaForCausalLM(config)
    real = T.LlamaForCausalLM(config)
    a = measure_activations(meta, BATCH, SEQ)
    b = measure_activations(real, BATCH, SEQ)
    assert a.peak == b.peak
    assert a.at("model.layers.1") == b.at("model.layers.1")


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def test_user_model_untouched():
    model = build("llama", lora=True)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {n: p for n, p in model.named_parameters()}
    modules = {n: type(m) for n, m in model.named_modules()}
    hooks = _hooks(model)
    layers = model.config.num_hidden_layers
    # 4 variants (first, plain, checkpointed, mlp checkpointed) for 3 layers: the copy's config says 4
    from transformers.cache_utils import Cache

    update = Cache.update
    profile = measure_activations(model, BATCH, SEQ, param_dtype="bfloat16",
                                  checkpoint=["base_model.model.model.layers.1.mlp"], use_cache=False)
    assert profile.measured_blocks == 4
    # the config's step (its key/value cache, Cache.update routed per copy while it runs)
    measure_activations(model, BATCH, SEQ, param_dtype="bfloat16", checkpoint=["base_model.model.model.layers.1.mlp"])
    assert Cache.update is update
    assert model.config.num_hidden_layers == layers
    assert not model.training
    assert {n: type(m) for n, m in model.named_modules()} == modules  # no checkpoint wrapper left
    assert _hooks(model) == hooks
    for n, p in model.named_parameters():
        assert p is params[n] and p.grad is None and p.dtype == torch.float32
        assert getattr(p, "_backward_hooks", None) in (None, {}) or not p._backward_hooks
        assert not getattr(p, "_post_accumulate_grad_hooks", None)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_api_cache_and_table(monkeypatch):
    model = build("llama")
    model.config.use_cache = False  # saved_checkpointed is measured alongside only without a key/value cache
    A.clear_cache()
    calls = []
    real = M.measure_copy
    monkeypatch.setattr(M, "measure_copy", lambda *a, **k: calls.append(1) or real(*a, **k))
    p1 = measure_activations(model, BATCH, SEQ)
    p2 = measure_activations(model, BATCH, SEQ)
    assert len(calls) == 1 and p1.peak == p2.peak
    measure_activations(model, BATCH, 2 * SEQ)
    assert len(calls) == 2
    size, phase, where = p1.peak
    assert size > 0 and phase in ("forward", "backward") and (where == "" or where in p1.modules)
    table = p1.table()
    assert {"fqn", "saved", "saved_plain", "saved_checkpointed", "pre_fw", "peak_fw", "peak_bw"} <= set(table.columns)
    assert set(p1.blocks) <= set(table["fqn"])
    assert "" in set(table["fqn"]) and "lm_head" in set(table["fqn"])
    sub = p1.table(["model.layers.0", ["model.norm", "lm_head"]])
    assert list(sub["fqn"]) == ["model.layers.0", "model.norm"]
    at = p1.at("model.layers.1")
    assert at.peak_fw >= max(at.pre_fw, at.post_fw) and at.peak_bw >= at.pre_bw
    assert at.saved_checkpointed < at.saved == at.saved_plain
    assert any("attention kernel" in a for a in p1.assumptions)
    levels = [e[3] for e in p1.timeline]
    assert min(levels) >= 0 and max(e[4] for e in p1.timeline) == size
    with pytest.raises(KeyError):
        p1.at("model.nope")


def test_the_cache_drops_the_least_recently_used(monkeypatch):
    """Past its size, the cache drops the step least recently asked for, not every step: the plan an
    Inspector session goes back to (undo) stays measured however many edits came between."""
    model = build("llama")
    model.config.use_cache = False
    A.clear_cache()
    monkeypatch.setattr(measure_cache, "_MAX_ENTRIES", 2)
    made = []  # the profiles made (from a measurement, kept or new)
    real = M._profile
    monkeypatch.setattr(M, "_profile", lambda *a, **k: made.append(a[1].seq_len) or real(*a, **k))
    first = measure_activations(model, BATCH, SEQ)
    measure_activations(model, BATCH, 2 * SEQ)
    assert measure_activations(model, BATCH, SEQ) is first  # asked again: the most recent now
    measure_activations(model, BATCH, 3 * SEQ)  # one too many: 2 * SEQ, the least recent, goes
    assert measure_activations(model, BATCH, SEQ) is first
    assert made == [SEQ, 2 * SEQ, 3 * SEQ]
    measure_activations(model, BATCH, 2 * SEQ)
    assert made == [SEQ, 2 * SEQ, 3 * SEQ, 2 * SEQ]


def test_model_changed_in_place_is_walked_again():
    model = build("llama")
    a = measure_activations(model, BATCH, SEQ)
    model.to(torch.bfloat16)
    b = measure_activations(model, BATCH, SEQ)
    assert b.at("model.layers.1").saved < a.at("model.layers.1").saved


def test_errors():
    with pytest.raises(ValueError, match="example_inputs"):
        measure_activations(Tower(), BATCH, SEQ)
    with pytest.raises(KeyError):
        measure_activations(build("llama"), BATCH, SEQ, checkpoint=["model.nope"])
    with pytest.raises(ValueError):
        measure_activations(build("llama"), 0, SEQ)


def test_scales_linearly_in_tokens():
    """Without an O(seq^2) attention matrix (flash kernel), a block's saved bytes are linear in
    batch * seq."""
    model = build("llama")
    a = measure_activations(model, 1, SEQ)
    b = measure_activations(model, 2, SEQ)
    block = a.blocks[1]
    assert math.isclose(b.at(block).saved, 2 * a.at(block).saved, rel_tol=0.01)


def test_recorder_answers_a_fake_tensors_device_itself():
    """``tensor.device`` of a fake tensor (most of what a Mamba scan dispatches) is answered by the
    recorder as FakeTensorMode answers it, without going through the modes below it."""
    from torch._subclasses import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from shardviz.activations.recorder import Recorder

    seen = []

    class Below(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    fake = FakeTensorMode()
    with fake:
        x = torch.empty(4, 4)
    with fake, Below(), Recorder({}, set()):
        device = torch.ops.prim.device.default(x)
        y = x + 1
    assert device == torch.device("cpu") and y.device == torch.device("cpu")
    assert torch.ops.prim.device.default not in seen and torch.ops.aten.add.Tensor in seen
