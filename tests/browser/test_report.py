"""The standalone HTML report opens offline: charts drawn, no request leaves the file."""

import warnings

import helpers

import shardviz as sv
from shardviz import zoo
from shardviz.report import write_report


def test_report_opens_offline_with_charts(tmp_path, chromium_browser):
    warnings.filterwarnings("ignore")
    model = zoo.tiny_llama_lora()
    path = tmp_path / "report.html"
    plans = {f"LoRA {x}": sv.Plan.auto(model, lora=x) for x in ("ignored", "sharded")}
    write_report(path, model, plans["LoRA ignored"], sv.Mesh(8, device_memory="80GiB"), compare_with=plans)
    text = path.read_text()
    assert "apply_fsdp" in text and "get_submodule" in text  # the exported code (highlighted)
    assert "SV102" in text  # trainable LoRA kept out of FSDP: the finding is there

    context = chromium_browser.new_context(viewport={"width": 1300, "height": 1000}, offline=True)
    requests = []

    def guard(route):
        requests.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == 3  # memory, traffic, layouts compared
    # bars were drawn in every chart, not just empty axes
    for i in range(plots.count()):
        assert plots.nth(i).locator("g.trace.bars path").count() > 0
    helpers.save_screenshot(page, "report", full_page=False)
    outside = [u for u in requests if not u.startswith("file://")]
    assert outside == [] and errors == []
    assert requests == [path.as_uri()]  # the file itself and nothing else
    context.close()
