"""torchao NF4 QLoRA (torchtune's ``FrozenNF4Linear`` weights) against torch's own ``fully_shard``, to the byte.

A tiny Llama whose decoder linears hold real ``NF4Tensor`` weights (``to_nf4``), peft's LoRA on every
linear layer, analysed as it is and run under the fake process group (``torch_truth.fake_run``) at
world sizes 2 and 4:

- each rank's parameters: the three inner tensors' shards (``quantized_data``, ``quantized_scalers``,
  ``quantization_factor``) plus ``scaler_mean`` and the code table every rank keeps whole (the tracker
  files those under Sharded Param; shardviz under ``quant_state``), gradients and optimizer states on
  the adapters alone (``FSDPMemTracker``);
- every collective with its dtype and bytes: each call's group gathered through one uint8 buffer,
  ``param_dtype`` ignored by the NF4 weights;
- the peak with activations, ``LinearNF4``'s dequantized weights included (batch 2 x 64), to the byte
  once the tracker sees the step's input ids (``fresh_inputs``);
- SV128 where torchao cannot split an NF4 weight, and its ``scaler_block_size`` that torch then shards.
"""

from __future__ import annotations

import pytest

import shardviz as sv
from qlora_models import nf4_llama
from torch_truth import batch, comm_mismatches, fake_run, memory_mismatches

pytest.importorskip("torchao.quantization", reason="torchao NF4: pip install 'shardviz[torchao]'")


def _nf4_params(model) -> int:
    from shardviz.model.quant_torchao import is_nf4

    return sum(1 for p in model.parameters() if is_nf4(p))


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_params_and_all_gathers_match_fully_shard(world):
    model = nf4_llama()
    plan, mesh, training = sv.Plan.auto(model), sv.Mesh(shard=world), sv.Training()
    a = sv.analyze(model, plan, mesh, training)
    assert not [f for f in a.findings if f.severity == "error"], a.findings
    assert set(a.params.dtype[a.params.fqn.str.endswith("proj.base_layer.weight")]) == {"uint8"}
    assert sv.verify(model, plan, mesh).empty  # placements and local (NF4, dequantized-shape) shards: torch's
    for rank in (0, world - 1):
        truth = fake_run(nf4_llama, plan, mesh, training, rank)
        row = a.memory.iloc[rank]
        # the tracker counts scaler_mean and the code table (shardviz's quant_state) as sharded parameters
        assert row.params_sharded + row.quant_state == truth.sharded_params
        assert [m for m in memory_mismatches(a, truth) if "params_sharded" not in m] == []
        assert comm_mismatches(a, truth) == []
    assert int(a.memory.quant_state.iloc[0]) == 34 * _nf4_params(model)  # bf16 scaler_mean + 16-entry table
    gathers = a.comm[(a.comm.collective == "all_gather") & a.comm.unit.str.contains("layers")]
    assert set(gathers.dtype) == {"uint8"}  # int8 scalers, bf16 factors, uint8 codes: one uint8 buffer


def test_peak_with_activations_matches_torch():
    """The peak (in layer 1's ``down_proj`` forward) to the byte, when torch's tracker sees the step's
    ``input_ids`` as shardviz's step holds them: made for the forward, dropped when it returns
    (``fresh_inputs``). With the harness's default, ids made once before the tracker starts, the
    tracker never sees them (Inputs 0) and its forward levels are lower by their bytes (2 x 64
    int64 = 1,024 B: the +1,024 B this test once pinned), while every backward level matched;
    the NF4 dequantization (``linear_nf4``, the code table, ``scaler_mean``) was never off."""
    model = nf4_llama()
    plan, mesh, training = sv.Plan.auto(model), sv.Mesh(shard=2), sv.Training(batch_size=2, seq_len=64)
    a = sv.analyze(model, plan, mesh, training)
    row = a.memory.iloc[0]
    assert row.activations > 0.5 * row.peak
    assert row.peak_phase == "forward"
    predicted = int(row.peak + row.cpu_optimizer)  # a CPU-only run keeps Adam's step scalars with the states
    truth = fake_run(nf4_llama, plan, mesh, training, 0, fresh_inputs=True)
    assert predicted == truth.peak_snap["Total"], (predicted, a.peak_breakdown(0), truth.peak_snap)


@pytest.mark.slow
def test_tracker_blind_to_the_ids_is_short_by_their_bytes():
    """The harness's default step (ids made before the tracker starts): torch's peak lacks exactly
    the ids' bytes, nothing else (the gap ``test_peak_with_activations_matches_torch`` explains)."""
    model = nf4_llama()
    plan, mesh, training = sv.Plan.auto(model), sv.Mesh(shard=2), sv.Training(batch_size=2, seq_len=64)
    row = sv.analyze(model, plan, mesh, training).memory.iloc[0]
    blind = fake_run(nf4_llama, plan, mesh, training, 0)
    assert blind.peak_snap["Inputs"] == 0
    ids = batch(model, training)
    assert int(row.peak + row.cpu_optimizer) - blind.peak_snap["Total"] == ids.untyped_storage().nbytes() == 1024


def test_nf4_built_on_meta_is_priced_as_the_real_one():
    """``to_nf4`` of meta weights (benchmarks/bench_qlora.py's 405B row) gives the figures of the real NF4
    model held to torch above: the same memory per rank, activations included, and the same traffic."""
    meta = nf4_llama(device="meta")
    assert _nf4_params(meta) == _nf4_params(nf4_llama()) > 0 and all(p.is_meta for p in meta.parameters())
    plan, mesh, training = sv.Plan.auto(meta), sv.Mesh(shard=2), sv.Training(batch_size=2, seq_len=64)
    a, real = (sv.analyze(m, plan, mesh, training) for m in (meta, nf4_llama()))
    assert a.memory.equals(real.memory) and a.comm.equals(real.comm)
    assert int(a.memory.activations.iloc[0]) > 0


def test_unsplittable_nf4_is_found_and_its_scaler_block_size_shards():
    from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group

    model = nf4_llama()
    plan, mesh = sv.Plan.auto(model), sv.Mesh(shard=8)
    found = [f for f in sv.analyze(model, plan, mesh, sv.Training()).findings if f.code == "SV128"]
    assert len(found) == 1 and found[0].severity == "error"
    assert "q_proj.base_layer.weight" in found[0].fqns[0] and "quantization_factor" in found[0].message
    with fake_process_group(0, 8), pytest.raises(AssertionError, match="quantization_factor"):
        apply_plan(nf4_llama(), plan, device_mesh(mesh))
    size = int(found[0].fix.split("scaler_block_size=")[1].split(" ")[0].rstrip(")"))
    fixed = nf4_llama(scaler_block_size=size)
    assert not [f for f in sv.analyze(fixed, plan, mesh, sv.Training()).findings if f.code == "SV128"]
    with fake_process_group(0, 8):
        apply_plan(fixed, plan, device_mesh(mesh))  # torch shards every NF4 weight now
