#!/usr/bin/env bash
# Build the torch 2.6 virtual environment used by the `compat` tests (tests/compat/).
#
#   ./scripts/compat_env.sh [DIR]      default DIR: ${XDG_CACHE_HOME:-~/.cache}/shardviz/compat-venv-2.6
#
# The environment lives outside the repository (5+ GB). tests/compat finds it there, or through
# SHARDVIZ_COMPAT_PYTHON=<DIR>/bin/python.
#
# PyPI's torch 2.6.0 wheel for Linux x86_64 is a CUDA 12.4 build (~0.8 GB, plus ~2.5 GB of
# nvidia-* wheels); it imports and runs on a machine with no GPU, and FSDP2 runs on the CPU
# with gloo. There is no CPU-only 2.6.0 wheel on PyPI. The exported code needs only torch; the
# test worker also builds the zoo's tiny Llama+LoRA and asks shardviz for its prediction, so
# shardviz is installed there too (editable, from this checkout, with its dependencies; torch
# stays pinned).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/shardviz/compat-venv-2.6}"
mkdir -p "$(dirname "$DIR")"
TORCH="${COMPAT_TORCH:-2.6.0}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$DIR/bin/python" ]; then
  "$PYTHON" -m venv "$DIR"
fi
if ! "$DIR/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  "$DIR/bin/pip" install -q "torch==$TORCH" numpy
fi
if ! "$DIR/bin/python" -c "import shardviz, transformers, peft" 2>/dev/null; then
  "$DIR/bin/pip" install -q "torch==$TORCH" -e "$ROOT[hf]"
fi
"$DIR/bin/python" -c "import torch, transformers, peft, shardviz; print('compat venv:', '$DIR', 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda available:', torch.cuda.is_available())"
