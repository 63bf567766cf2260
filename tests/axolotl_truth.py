"""Run in the axolotl venv (``scripts/setup.sh --axolotl``; ``tests/test_axolotl_config.py`` calls it):
accelerate's FSDP2 preparation with axolotl's own ``fsdp2_prepare_model`` (as ``patch_accelerate_fsdp2``
installs it) on a meta copy under the fake process group, outside shardviz's capture, against torch's record
after shardviz's oracle applies the plan ``sv.from_axolotl`` read. Prints one JSON object.

    python tests/axolotl_truth.py AXOLOTL.yaml
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(__file__))
from capture_truth import KeptEnviron, checkpointed, torch_calls  # noqa: E402

import shardviz as sv  # noqa: E402
from shardviz.frameworks.axolotl_config import axolotl_prepare, from_axolotl, fsdp_env  # noqa: E402
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy  # noqa: E402

WORLD = 4


def held_bytes(root) -> dict:
    """What rank 0 holds after the preparation, read off torch's FSDP state: each call's sharded parameter
    storage (``FSDPParam._sharded_param_data``, padding included) by dtype, and the bitsandbytes ``quant_state``
    the 4-bit linears keep on the module (no parameter: FSDP2 leaves it whole on every rank)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    sharded, seen = {}, set()
    for m in root.modules():
        group = fully_shard.state(m)._fsdp_param_group if isinstance(m, FSDPModule) else None
        if group is None or id(group) in seen:
            continue
        seen.add(id(group))
        for fp in group.fsdp_params:
            data = fp._sharded_param_data
            key = str(data.dtype).removeprefix("torch.")
            sharded[key] = sharded.get(key, 0) + data.numel() * data.element_size()
    states = [m.quant_state for m in root.modules() if getattr(m, "quant_state", None) is not None]
    quant = 0
    for state in states:
        while state is not None:
            quant += sum(t.numel() * t.element_size() for t in vars(state).values() if hasattr(t, "element_size"))
            state = getattr(state, "state2", None)
    return {"sharded": sharded, "quant_state": quant, "quant_linears": len(states)}


def main(path):
    setup = from_axolotl(path, world_size=WORLD)
    with KeptEnviron(), fake_process_group(0, WORLD):
        theirs_model = axolotl_prepare(meta_copy(setup.model), fsdp_env(setup.config))
        theirs = torch_calls(theirs_model), checkpointed(theirs_model)
        held = held_bytes(theirs_model)
    row = sv.analyze(setup.model, setup.plan, sv.Mesh(WORLD), replace(setup.training, batch_size=None)).memory.iloc[0]
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(setup.model)
        apply_plan(copy_, setup.plan, device_mesh(sv.Mesh(WORLD)))
        ours = torch_calls(copy_), checkpointed(copy_)
    t = setup.training
    lora_units = [u for u in setup.plan.units if any(".lora_" in m for m in u.modules)]
    n_lora_modules = sum(1 for n, _ in setup.model.named_modules() if n.endswith((".lora_A.default", ".lora_B.default")))
    print(json.dumps({
        "calls_equal": theirs[0] == ours[0], "n_calls": len(theirs[0]), "units": len(setup.plan.units),
        "lora_units": len(lora_units), "lora_modules": n_lora_modules,
        "checkpoint": list(setup.plan.checkpoint),
        "training": {"batch_size": t.batch_size, "seq_len": t.seq_len, "grad_accum": t.grad_accum,
                     "param_dtype": t.param_dtype, "fused": t.fused},
        "lora_r": setup.config.lora_r, "origins": setup.origins, "findings": [[f.code, f.message, f.fix] for f in setup.findings],
        "label": setup.plan.origin.label, "torch_held": held,
        "predicted": {"params_sharded": int(row.params_sharded), "quant_state": int(row.quant_state)},
        "params": sorted({f"{type(p).__name__} {str(p.dtype).removeprefix('torch.')}" for p in setup.model.parameters()})}))


def export_back(path):
    """to_axolotl on the plan axolotl itself made (round trip: the exported YAML read back by from_axolotl, and
    axolotl's own preparation of it outside capture, against the plan exported applied by shardviz's oracle),
    and on shardviz's auto plan (what axolotl's keys cannot say)."""
    import tempfile

    from shardviz.frameworks.axolotl_config import to_axolotl

    setup = from_axolotl(path, world_size=WORLD)
    text, cannot = to_axolotl(path, setup.plan, setup.model, world_size=WORLD)
    with tempfile.TemporaryDirectory() as tmp:
        exported = os.path.join(tmp, "exported.yaml")
        with open(exported, "w", encoding="utf-8") as f:
            f.write(text)
        back = from_axolotl(exported, world_size=WORLD)
        with KeptEnviron(), fake_process_group(0, WORLD):
            theirs = torch_calls(axolotl_prepare(meta_copy(back.model), fsdp_env(back.config)))
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(setup.model)
        apply_plan(copy_, setup.plan, device_mesh(sv.Mesh(WORLD)))
        ours = torch_calls(copy_)
    _, cannot_auto = to_axolotl(path, sv.Plan.auto(setup.model, checkpoint="blocks"), setup.model, world_size=WORLD)
    print(json.dumps({"cannot": cannot, "units_equal": back.plan.units == setup.plan.units,
                      "checkpoint_equal": set(back.plan.checkpoint) == set(setup.plan.checkpoint),
                      "torch_calls_equal": theirs == ours, "n_calls": len(theirs), "text": text,
                      "cannot_auto": cannot_auto}))


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[2] == "--export":
    export_back(sys.argv[1])
elif __name__ == "__main__":
    main(sys.argv[1])
