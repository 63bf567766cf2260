"""bitsandbytes 8-bit and fp8 block-quantized configs, built on meta by ``sv.load_model``, against torch.

- 8-bit: the meta model against the one transformers' ``from_pretrained(load_in_8bit=True)`` quantizes on
  the CPU: every parameter's class, shape, dtype, and the bytes of each ``Int8Params``' ``SCB``.
- Both (8-bit, and DeepSeek-V3's ``quant_method: fp8`` with 128 x 128 blocks): torch's own ``fully_shard``
  on the model ``load_model`` builds, under the fake process group at world sizes 2 and 4: each rank's
  sharded parameter bytes (``FSDPParam._sharded_param_data``, what FSDP2 allocates, padding included) and
  every call's all-gather (dtype and bytes, counted at the c10d op) against the analysis. No training
  step: neither format has a CPU forward (fp8 runs Triton / DeepGEMM kernels; bitsandbytes' 8-bit
  forward reads ``weight.SCB``, which ``fully_shard``'s plain DTensor parameter no longer carries).
"""

from __future__ import annotations

import json

import pytest
import torch

import shardviz as sv
from qlora_models import ADAPTER, LLAMA, quantized, save_llama
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group
from torch_truth import _collective_recorder

FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
BNB_8BIT = {"quant_method": "bitsandbytes", "load_in_8bit": True}


