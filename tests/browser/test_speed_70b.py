"""Each edit's time to the full numbers on screen, Llama-3.1-70B + LoRA (r=16, on meta), 64 x H100,
``sv.Training(batch_size=1, seq_len=8192)``, at JupyterLab's default 1280 x 800 (issue 37).

Every edit is made in the page as a user makes it and timed there (``performance.now()`` and a
MutationObserver): to the memory chart's next revision with every number measured (``data-pending``
not "true": the full numbers, never the model state alone), and to the findings in (no background
work, no stale findings). First render: from running the cell that makes the Inspector to its
full numbers. Suggest: from the click to its rows. The figures are printed against issue 37's
targets (plan edits <= 300 ms, dtype / sequence / TP / HSDP <= 1 s, first render <= 3 s, Suggest
<= 5 s, findings stale <= 1 s); speed is printed, not asserted (CONTRIBUTING: benchmarks print).
The edits run back to back; ``SHARDVIZ_READING_S=0,5`` adds a pass with 5 s of reading before each.
What is asserted: every edit reaches its full numbers (a timeout fails the test) and the
header's verdict reads a judged peak.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import make_notebook, open_and_run_notebook, save_screenshot
from inspector_page import expand
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PLAN_MS, SETUP_MS = 300, 1000
SETUP = (
    "import shardviz as sv\nfrom shardviz import zoo\n"
    "model = zoo.llama3_70b()\n"
    "training = sv.Training(batch_size=1, seq_len=8192)\n"
)
LAYERS = "base_model.model.model.layers"
BLOCK = LAYERS + ".1"
ROW = f'.sv-row[data-fqn="{BLOCK}"]'
INSPECTOR = "inspector = sv.Inspector(model, mesh=sv.Mesh(shard=64, device='H100'), training=training)\ninspector"

# Run the notebook's second cell; resolve with ms to the first full numbers and to the findings.
_JS_FIRST = """
async ([timeoutMs]) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = 1;
  const cell = nb.widgets[1];
  let full = null, findings = null;
  const t0 = performance.now();
  app.commands.execute('notebook:run-cell');
  return await new Promise((resolve, reject) => {
    const check = () => {
      const root = cell.node.querySelector('.sv-inspector');
      const mem = root && root.querySelector('.sv-memory');
      if (!mem) return;
      const now = performance.now() - t0;
      if (full === null && mem.querySelector('.sv-mem-bar') && mem.dataset.pending === 'false') full = now;
      if (full !== null && findings === null && root.querySelector('.sv-sum-findings:not(.sv-stale)')) findings = now;
      if (findings !== null && !root.querySelector('.sv-work')) {
        obs.disconnect(); resolve({ full, findings, settled: now });
      }
    };
    const obs = new MutationObserver(check);
    obs.observe(cell.node, { subtree: true, childList: true, attributes: true, characterData: true });
    setTimeout(() => { obs.disconnect(); reject(new Error('no first render within ' + timeoutMs + ' ms')); }, timeoutMs);
  });
}
"""

# One edit: a click on `sel`, or `value` set on it (a select or an input, hidden in a drawer or not).
_JS_EDIT = """
async ([sel, value, timeoutMs]) => {
  const root = [...document.querySelectorAll('.sv-inspector')].pop();
  const mem = root.querySelector('.sv-memory');
  const rev = mem.dataset.revision;
  const el = root.querySelector(sel);
  if (!el) throw new Error('no element ' + sel);
  const rowEl = el.closest('.sv-row');  // a row's button: when the row shows the edit (a new element or a new content)
  const rowSel = rowEl ? `.sv-row[data-fqn="${rowEl.dataset.fqn}"]` : null;
  const rowHtml = rowEl ? rowEl.outerHTML : null;
  let full = null, findings = null, rowAt = null;
  return await new Promise((resolve, reject) => {
    const check = () => {
      const now = performance.now() - t0;
      if (rowSel && rowAt === null) {
        const r = root.querySelector(rowSel);
        if (r && r.outerHTML !== rowHtml) rowAt = now;
      }
      if (full === null && mem.dataset.revision !== rev && mem.dataset.pending !== 'true') full = now;
      if (full !== null && findings === null && root.querySelector('.sv-sum-findings:not(.sv-stale)')) findings = now;
      if (findings !== null && !root.querySelector('.sv-work')) {
        obs.disconnect(); resolve({ full, findings, settled: now, row: rowAt });
      }
    };
    const obs = new MutationObserver(check);
    obs.observe(root, { subtree: true, childList: true, attributes: true, characterData: true });
    setTimeout(() => { obs.disconnect(); reject(new Error(`no full numbers within ${timeoutMs} ms`)); }, timeoutMs);
    const t0 = performance.now();
    if (value === null) el.click();
    else { el.value = value; el.dispatchEvent(new Event('change', { bubbles: true })); }
  });
}
"""

_JS_SUGGEST = """
async ([timeoutMs]) => {
  const root = [...document.querySelectorAll('.sv-inspector')].pop();
  root.querySelector('.sv-tab[data-tab="suggest"]').click();
  await new Promise(r => setTimeout(r, 50));
  const t0 = performance.now();
  root.querySelector('.sv-suggest-run').click();
  while (performance.now() - t0 < timeoutMs) {
    if (root.querySelector('.sv-suggest-row') && !root.querySelector('.sv-suggest-cancel:not([hidden])')) return performance.now() - t0;
    await new Promise(r => setTimeout(r, 20));
  }
  throw new Error('no suggestions within ' + timeoutMs + ' ms');
}
"""

EDITS = [  # (name, selector, value or None for a click, target ms)
    ("preset -> LoRA ignored", ".sv-preset", "ignored", PLAN_MS),
    ("checkpoint all blocks", ".sv-ckpt-blocks", None, PLAN_MS),
    ("uncheckpoint all", ".sv-ckpt-blocks", None, PLAN_MS),
    ("undo", ".sv-undo", None, PLAN_MS),
    ("redo", ".sv-redo", None, PLAN_MS),
    ("one block's checkpoint", f"{ROW} .sv-act-ckpt", None, PLAN_MS),
    ("un-ignore LoRA on a block", f"{ROW} .sv-act-unignore-lora", None, PLAN_MS),
    ("param dtype -> float32", ".sv-param-dtype", "float32", SETUP_MS),
    ("sequence 8192 -> 4096", ".sv-seq", "4096", SETUP_MS),
    ("TP 1 -> 2", ".sv-tensor", "2", SETUP_MS),
    ("TP 2 -> 1", ".sv-tensor", "1", SETUP_MS),
    ("HSDP 1 -> 2", ".sv-replicate", "2", SETUP_MS),
    ("undo (HSDP 2 -> 1)", ".sv-undo", None, PLAN_MS),
]


#: seconds the user reads the numbers before the next edit: 0, back to back (every edit pays for its own
#: measurement); with SHARDVIZ_READING_S=0,5 also 5, what the look-ahead (look_ahead.look_ahead) measures
#: meanwhile is ready when asked (a second pass of two minutes: out of the default run, which keeps to 30)
READING_S = tuple(int(s) for s in os.environ.get("SHARDVIZ_READING_S", "0").split(","))


@pytest.mark.parametrize("reading_s", READING_S)
def test_each_edit_to_full_numbers_on_70b_lora(lab_server, shared_lab_page, reading_s):
    page = shared_lab_page
    page.set_viewport_size({"width": 1280, "height": 800})
    panel = open_and_run_notebook(page, lab_server, make_notebook(SETUP, "pass"), name="speed_70b.ipynb",
                                  timeout=600_000)
    page.evaluate("([src]) => window.jupyterapp.shell.currentWidget.content.widgets[1].model.sharedModel.setSource(src)",
                  [INSPECTOR])
    figures = {"first render": {**page.evaluate(_JS_FIRST, [300_000]), "target": 3000}}
    widget = panel.locator(".sv-inspector").first
    for fqn in ("base_model", "base_model.model", "base_model.model.model", LAYERS):  # block 1's row
        expand(widget, fqn)
    group = widget.locator(".sv-row.sv-kind-group").first
    if group.locator(".sv-caret").get_attribute("aria-label") == "expand":
        group.locator(".sv-caret").click()
    expand(widget, BLOCK)
    for name, sel, value, target in EDITS:
        page.wait_for_timeout(reading_s * 1000)
        figures[name] = {**page.evaluate(_JS_EDIT, [sel, value, 180_000]), "target": target}
    ms = page.evaluate(_JS_SUGGEST, [600_000])
    figures["Suggest"] = {"full": ms, "findings": ms, "settled": ms, "target": 5000}
    expect(widget.locator(".sv-suggest-apply").first).to_be_attached()
    figures["apply a suggestion"] = {**page.evaluate(_JS_EDIT, [".sv-suggest-apply", None, 180_000]), "target": PLAN_MS}
    save_screenshot(widget, "inspector_speed_70b_edits")

    print(f"\nLlama-3.1-70B + LoRA, 64 x H100, 1 x 8192, 1280 x 800, {reading_s} s of reading before each edit: "
          "ms to the full numbers, to the findings (SV201's fixes marked as being priced), to the priced fixes; "
          "a row's button: ms to the row showing the edit")
    for name, f in figures.items():
        verdict = "met" if f["full"] <= f["target"] else "MISSED"
        stale = "met" if f["findings"] - f["full"] <= 1000 else "MISSED"
        row = f" (row {f['row']:.0f} ms)" if f.get("row") is not None else ""
        print(f"  {name:<26}{f['full']:9.0f}{f['findings']:10.0f}{f['settled']:10.0f}   target {f['target']:5.0f} ms: "
              f"{verdict}; findings stale <= 1 s: {stale}{row}")
    print(json.dumps({k: {"full_ms": round(v["full"]), "findings_ms": round(v["findings"]), "priced_ms": round(v["settled"])}
                      for k, v in figures.items()}))

    peak = page.evaluate("() => [...document.querySelectorAll('.sv-inspector')].pop().querySelector('.sv-sum-peak')"
                         ".dataset.bytes")
    assert peak and int(float(peak)) > 0
