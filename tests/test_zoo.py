"""Tests for shardviz.zoo: real model trees, built offline, on meta where big.

Parameter counts are checked twice: against the figure published for each
checkpoint (Hugging Face safetensors metadata / model papers) and against
arithmetic on the config, so a wrong shipped config cannot pass by accident.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardviz import zoo

# Published totals (safetensors metadata of the Hub checkpoints; NLLB-MoE's
# paper gives 54.5B, the checkpoint is not in safetensors).
PUBLISHED = {
    "llama3_8b": 8_030_261_248,
    "llama3_70b": 70_553_706_496,
    "llama3_405b": 405_853_388_800,
    "qwen3_moe_30b_a3b": 30_532_122_624,
}
NLLB_PUBLISHED_B = 54.5

slow = pytest.mark.slow
BIG = [
    "llama3_8b",
    "llama3_70b",
    pytest.param("llama3_405b", marks=slow),
    "qwen3_moe_30b_a3b",
    pytest.param("nllb_moe_54b", marks=slow),
]


pytestmark = pytest.mark.usefixtures("no_network")  # the zoo must be offline (tests/conftest.py)


def _split(model):
    """(base params, LoRA params) by name; peft names every adapter tensor lora_*."""
    named = list(model.named_parameters())
    return [p for n, p in named if "lora_" not in n], [p for n, p in named if "lora_" in n]


def _count(params):
    return sum(p.numel() for p in params)


def _formula(name):
    """Parameter count from the config alone, independent of torch."""
    c = zoo.load_config(name)
    if c.model_type == "llama":
        h, i, L, v = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
        kv = c.num_key_value_heads * h // c.num_attention_heads
        layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
        return L * layer + 2 * v * h + h  # untied embed + lm_head, final norm
    if c.model_type == "qwen3_moe":
        h, L, v, E, mi = c.hidden_size, c.num_hidden_layers, c.vocab_size, c.num_experts, c.moe_intermediate_size
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        attn = 2 * h * q + 2 * h * kv + 2 * c.head_dim  # q,o,k,v + q_norm,k_norm
        layer = attn + E * h + E * 3 * h * mi + 2 * h  # router, experts, 2 norms
        return L * layer + 2 * v * h + h
    if c.model_type == "nllb-moe":
        d, f, v, E = c.d_model, c.encoder_ffn_dim, c.vocab_size, c.num_experts
        attn = 4 * (d * d + d)
        dense = d * f + f + f * d + d
        moe = E * dense + E * d  # experts + router (no bias)
        enc_sparse = c.encoder_layers // c.encoder_sparse_step
        dec_sparse = c.decoder_layers // c.decoder_sparse_step
        enc = c.encoder_layers * (attn + 4 * d) + enc_sparse * moe + (c.encoder_layers - enc_sparse) * dense
        dec = c.decoder_layers * (2 * attn + 6 * d) + dec_sparse * moe + (c.decoder_layers - dec_sparse) * dense
        return v * d + enc + dec + 2 * 2 * d  # shared (tied) embedding, final norms
    raise AssertionError(name)


# ---------------------------------------------------------------- registry


def test_registry_names_and_errors():
    assert isinstance(zoo.NAMES, tuple) and "tiny_llama_lora" in zoo.NAMES
    with pytest.raises(ValueError) as err:
        zoo.build("llama3_9000b")
    for name in zoo.NAMES:
        assert name in str(err.value)


def test_build_accepts_cli_prefix_and_describe():
    model = zoo.build("zoo:tiny_llama_lora")
    assert isinstance(model, torch.nn.Module)
    (row,) = zoo.describe(["tiny_llama_lora"])
    assert row["name"] == "tiny_llama_lora" and (row["params"], row["trainable"]) == (106_816, 16_384)
    assert row["modules"] > 33  # the bare tiny Llama has 33; peft adds its wrappers


# ---------------------------------------------------------------- tiny model


def test_tiny_is_deterministic_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = zoo.tiny_llama_lora(seed=0), zoo.tiny_llama_lora(seed=0), zoo.tiny_llama_lora(seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert list(sa) == list(sb) and [n for n, _ in a.named_modules()] == [n for n, _ in b.named_modules()]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    x, y = zoo.tiny_batch(3), zoo.tiny_batch(3)
    assert torch.equal(x["input_ids"], y["input_ids"]) and x["input_ids"].shape == (2, 16)
    assert torch.equal(x["labels"], x["input_ids"]) and int(x["input_ids"].max()) < 128


def test_tiny_shapes_and_lora_placement():
    model = zoo.tiny_llama_lora()
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (64, 128, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings) == (4, 2, 128, False)
    base, lora = _split(model)
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in base + lora)
    assert not any(p.requires_grad for p in base) and all(p.requires_grad for p in lora)
    wrapped = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert _count(lora) == 16_384 and _count(base) == 90_432
    plain = zoo.tiny_llama_lora(lora=False)
    assert type(plain).__name__ == "LlamaForCausalLM" and all(p.requires_grad for p in plain.parameters())


def test_tiny_trains():
    model = zoo.tiny_llama_lora(seed=0)
    batch = zoo.tiny_batch(seed=0)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(20):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses  # ~4.86 -> ~3.69
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if not p.requires_grad)


# ---------------------------------------------------------------- meta models


# Peak RSS is a high-water mark: in the test process an earlier test's peak hides the build, so the
# build is measured in a fresh interpreter, after the imports and the config it needs.
BUILD_PEAK = """
import resource, sys
from shardviz import zoo
zoo.load_config(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
zoo.build(sys.argv[1])  # lora=True
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def build_peak_growth_mib(name: str) -> float:
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", BUILD_PEAK, name], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split()[-2:])
    return (after - before) / 1024


@pytest.mark.parametrize("name", BIG)
def test_meta_model_builds_offline_without_allocating(name):
    # measured: 56 (8B) to 229 MiB (NLLB, 43k modules) of Python objects; with peft's LoRA made
    # outside the meta device (zoo._meta_model's docstring): 488 (70B) to 1794 MiB (NLLB)
    grown_mib = build_peak_growth_mib(name)
    assert grown_mib < 384, f"{name} grew peak RSS by {grown_mib:.0f} MiB"
    model = zoo.build(name)  # lora=True

    assert all(t.is_meta for t in itertools.chain(model.parameters(), model.buffers()))
    base, lora = _split(model)
    assert lora and all(p.requires_grad and p.dtype == torch.float32 for p in lora)
    assert not any(p.requires_grad for p in base)
    assert all(p.dtype == torch.bfloat16 for p in base)

    n = _count(base)
    assert n == _formula(name)
    if name in PUBLISHED:
        assert n == PUBLISHED[name]
    else:
        assert round(n / 1e9, 1) == NLLB_PUBLISHED_B

    head = model.get_output_embeddings()
    assert not any("lora_" in pn for pn, _ in head.named_parameters()), "lm_head must not get LoRA"
    if name == "nllb_moe_54b":
        assert sum(1 for _ in model.modules()) >= 20_000


def test_meta_llama_shapes_and_plain_build():
    model = zoo.llama3_8b(lora=False)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert all(p.is_meta and p.requires_grad for p in model.parameters())
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (4096, 14336, 32)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (32, 8, 128256)
    assert c.tie_word_embeddings is False and c.rope_parameters["rope_type"] == "llama3"
    assert c.rope_parameters["rope_theta"] == 500000.0
    for build, (h, layers, heads) in [(zoo.llama3_70b, (8192, 80, 64)), (zoo.llama3_405b, (16384, 126, 128))]:
        c = zoo.load_config(build.__name__)
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (h, layers, heads, 8)


def test_meta_tree_is_deterministic():
    a, b = zoo.llama3_8b(), zoo.llama3_8b()
    assert [n for n, _ in a.named_modules()] == [n for n, _ in b.named_modules()]
    assert [(n, p.shape, p.dtype) for n, p in a.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in b.named_parameters()
    ]
