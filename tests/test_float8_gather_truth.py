"""torchao float8 all-gather (``Float8Linear``, ``enable_fsdp_float8_all_gather``, tensorwise) against
torch's own ``fully_shard``, to the byte.

Full training of a tiny fp32 Llama whose decoder linears are ``Float8Linear`` (``qlora_models.float8_llama``),
under the fake process group at world sizes 2 and 4: each rank's sharded parameters, gradients and optimizer
states, and the state peak (``FSDPMemTracker``); every collective with its dtype and bytes: the float8 weights
gather 1 byte per element whatever the call's ``param_dtype`` (bf16 here), in one uint8 buffer with the call's
bf16 norms, and the unsharded weight is that float8 data, while each weight's unsharded gradient is in
``param_dtype``. The amax all-reduces (per weight per gather, or ``precompute_float8_dynamic_scale_for_fsdp``'s
one per step) are functional collectives the counted c10d ops do not see: ``a.comm`` prices the export's
choice, one all-reduce of every amax after the optimizer step, held against what torchao's
``precompute_float8_dynamic_scale_for_fsdp`` issues on the trained model.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import shardviz as sv
from qlora_models import float8_llama
from torch_truth import comm_mismatches, fake_run, memory_mismatches

pytest.importorskip("torchao.float8", reason="torchao float8: pip install 'shardviz[torchao]'")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_float8_all_gather_matches_fully_shard(world):
    model = float8_llama()
    plan, mesh, training = sv.Plan.auto(model), sv.Mesh(shard=world), sv.Training()
    a = sv.analyze(model, plan, mesh, training)
    assert not [f for f in a.findings if f.code == "SV122"]
    gathers = a.comm[(a.comm.collective == "all_gather") & a.comm.unit.str.contains("layers")]
    assert set(gathers.dtype) == {"uint8"}
    assert sv.verify(model, plan, mesh).empty
    step_only = SimpleNamespace(comm=a.comm[a.comm.phase != "optimizer"])  # fake_run's step has no optimizer row
    amax = a.comm[a.comm.phase == "optimizer"]
    for rank in (0, world - 1):
        seen: list = []
        truth = fake_run(float8_llama, plan, mesh, training, rank, inspect=lambda m, seen=seen: seen.extend(_precompute(m)))
        assert memory_mismatches(a, truth) == []
        assert comm_mismatches(step_only, truth) == []
        # precompute_float8_dynamic_scale_for_fsdp after the step: one all-reduce of every amax
        assert [("all_reduce", r.dtype, int(r.bytes)) for r in amax.itertuples()] == seen


def _precompute(model) -> list:
    """The all-reduces torchao's ``precompute_float8_dynamic_scale_for_fsdp`` issues on ``model`` (DTensor's
    redistribution of the Partial amaxes through ``torch.distributed._functional_collectives.all_reduce``),
    as (kind, dtype, bytes)."""
    import torch.distributed._functional_collectives as funcol
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    log, orig = [], funcol.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        log.append(("all_reduce", str(tensor.dtype).replace("torch.", ""), tensor.numel() * tensor.element_size()))
        return orig(tensor, *args, **kwargs)

    funcol.all_reduce = all_reduce
    try:
        precompute_float8_dynamic_scale_for_fsdp(model)
    finally:
        funcol.all_reduce = orig
    return log


def test_export_converts_and_shards_as_priced():
    """The export of a model carrying float8 linears converts a plain copy of it with torchao's own
    ``convert_to_float8_training`` (the linears it priced), then shards it as the analysis says; its
    ``after_optimizer_step`` runs torchao's ``precompute_float8_dynamic_scale_for_fsdp``."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
    from transformers import LlamaForCausalLM

    from exported_code import apply_under_fake_pg, layout_mismatches

    model = float8_llama()
    plan, mesh = sv.Plan.auto(model), sv.Mesh(shard=2)
    a = sv.analyze(model, plan, mesh, sv.Training())
    code = sv.export_code(model, plan, mesh, sv.Training())
    assert "convert_to_float8_training(" in code and "precompute_float8_dynamic_scale_for_fsdp(model)" in code
    plain = LlamaForCausalLM(model.config)

    def check(m, module):
        kinds = {n: type(p.to_local()).__name__ for n, p in m.named_parameters() if "proj" in n}
        assert set(kinds.values()) == {WeightWithDynamicFloat8CastTensor.__name__}
        assert layout_mismatches(m, a, 0) == []
        module.after_optimizer_step(m)

    apply_under_fake_pg(code, plain, mesh, 0, check)
