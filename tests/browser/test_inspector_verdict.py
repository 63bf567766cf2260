"""One verdict in every view of the Inspector (issue 35), in a real JupyterLab and headless Chromium.

Two devices for the same tiny Llama + LoRA plan, sized from the plan's own peaks as torch-priced here:
one between the allocated and the reserved peak (the allocated peak alone would fit, the judged reserved
one does not: where the views used to disagree), and one with room. The summary, the memory chart's
words and bars, the findings, Suggest, A vs B and the exported code must all say ``a.fit``'s verdict,
judged figure and margin, as ``sv.analyze`` gives them in the test process. The figures are printed.
"""

from __future__ import annotations

import pytest
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from inspector_page import fmt_bytes, numbers_settled
from playwright.sync_api import expect

import shardviz as sv
from shardviz import zoo

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TRAINING = sv.Training(batch_size=2, seq_len=64)


def device_memory(case: str) -> int:
    """Bytes of device memory (no reserve) for ``case``, from the plan's own peaks."""
    model = zoo.tiny_llama_lora()
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device_memory=1 << 40, memory_reserve=0), TRAINING)
    peak, reserved = int(a.memory.peak.max()), int(a.memory.reserved_peak.max())
    assert peak * 1.1 < reserved, "the premise: the reserved peak is well above the allocated one"
    return (int(peak * 1.06) + reserved) // 2 if case == "over" else 4 * reserved


def unwrapped(code: str) -> str:
    """The exported code's header comment as one line."""
    return " ".join(line[2:] for line in code.splitlines() if line.startswith("# "))


@pytest.mark.parametrize("case", ["over", "fits"])
def test_every_view_says_the_one_verdict(lab_server, shared_lab_page, case):
    page = shared_lab_page
    page.set_viewport_size({"width": 1280, "height": 1400})
    memory = device_memory(case)
    model = zoo.tiny_llama_lora()
    mesh = sv.Mesh(4, device_memory=memory, memory_reserve=0)
    a = sv.analyze(model, sv.Plan.auto(model), mesh, TRAINING)
    fit = a.fit
    assert fit.verdict == ("over" if case == "over" else "fits")
    nb = make_notebook(
        "import shardviz as sv\nfrom shardviz import zoo\n"
        f"inspector = sv.Inspector(zoo.tiny_llama_lora(), mesh=sv.Mesh(4, device_memory={memory}, memory_reserve=0), "
        "training=sv.Training(batch_size=2, seq_len=64))\ninspector\n")
    out = open_and_run_notebook(page, lab_server, nb, name=f"inspector_verdict_{case}.ipynb", timeout=240_000)
    widget = out.locator(".sv-inspector")
    expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=60_000)
    numbers_settled(widget)
    seen = {}

    # the summary: the verdict word, the judged figure and the margin
    summary = widget.locator(".sv-sum-peak")
    expect(summary).to_have_attribute("data-verdict", fit.verdict)
    expect(summary.locator(".sv-verdict-word")).to_have_text(fit.word)
    expect(summary).to_contain_text(f"reserved peak {fmt_bytes(fit.judged)}")
    expect(summary).to_contain_text(fit.spare_text)
    seen["summary"] = summary.text_content()

    # the memory chart: its words are the headline; every bar's cap is its reserved peak, its class the verdict
    label = widget.locator(".sv-memory .sv-limit-label")
    expect(label).to_contain_text(fit.headline)
    seen["chart"] = label.text_content()
    bars = widget.locator(".sv-mem-bar")
    assert bars.count() >= 1
    caps = [int(bars.nth(i).get_attribute("data-reserved")) for i in range(bars.count())]
    assert max(caps) == fit.reserved
    assert {bars.nth(i).get_attribute("data-verdict") for i in range(bars.count())} == {fit.verdict}
    expect(widget.locator(".sv-mem-bar .sv-reserved-cap").first).to_be_visible()
    save_screenshot(widget, f"inspector_verdict_{case}")

    # the findings: SV201 opens with the headline when the plan does not fit, and is absent when it does
    widget.locator('.sv-tab[data-tab="findings"]').click()
    sv201 = widget.locator('.sv-finding[data-code="SV201"]')
    if case == "over":
        expect(sv201).to_have_count(1)
        expect(sv201.locator(".sv-finding-head")).to_contain_text(fit.headline)
        seen["SV201"] = sv201.locator(".sv-finding-head").text_content()[:160]
    else:
        expect(sv201).to_have_count(0)

    # the export: its header states the headline
    widget.locator('.sv-tab[data-tab="export"]').click()
    code = widget.locator(".sv-panel-export .sv-code")
    expect(code).to_contain_text("shardviz's verdict on")
    assert fit.headline in unwrapped(code.text_content())
    seen["export"] = "present"

    # A vs B: pinned as A, B is the same plan: the tab counts no figure, the note says both verdicts
    widget.locator(".sv-pin-box .sv-pin").click()
    panel = widget.locator(".sv-panel-compare")
    expect(panel).to_have_attribute("data-pinned", "true")
    widget.locator('.sv-tab[data-tab="compare"]').click()
    expect(widget.locator('.sv-tab[data-tab="compare"]')).to_have_text("A vs B (0 figures, 0 params differ)", timeout=30_000)
    expect(panel).to_contain_text(f"verdict A: {fit.word} · B: {fit.word}")
    judged = panel.locator('.sv-cmp-row[data-key="judged_peak"] .sv-cmp-b')
    assert int(judged.get_attribute("data-value")) == fit.judged

    # Suggest: each row's judged peak plus what it keeps to spare is the usable memory, as in the summary
    widget.locator('.sv-tab[data-tab="suggest"]').click()
    suggest = widget.locator(".sv-panel-suggest")
    suggest.locator(".sv-suggest-run").click()
    ref = sv.search(model, mesh=mesh, training=TRAINING)
    expect(suggest.locator(".sv-suggest-status")).to_contain_text(f"{ref.n_candidates} plans tried", timeout=240_000)
    first = suggest.locator('.sv-suggest-row[data-index="0"]')
    assert int(first.locator(".sv-suggest-peak").get_attribute("data-value")) == int(ref.table.judged_peak.iloc[0])
    assert int(ref.table.judged_peak.iloc[0]) + int(ref.table.margin.iloc[0]) == mesh.usable_memory
    seen["suggest row 1"] = first.locator(".sv-suggest-peak").text_content()
    print(f"\n[{case}] a.fit: {fit.headline}")
    for where, text in seen.items():
        print(f"[{case}] {where}: {' '.join(text.split())}")
