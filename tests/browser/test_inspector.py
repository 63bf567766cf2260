"""The Inspector in a real JupyterLab and headless Chromium.

Each test opens a notebook that shows ``sv.Inspector`` on the tiny Llama+LoRA, clicks like a user,
and checks what the page shows against ``sv.analyze`` / ``sv.export_code`` computed here, in the
test process, from the plan the widget saved (its ``plan_path``): the browser's numbers are never
checked against the widget's own arithmetic.
"""

from __future__ import annotations

import json
import time

import pytest
from inspector_page import expand, fmt_bytes, numbers_settled, open_block, row, saved_plan
from helpers import make_notebook, open_and_run_notebook, save_screenshot, shutdown_all_kernels
from playwright.sync_api import expect

import shardviz as sv

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MESH = sv.Mesh(shard=4, device_memory=1024**2)
TRAINING = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")  # the Inspector's default (README table)
L0 = "base_model.model.model.layers.0"
L1 = "base_model.model.model.layers.1"
Q0 = L0 + ".self_attn.q_proj"


def setup_cell(plan_file: str) -> str:
    return (
        "import shardviz as sv\n"
        "from shardviz import zoo\n"
        "model = zoo.tiny_llama_lora()\n"
        f"inspector = sv.Inspector(model, mesh=sv.Mesh(shard=4, device_memory=1024**2), plan_path={plan_file!r})\n"
    )


