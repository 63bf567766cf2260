"""The code exported for torch 2.6 trains correctly on a real torch 2.6 (``compat`` marker).

Needs a second virtual environment with torch 2.6.0 (+ transformers, peft, pandas for the zoo's
tiny Llama and shardviz's engine): build it with ``scripts/compat_env.sh`` and point
``SHARDVIZ_COMPAT_PYTHON`` at its python, or leave it where the script puts it
(``~/.cache/shardviz/compat-venv-2.6``). Run with ``pytest -m compat tests/compat``. docs/compat.md records a run.

The checks are those of tests/test_codegen_torchrun.py (same worker and tolerances: tests/torchrun_export.py), under
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
from torchrun_export import check_results, launch, make_jobs  # noqa: E402
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
CANDIDATES = [os.environ.get("SHARDVIZ_COMPAT_PYTHON", ""), str(CACHE / "shardviz/compat-venv-2.6/bin/python")]

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


GLOO_AVG = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = torch.empty(2)
dist.reduce_scatter_tensor(out, torch.full((4,), float(dist.get_rank() + 1)), op=dist.ReduceOp.AVG)
print("RESULT", dist.get_rank(), out.tolist(), flush=True)
"""


def test_gloo_2_6_reduce_scatter_avg_sums(tmp_path):
    """The torch 2.6 fact the sharded-LoRA reference relies on: gloo's AVG reduce-scatter sums."""
    python = compat_python()
    script = tmp_path / "avg.py"
    script.write_text(GLOO_AVG)
    proc = subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    results = sorted(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert results == ["RESULT 0 [3.0, 3.0]", "RESULT 1 [3.0, 3.0]"], proc.stdout + proc.stderr  # 1+2, not 1.5


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("target", ["2.6", None])
def test_code_exported_for_2_6_trains_on_torch_2_6(tmp_path, nproc, target):
    python = compat_python()
    # reshard_after_forward=False: torch 2.6's CPU path of the backward re-all-gather bumps the
    # version counter of the unsharded parameters ("modified by an inplace operation"); see docs/compat.md
    # fsdp_grad_scale=nproc: torch 2.6's gloo returns the SUM for reduce_scatter_tensor(op=AVG)
    # (test_gloo_2_6_reduce_scatter_avg_sums), so FSDP's own gradients of sharded LoRA are world x
    # the mean there; the exported code's average of whole parameters uses SUM / world and is exact.
    jobs = make_jobs(tmp_path, nproc, target, hsdp=nproc == 4, sabotage=nproc == 2, reshard_after_forward=False,
                     fsdp_grad_scale=nproc)
    code = Path(jobs[0]["code"]).read_text()
    if target == "2.6":
        tree = ast.parse(code)
        assert any(isinstance(n, ast.ImportFrom) and n.module == "torch.distributed.fsdp" for n in ast.walk(tree))
        assert not any(isinstance(n, ast.keyword) and n.arg == "ignored_params" for n in ast.walk(tree))
    results = launch(python, nproc, jobs, tmp_path, timeout=420)
    assert {r["torch"].split("+")[0] for r in results} == {"2.6.0"}
    assert all(r["cpu_stream_backport"] for r in results)  # torch 2.6's CPU stream stub lacks record_event
    print(json.dumps({job: r for job, r in results[0]["jobs"].items()}, indent=1))
    check_results(results, jobs)
