"""The Inspector's Suggest panel in a real JupyterLab and headless Chromium (issue 18).

Click Suggest, see "searching N plans…" and then the rows (their names read from ``sv.search`` run
here, in the test process), apply the 2nd row and see the plan's name change in the header and in
the saved plan file (its ``plan_path``), undo and see it go back. At JupyterLab's default width
(file browser open: about 830 px), light and dark: the panel is readable (text against its
background) and nothing scrolls sideways.
"""

from __future__ import annotations

import re

import pytest
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from inspector_page import layout_problems, saved_plan
from playwright.sync_api import expect

import shardviz as sv
from shardviz import zoo
from shardviz.format import format_bytes

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MESH = sv.Mesh(4, device="H100")
TRAINING = sv.Training(batch_size=2, seq_len=64)
PLAN_FILE = "plan-suggest.json"
SETUP = (
    "import shardviz as sv\nfrom shardviz import zoo\n"
    "model = zoo.tiny_llama_lora()\n"
    "inspector = sv.Inspector(model, mesh=sv.Mesh(4, device='H100'), training=sv.Training(batch_size=2, seq_len=64), "
    f"plan_path={PLAN_FILE!r})\n"
)

# The contrast of each text of the panel with what is drawn behind it (WCAG's ratio).
CONTRAST_JS = r"""
(panel) => {
  // any CSS colour (color-mix() computes to "color(srgb r g b)", 0-1): through a canvas to 0-255 RGBA
  const cv = document.createElement('canvas'); cv.width = cv.height = 1;
  const cx = cv.getContext('2d', { willReadFrequently: true });
  const rgb = (c) => { cx.clearRect(0, 0, 1, 1); cx.fillStyle = 'rgba(0,0,0,0)'; cx.fillStyle = c; cx.fillRect(0, 0, 1, 1);
    const d = cx.getImageData(0, 0, 1, 1).data; return [d[0], d[1], d[2], d[3] / 255]; };
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (e) => {
    for (; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  };
  const out = [];
  for (const e of panel.querySelectorAll('.sv-suggest-name, .sv-suggest-why, .sv-suggest-applies, .sv-suggest-table th, .sv-suggest-peak, .sv-suggest-step, .sv-suggest-tokens, .sv-suggest-status, .sv-suggest-explain, .sv-suggest-fits, .sv-suggest-apply')) {
    const a = lum(rgb(getComputedStyle(e).color)), b = lum(background(e));
    out.push([e.className, Math.round(100 * (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)) / 100]);
  }
  return out;
}
"""


def set_file_browser(page, open_: bool) -> None:
    page.evaluate(f"() => {{ const s = window.jupyterapp.shell; {'s.expandLeft()' if open_ else 's.collapseLeft()'}; }}")
    page.wait_for_function(f"() => window.jupyterapp.shell.leftCollapsed === {'false' if open_ else 'true'}")
    page.wait_for_timeout(400)


def assert_readable_and_clean(widget, panel, theme: str) -> None:
    panel.scroll_into_view_if_needed()
    save_screenshot(widget.locator(".sv-views"), f"inspector_suggest_{theme}")
    contrast = panel.evaluate(CONTRAST_JS)
    assert contrast and all(ratio >= 3.0 for _, ratio in contrast), (theme, [c for c in contrast if c[1] < 3.0])
    assert layout_problems(widget) == [], theme
    assert panel.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), theme


def test_suggest_apply_the_second_row_and_undo(lab_server, shared_lab_page):
    page = shared_lab_page
    page.set_viewport_size({"width": 1280, "height": 1400})
    model = zoo.tiny_llama_lora()
    nb = make_notebook(SETUP, "inspector")
    out = open_and_run_notebook(page, lab_server, nb, name="inspector_suggest.ipynb", timeout=240_000)
    widget = out.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    set_file_browser(page, True)
    w = widget.evaluate("el => el.getBoundingClientRect().width")
    assert 760 <= w <= 900, w
    start = saved_plan(lab_server, PLAN_FILE)
    assert start == sv.Plan.auto(model)
    name_before = widget.locator(".sv-plan-name").text_content()

    widget.locator('.sv-tab[data-tab="suggest"]').click()
    panel = widget.locator(".sv-panel-suggest")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-state", "idle")
    panel.locator(".sv-suggest-run").click()
    ref = sv.search(model, mesh=MESH, training=TRAINING)  # meanwhile, here: what the rows must say
    expect(panel.locator(".sv-suggest-status")).to_have_text(re.compile(r"(starting the search…|searching \d+ plans…|\d+ plans tried)"))
    expect(panel).to_have_attribute("data-state", "done", timeout=180_000)
    expect(panel.locator(".sv-suggest-status")).to_contain_text(f"{ref.n_candidates} plans tried")
    rows = panel.locator(".sv-suggest-row")
    expect(rows).to_have_count(8)
    for i in range(8):
        expect(rows.nth(i).locator(".sv-suggest-rank")).to_have_text(str(i + 1))
        expect(rows.nth(i).locator(".sv-suggest-name")).to_have_text(ref.table.name.iloc[i])
        expect(rows.nth(i).locator(".sv-suggest-peak > div").first).to_have_text(format_bytes(ref.table.judged_peak.iloc[i]))
    second = panel.locator('.sv-suggest-row[data-index="1"]')
    assert int(second.locator(".sv-suggest-peak").get_attribute("data-value")) == int(ref.table.judged_peak.iloc[1])

    second.locator(".sv-suggest-apply").click()
    want = f"search: {ref.table.name.iloc[1]}"
    expect(widget.locator(".sv-plan-name")).to_have_text(want, timeout=30_000)
    expect(second).to_have_attribute("data-current", "true")
    plan, mesh, _ = ref.candidate(1)
    assert saved_plan(lab_server, PLAN_FILE, until=lambda p: p == plan) == plan
    if mesh.is_hsdp:  # the HSDP split came with it, in the same step
        expect(widget.locator(".sv-replicate")).to_have_value(str(mesh.replicate))

    widget.locator(".sv-undo").click()
    expect(widget.locator(".sv-plan-name")).to_have_text(name_before, timeout=30_000)
    expect(second).to_have_attribute("data-current", "false")
    assert saved_plan(lab_server, PLAN_FILE, until=lambda p: p == start) == start
    expect(widget).to_have_attribute("data-pending", "0", timeout=30_000)

    assert_readable_and_clean(widget, panel, "light")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    try:
        page.wait_for_timeout(300)
        assert_readable_and_clean(widget, panel, "dark")
    finally:
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1000})
