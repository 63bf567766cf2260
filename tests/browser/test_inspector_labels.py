"""What a user reads in the Inspector (issue 11), read in a real JupyterLab at 1280 px wide, light
and dark. Every number on the page is checked against ``sv.analyze`` (or the plan file) computed
here, in the test process; every label against what it must say. README screenshots are retaken
here (docs/img/inspector.png), in a run with SHARDVIZ_SCREENSHOTS=1 only."""

from __future__ import annotations

import re

import pytest
from helpers import make_notebook, open_and_run_notebook, retake_readme_image, save_screenshot
from inspector_page import expand, numbers_settled, open_block, row, saved_plan
from playwright.sync_api import expect

import shardviz as sv

pytestmark = [pytest.mark.browser, pytest.mark.slow]

L0 = "base_model.model.model.layers.0"
Q0 = L0 + ".self_attn.q_proj"
PLAN_FILE = "plan-labels.json"


def open_at_1280(page, server, cells, name):
    page.set_viewport_size({"width": 1280, "height": 900})
    panel = open_and_run_notebook(page, server, make_notebook(*cells), name=name, timeout=240_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    expect(widget.locator(".sv-memory .sv-mem-bar").first).to_be_attached()
    return widget


def settle(widget, old_rev):
    expect(widget.locator(".sv-memory")).not_to_have_attribute("data-revision", str(old_rev), timeout=30_000)
    expect(widget).to_have_attribute("data-pending", "0", timeout=30_000)
    numbers_settled(widget)


def rev(widget) -> str:
    return widget.locator(".sv-memory").get_attribute("data-revision")


def no_clipping(widget) -> list[str]:
    """Rows whose cells are cut: the actions column past the tree's right edge, or a number, shape
    or status wider than its cell (an ellipsis). Deep names may end in an ellipsis: the full name
    is the row's tooltip."""
    return widget.evaluate(
        """(root) => {
          const bad = [];
          const scroller = root.querySelector('.sv-scroller');
          if (scroller.scrollWidth > scroller.clientWidth + 1) bad.push(`tree scrolls sideways: ${scroller.scrollWidth} > ${scroller.clientWidth}`);
          const right = scroller.getBoundingClientRect().right;
          for (const r of root.querySelectorAll('.sv-rows .sv-row')) {
            const act = r.querySelector('.sv-col-actions');
            for (const b of act.children) {
              if (b.getBoundingClientRect().right > right + 1) bad.push(`${r.dataset.id}: ${b.textContent} past the edge`);
            }
            for (const c of r.querySelectorAll('.sv-col-size, .sv-col-status, .sv-badge, .sv-col-local, .sv-col-bytes')) {
              if (c.scrollWidth > c.clientWidth + 1) bad.push(`${r.dataset.id} ${c.className}: "${c.textContent}" cut`);
            }
          }
          return bad;
        }"""
    )


def test_labels_a_user_reads(lab_server, shared_lab_page, model):
    page = shared_lab_page
    setup = (
        "import shardviz as sv, shardviz.checks\n"
        "from shardviz import zoo\n"
        "shardviz.checks.MAX_FQNS = 5  # the tiny model has 28 LoRA parameters: the list gets cut as at 70B\n"
        "model = zoo.tiny_llama_lora()\n"
        f"inspector = sv.Inspector(model, mesh=sv.Mesh(shard=4), plan_path={PLAN_FILE!r})\n"
    )
    (lab_server.root_dir / PLAN_FILE).unlink(missing_ok=True)
    widget = open_at_1280(page, lab_server, [setup, "inspector"], "inspector_labels.ipynb")
    plan0 = sv.Plan.auto(model)

    # the defaults are the README table's training, and say so
    expect(widget.locator(".sv-sum-training")).to_have_text("AdamW · bf16 params · fp32 reduce · no batch (model state only)")
    expect(widget.locator(".sv-param-dtype")).to_have_value("bfloat16")

    # sizes: element counts never read as bytes ("70.76B" next to "512 B")
    sizes = widget.locator(".sv-rows .sv-col-size").all_inner_texts()
    assert sizes and not [t for t in sizes if re.search(r"\d[KMBT]$", t)], sizes
    expect(widget.locator(".sv-header .sv-col-size")).to_have_text("elements")

    # a preset from the controls, then LoRA given back: the plan's name follows
    r0 = rev(widget)
    widget.locator(".sv-preset").select_option("ignored")  # choosing a preset applies it
    settle(widget, r0)
    expect(widget.locator(".sv-plan-name")).to_have_text("auto (LoRA ignored)")

    # findings: "and N more" counts every name left, not the 5 the finding keeps
    widget.locator('.sv-tab[data-tab="findings"]').click()
    n_lora = sum(p.role == "lora" for p in sv.ModelTree(model).params)
    sv102 = widget.locator('.sv-finding[data-code="SV102"]')
    expect(sv102.locator(".sv-finding-head")).to_contain_text(f"{n_lora} trainable parameters")
    expect(sv102.locator(".sv-finding-more")).to_have_text(f" and {n_lora - 4} more")

    r0 = rev(widget)
    row(widget, "").locator(".sv-act-unignore-lora").click()
    settle(widget, r0)
    expect(widget.locator(".sv-plan-name")).to_have_text("auto (LoRA sharded)")
    expect(widget.locator(".sv-sum-plan")).not_to_contain_text("ignored)")
    open_block(widget, L0)
    r0 = rev(widget)
    row(widget, L0).locator(".sv-act-unit").click()
    settle(widget, r0)
    name = "auto (LoRA sharded), edited: 1 change"
    expect(widget.locator(".sv-plan-name")).to_have_text(name)
    plan = saved_plan(lab_server, PLAN_FILE, until=lambda p: p.name == name)
    assert plan.name == name and plan == plan0.without_unit(L0)

    # modules without parameters: no "+ unit" (peft's lora_dropout, lora_embedding_A/B)
    expand(widget, L0 + ".self_attn")
    expand(widget, Q0)
    for empty in ("lora_dropout", "lora_embedding_A", "lora_embedding_B"):
        expect(row(widget, f"{Q0}.{empty}")).to_be_visible()
        expect(row(widget, f"{Q0}.{empty}").locator(".sv-act-unit")).to_have_count(0)
    expect(row(widget, f"{Q0}.lora_A").locator(".sv-act-unit")).to_have_count(1)

    # nothing cut at 1280 px, light theme
    bad = no_clipping(widget)
    save_screenshot(page, "inspector_1280_light_page")
    assert bad == [], "\n".join(bad)

    # device memory: "peak uses" computed in Python, not red when it fits
    r0 = rev(widget)
    widget.locator(".sv-device").fill("80")
    widget.locator(".sv-device").press("Enter")
    settle(widget, r0)
    a = sv.analyze(model, plan, sv.Mesh(shard=4, device_memory="80GiB"),
                   sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32"))
    limit_label = widget.locator(".sv-memory .sv-limit-label")
    expect(limit_label).to_have_text(a.fit.headline)  # the one verdict's words (the limit is far above the bars)
    assert "sv-over" not in (limit_label.get_attribute("class") or "")
    error_color = widget.evaluate("el => getComputedStyle(el).getPropertyValue('--sv-error').trim()")
    fill = limit_label.evaluate("el => getComputedStyle(el).fill")
    assert fill != widget.evaluate(f"() => {{ const d = document.createElement('div'); d.style.color = '{error_color}'; document.body.append(d); const c = getComputedStyle(d).color; d.remove(); return c; }}")
    expect(widget.locator(".sv-sum-peak")).to_have_attribute("data-bytes", str(a.fit.judged))
    # an enabled button never wears the disabled one's colour ("− unit" read as greyed out, issue 37)
    colour = "el => [getComputedStyle(el).color, getComputedStyle(el).opacity, getComputedStyle(el).borderStyle]"
    enabled = widget.locator(".sv-act-remove:not([disabled])").first.evaluate(colour)
    disabled = widget.locator(".sv-redo").evaluate(colour)
    assert widget.locator(".sv-redo").is_disabled() and enabled != disabled and enabled[0] != disabled[0], (enabled, disabled)

    # a batch size brings the activations into the peak, and the moment of the peak is named
    r0 = rev(widget)
    widget.locator(".sv-batch").fill("1")
    widget.locator(".sv-batch").press("Enter")
    settle(widget, r0)
    expect(widget.locator(".sv-sum-training")).to_contain_text("batch 1 × 2048 tokens")
    tr1 = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=1)
    a1 = sv.analyze(model, plan, sv.Mesh(shard=4, device_memory="80GiB"), tr1)
    act = widget.locator('.sv-memory .sv-mem-bar').first.locator('.sv-seg[data-cat="activations"]')
    assert int(act.get_attribute("data-bytes")) == a1.peak_breakdown(0)["activations"] > 0
    row0 = a1.memory.loc[a1.memory["peak"].idxmax()]
    expect(widget.locator(".sv-peak-moment")).to_contain_text(f"in {row0['peak_phase']}")
    r0 = rev(widget)
    widget.locator(".sv-batch").fill("")
    widget.locator(".sv-batch").press("Enter")
    settle(widget, r0)
    expect(widget.locator(".sv-sum-training")).to_contain_text("no batch (model state only)")

    # the stacked bar is the one breakdown, in the one order
    widget.locator('.sv-tab[data-tab="charts"]').click()
    # (the parts of the worst bar, a 0 B part left out of the legend too, then the reserved cap)
    legend = widget.locator(".sv-memory .sv-legend-item")
    named = [legend.nth(i).get_attribute("data-cat") for i in range(legend.count())]
    worst = max(widget.locator(".sv-memory .sv-mem-bar").all(), key=lambda b: int(b.get_attribute("data-peak")))
    drawn = [s.get_attribute("data-cat") for s in worst.locator(".sv-seg").all()]
    from shardviz.views.display import PEAK_PARTS
    assert named == drawn + ["reserved"] and drawn == [p for p in PEAK_PARTS if p in drawn]

    # traffic labels: the common prefix dropped, the end that names the module kept, full name on hover
    labels = widget.locator(".sv-traffic-units .sv-unit-bar")
    for i in range(labels.count()):
        g = labels.nth(i)
        unit = g.get_attribute("data-unit")
        text = g.locator("text.sv-axis").first.evaluate("el => el.firstChild.nodeValue")  # without its <title>
        assert g.locator("text.sv-axis title").first.text_content() == unit
        if unit.startswith("[") or unit in ("(outside FSDP)", "<root>"):
            continue
        assert unit.endswith(text.lstrip("…")) and not text.startswith("_"), (unit, text)

    # one spelling of each collective on every chart (issue 37: "all_gather ×68", lane "all-gather", legend "all gather")
    charts = widget.locator(".sv-traffic").text_content() + widget.locator(".sv-timeline").text_content()
    assert "all-gather" in charts and "reduce-scatter" in charts
    assert not re.search(r"all_gather|all gather|reduce_scatter|reduce scatter|all_reduce|all reduce", charts), charts[:300]

    # a filter that matches nothing says so
    widget.locator(".sv-filter-text").fill("no_such_thing")
    widget.locator(".sv-filter-text").press("Enter")
    expect(widget.locator(".sv-filter-note")).to_contain_text("nothing matches this filter")
    widget.locator(".sv-filter-text").fill("")
    widget.locator(".sv-filter-text").press("Enter")
    expect(widget.locator(".sv-filter-note")).to_have_text("")

    # export: the header carries the edited name; "saved to" gives the absolute path
    widget.locator('.sv-tab[data-tab="export"]').click()
    expect(widget.locator(".sv-code code")).to_contain_text(name, timeout=60_000)
    (lab_server.root_dir / "fsdp_plan.py").unlink(missing_ok=True)
    widget.locator(".sv-save").click()
    expect(widget.locator(".sv-export-status")).to_have_text(f"saved to {lab_server.root_dir / 'fsdp_plan.py'}")

    widget.locator('.sv-tab[data-tab="charts"]').click()
    save_screenshot(widget, "inspector_labels_light")

    # dark theme: the page and the charts follow it
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    page.wait_for_timeout(500)
    try:
        bg = widget.evaluate("el => getComputedStyle(el).backgroundColor")
        axis = widget.locator(".sv-memory text.sv-axis").first.evaluate("el => getComputedStyle(el).fill")
        lum = lambda c: sum(int(x) for x in re.findall(r"\d+", c)[:3]) / 3  # noqa: E731
        assert lum(bg) < 100 and lum(axis) > 120, (bg, axis)
        assert no_clipping(widget) == []
        save_screenshot(widget, "inspector_labels_dark")
    finally:
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)


