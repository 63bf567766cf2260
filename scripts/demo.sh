#!/usr/bin/env bash
# The main job on the built-in example, no download: set up .venv, write the standalone report for
# the zoo's tiny Llama + LoRA (LoRA ignored, 8 ranks, compared with LoRA sharded and separate) to
# report.html, then print the per-parameter and per-call tables of Llama-3-8B + LoRA (meta device).
#   ./scripts/demo.sh              writes ./report.html (replacing an earlier one)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
.venv/bin/shardviz report zoo:tiny_llama_lora --layout ignored --world-size 8 --device-memory 80GiB \
  -o report.html --force
exec .venv/bin/python - <<'PY'
import warnings

warnings.filterwarnings("ignore")
import pandas as pd

import shardviz as sv
from shardviz import zoo

pd.set_option("display.width", 250, "display.max_colwidth", 70, "display.max_rows", 60)
model = zoo.llama3_8b(lora=True)
a = sv.analyze(model, sv.Plan.auto(model, lora="ignored"), mesh=sv.Mesh(shard=8, device_memory="80GiB"))
print(a.summary(), end="\n\n")
cols = ["fqn", "shape", "dtype", "role", "status", "unit", "shard_shape"]
print("Per parameter (first rows):")
print(a.params[cols].head(12).to_string(), end="\n\n")
print("Per fully_shard call, in the order they are applied (first and last):")
units = a.units.drop(columns=["modules"])
print(pd.concat([units.head(3), units.tail(3)]).to_string(), end="\n\n")
print("Memory per rank (bytes), rank 0:")
print(a.memory.loc[0, ["params", "grads", "optimizer", "peak", "peak_phase"]].to_string(), end="\n\n")
for f in a.findings:
    print(f)
print("\nOpen report.html in a browser (works offline).")
PY
