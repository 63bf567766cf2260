"""torchtune's published Llama-3.1-70B LoRA row (README @v0.6.1, L108-129: 8 x A100, batch 2, packed to 2048,
27.6 GiB peak per GPU, 3497 tokens/s) predicted from torchtune's own recipe ``llama3_1/70B_lora.yaml`` with
the README's stated setup as ``tune run`` overrides. Runs in the torchtune venv (scripts/setup.sh --torchtune):

    PYTHONPATH=. .venv-torchtune/bin/python benchmarks/bench_torchtune_row.py

Prints one JSON object; tests/test_torchtune_config.py pins the deviations; docs/capture.md discusses them.
"""

from __future__ import annotations

import json
import os

PUBLISHED = {"peak_gib": 27.6, "tokens_per_s": 3497, "gpus": 8, "device": "A100"}
OVERRIDES = ["tokenizer.max_seq_len=2048", "dataset.packed=True"]  # the README's setup; batch_size 2 is the recipe's


def main() -> dict:
    import torchtune

    import shardviz as sv
    from shardviz.frameworks.torchtune_config import from_torchtune

    recipe = os.path.join(os.path.dirname(torchtune.__file__), "..", "recipes", "configs", "llama3_1", "70B_lora.yaml")
    setup = from_torchtune(recipe, OVERRIDES, mesh=sv.Mesh(PUBLISHED["gpus"], device=PUBLISHED["device"]))
    a = sv.analyze(setup.model, setup.plan, setup.mesh, setup.training)
    row = a.memory.iloc[0]
    tokens = a.step.tokens_per_s * PUBLISHED["gpus"]
    out = {"calls": len(setup.plan.units), "checkpointed": len(setup.plan.checkpoint),
           "batch_size": setup.training.batch_size, "seq_len": setup.training.seq_len,
           "peak_gib": row.peak / 2**30, "reserved_gib": row.reserved_peak / 2**30,
           "activations_gib": row.activations / 2**30, "tokens_per_s": tokens,
           "peak_vs_published": row.peak / 2**30 / PUBLISHED["peak_gib"] - 1,
           "reserved_vs_published": row.reserved_peak / 2**30 / PUBLISHED["peak_gib"] - 1,
           "tokens_vs_published": tokens / PUBLISHED["tokens_per_s"] - 1, "device": a.step.device}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