def test_llama70b_shapes_and_statuses_are_not_cut(lab_server, shared_lab_page):
    """At 70B the shapes ("(28672, 8192)"), local shards and statuses ("sharded · layers.79") fit
    their columns at 1280 px, and sizes read "70.76 billion" (format.py), not "70.76B" or "bn"."""
    page = shared_lab_page
    last = "base_model.model.model.layers.79"
    setup = (
        "import shardviz as sv\nfrom shardviz import zoo\n"
        "inspector = sv.Inspector(zoo.llama3_70b(lora=True), mesh=sv.Mesh(shard=64, device_memory='80GiB'))\n"
        f"inspector.controller.reveal({last + '.mlp.down_proj.base_layer.weight'!r})\n"
        f"inspector.controller.reveal({last + '.mlp.down_proj.lora_A.default.weight'!r})\n"
        f"inspector.controller.reveal({last + '.self_attn.q_proj.lora_B.default.weight'!r})\n"
    )
    widget = open_at_1280(page, lab_server, [setup, "inspector"], "inspector_70b.ipynb")
    expect(widget.locator(".sv-sum-size")).to_contain_text("70.76 billion parameter elements")  # format_large_count
    scroller = widget.locator(".sv-scroller")
    seen = set()
    for _ in range(40):  # scroll through the open rows (the list is virtualised)
        bad = no_clipping(widget)
        assert bad == [], "\n".join(bad)
        seen.update(widget.locator(".sv-rows .sv-row").evaluate_all("rs => rs.map(r => r.dataset.id)"))
        at_end = scroller.evaluate("el => el.scrollTop + el.clientHeight >= el.scrollHeight - 1")
        if at_end:
            break
        scroller.evaluate("el => { el.scrollTop += el.clientHeight; }")
        page.wait_for_timeout(150)
    big = row(widget, last + ".mlp.down_proj.base_layer.weight")
    big.scroll_into_view_if_needed()
    expect(big.locator(".sv-col-size")).to_have_text("(8192, 28672)")
    expect(big.locator(".sv-badge")).to_have_text("sharded · layers.79")
    # the README's screenshot: the whole widget at 1280 px wide (a viewport tall enough to hold it)
    page.set_viewport_size({"width": 1280, "height": 1900})
    page.wait_for_timeout(300)
    widget.scroll_into_view_if_needed()
    scroller.evaluate("el => { el.scrollTop = 0; }")
    page.wait_for_timeout(200)
    shot = save_screenshot(widget, "inspector_70b_1280")
    retake_readme_image(shot, "inspector.png")  # with SHARDVIZ_SCREENSHOTS=1 only
    page.set_viewport_size({"width": 1280, "height": 900})
