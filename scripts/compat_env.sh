#!/usr/bin/env bash
# Build the torch 2.6 virtual environment used by the `compat` tests (tests/compat/).
#
#   ./scripts/compat_env.sh [DIR]      default DIR: <repo>/.venv-compat (git-ignored)
#
# PyPI's torch 2.6.0 wheel for Linux x86_64 is a CUDA 12.4 build (~0.8 GB, plus ~2.5 GB of
# nvidia-* wheels); it imports and runs on a machine with no GPU, and FSDP2 runs on the CPU
# with gloo. There is no CPU-only 2.6.0 wheel on PyPI. shardviz itself is not installed
# there: the exported code is self-contained and only needs torch (+ numpy for torch's warning).
# The tiny test model is plain torch, so no transformers/peft are needed either.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.venv-compat}"
TORCH="${COMPAT_TORCH:-2.6.0}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$DIR/bin/python" ]; then
  "$PYTHON" -m venv "$DIR"
fi
if ! "$DIR/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  "$DIR/bin/pip" install -q "torch==$TORCH" numpy
fi
"$DIR/bin/python" -c "import torch; print('compat venv:', '$DIR', 'torch', torch.__version__, 'cuda available:', torch.cuda.is_available())"
