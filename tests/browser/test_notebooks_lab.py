"""The shipped notebooks, run with "Run All" in JupyterLab as a user does, read in the page: the
quickstart's widget shows what its text says; notebook 02 shows bytes with units, charts that
follow the dark theme and a device limit that does not flatten the bars."""

from __future__ import annotations

import re

import pytest
from helpers import REPO_ROOT, open_and_run_notebook, save_screenshot
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]
NOTEBOOKS = REPO_ROOT / "notebooks"


def test_quickstart_widget_shows_what_the_text_says(lab_server, shared_lab_page):
    page = shared_lab_page
    panel = open_and_run_notebook(page, lab_server, NOTEBOOKS / "01_quickstart.ipynb", timeout=300_000)
    widget = panel.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    # the cell before the widget prints the plan's name: the widget shows that plan, not a later one
    printed = panel.locator(".jp-CodeCell").nth(1).locator(".jp-OutputArea-output pre").first.inner_text().splitlines()[0]
    assert printed.startswith("auto (LoRA sharded), edited: ")
    expect(widget.locator(".sv-plan-name")).to_have_text(printed)
    text = panel.locator(".jp-MarkdownCell").nth(2).inner_text()
    assert "It opens on the plan above" in text
    # the text after the widget checks the same numbers: analyze with the widget's training
    peak = int(widget.locator(".sv-sum-peak").get_attribute("data-bytes"))
    import shardviz as sv
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model).without_unit("base_model.model.model.embed_tokens").with_ignored(
        [p.fqn for p in sv.ModelTree(model).params if p.role == "lora" and p.fqn.startswith("base_model.model.model.layers.0.")])
    a = sv.analyze(model, plan, sv.Mesh(shard=8, device_memory="80GiB"),
                   sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32"))
    assert peak == (a.fit.judged if a.fit is not None else int(a.memory["peak"].max()))  # the judged figure


def test_notebook_02_reads_well_in_the_dark(lab_server, shared_lab_page):
    page = shared_lab_page
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    try:
        panel = open_and_run_notebook(page, lab_server, NOTEBOOKS / "02_lora_ignored_vs_sharded.ipynb", timeout=600_000)
        table = panel.locator(".jp-OutputArea-output table").first
        expect(table).to_be_visible()
        cells = table.locator("td").all_inner_texts()
        assert not [c for c in cells if re.fullmatch(r"\d{7,}", c.strip())], cells  # no raw bytes (2175337472)
        assert any(c.replace("\xa0", " ").endswith(" GiB") for c in cells) and "yes" in cells  # sv.fmt keeps "2.03 GiB" on one line
        charts = panel.locator(".sv-chart-widget")
        expect(charts).to_have_count(2, timeout=60_000)  # the layouts, and the sweep where the answer flips
        for i in range(2):
            ch = charts.nth(i)
            expect(ch.locator("svg")).to_be_visible()
            fill = ch.locator("svg text.sv-axis").first.evaluate("el => getComputedStyle(el).fill")
            lum = sum(int(x) for x in re.findall(r"\d+", fill)[:3]) / 3
            assert lum > 120, fill  # light text on the dark theme (a plotly figure stays white)
        # 80 GiB far above a 4 GiB peak is named, not drawn: the bars keep their height
        first = charts.nth(0)
        assert first.locator("line.sv-limit").count() == 0
        expect(first.locator(".sv-limit-label")).to_contain_text("fits: reserved peak")
        heights = [float(b.get_attribute("height")) for b in first.locator("rect.sv-seg").all()]
        assert sum(heights) > 150  # the stacks fill the chart
        save_screenshot(panel, "notebook02_dark")
        # the flip section says what it found, in words, and there is a flip (activations count)
        out = "\n".join(panel.locator(".jp-OutputArea-output").all_inner_texts())
        assert ("Llama-3 8B, no checkpointing: LoRA sharded fits 79.00 GiB usable (80.00 GiB − 1.00 GiB reserve) from 8 ranks, "
                "LoRA ignored at no world size") in out
        assert "the answer flips between the layouts" in out
    finally:
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
