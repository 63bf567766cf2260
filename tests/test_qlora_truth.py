"""bitsandbytes 4-bit QLoRA against torch and transformers, to the byte.

- ``sv.load_model`` on the ``config.json`` a 4-bit model saves builds, on meta, the model transformers'
  ``from_pretrained`` quantizes on the CPU: every parameter's class, packed shape and storage dtype, and
  the bytes of every quantization state (``absmax``, code tables, the nested state with double
  quantization), for nf4 / fp4, each storage dtype, with and without double quantization.
- The analysis of that meta model (with the same LoRA adapter) against torch's own ``fully_shard`` on the
  real quantized model under the fake process group, at world sizes 2 and 4 (``torch_truth.fake_run``):
  each rank's sharded parameter bytes, buffers, gradients and optimizer states (``FSDPMemTracker``), every
  collective with its dtype and bytes, and the quantization state each rank keeps whole (the storages of
  the real ``QuantState`` tensors: the tracker does not see them, they are no parameters).
- The peak with activations (batch 2 x 64): the fake copy runs ``Linear4bit`` through
  ``activations.patches.bnb_4bit_reference`` (bitsandbytes' MatMul4Bit as it allocates: the dequantized
  weight in backward, and in forward above 1,536 rows where the CUDA kernel dequantizes): torch's largest
  Total plus the quantization state, within the pinned ``ACTIVATION_DEVIATION``. At 128 rows bitsandbytes'
  CPU kernel (an opaque op, as the fused CUDA kernel) shows torch no forward temporary either.
"""

from __future__ import annotations

import pytest

import shardviz as sv
from qlora_models import bnb_config, quant_state_storage_bytes, quantized, quantized_files
from torch_truth import comm_mismatches, fake_run, memory_mismatches

pytest.importorskip("bitsandbytes")

CASES = [("nf4", "bfloat16", False), ("nf4", "bfloat16", True), ("fp4", "uint8", True), ("nf4", "float32", False),
         ("nf4", "float16", True)]


def _described(model) -> dict:
    from shardviz.model.quant import quant_state_bytes

    return {n: (type(p).__name__, tuple(p.shape), p.dtype, p.requires_grad, quant_state_bytes(p))
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("quant_type, storage, double_quant", CASES, ids=lambda v: str(v))
def test_load_model_builds_what_transformers_quantizes(tmp_path, quant_type, storage, double_quant):
    real, folder = quantized_files(tmp_path, bnb_config(quant_type, storage, double_quant))
    meta = sv.load_model(folder / "config.json")
    assert all(p.is_meta for p in meta.parameters())
    assert _described(meta) == _described(real)
    a = sv.analyze(meta, sv.Plan.auto(meta), sv.Mesh(shard=2), sv.Training())
    assert int(a.memory.quant_state.iloc[0]) == quant_state_storage_bytes(real) > 0
    assert not [f for f in a.findings if f.code == "SV122"]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("double_quant", [False, True], ids=["plain", "double_quant"])
def test_params_and_all_gathers_match_fully_shard(tmp_path, world, double_quant):
    config = bnb_config("nf4", "bfloat16", double_quant)
    real, folder = quantized_files(tmp_path, config)
    meta = sv.load_model(folder / "config.json", adapter=folder / "adapter_config.json")
    plan, mesh, training = sv.Plan.auto(meta), sv.Mesh(shard=world), sv.Training()
    a = sv.analyze(meta, plan, mesh, training)
    assert not [f for f in a.findings if f.severity == "error"], a.findings
    for rank in (0, world - 1):
        state: dict = {}
        truth = fake_run(lambda: quantized(tmp_path / "base", config, adapter=True), plan, mesh, training, rank,
                         inspect=lambda m, state=state: state.setdefault("quant", quant_state_storage_bytes(m)))
        # the peak to the byte: torch's tracker does not see the quantization state (no parameter, no buffer)
        assert memory_mismatches(a, truth, peak_offset=state["quant"]) == []
        assert comm_mismatches(a, truth) == []
        assert int(a.memory.quant_state.iloc[rank]) == state["quant"]
    row = a.memory.iloc[0]
    # the packed data is what is sharded: a quarter of the bf16 weights' bytes, sharded over the mesh
    bf16 = sv.load_model(folder / "config.json", adapter=folder / "adapter_config.json", quantization={})
    unquantized = sv.analyze(bf16, sv.Plan.auto(bf16), mesh, training).memory.iloc[0]
    assert row.params_sharded < unquantized.params_sharded / 2


# measured: 0 B on both settings and world sizes 2 and 4 (+1,024 B before the allocator replay freed a call's forward
# transients before the next call's all-gather and bf16 parameters became the one default)
ACTIVATION_DEVIATION = {False: 0, True: 0}


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("double_quant", [False, True], ids=["plain", "double_quant"])
def test_peak_with_activations_matches_torch(tmp_path, double_quant, world):
    config = bnb_config("nf4", "bfloat16", double_quant)
    real, folder = quantized_files(tmp_path, config)
    meta = sv.load_model(folder / "config.json", adapter=folder / "adapter_config.json")
    plan, mesh, training = sv.Plan.auto(meta), sv.Mesh(shard=world), sv.Training(batch_size=2, seq_len=64)
    a = sv.analyze(meta, plan, mesh, training)
    truth = fake_run(lambda: quantized(tmp_path / "base", config, adapter=True), plan, mesh, training, 0)
    row = a.memory.iloc[0]
    assert row.activations > 0.5 * row.peak
    predicted = int(row.peak + row.cpu_optimizer)  # a CPU-only run keeps Adam's step scalars with the states
    torch_peak = truth.peak_snap["Total"] + quant_state_storage_bytes(real)
    assert predicted - torch_peak == ACTIVATION_DEVIATION[double_quant], (predicted, torch_peak, a.peak_breakdown(0),
                                                                          truth.peak_snap)
