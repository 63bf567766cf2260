"""The Inspector's pictures in docs/img (issue 37): Llama-3-8B + LoRA on 8 x H100, one 8k sequence per
rank, blocks checkpointed; at the widths a 1280 px and an 830 px window give it, light and dark.
Every run saves them under artifacts/screenshots and checks what a reader must see in each (the
answer first, 11 px chart text, nothing cut); ``SHARDVIZ_SCREENSHOTS=1`` copies them over
docs/img/inspector_<width>_<theme>.png."""

from __future__ import annotations

import pytest
from helpers import retake_readme_image, save_screenshot
from inspector_page import layout_problems
from static_inspector import StaticInspector
from test_inspector_front import SMALLEST_TEXT_JS

import shardviz as sv
from shardviz import zoo

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: window width -> the widget's width in it (JupyterLab's notebook margins; the file browser closed)
WIDTHS = {"1280": 1240, "830": 790}


def test_screenshots_light_and_dark(chromium_browser):
    model = zoo.build("llama3_8b", lora=True)
    plan = sv.Plan.auto(model, checkpoint="blocks")
    ins = sv.Inspector(model, plan=plan, mesh=sv.Mesh(shard=8, device="H100"),
                       training=sv.Training(batch_size=1, seq_len=8192), background=False)
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 2200})
    page = context.new_page()
    try:
        si = None
        for window, width in WIDTHS.items():
            for theme in ("light", "dark"):
                if si is None:
                    si = StaticInspector(page, ins, width=width, dark=theme == "dark")
                else:
                    si.load(width, theme == "dark")
                page.wait_for_timeout(300)
                card = si.widget.locator(".sv-card")
                assert card.locator(".sv-verdict-word").text_content() == ins.analysis.fit.word
                assert card.evaluate("e => e.getBoundingClientRect().top") < 60  # the answer first
                assert min(si.widget.evaluate(SMALLEST_TEXT_JS).values()) >= 11 - 0.05
                assert layout_problems(si.widget) == []
                shot = save_screenshot(si.widget, f"inspector_{window}_{theme}")
                retake_readme_image(shot, f"inspector_{window}_{theme}.png")
    finally:
        context.close()
