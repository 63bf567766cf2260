"""The search on QLoRA models (issue 38): what QLoRA users choose between is searched, and the host RAM
of CPU offload is part of each offloaded row's verdict.

- The 4-bit storage knob: bf16 storage (FSDP2 shards the packed weights) against uint8 storage, which
  accelerate's ``fsdp2_prepare_model`` puts in ``ignored_params`` (every rank holds them whole): the
  replicated row's plan is the sharded row's with the packed weights ignored, and torch's own
  ``fully_shard`` (``sv.verify``) places them so.
- Offloaded rows carry the host's part of the one verdict (``MemoryFit.host``): judged against
  ``Mesh.host_memory``, over when the host cannot hold it whatever the device says.
- The 70B QLoRA case on 2 x RTX 3090 (slow): a plan fits only with CPU offload, its host RAM stated and
  judged, and every other plan says why not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardviz as sv
from shardviz.format import format_bytes

pytest.importorskip("bitsandbytes")

CONFIGS = Path(sv.__file__).parent / "configs"
NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
       "bnb_4bit_quant_storage": "bfloat16", "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_use_double_quant": False}
ADAPTER = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear",
           "task_type": "CAUSAL_LM"}


def qlora(folder: Path, config: str, r: int = 8, storage: str = "bfloat16"):
    """``config`` (a shipped config.json) with a bitsandbytes nf4 quantization_config (bf16 storage) and
    LoRA r on every linear, built on meta by ``sv.load_model``."""
    cfg = json.loads((CONFIGS / config).read_text())
    cfg.pop("_comment", None)
    cfg["quantization_config"] = {**NF4, "bnb_4bit_quant_storage": storage}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "adapter_config.json").write_text(json.dumps({**ADAPTER, "r": r}))
    return sv.load_model(folder / "config.json", adapter=folder / "adapter_config.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return qlora(tmp_path_factory.mktemp("tiny"), "tiny_llama.json")


def _packed(model) -> list[str]:
    return [n for n, p in model.named_parameters() if type(p).__name__ == "Params4bit"]


def test_storage_is_searched_and_the_replicated_plan_is_what_torch_places(tiny):
    mesh = sv.Mesh(shard=2, device_memory="24GiB")
    s = sv.search(tiny, mesh, sv.Training(batch_size=1, seq_len=64), offload=(False,))
    assert set(s.table.quant) == {"sharded", "replicated"}
    i = next(i for i, q in enumerate(s.table.quant) if q == "replicated")
    j = next(k for k, row in enumerate(s.rows) if row.candidate == s.rows[i].candidate.__class__(
        **{**s.rows[i].candidate.__dict__, "quant": "sharded"}))
    replicated, sharded = s.candidate(i)[0], s.candidate(j)[0]
    packed = _packed(tiny)
    assert packed and set(packed) <= set(replicated.ignored) and not set(packed) & set(sharded.ignored)
    assert "uint8 storage" in s.table.name.iloc[i] and "bf16 storage" in s.table.name.iloc[j]
    diff = sv.verify(tiny, replicated, mesh=mesh, ranks=[0, 1])  # torch's own fully_shard: packed weights whole
    assert diff.empty, diff
    ra, sa = (sv.analyze(tiny, p, mesh, sv.Training()) for p in (replicated, sharded))
    assert ra.memory.params_whole.iloc[0] > sa.memory.params_whole.iloc[0]


def test_the_storage_knob_names_what_the_model_has(tmp_path):
    """A uint8-stored model's sharded row says uint8 storage (FSDP2 shards its packed uint8 data: torch's
    own fully_shard places it so), not the bf16 storage it does not have."""
    model = qlora(tmp_path, "tiny_llama.json", storage="uint8")
    mesh = sv.Mesh(shard=2, device_memory="24GiB")
    s = sv.search(model, mesh, sv.Training(batch_size=1, seq_len=64), offload=(False,))
    i = next(i for i, q in enumerate(s.table.quant) if q == "sharded")
    assert "nf4 (uint8 storage) sharded" in s.table.name.iloc[i] and "bf16" not in s.table.name.iloc[i]
    plan = s.candidate(i)[0]
    assert not set(_packed(model)) & set(plan.ignored)
    assert sv.verify(model, plan, mesh=mesh, ranks=[0, 1]).empty


def test_offloaded_rows_carry_the_host_verdict(tiny):
    mesh = sv.Mesh(shard=2, device_memory="24GiB")
    training = sv.Training(batch_size=1, seq_len=64)
    s = sv.search(tiny, mesh, training, offload=(True,))
    top = s.table.iloc[0]
    a = sv.analyze(tiny, s.best, s.best_mesh, s.best_training or training)
    assert top.offload and top.host == a.fit.host > 0
    assert "host RAM" in top.why and "no host limit given" in top.why and "host RAM" in s.explain()
    need = int(s.table.host.max())
    judged = sv.search(tiny, sv.Mesh(shard=2, device_memory="24GiB", host_memory=need), training, offload=(True,))
    assert judged.fits and f"of {format_bytes(need)}" in judged.table.why.iloc[0]
    low = sv.search(tiny, sv.Mesh(shard=2, device_memory="24GiB", host_memory=need // 4), training, offload=(True,))
    over = low.table[low.table.analysed & low.table.host.notna() & ~low.table.fits]
    assert len(over) and over.why.str.startswith("over the host: host RAM").all()


@pytest.mark.slow
def test_llama_70b_qlora_on_two_rtx_3090_fits_with_offload_and_says_why_not_otherwise(tmp_path):
    model = qlora(tmp_path / "70b", "llama3_70b.json", r=64)
    mesh = sv.Mesh(shard=2, device="RTX-3090", host_memory="128GiB")
    s = sv.search(model, mesh, sv.Training(batch_size=1, seq_len=2048))
    t = s.table
    assert s.fits and t.offload.iloc[0] and t.quant.iloc[0] == "sharded" and t.checkpoint.iloc[0] == "blocks"
    a = sv.analyze(model, s.best, s.best_mesh, s.best_training)
    assert a.fit.fits and a.fit.host == t.host.iloc[0] and a.fit.host_memory == 128 * 2**30
    assert f"host RAM {format_bytes(a.fit.host)} per node" in t.why.iloc[0] and "of 128.00 GiB" in t.why.iloc[0]
    plain = t[t.analysed & ~t.offload]
    assert len(plain) and not plain.fits.any() and plain.why.str.startswith("over 23.00 GiB usable by").all()  # 24 GiB less the reserve
    replicated = t[t.quant == "replicated"]
    assert len(replicated) and not replicated.fits.any() and replicated.why.str.contains("model state alone").any()
