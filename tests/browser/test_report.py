"""The standalone HTML report opens offline: the Inspector's own charts drawn, readable labels, no
request leaves the file."""

import re
import warnings

import helpers
import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.report import write_report


def open_offline(browser, path, dark=False):
    context = browser.new_context(viewport={"width": 1300, "height": 1000}, offline=True,
                                  color_scheme="dark" if dark else "light")
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
    page.wait_for_selector(".sv-report-chart svg", timeout=30_000)
    return context, page, requests, errors


@pytest.mark.parametrize("world", [8, 64])
def test_report_opens_offline_with_charts(tmp_path, chromium_browser, world):
    warnings.filterwarnings("ignore")
    model = zoo.tiny_llama_lora()
    path = tmp_path / "report.html"
    plans = {f"LoRA {x}": sv.Plan.auto(model, lora=x) for x in ("ignored", "sharded")}
    write_report(path, model, plans["LoRA ignored"], sv.Mesh(world, device_memory="80GiB"), compare_with=plans)
    text = path.read_text()
    assert "apply_fsdp" in text and "get_submodule" in text  # the exported code (highlighted)
    assert "SV102" in text  # trainable LoRA kept out of FSDP: the finding is there

    context, page, requests, errors = open_offline(chromium_browser, path)
    charts = page.locator(".sv-report-chart")
    assert charts.count() == 3  # memory per rank, traffic, layouts compared
    assert [charts.nth(i).get_attribute("data-kind") for i in range(3)] == ["memory", "traffic", "memory"]
    for i in range(3):
        assert charts.nth(i).locator("rect.sv-seg").count() > 0  # bars drawn, not just axes
    # one unit per chart, picked for the chart (a tiny model reads KiB, never "500μ GiB")
    axes = page.locator(".sv-memory-svg text.sv-axis").all_text_contents()
    ticks = [t for t in axes if re.match(r"^[\d.]+ \w+$", t)]
    assert ticks and all(t.endswith(" KiB") for t in ticks), ticks
    # the one breakdown, in the Inspector's order
    legend = charts.nth(0).locator(".sv-legend-item")
    assert legend.nth(0).get_attribute("data-cat") == "sharded params" and legend.count() == 9
    # ranks with the same numbers share a bar: at 64 ranks the rank labels do not collide
    boxes = page.evaluate("""() => [...document.querySelectorAll('.sv-report-chart')][0]
        .querySelectorAll('.sv-mem-bar text.sv-axis').length""")
    assert boxes <= 4
    overlap = page.evaluate("""() => {
        const ls = [...[...document.querySelectorAll('.sv-report-chart')][0].querySelectorAll('.sv-mem-bar text.sv-axis')]
          .map(t => t.getBoundingClientRect());
        for (let i = 1; i < ls.length; i++) if (ls[i].left < ls[i-1].right) return true;
        return false; }""")
    assert not overlap
    # the device line far above the bars is named, not drawn, and not in red when the peak fits
    label = charts.nth(0).locator(".sv-limit-label")
    assert label.text_content().startswith("peak uses") and "sv-over" not in label.get_attribute("class")
    # tables read as text: no None / NaN, "(outside FSDP)" for the all-reduce of ignored LoRA
    body = page.locator("body").inner_text()
    tables = "\n".join(page.locator("table").all_inner_texts())
    for bad in ("None", "NaN", "nan"):
        assert not re.search(rf"\b{bad}\b", tables), bad
    assert "(outside FSDP)" in tables and "no bandwidth given" in body and "no limit set" not in body
    # nothing wider than the page
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot = helpers.save_screenshot(page, f"report-{world}", full_page=False)
    if world == 8:
        helpers.retake_readme_image(shot, "report.png")  # the README's screenshot, with SHARDVIZ_SCREENSHOTS=1
    outside = [u for u in requests if not u.startswith("file://")]
    assert outside == [] and errors == []
    assert requests == [path.as_uri()]  # the file itself and nothing else
    context.close()


def test_report_dark(tmp_path, chromium_browser):
    model = zoo.tiny_llama_lora()
    path = tmp_path / "report.html"
    write_report(path, model, sv.Plan.auto(model), sv.Mesh(8))
    context, page, _, errors = open_offline(chromium_browser, path, dark=True)
    fill = page.locator(".sv-memory-svg text.sv-axis").first.evaluate("el => getComputedStyle(el).fill")
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    lum = lambda c: sum(int(x) for x in re.findall(r"\d+", c)[:3]) / 3  # noqa: E731
    assert lum(bg) < 60 and lum(fill) > 120, (bg, fill)
    helpers.save_screenshot(page, "report-dark")
    assert errors == []
    context.close()
