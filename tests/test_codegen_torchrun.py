"""End to end: code from ``sv.export_code`` trains the zoo's tiny Llama+LoRA under ``torchrun`` (gloo, CPU).

The harness (the jobs, the launch, the worker that runs under torchrun and what it checks on every
rank: placements, the broadcast, weights against a single-process reference, one all-reduce per
step, checkpoint wrappers) is ``tests/torchrun_export.py``.
"""

from __future__ import annotations

import json
import sys

import pytest

from torchrun_export import check_results, launch, make_jobs


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_exported_code_trains_under_torchrun(tmp_path, nproc):
    jobs = make_jobs(tmp_path, nproc, None, hsdp=nproc == 4, sabotage=nproc == 2)
    results = launch(sys.executable, nproc, jobs, tmp_path)
    print(json.dumps(results[0], indent=1))
    check_results(results, jobs)


@pytest.mark.slow
def test_checkpointed_plan_trains_like_the_plain_one(tmp_path):
    """plan.checkpoint exported: checkpoint_wrapper before fully_shard, same weights as the reference."""
    jobs = make_jobs(tmp_path, 2, None, hsdp=False, checkpoint="blocks")
    results = launch(sys.executable, 2, jobs, tmp_path)
    print(json.dumps(results[0], indent=1))
    check_results(results, jobs)
