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


def recipe_loss(loss_fn, batch_size: int):
    """The forward and loss of ``lora_finetune_distributed.train`` (torchtune 0.6.1, its loop's lines): logits of
    ``model(tokens)`` (a list of chunks under ``CEWithChunkedOutputLoss``), labels shifted by ``hstack`` with the
    recipe's ``ignore_labels_cache``, the loss times the batch's token count, the logits freed before backward."""
    import torch

    ignore = torch.full((batch_size, 1), loss_fn.ignore_index)  # made in _setup_data, before the loop

    def loss_of(model, tokens):
        labels = tokens
        num_tokens = (labels != loss_fn.ignore_index).sum()
        logits = model(tokens)
        labels = torch.hstack((labels[..., 1:], ignore[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels, logits = labels.reshape(-1), logits.reshape(-1, logits.size(-1))
        loss = loss_fn(logits, labels) * num_tokens
        del logits
        return loss

    return loss_of


def step_peak(path, overrides):
    """torch's FSDPMemTracker on torchtune's own recipe step (its model with real weights on the CPU, its
    checkpointing and shard_model, its chunked loss as its loop calls it) under the fake process group, against
    shardviz's prediction for the setup ``from_torchtune`` read: the model state to the byte, and the peak."""
    from torch_truth import breakdown_mismatches, fake_run, memory_mismatches

    from shardviz.frameworks.torchtune_config import build_model

    setup = from_torchtune(path, overrides, world_size=WORLD)
    cfg, t = setup.config, setup.training
    _, loss_fn, _ = build_model(cfg, device="cpu")
    args = (bool(cfg.get("enable_activation_checkpointing", False)), cfg.get("custom_sharded_layers", None),
            bool(cfg.get("fsdp_cpu_offload", False)), bool(cfg.get("fsdp_reshard_after_forward", True)))
    truth = fake_run(lambda: build_model(cfg, device="cpu")[0], setup.plan, setup.mesh, t, 0,
                     apply=lambda model, _mesh: recipe_shard(model, *args), fresh_inputs=True,
                     loss_of=recipe_loss(loss_fn, t.batch_size))
    a = sv.analyze(setup.model, setup.plan, setup.mesh, t)
    row = a.memory.iloc[0]
    predicted, torch_peak = int(row.peak + row.cpu_optimizer), int(truth.peak_snap["Total"])
    print(json.dumps({"predicted_peak": predicted, "torch_peak": torch_peak, "activations": int(row.activations),
                      "state": [m for m in memory_mismatches(a, truth) if " peak: " not in m],  # the no-batch peak
                      "breakdown": breakdown_mismatches(a, truth, 0, activations=True, slack=predicted - torch_peak),
                      "torch_at_peak": truth.peak_snap, "predicted_breakdown": dict(a.peak_breakdown(0)),
                      "batch": [t.batch_size, t.seq_len, t.grad_accum], "units": len(setup.plan.units)}))


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


if __name__ == "__main__" and os.environ.get("TT_TRUTH") == "--peak":
    step_peak(sys.argv[1], sys.argv[2:])
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
