"""Smoke test of the browser harness: real JupyterLab + headless Chromium + live widgets.

A notebook builds an ipywidgets.IntSlider and an anywidget.AnyWidget counter (inline _esm).
The test clicks the counter's button in the browser and checks the full round trip:
browser click -> kernel trait change -> (a) a file the kernel writes, (b) a second trait the
kernel sets, rendered back into the DOM.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from playwright.sync_api import expect

STATE_FILE = "smoke_state.json"

SETUP = f'''
import json, pathlib, sys
import anywidget, ipywidgets as widgets, traitlets

STATE = pathlib.Path({STATE_FILE!r}).resolve()

class Counter(anywidget.AnyWidget):
    _esm = """
    function render({{ model, el }}) {{
      const btn = document.createElement("button");
      btn.className = "sv-smoke-counter";
      const echo = document.createElement("span");
      echo.className = "sv-smoke-echo";
      const update = () => {{
        btn.textContent = `count is ${{model.get("count")}}`;
        echo.textContent = `kernel saw ${{model.get("echo")}}`;
      }};
      btn.addEventListener("click", () => {{
        model.set("count", model.get("count") + 1);
        model.save_changes();
      }});
      model.on("change:count", update);
      model.on("change:echo", update);
      update();
      el.append(btn, echo);
    }}
    export default {{ render }};
    """
    count = traitlets.Int(0).tag(sync=True)
    echo = traitlets.Int(-1).tag(sync=True)

def _record(value):
    STATE.write_text(json.dumps({{"count": value, "prefix": sys.prefix}}))

counter = Counter()
def _on_count(change):
    _record(change["new"])      # kernel-side value, for the test to read from disk
    counter.echo = change["new"]  # and back to the browser
counter.observe(_on_count, names="count")
_record(counter.count)

slider = widgets.IntSlider(value=7, min=0, max=10, description="smoke")
'''


@pytest.mark.browser
@pytest.mark.slow
def test_lab_widgets_round_trip(lab_server, lab_page):
    t0 = time.monotonic()
    nb = make_notebook(SETUP, "slider", "counter")
    panel = open_and_run_notebook(lab_page, lab_server, nb, name="smoke.ipynb")

    state_path = lab_server.root_dir / STATE_FILE
    first = json.loads(state_path.read_text())
    assert first["count"] == 0
    # The kernel is the repo venv's python (the kernelspec setup.sh registers).
    assert first["prefix"] == sys.prefix

    # ipywidgets rendered through the widget manager
    slider = panel.locator(".widget-slider")
    expect(slider).to_be_visible()
    expect(slider.locator(".widget-readout")).to_have_text("7")

    # anywidget: click three times, the kernel's echo comes back into the DOM
    button = panel.locator("button.sv-smoke-counter")
    expect(button).to_have_text("count is 0")
    for _ in range(3):
        button.click()
    expect(button).to_have_text("count is 3")
    expect(panel.locator(".sv-smoke-echo")).to_have_text("kernel saw 3", timeout=15_000)

    deadline = time.monotonic() + 10
    while json.loads(state_path.read_text())["count"] != 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(state_path.read_text())["count"] == 3

    shot = save_screenshot(lab_page, "lab_smoke")
    assert shot.stat().st_size > 10_000
    print(f"smoke test body: {time.monotonic() - t0:.1f}s")


@pytest.mark.browser
@pytest.mark.slow
def test_shared_page_opens_notebooks_in_place(lab_server, shared_lab_page):
    """The fast path later widget tests use: one loaded JupyterLab, notebooks swapped in place."""
    for value in (3, 9):
        panel = open_and_run_notebook(
            shared_lab_page,
            lab_server,
            make_notebook(f"import ipywidgets\nipywidgets.IntSlider(value={value}, max=10)"),
            name=f"shared-{value}.ipynb",
        )
        expect(panel.locator(".widget-readout")).to_have_text(str(value))
        # the previous notebook's tab was closed: one notebook panel only
        expect(shared_lab_page.locator(".jp-NotebookPanel")).to_have_count(1)
    save_screenshot(panel, "lab_shared_page_panel")
