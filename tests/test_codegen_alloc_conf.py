"""The exported code sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` where that is what
makes the plan fit (judged on the caching allocator's reserved peak, ``step.reserved``), says so,
and does it before torch is imported; otherwise it leaves the allocator alone."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import replace

import shardviz as sv
from shardviz import zoo

TRAINING = sv.Training(batch_size=8, seq_len=2048)
LINE = 'os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")'


@functools.lru_cache(maxsize=None)
def setting():
    """(model, plan, a device memory between the reserved peaks with and without expandable segments)."""
    m = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(m, lora="sharded", checkpoint="blocks")
    peaks = [int(sv.analyze(m, plan, sv.Mesh(8, expandable_segments=e), TRAINING).memory.reserved_peak.max())
             for e in (False, True)]
    assert peaks[1] < peaks[0], "the premise: expandable segments reserve less for this step"
    return m, plan, int(peaks[1] / 0.9)  # keeps the 5 % margin with them, over without


def test_the_code_sets_expandable_segments_where_that_makes_the_plan_fit():
    m, plan, memory = setting()
    mesh = sv.Mesh(8, device_memory=memory, memory_reserve=0)
    assert sv.analyze(m, plan, mesh, TRAINING).fit.verdict != "fits"
    code = sv.export_code(m, plan, mesh, TRAINING)
    lines = code.splitlines()
    assert LINE in lines and lines.index(LINE) < lines.index("import torch")
    grown = sv.analyze(m, plan, replace(mesh, expandable_segments=True), TRAINING).fit
    plain = sv.analyze(m, plan, mesh, TRAINING).fit
    said = " ".join(line.lstrip("# ") for line in lines)  # the comment's words, unwrapped
    assert grown.verdict == "fits" and f"with it, {grown.headline}; without it, {plain.headline}" in said
    compile(code, "export.py", "exec")


def test_the_code_leaves_the_allocator_alone_when_the_plan_fits_without():
    m, plan, memory = setting()
    code = sv.export_code(m, plan, sv.Mesh(8, device_memory=4 * memory, memory_reserve=0), TRAINING)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in code
    assert "PYTORCH_CUDA_ALLOC_CONF" not in sv.export_code(m, plan, sv.Mesh(8), TRAINING)  # no device memory


def test_a_mesh_sized_for_expandable_segments_gets_them_and_the_line_sets_the_variable():
    m, plan, memory = setting()
    code = sv.export_code(m, plan, sv.Mesh(8, device_memory=4 * memory, expandable_segments=True), TRAINING)
    assert LINE in code and "Mesh(expandable_segments=True)" in code
    head = "\n".join(code.splitlines()[: code.splitlines().index(LINE) + 1])
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", head + "\nprint(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"],
                         capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "expandable_segments:True"


def test_sv201_names_the_allocator_setting_as_the_free_fix():
    """Over without expandable segments, fitting with them: SV201's cheapest fix is the setting
    (no time cost), with the reserved peak it would have."""
    m, plan, memory = setting()
    a = sv.analyze(m, plan, sv.Mesh(8, device_memory=memory, memory_reserve=0), TRAINING)
    found = [f for f in a.findings if f.code == "SV201"]
    assert found and found[0].fix.startswith("cheapest fix: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    grown = int(sv.analyze(m, plan, sv.Mesh(8, expandable_segments=True), TRAINING).memory.reserved_peak.max())
    assert f"reserved {sv.format.format_bytes(grown)}" in found[0].fix
    assert "reserved peak judged" in found[0].message and "5 % safety margin" in found[0].message