def _files(tmp_path, qc):
    from transformers import LlamaConfig

    config = LlamaConfig(**LLAMA, torch_dtype="bfloat16").to_dict()
    config["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "adapter_config.json").write_text(json.dumps(ADAPTER))
    return lambda: sv.load_model(tmp_path / "config.json", adapter=tmp_path / "adapter_config.json")


def _torch_shards_and_gathers(model, plan, mesh, rank, training=None) -> tuple[int, list]:
    """(sharded parameter bytes FSDP2 allocates on ``rank``, every call's forward all-gather as (dtype,
    bytes)) after torch's ``fully_shard`` of ``plan`` on ``model``, materialised (``to_empty``) and each
    call unsharded once."""
    with fake_process_group(rank, mesh.world):
        apply_plan(model, plan, device_mesh(mesh), training=training or sv.Training())
        states = {id(s): s for s in (m._get_fsdp_state() for m in model.modules() if hasattr(m, "_get_fsdp_state"))}
        groups = [s._fsdp_param_group for s in states.values() if s._fsdp_param_group is not None]
        sharded = sum(fp._sharded_param_data.numel() * fp._sharded_param_data.element_size()
                      for g in groups for fp in g.fsdp_params)
        model.to_empty(device="cpu")
        model._get_fsdp_state()._lazy_init()
        recorder = _collective_recorder()
        with recorder:
            for g in groups:
                g.unshard()
                g.wait_for_unshard()
                g.reshard()
    return sharded, sorted((c["dtype"], c["bytes"]) for c in recorder.log if c["collective"] == "all_gather")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("qc", [FP8, BNB_8BIT], ids=["fp8", "bnb_8bit"])
def test_params_and_all_gathers_match_fully_shard(tmp_path, qc, world):
    if qc is BNB_8BIT:
        pytest.importorskip("bitsandbytes")
    load = _files(tmp_path, qc)
    model = load()
    kinds = {p.dtype for n, p in model.named_parameters() if "proj.base_layer" in n}
    assert kinds == ({torch.float8_e4m3fn, torch.float32} if qc is FP8 else {torch.int8})
    plan, mesh = sv.Plan.auto(model), sv.Mesh(shard=world)
    a = sv.analyze(model, plan, mesh, sv.Training())
    assert not [f for f in a.findings if f.code == "SV122"]
    gathers = a.comm[(a.comm.collective == "all_gather") & (a.comm.phase == "forward")]
    predicted = sorted((r.dtype, int(r.bytes)) for r in gathers.itertuples() for _ in range(int(r.count)))
    for rank in (0, world - 1):
        sharded, torch_gathers = _torch_shards_and_gathers(load(), plan, mesh, rank)
        assert int(a.memory.params_sharded.iloc[rank]) == sharded
        assert predicted == torch_gathers


def test_8bit_builds_what_transformers_quantizes(tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    from shardviz.model.quant import quant_state_bytes

    save_llama(tmp_path / "base")
    real = quantized(tmp_path / "base", BitsAndBytesConfig(load_in_8bit=True))
    _files(tmp_path, BNB_8BIT)
    meta = sv.load_model(tmp_path / "config.json")

    def described(m):
        return {n: (type(p).__name__, tuple(p.shape), p.dtype, p.requires_grad, quant_state_bytes(p))
                for n, p in m.named_parameters()}

    assert described(meta) == described(real)
    a = sv.analyze(meta, sv.Plan.auto(meta), sv.Mesh(shard=2), sv.Training())
    scb = sum(p.SCB.numel() * p.SCB.element_size() for p in real.parameters() if getattr(p, "SCB", None) is not None)
    assert int(a.memory.quant_state.iloc[0]) == scb > 0


def test_fp8_weights_cast_by_param_dtype_are_found(tmp_path):
    """SV129 under the default bf16 policy (torch gathers the float8 weights as bf16: the test above);
    without a param_dtype the float8 weights gather as they are, 1 byte each, as torch does."""
    load = _files(tmp_path, FP8)
    model = load()
    plan, mesh = sv.Plan.auto(model), sv.Mesh(shard=2)
    found = [f for f in sv.analyze(model, plan, mesh, sv.Training()).findings if f.code == "SV129"]
    assert len(found) == 1 and "q_proj.base_layer.weight" in found[0].fqns[0] and "param_dtype=None" in found[0].fix
    training = sv.Training(param_dtype=None)
    a = sv.analyze(model, plan, mesh, training)
    assert not [f for f in a.findings if f.code == "SV129"]
    gathers = a.comm[(a.comm.collective == "all_gather") & (a.comm.phase == "forward")]
    sharded, torch_gathers = _torch_shards_and_gathers(load(), plan, mesh, 0, training)
    assert sorted((r.dtype, int(r.bytes)) for r in gathers.itertuples()) == torch_gathers
    assert int(a.memory.params_sharded.iloc[0]) == sharded
    assert "uint8" in {d for d, _ in torch_gathers}  # float8 weights, fp32 scales and LoRA: one uint8 buffer


def test_cli_load_in_8bit_builds_the_8bit_model_torch_shards(tmp_path, capsys):
    """--load-in-8bit on a bf16 config.json analyses the model ``BitsAndBytesConfig(load_in_8bit=True)``
    gives (int8 weights, their SCB), named on the model line: its printed peak is that of the same model
    declared in the config, whose sharded bytes are torch's own ``fully_shard``'s."""
    pytest.importorskip("bitsandbytes")
    from shardviz.cli import main
    from shardviz.format import format_bytes

    load = _files(tmp_path, BNB_8BIT)
    declared = load()
    plan, mesh = sv.Plan.auto(declared), sv.Mesh(shard=2)
    a = sv.analyze(declared, plan, mesh, sv.Training())
    assert int(a.memory.params_sharded.iloc[0]) == _torch_shards_and_gathers(load(), plan, mesh, 0)[0]
    config = json.loads((tmp_path / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    flags = ["report", str(tmp_path / "config.json"), "--adapter", str(tmp_path / "adapter_config.json"),
             "--world-size", "2", "--no-compare", "-o", str(tmp_path / "r.html")]
    assert main([*flags, "--load-in-8bit"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps at 100 columns
    assert "8-bit int8 (bitsandbytes)" in out and "SV122" not in out
    assert f"peak {format_bytes(int(a.memory.peak.max()))} allocated" in out
    assert main([*flags, "--load-in-8bit", "--quant-storage", "bfloat16", "--force"]) == 2
    assert "--load-in-8bit has no such field" in capsys.readouterr().err
