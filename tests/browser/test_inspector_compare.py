"""The Inspector's A vs B view in a real JupyterLab and headless Chromium.

Pin the auto plan as A, click "ignore LoRA" on a block, open the A vs B tab and read its numbers
from the page; they are checked against ``sv.compare`` run here, in the test process, on the
pinned plan and on plan B as the widget saved it (its ``plan_path``).
"""

from __future__ import annotations


import pytest
from inspector_page import fmt_bytes, numbers_settled, open_block, row, saved_plan
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from playwright.sync_api import expect

import shardviz as sv
from shardviz.widget.panels import COMPARISON_ROWS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MESH = sv.Mesh(shard=4, device_memory=1024**2)
TRAINING = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")  # the Inspector's default (README table)
L0 = "base_model.model.model.layers.0"
PLAN_FILE = "plan-compare.json"
ROWS = ("params", "grads", "optimizer", "peak", "bytes_per_step", "sent_bytes_per_rank", "collectives_per_step",
        "n_all_gather", "n_reduce_scatter", "n_all_reduce", "errors", "warnings")
BYTES = {"params", "grads", "optimizer", "peak", "bytes_per_step", "sent_bytes_per_rank"}


def test_pin_ignore_lora_and_compare(lab_server, shared_lab_page, model):
    page = shared_lab_page
    nb = make_notebook(
        "import shardviz as sv\n"
        "from shardviz import zoo\n"
        "model = zoo.tiny_llama_lora()\n"
        f"inspector = sv.Inspector(model, mesh=sv.Mesh(shard=4, device_memory=1024**2), plan_path={PLAN_FILE!r})\n"
        "inspector\n"
    )
    panel = open_and_run_notebook(page, lab_server, nb, name="inspector_compare.ipynb", timeout=240_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    plan_a = saved_plan(lab_server, PLAN_FILE, until=lambda p: not p.ignored)
    assert plan_a == sv.Plan.auto(model)

    compare_panel = widget.locator(".sv-panel-compare")
    expect(compare_panel).to_have_attribute("data-pinned", "false")
    widget.locator(".sv-pin-box .sv-pin").click()
    expect(compare_panel).to_have_attribute("data-pinned", "true")
    expect(widget.locator(".sv-pin-box .sv-unpin")).to_be_visible()

    open_block(widget, L0)
    before = widget.locator(".sv-memory").get_attribute("data-revision")
    row(widget, L0).locator(".sv-act-ignore-lora").click()
    expect(widget.locator(".sv-memory")).not_to_have_attribute("data-revision", before, timeout=30_000)
    expect(widget).to_have_attribute("data-pending", "0", timeout=30_000)
    numbers_settled(widget)
    rev = widget.locator(".sv-memory").get_attribute("data-revision")
    lora = {p.fqn for p in sv.ModelTree(model).params if p.role == "lora" and p.fqn.startswith(L0 + ".")}
    plan_b = saved_plan(lab_server, PLAN_FILE, until=lambda p: set(p.ignored) == lora)
    assert set(plan_b.ignored) == lora
    assert plan_b.units == plan_a.units

    widget.locator('.sv-tab[data-tab="compare"]').click()
    expect(compare_panel).to_be_visible()
    expect(compare_panel).to_have_attribute("data-revision", rev, timeout=30_000)

    cmp = sv.compare(model, {"A": plan_a, "B": plan_b}, mesh=MESH, training=TRAINING)
    table = cmp.table
    for key in ROWS:
        tr = compare_panel.locator(f'.sv-cmp-row[data-key="{key}"]')
        for side, name in (("a", "A"), ("b", "B")):
            cell = tr.locator(f".sv-cmp-{side}")
            want = int(table.at[name, key])
            assert int(cell.get_attribute("data-value")) == want, (key, name)
            expect(cell).to_have_text(fmt_bytes(want) if key in BYTES else str(want))
        assert int(tr.locator(".sv-cmp-delta").get_attribute("data-value")) == int(table.at["B", key]) - int(table.at["A", key])
    # the paired bars carry the same numbers
    for key in ("peak", "params", "bytes_per_step", "n_all_reduce"):
        pair = compare_panel.locator(f'.sv-cmp-pair[data-key="{key}"]')
        for side, name in (("a", "A"), ("b", "B")):
            assert int(pair.locator(f'rect[data-side="{side}"]').get_attribute("data-value")) == int(table.at[name, key])
    # ignoring LoRA changes memory and traffic here, and adds a warning
    assert int(table.at["B", "peak"]) != int(table.at["A", "peak"])

    diff = cmp.diff("A", "B")
    assert set(diff["fqn"]) == lora
    shown = compare_panel.locator(".sv-cmp-diff-row")
    expect(shown).to_have_count(len(diff))
    assert {shown.nth(i).get_attribute("data-fqn") for i in range(shown.count())} == lora
    expect(compare_panel.locator(".sv-cmp-diff")).to_have_attribute("data-n", str(len(diff)))
    expect(compare_panel.locator(".sv-cmp-diff-row .sv-cmp-diff-b").first).to_have_text("ignored")
    changed = sum(int(table.at["B", k]) != int(table.at["A", k]) for k, *_ in COMPARISON_ROWS)
    assert changed > 0  # the tab counts the figures that differ too, never "0 differ" beside a changed peak
    expect(widget.locator('.sv-tab[data-tab="compare"]')).to_have_text(f"A vs B ({changed} figures, {len(diff)} params differ)")
    widget.locator(".sv-views").scroll_into_view_if_needed()
    save_screenshot(widget.locator(".sv-views"), "inspector_compare")

    # unpin clears the view
    widget.locator(".sv-pin-box .sv-unpin").click()
    expect(compare_panel).to_have_attribute("data-pinned", "false")
    expect(compare_panel.locator(".sv-cmp-row")).to_have_count(0)
    expect(widget.locator(".sv-pin-box .sv-unpin")).to_be_hidden()
