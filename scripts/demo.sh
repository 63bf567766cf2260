#!/usr/bin/env bash
# The main job on the built-in example, no download: set up .venv, then analyse the zoo's
# Llama-3-8B + LoRA (meta device) with the per-block plan on 8 ranks and print the tables.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
exec .venv/bin/python - "$@" <<'PY'
import warnings

warnings.filterwarnings("ignore")
import pandas as pd

import shardviz as sv
from shardviz import zoo

pd.set_option("display.width", 250, "display.max_colwidth", 70, "display.max_rows", 40)
model = zoo.llama3_8b(lora=True)
plan = sv.Plan.auto(model, lora="sharded")
a = sv.analyze(model, plan, mesh=sv.Mesh(shard=8))
print(a.summary(), end="\n\n")
cols = ["fqn", "shape", "dtype", "role", "status", "unit", "shard_shape"]
print("Per parameter (first and last rows):")
print(pd.concat([a.params[cols].head(12), a.params[cols].tail(4)]).to_string(), end="\n\n")
print("Per fully_shard call, in the order they are applied:")
print(a.units.drop(columns=["modules"]).to_string())
PY
