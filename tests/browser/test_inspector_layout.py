"""The Inspector at JupyterLab's default layout (file browser open: about 830 px for the widget) and
with the file browser closed at 1280 px (issue 19), light and dark: nothing overlaps, nothing is cut,
no needless sideways scrollbar, sibling names can be told apart, no label sits on the data. The
inputs that used to fail silently are driven here as a user would: a preset keeps checkpointing,
junk device memory gets a message, a sequence past the model's positions is flagged, the plan's
name counts the clicks, and a message once dismissed stays gone."""

from __future__ import annotations

import pytest
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from inspector_page import contrast_problems, expand, layout_problems, numbers_settled, open_block, row
from playwright.sync_api import expect

import shardviz as sv

pytestmark = [pytest.mark.browser, pytest.mark.slow]

L0 = "base_model.model.model.layers.0"
Q0 = L0 + ".self_attn.q_proj"
SETUP = (
    "import shardviz as sv\nfrom shardviz import zoo\n"
    "model = zoo.tiny_llama_lora()\n"
    "inspector = sv.Inspector(model, mesh=sv.Mesh(shard=4))\n"
)
# no reserve: a limit below the tiny model's peak (200 KiB) is a size the field accepts
SETUP_NO_RESERVE = SETUP.replace("sv.Mesh(shard=4)", "sv.Mesh(shard=4, memory_reserve=0)")


def rev(widget) -> str:
    return widget.locator(".sv-memory").get_attribute("data-revision")


def settle(widget, old_rev) -> None:
    expect(widget.locator(".sv-memory")).not_to_have_attribute("data-revision", str(old_rev), timeout=30_000)
    expect(widget).to_have_attribute("data-pending", "0", timeout=30_000)
    numbers_settled(widget)


def set_file_browser(page, open_: bool) -> None:
    page.evaluate(f"() => {{ const s = window.jupyterapp.shell; {'s.expandLeft()' if open_ else 's.collapseLeft()'}; }}")
    page.wait_for_function(f"() => window.jupyterapp.shell.leftCollapsed === {'false' if open_ else 'true'}")
    page.wait_for_timeout(400)


def field(widget, cls: str, text: str) -> None:
    r0 = rev(widget)
    widget.locator(cls).fill(text)
    widget.locator(cls).press("Enter")
    settle(widget, r0)


def assert_clean(widget, page, name: str) -> None:
    bad = layout_problems(widget) + contrast_problems(widget)
    save_screenshot(widget.locator(".sv-views"), name)  # the tab; the tree is in the charts' shot
    if name.endswith(("charts_light", "charts_dark")):
        widget.scroll_into_view_if_needed()
        save_screenshot(widget, name + "_tree")
    assert bad == [], f"{name}:\n" + "\n".join(bad)


def check_every_tab(widget, page, width: str, theme: str) -> None:
    for tab in ("charts", "compare", "findings", "export", "suggest"):
        widget.locator(f'.sv-tab[data-tab="{tab}"]').click()
        widget.locator(".sv-views").scroll_into_view_if_needed()
        expect(widget).to_have_attribute("data-tab", tab)
        if tab == "export":
            expect(widget.locator(".sv-code code")).to_contain_text("fully_shard", timeout=60_000)
        page.wait_for_timeout(200)
        assert_clean(widget, page, f"inspector_layout_{width}_{tab}_{theme}")
    widget.locator('.sv-tab[data-tab="charts"]').click()


def test_layout_at_lab_default_and_at_1280(lab_server, shared_lab_page, model):
    page = shared_lab_page
    page.set_viewport_size({"width": 1280, "height": 1400})  # tall: a tab's screenshot holds all of it
    panel = open_and_run_notebook(page, lab_server, make_notebook(SETUP_NO_RESERVE, "inspector"), name="inspector_layout.ipynb",
                                  timeout=240_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)

    # a limit below the peak, on the chart's scale: its label must not sit on the bars
    field(widget, ".sv-device", "200KiB")
    expect(widget.locator(".sv-memory .sv-limit-label")).to_contain_text("does not fit")
    expect(widget.locator(".sv-device")).to_have_value("200.00 KiB")
    # the siblings that used to read alike ("lora_e…", "lora_e…")
    open_block(widget, L0)
    expand(widget, L0 + ".self_attn")
    expand(widget, Q0)
    expect(row(widget, Q0 + ".lora_embedding_B")).to_be_visible()
    # A vs B: pinned, then LoRA of one block ignored
    widget.locator(".sv-pin-box .sv-pin").click()
    r0 = rev(widget)
    row(widget, L0).locator(".sv-act-ignore-lora").click()
    settle(widget, r0)
    expect(widget.locator('.sv-tab[data-tab="compare"]')).to_contain_text("differ")
    r0 = rev(widget)
    row(widget, L0).locator(".sv-act-ckpt").click()  # one pressed toggle, the others not
    settle(widget, r0)
    expect(row(widget, L0).locator(".sv-act-ckpt")).to_have_attribute("aria-pressed", "true")

    for width, browser_open, lo, hi in (("lab-default", True, 760, 900), ("1280", False, 1100, 1280)):
        set_file_browser(page, browser_open)
        w = widget.evaluate("el => el.getBoundingClientRect().width")
        assert lo <= w <= hi, (width, w)
        check_every_tab(widget, page, width, "light")
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        try:
            page.wait_for_timeout(300)
            check_every_tab(widget, page, width, "dark")
        finally:
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
            page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
    # an 830 px window with the file browser open: the tree's actions in view, the tabs one line each
    set_file_browser(page, True)
    page.set_viewport_size({"width": 830, "height": 1400})
    page.wait_for_timeout(500)
    tab_lines = widget.locator(".sv-tab").evaluate_all(
        "ts => ts.map(t => { const r = document.createRange(); r.selectNodeContents(t); return r.getClientRects().length; })")
    assert max(tab_lines) == 1, tab_lines  # one line each (they wrapped to 4)
    check_every_tab(widget, page, "830-window", "light")
    page.set_viewport_size({"width": 1280, "height": 1000})


