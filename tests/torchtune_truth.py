"""Run in the torchtune venv (``scripts/setup.sh --torchtune``; ``tests/test_torchtune_config.py`` calls it):
torchtune's own recipe steps on a meta copy under the fake process group, outside shardviz's capture,
against torch's record after shardviz's oracle applies the plan ``sv.from_torchtune`` read. Prints one
JSON object per case on stdout.

    python tests/torchtune_truth.py RECIPE.yaml [key=value ...]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from capture_truth import KeptEnviron, checkpointed, torch_calls  # noqa: E402

import shardviz as sv  # noqa: E402
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy  # noqa: E402
from shardviz.frameworks.torchtune_config import from_torchtune, recipe_shard  # noqa: E402

WORLD = 4


def torchtune_truth(setup):
    """torch's record after torchtune's own checkpointing and shard_model, as the recipe calls them."""
    cfg = setup.config
    with KeptEnviron(), fake_process_group(0, WORLD):
        copy_ = meta_copy(setup.model)
        recipe_shard(copy_, bool(cfg.get("enable_activation_checkpointing", False)),
                     cfg.get("custom_sharded_layers", None), bool(cfg.get("fsdp_cpu_offload", False)),
                     bool(cfg.get("fsdp_reshard_after_forward", True)))
        return torch_calls(copy_), checkpointed(copy_)


def shardviz_applies(setup):
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(setup.model)
        apply_plan(copy_, setup.plan, device_mesh(sv.Mesh(WORLD)))
        return torch_calls(copy_), checkpointed(copy_)


def main(argv):
    path, overrides = argv[0], argv[1:]
    setup = from_torchtune(path, overrides, world_size=WORLD)
    theirs, ours = torchtune_truth(setup), shardviz_applies(setup)
    t = setup.training
    out = {"calls_equal": theirs[0] == ours[0], "checkpointed_equal": theirs[1] == ours[1],
           "n_calls": len(theirs[0]), "n_checkpointed": len(theirs[1]), "units": len(setup.plan.units),
           "training": {"batch_size": t.batch_size, "seq_len": t.seq_len, "grad_accum": t.grad_accum,
                        "param_dtype": t.param_dtype, "offload": t.offload, "fused": t.fused},
           "params_dtypes": sorted({str(p.dtype) for p in setup.model.parameters()}),
           "trainable": sum(p.numel() for p in setup.model.parameters() if p.requires_grad),
           "origins": setup.origins, "findings": [[f.code, f.message, f.fix] for f in setup.findings], "label": setup.plan.origin.label}
    if "--step" in os.environ.get("TT_TRUTH", ""):
        a = sv.analyze(setup.model, setup.plan, sv.Mesh(WORLD), t)
        out["activations"] = int(a.memory["activations"].iloc[0])
        plain = sv.analyze(setup.model, setup.plan, sv.Mesh(WORLD), sv.Training(
            batch_size=t.batch_size, seq_len=t.seq_len, param_dtype=None, reduce_dtype=None,
            example_inputs=lambda b, s: t.example_inputs(b, s)))
        out["activations_sum_of_logits"] = int(plain.memory["activations"].iloc[0])
    print(json.dumps(out))


def export_back(path):
    """to_torchtune on plans torchtune itself made: its keys give the same calls (cannot empty); a plan with an
    ignored parameter cannot be said."""
    from dataclasses import replace

    from shardviz.frameworks.torchtune_config import to_torchtune

    target = from_torchtune(path, ["enable_activation_checkpointing=False", "fsdp_reshard_after_forward=False",
                                   "custom_sharded_layers=['tok_embeddings']"], world_size=WORLD).plan
    keys, cannot = to_torchtune(path, target, world_size=WORLD)
    lora = next(n for n, p in from_torchtune(path, world_size=WORLD).model.named_parameters() if "lora_a" in n)
    _, cannot_ignored = to_torchtune(path, replace(target, ignored=[lora]), world_size=WORLD)
    print(json.dumps({"keys": keys, "cannot": cannot, "cannot_ignored": cannot_ignored}))


if __name__ == "__main__" and os.environ.get("TT_TRUTH") == "--export":
    export_back(sys.argv[1])
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