def open_inspector(page, server, plan_file: str, name: str):
    nb = make_notebook(setup_cell(plan_file), "inspector")
    panel = open_and_run_notebook(page, server, nb, name=name, timeout=240_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    expect(widget.locator(".sv-memory .sv-mem-bar").first).to_be_attached()
    return widget


def revision(widget) -> int:
    return int(widget.locator(".sv-memory").get_attribute("data-revision"))


def wait_revision_above(widget, old: int) -> int:
    expect(widget.locator(".sv-memory")).not_to_have_attribute("data-revision", str(old), timeout=30_000)
    # the rows of the same change follow the chart
    expect(widget).to_have_attribute("data-pending", "0", timeout=30_000)
    numbers_settled(widget)
    return revision(widget)


def test_make_unit_updates_memory_to_analyze(lab_server, lab_page, model):
    widget = open_inspector(lab_page, lab_server, "plan-unit.json", "inspector_unit.ipynb")
    start = sv.Plan.auto(model)
    assert saved_plan(lab_server, "plan-unit.json", until=start.__eq__) == start
    a0 = sv.analyze(model, start, MESH, TRAINING)
    bar = widget.locator(".sv-memory .sv-mem-bar").first
    assert int(bar.get_attribute("data-peak")) == int(a0.memory["peak"].max())

    open_block(widget, L0)
    expand(widget, L0 + ".self_attn")
    q = row(widget, Q0)
    expect(q).to_have_attribute("data-badge", "in")
    before = revision(widget)
    q.locator(".sv-act-unit").click()
    wait_revision_above(widget, before)
    expect(q).to_have_attribute("data-badge", "unit")

    want = start.with_unit(Q0)
    assert saved_plan(lab_server, "plan-unit.json", until=want.__eq__) == want
    a = sv.analyze(model, want, MESH, TRAINING)
    peaks = a.memory["peak"]
    bars = widget.locator(".sv-memory .sv-mem-bar")
    shown = []
    for i in range(bars.count()):
        b = bars.nth(i)
        first, last = int(b.get_attribute("data-first")), int(b.get_attribute("data-last"))
        peak = int(b.get_attribute("data-peak"))
        shown.append((first, last))
        for rank in range(first, last + 1):
            assert peak == int(peaks[rank]), (rank, peak, int(peaks[rank]))
        # the bar's top is its reserved peak (the cap the verdict judges), and its label says that figure
        reserved = int(b.get_attribute("data-reserved"))
        assert reserved == int(a.memory["reserved_peak"][first]) >= peak
        expect(b.locator(".sv-peak-label")).to_have_text(fmt_bytes(max(peak, reserved)))
        # the stacked segments add up to the peak
        segs = b.locator(".sv-seg")
        assert sum(int(segs.nth(j).get_attribute("data-bytes")) for j in range(segs.count())) == peak
    assert shown[0][0] == 0 and shown[-1][1] == MESH.world - 1
    # the summary shows the figure the one verdict judges
    expect(widget.locator(".sv-sum-peak")).to_have_attribute("data-bytes", str(a.fit.judged if a.fit else int(peaks.max())))
    # every segment is the one breakdown of the peak (a.peak_breakdown), in its order
    parts = a.peak_breakdown(0)
    segs = bars.first.locator(".sv-seg")
    shown_parts = {segs.nth(j).get_attribute("data-cat"): int(segs.nth(j).get_attribute("data-bytes")) for j in range(segs.count())}
    assert shown_parts == {k: v for k, v in parts.items() if v > 0}
    assert shown_parts["sharded params"] == int(a.memory.loc[0, "params_sharded"])
    save_screenshot(widget, "inspector_make_unit")
    save_screenshot(lab_page, "inspector_make_unit_page")


def test_ignore_lora_under_a_block_changes_badges(lab_server, lab_page, model):
    widget = open_inspector(lab_page, lab_server, "plan-lora.json", "inspector_lora.ipynb")
    open_block(widget, L0)
    expand(widget, L0 + ".self_attn")
    expand(widget, Q0)
    expand(widget, Q0 + ".lora_A")
    expand(widget, Q0 + ".lora_A.default")
    lora_a = row(widget, Q0 + ".lora_A")
    expect(lora_a).to_have_attribute("data-badge", "in")
    expect(row(widget, Q0)).to_have_attribute("data-badge", "in")
    block = row(widget, L0)
    before = revision(widget)
    block.locator(".sv-act-ignore-lora").click()
    wait_revision_above(widget, before)

    expect(lora_a).to_have_attribute("data-badge", "ignored")
    expect(lora_a.locator(".sv-badge")).to_have_text("ignored")
    weight = row(widget, Q0 + ".lora_A.default.weight")
    expect(weight).to_have_attribute("data-badge", "ignored")
    expect(weight.locator(".sv-act-ignore")).to_have_text("un-ignore")
    expect(row(widget, Q0)).to_have_attribute("data-badge", "mixed")  # base sharded, LoRA ignored
    expect(row(widget, Q0 + ".base_layer")).to_have_attribute("data-badge", "in")
    expect(block.locator(".sv-act-lora")).to_have_text("un-ignore LoRA")
    expect(block).to_have_attribute("data-badge", "unit")

    want = sv.Plan.auto(model)
    lora = [p.fqn for p in sv.ModelTree(model).params if p.role == "lora" and p.fqn.startswith(L0 + ".")]
    plan = saved_plan(lab_server, "plan-lora.json")
    deadline = time.monotonic() + 10
    while set(plan.ignored) != set(lora) and time.monotonic() < deadline:
        time.sleep(0.1)
        plan = saved_plan(lab_server, "plan-lora.json")
    assert plan.units == want.units and set(plan.ignored) == set(lora)
    a = sv.analyze(model, plan, MESH, TRAINING)
    status = a.params.set_index("fqn")["status"]
    assert all(status[f] == "ignored" for f in lora)
    assert int(widget.locator(".sv-memory .sv-mem-bar").first.get_attribute("data-peak")) == int(a.memory.loc[0, "peak"])
    save_screenshot(widget, "inspector_ignore_lora")

    # the findings tab lists what changed, and a click reveals the module in the tree
    widget.locator('.sv-tab[data-tab="findings"]').click()
    findings = widget.locator(".sv-finding")
    expect(findings.first).to_be_visible()
    codes = [f.code for f in a.findings]
    assert findings.count() == len(codes)
    assert [findings.nth(i).get_attribute("data-code") for i in range(findings.count())] == codes
    link = widget.locator(".sv-finding .sv-reveal").first
    target = link.inner_text()
    link.click()
    expect(widget.locator(".sv-row.sv-flash")).to_have_attribute("data-fqn", target)
    save_screenshot(widget, "inspector_findings")

    # undo (an ipywidgets button) restores the LoRA
    lab_page.locator(".sv-undo").first.click()
    expect(lora_a).to_have_attribute("data-badge", "in", timeout=30_000)


def test_export_copy_save_and_verify(lab_server, lab_page, model):
    widget = open_inspector(lab_page, lab_server, "plan-export.json", "inspector_export.ipynb")
    lab_page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    plan = sv.Plan.auto(model)
    widget.locator('.sv-tab[data-tab="export"]').click()
    code = widget.locator(".sv-code code")
    expected = sv.export_code(model, plan, mesh=MESH, training=TRAINING)
    expect(code).to_contain_text("fully_shard", timeout=60_000)
    shown = code.evaluate("el => el.textContent")
    assert shown == expected
    assert widget.locator(".sv-code .sv-tok-kw").count() > 10  # highlighted

    widget.locator(".sv-copy").click()
    expect(widget.locator(".sv-export-status")).to_contain_text("copied")
    assert lab_page.evaluate("navigator.clipboard.readText()") == expected

    path = widget.locator(".sv-save-path")
    path.fill("exported_plan.py")
    widget.locator(".sv-save").click()
    expect(widget.locator(".sv-export-status")).to_contain_text("saved to")
    out = lab_server.root_dir / "exported_plan.py"
    assert out.read_text() == expected

    # the target release changes the code; saving again asks before overwriting
    widget.locator(".sv-torch-version").select_option("2.6")
    expected26 = sv.export_code(model, plan, mesh=MESH, training=TRAINING, torch_version="2.6")
    expect(code).to_contain_text("torch.distributed.fsdp", timeout=30_000)
    expect(code).to_have_text(expected26, timeout=30_000)
    widget.locator(".sv-save").click()
    expect(widget.locator(".sv-export-status")).to_contain_text("exists")
    assert out.read_text() == expected  # not yet
    widget.locator(".sv-confirm-overwrite").click()
    expect(widget.locator(".sv-export-status")).to_contain_text("saved to")
    assert out.read_text() == expected26

    widget.locator(".sv-verify").click()
    line = widget.locator(".sv-verify-line")
    expect(line).to_have_attribute("data-ok", "true", timeout=120_000)
    expect(line).to_contain_text("torch agrees")
    save_screenshot(widget, "inspector_export")

    # dark theme: the widget follows JupyterLab's theme variables
    lab_page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    lab_page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    widget.locator('.sv-tab[data-tab="charts"]').click()
    lab_page.wait_for_timeout(500)
    bg = widget.evaluate("el => getComputedStyle(el).backgroundColor")
    rgb = [int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
    assert sum(rgb) < 3 * 100, bg  # a dark background
    save_screenshot(widget, "inspector_dark")
    lab_page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")


def test_plan_file_survives_a_kernel_restart(lab_server, lab_page, model):
    """Toggle, restart the kernel (a crash loses the Python state), run again: the toggle is back."""
    widget = open_inspector(lab_page, lab_server, "plan-restart.json", "inspector_restart.ipynb")
    open_block(widget, L0)
    before = revision(widget)
    row(widget, L0).locator(".sv-act-unit").click()
    wait_revision_above(widget, before)
    want = sv.Plan.auto(model).without_unit(L0)
    assert saved_plan(lab_server, "plan-restart.json", until=want.__eq__) == want
    # a fresh kernel and the same notebook: the widget starts from the saved plan
    shutdown_all_kernels(lab_server)
    widget2 = open_inspector(lab_page, lab_server, "plan-restart.json", "inspector_restart.ipynb")
    expect(widget2.locator(".sv-sum-plan")).to_contain_text(f"{len(want.units)} calls")
    open_block(widget2, L0)
    expect(row(widget2, L0)).not_to_have_attribute("data-badge", "unit")
    assert json.loads((lab_server.root_dir / "plan-restart.json").read_text())["units"] == want.to_dict()["units"]