def test_inputs_never_fail_silently(lab_server, shared_lab_page, model):
    page = shared_lab_page
    page.set_viewport_size({"width": 1280, "height": 1000})
    panel = open_and_run_notebook(page, lab_server, make_notebook(SETUP, "inspector"), name="inspector_inputs.ipynb", timeout=240_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    name = widget.locator(".sv-plan-name")

    # the edit count is the user's clicks: "checkpoint all blocks" is one, and a known plan
    r0 = rev(widget)
    widget.locator(".sv-ckpt-blocks").click()
    settle(widget, r0)
    expect(name).to_have_text(sv.Plan.auto(model, checkpoint="blocks").name)
    open_block(widget, L0)
    r0 = rev(widget)
    row(widget, L0).locator(".sv-act-ignore-lora").click()  # 14 parameters, one click
    settle(widget, r0)
    expect(name).to_have_text("auto (LoRA sharded, blocks checkpointed), edited: 1 change")
    r0 = rev(widget)
    row(widget, L0).locator(".sv-act-unit").click()
    settle(widget, r0)
    expect(name).to_have_text("auto (LoRA sharded, blocks checkpointed), edited: 2 changes")

    # choosing a preset applies it and keeps the checkpointing, and says so
    r0 = rev(widget)
    widget.locator(".sv-preset").select_option("ignored")
    settle(widget, r0)
    want = sv.Plan.auto(model, lora="ignored", checkpoint="blocks")
    expect(name).to_have_text(want.name)
    expect(widget.locator(".sv-sum-plan")).to_contain_text("2 checkpointed")
    expect(widget.locator(".sv-msg-info")).to_contain_text("keeps your checkpointing")
    expect(widget.locator(".sv-preset")).to_have_value("ignored")

    # junk device memory: refused with a message naming the field; units accepted
    field(widget, ".sv-device", "80GiB")
    expect(widget.locator(".sv-sum-peak")).to_contain_text("of 79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)")
    widget.locator(".sv-device").fill("abc")
    widget.locator(".sv-device").press("Enter")
    expect(widget.locator(".sv-msg-error")).to_contain_text("device memory 'abc'")
    expect(widget.locator(".sv-device")).to_have_value("80")
    expect(widget.locator(".sv-sum-peak")).to_contain_text("of 79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)")  # the verdict stays
    # a dismissed message stays gone, and the next change clears the rest
    widget.locator(".sv-msg-error .sv-msg-close").click()
    expect(widget.locator(".sv-msg-error")).to_have_count(0)
    r0 = rev(widget)
    widget.locator(".sv-batch").fill("1")
    widget.locator(".sv-batch").press("Enter")
    settle(widget, r0)
    expect(widget.locator(".sv-msg")).to_have_count(0)

    # a sequence past the model's max_position_embeddings is flagged, and the field shows it whole
    widget.locator(".sv-seq").fill("1000000000")  # with a batch: more tokens than a step measures
    widget.locator(".sv-seq").press("Enter")
    expect(widget.locator(".sv-msg-error")).to_contain_text("tokens per rank")
    field(widget, ".sv-seq", "1000000")
    note = widget.locator(".sv-seq-note")
    expect(note).to_be_visible()
    assert "max_position_embeddings (256)" in note.get_attribute("title")
    seq = widget.locator(".sv-seq")
    fits = seq.evaluate("""el => { const st = getComputedStyle(el); const c = document.createElement('canvas').getContext('2d');
      c.font = `${st.fontSize} ${st.fontFamily}`;
      return c.measureText(el.value).width <= el.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight) - 16; }""")
    assert fits, "the sequence length is cut in its field (room for the spinner kept)"
    ticks = widget.locator(".sv-memory text.sv-axis").evaluate_all("ts => ts.map(t => t.textContent)")
    assert any(t.endswith(("GiB", "TiB")) for t in ticks), ticks  # the axis unit follows the magnitude
    field(widget, ".sv-seq", "128")
    expect(note).to_have_text("")
    assert layout_problems(widget) == []
    save_screenshot(widget, "inspector_inputs")
