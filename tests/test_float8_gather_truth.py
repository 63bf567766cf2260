"""torchao float8 all-gather (``Float8Linear``, ``enable_fsdp_float8_all_gather``, tensorwise) against
torch's own ``fully_shard``, to the byte.

Full training of a tiny fp32 Llama whose decoder linears are ``Float8Linear`` (``qlora_models.float8_llama``),
under the fake process group at world sizes 2 and 4: each rank's sharded parameters, gradients and optimizer
states, and the state peak (``FSDPMemTracker``); every collective with its dtype and bytes: the float8 weights
gather 1 byte per element whatever the call's ``param_dtype`` (bf16 here), in one uint8 buffer with the call's
bf16 norms, and the unsharded weight is that float8 data, while each weight's unsharded gradient is in
``param_dtype``. The amax all-reduces (per weight per gather, or ``precompute_float8_dynamic_scale_for_fsdp``'s
one per step) are functional collectives the counted c10d ops do not see, and ``a.comm`` has no row for them.
"""

from __future__ import annotations

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
    for rank in (0, world - 1):
        truth = fake_run(float8_llama, plan, mesh, training, rank)
        assert memory_mismatches(a, truth) == []
        assert comm_mismatches(a, truth) == []


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
