#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment at <repo>/.venv.
#
#   ./scripts/setup.sh             venv + torch (CPU wheel) + shardviz[test,lab,hf,qlora,torchao] + kernelspec
#   ./scripts/setup.sh --browser   ... and Debian's chromium + chromium-driver (browser tests)
#   ./scripts/setup.sh --node      ... and Debian's nodejs when `node` is missing (tests/test_widget_protocol_js.py)
#   ./scripts/setup.sh --torchtune ... and <repo>/.venv-torchtune: torch + shardviz[torchtune] (torchtune 0.6.1 with
#                                  torchao 0.15, which peft refuses: a venv of its own; tests/test_torchtune_config.py)
#   ./scripts/setup.sh --axolotl   ... and <repo>/.venv-axolotl: torch + axolotl 0.19.0 (--no-deps: it pins gradio, wandb,
#                                  xformers, ...) + shardviz[axolotl], the pins its config and FSDP2 code import)
#
# Quiet when all is well; on failure it prints the failing step's full log and exits non-zero.
# A re-run is cheap: pip is skipped while pyproject.toml and this script are unchanged and
# the editable install still points at this checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/$(basename "${BASH_SOURCE[0]}")"
cd "$ROOT"

WANT_BROWSER=0
WANT_NODE=0
WANT_TORCHTUNE=0
WANT_AXOLOTL=0
for arg in "$@"; do
  case "$arg" in
    --browser) WANT_BROWSER=1 ;;
    --node) WANT_NODE=1 ;;
    --torchtune) WANT_TORCHTUNE=1 ;;
    --axolotl) WANT_AXOLOTL=1 ;;
    -h|--help) sed -n '2,14p' "$SELF"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
TORCH_VERSION="2.13.0"   # a CPU wheel of this release lies on this machine's disk
STAMP="$VENV/.shardviz-setup.sha256"
LOG="$(mktemp -t shardviz-setup.XXXXXX.log)"
trap 'rm -f "$LOG"' EXIT

