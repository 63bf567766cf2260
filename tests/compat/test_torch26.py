"""The code exported for torch 2.6 trains correctly on a real torch 2.6 (``compat`` marker).

Needs a second virtual environment with torch 2.6.0 (+ transformers, peft, pandas for the zoo's
tiny Llama and shardviz's engine): build it with ``scripts/compat_env.sh`` and point
``SHARDVIZ_COMPAT_PYTHON`` at its python, or leave it at ``<repo>/.venv-compat`` or
``/work/compat-venv``. Run with ``pytest -m compat tests/compat``. docs/compat.md records a run.

The checks are those of tests/test_codegen_torchrun.py (same worker, same tolerances), under
``torchrun --nproc_per_node=2`` and ``=4`` of the 2.6 environment: placements and local shapes as
predicted, the LoRA weights identical on all ranks and equal to a single-process reference
trained on the combined batch, one all-reduce per step.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_codegen_torchrun import check_results, launch, make_jobs  # noqa: E402
CANDIDATES = [os.environ.get("SHARDVIZ_COMPAT_PYTHON", ""), str(ROOT / ".venv-compat/bin/python"),
              "/work/compat-venv/bin/python"]

pytestmark = [pytest.mark.compat, pytest.mark.slow]


def compat_python() -> str:
    for candidate in CANDIDATES:
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no torch 2.6 environment: run scripts/compat_env.sh (see docs/compat.md)")


def test_compat_python_runs_torch_2_6():
    python = compat_python()
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("2.6."), version


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("target", ["2.6", None])
def test_code_exported_for_2_6_trains_on_torch_2_6(tmp_path, nproc, target):
    python = compat_python()
    jobs = make_jobs(tmp_path, nproc, target, hsdp=nproc == 4, sabotage=nproc == 2)
    code = Path(jobs[0]["code"]).read_text()
    if target == "2.6":
        tree = ast.parse(code)
        assert any(isinstance(n, ast.ImportFrom) and n.module == "torch.distributed.fsdp" for n in ast.walk(tree))
        assert not any(isinstance(n, ast.keyword) and n.arg == "ignored_params" for n in ast.walk(tree))
    results = launch(python, nproc, jobs, tmp_path, timeout=420)
    assert {r["torch"].split("+")[0] for r in results} == {"2.6.0"}
    print(json.dumps({job: r for job, r in results[0]["jobs"].items()}, indent=1))
    check_results(results, jobs)