# step "description" cmd...: run quietly, dump the log and fail loudly on error.
step() {
  local what="$1"; shift
  if ! "$@" >"$LOG" 2>&1; then
    echo "setup.sh: FAILED: $what" >&2
    echo "setup.sh: command: $*" >&2
    cat "$LOG" >&2
    exit 1
  fi
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# 1. the virtual environment
if [ ! -x "$VPY" ]; then
  echo "setup.sh: creating $VENV"
  step "create venv" "$PYTHON" -m venv "$VENV"
fi

# 2. torch FIRST and pinned: an unpinned torch would pull a multi-GB CUDA build.
torch_ok() {
  "$VPY" -c "import sys; from importlib.metadata import version as v; sys.exit(v('torch').split('+')[0] != '$TORCH_VERSION')" >/dev/null 2>&1
}
if ! torch_ok; then
  echo "setup.sh: installing torch==$TORCH_VERSION"
  step "install torch" "$VPY" -m pip install -q "torch==$TORCH_VERSION"
fi

# 3. the project, editable, with its test and lab extras
want_stamp="$(cat pyproject.toml "$SELF" | sha256sum | cut -d' ' -f1)"
editable_ok() {
  # shardviz is installed editable from *this* checkout (a venv copied from elsewhere is not).
  (cd / && "$VPY" - "$ROOT" <<'PY'
import json, pathlib, sys
from importlib import metadata
try:
    dist = metadata.distribution("shardviz")
except metadata.PackageNotFoundError:
    sys.exit(1)
from urllib.parse import unquote, urlparse
info = json.loads(dist.read_text("direct_url.json") or "{}")
url = urlparse(info.get("url", ""))
here = pathlib.Path(unquote(url.path)).resolve() if url.scheme == "file" else None
ok = info.get("dir_info", {}).get("editable") and here == pathlib.Path(sys.argv[1]).resolve()
from importlib.util import find_spec
mods = ["jupyterlab", "playwright", "xdist", "ipykernel", "anywidget", "ipywidgets", "nbformat", "ruff", "transformers", "peft", "bitsandbytes"]
sys.exit(0 if ok and all(find_spec(m) for m in mods) else 1)
PY
  ) >/dev/null 2>&1
}
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want_stamp" ] || ! editable_ok; then
  echo "setup.sh: installing shardviz[test,lab,hf,qlora,torchao] (editable)"
  step "install shardviz[test,lab,hf,qlora,torchao]" "$VPY" -m pip install -q -e ".[test,lab,hf,qlora,torchao]" "torch==$TORCH_VERSION"
  echo "$want_stamp" >"$STAMP"
fi

# 4. a kernelspec inside the venv's own prefix whose argv is this venv's python,
#    so JupyterLab (run from the venv) starts kernels with the project's environment.
KERNEL_JSON="$VENV/share/jupyter/kernels/python3/kernel.json"
if ! grep -qF "\"$VPY\"" "$KERNEL_JSON" 2>/dev/null; then
  step "register ipykernel" "$VPY" -m ipykernel install --sys-prefix --name python3 \
    --display-name "Python 3 (ipykernel)"
fi

# 5. Debian's Chromium for the browser tests (Playwright's own browser download cannot work here).
if [ "$WANT_BROWSER" -eq 1 ] && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
  echo "setup.sh: installing chromium + chromium-driver (apt)"
  step "apt-get update" as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  step "apt-get install chromium" as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation
  [ -x /usr/bin/chromium ] || { echo "setup.sh: /usr/bin/chromium still missing" >&2; exit 1; }
fi

# 6. node for the front end's protocol check (CI fails that test without it).
if [ "$WANT_NODE" -eq 1 ] && ! command -v node >/dev/null 2>&1; then
  echo "setup.sh: installing nodejs (apt)"
  step "apt-get update" as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  step "apt-get install nodejs" as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends nodejs
  command -v node >/dev/null 2>&1 || { echo "setup.sh: node still missing" >&2; exit 1; }
fi

# 7. torchtune's own venv (sv.from_torchtune): torchtune 0.6.1 needs torchao<=0.15, peft needs torchao>=0.16.
if [ "$WANT_TORCHTUNE" -eq 1 ]; then
  TVENV="$ROOT/.venv-torchtune"
  TPY="$TVENV/bin/python"
  [ -x "$TPY" ] || step "create torchtune venv" "$PYTHON" -m venv "$TVENV"
  if ! "$TPY" -c "import torch, torchtune, torchao, omegaconf, pandas, pytest; from torchtune import training" >/dev/null 2>&1 \
      || [ "$(cat "$TVENV/.stamp" 2>/dev/null || true)" != "$want_stamp" ]; then
    echo "setup.sh: installing .venv-torchtune (torch==$TORCH_VERSION, shardviz[torchtune])"
    step "install torch (torchtune venv)" "$TPY" -m pip install -q "torch==$TORCH_VERSION"
    step "install shardviz[torchtune]" "$TPY" -m pip install -q -e ".[torchtune]" pytest "torch==$TORCH_VERSION"
    echo "$want_stamp" >"$TVENV/.stamp"
  fi
fi

# 8. axolotl's own venv (sv.from_axolotl): axolotl pins its whole stack; only what its config, adapter and FSDP2
#    modules import is installed beside it (shardviz[axolotl]).
if [ "$WANT_AXOLOTL" -eq 1 ]; then
  AVENV="$ROOT/.venv-axolotl"
  APY="$AVENV/bin/python"
  [ -x "$APY" ] || step "create axolotl venv" "$PYTHON" -m venv "$AVENV"
  if ! "$APY" -c "import torch, shardviz.frameworks.axolotl_config, pytest; from axolotl.loaders.adapter import load_lora; from axolotl.loaders.model import ModelLoader; from axolotl.monkeypatch.accelerate.fsdp2 import fsdp2_prepare_model" >/dev/null 2>&1 \
      || [ "$(cat "$AVENV/.stamp" 2>/dev/null || true)" != "$want_stamp" ]; then
    echo "setup.sh: installing .venv-axolotl (torch==$TORCH_VERSION, axolotl==0.19.0 --no-deps, shardviz[axolotl])"
    step "install torch (axolotl venv)" "$APY" -m pip install -q "torch==$TORCH_VERSION"
    step "install axolotl" "$APY" -m pip install -q --no-deps "axolotl==0.19.0"
    step "install shardviz[axolotl]" "$APY" -m pip install -q -e ".[axolotl]" pytest "torch==$TORCH_VERSION"
    echo "$want_stamp" >"$AVENV/.stamp"
  fi
fi

exit 0
