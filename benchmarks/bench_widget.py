"""How fast the Inspector is in a real browser: JupyterLab + headless Chromium (Playwright).

For each model (built in a first cell, not timed, as a user has it before calling the widget):

- first render: from running the cell ``inspector = sv.Inspector(model, mesh=...)`` to the tree's
  first row and the memory chart drawn in the page (the tree walk, the analysis, the widget's
  messages and the drawing all included). The first run in a kernel is reported apart ("cold":
  the front end's modules load once per page), then the median of the next runs;
- round trip: from a click on a block's "+ unit" / "- unit" button to the memory chart redrawn
  with the new numbers (and, apart, to the block's row showing its new badge), measured in the
  page with ``performance.now()``; the median and the worst of ``--toggles`` clicks.

Targets on the 2-core machine for Llama-3-70B + LoRA (~6,600 modules): first render within 2 s,
round trip within 300 ms.

Run: .venv/bin/python benchmarks/bench_widget.py [--models tiny_llama_lora llama3_70b nllb_moe_54b] [--toggles 20]
Writes artifacts/bench_widget.json and prints a table. Needs /usr/bin/chromium
(./scripts/setup.sh --browser).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import helpers  # noqa: E402

TARGETS = {"llama3_70b": {"first_render_s": 2.0, "round_trip_ms": 300.0}}
WORLD = {"tiny_llama_lora": 4}
DEFAULT_WORLD = 64
# Where the repeated blocks are: the rows opened before the toggles, and the block toggled.
_LLAMA = ("base_model.model.model.layers", "base_model.model.model.layers.1")
BLOCKS = {
    "nllb_moe_54b": ("base_model.model.model.encoder.layers", "base_model.model.model.encoder.layers.1"),
    "qwen3_moe_30b_a3b": _LLAMA,
}

# Put `src` into the notebook's second cell, run it, resolve when a *new* Inspector shows its
# first tree row and its memory chart; returns milliseconds since the run command.
_JS_FIRST_RENDER = """
async ([src, timeoutMs]) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  const nb = panel.content;
  const cell = nb.widgets[1];
  for (const old of document.querySelectorAll('.sv-inspector')) old.dataset.old = '1';
  nb.activeCellIndex = 1;
  cell.model.sharedModel.setSource(src);
  const ready = () => {
    for (const el of cell.node.querySelectorAll('.sv-inspector')) {
      if (el.dataset.old) continue;
      if (el.querySelector('.sv-row[data-id="m0"]') && el.querySelector('.sv-memory .sv-mem-bar')) return true;
    }
    return false;
  };
  const t0 = performance.now();
  app.commands.execute('notebook:run-cell');
  return await new Promise((resolve, reject) => {
    const obs = new MutationObserver(() => {
      if (ready()) { obs.disconnect(); resolve(performance.now() - t0); }
    });
    obs.observe(cell.node, { subtree: true, childList: true, attributes: true });
    setTimeout(() => { obs.disconnect(); reject(new Error('no render within ' + timeoutMs + ' ms')); }, timeoutMs);
  });
}
"""

# Click the unit button of the row for `fqn`; resolve with [ms to the chart redrawn, ms to the
# row's new badge].
_JS_TOGGLE = """
async ([fqn, timeoutMs]) => {
  const root = [...document.querySelectorAll('.sv-inspector')].find(el => !el.dataset.old);
  const mem = root.querySelector('.sv-memory');
  const rev = mem.dataset.revision;
  const rowSel = `.sv-row[data-fqn="${fqn}"]`;
  const badge = root.querySelector(rowSel).dataset.badge;
  let chart = null;
  return await new Promise((resolve, reject) => {
    const check = () => {
      const now = performance.now();
      if (chart === null && mem.dataset.revision !== rev) chart = now - t0;
      const row = root.querySelector(rowSel);
      if (chart !== null && row && row.dataset.badge !== badge) {
        obs.disconnect();
        resolve([chart, now - t0]);
      }
    };
    const obs = new MutationObserver(check);
    obs.observe(root, { subtree: true, childList: true, attributes: true });
    setTimeout(() => { obs.disconnect(); reject(new Error('no update within ' + timeoutMs + ' ms')); }, timeoutMs);
    const t0 = performance.now();
    root.querySelector(rowSel + ' .sv-act-unit').click();
  });
}
"""

_JS_EXPAND = """
async ([sel, timeoutMs]) => {
  const root = [...document.querySelectorAll('.sv-inspector')].find(el => !el.dataset.old);
  const t0 = performance.now();
  const row = root.querySelector(sel);
  if (!row) throw new Error('no row ' + sel);
  const caret = row.querySelector('.sv-caret');
  if (caret.getAttribute('aria-label') === 'expand') caret.click();
  while (performance.now() - t0 < timeoutMs) {
    const r = root.querySelector(sel);
    if (r && r.querySelector('.sv-caret').getAttribute('aria-label') === 'collapse') return performance.now() - t0;
    await new Promise(r => setTimeout(r, 5));
  }
  throw new Error('did not expand ' + sel);
}
"""


def bench_model(page, server, name: str, renders: int, toggles: int) -> dict:
    world = WORLD.get(name, DEFAULT_WORLD)
    setup = (
        "import time, shardviz as sv\n"
        "from shardviz import zoo\n"
        f"t0 = time.perf_counter(); model = zoo.build({name!r}); build_s = time.perf_counter() - t0\n"
        "print(f'model built in {build_s:.1f}s')\n"
    )
    nb = helpers.make_notebook(setup, "pass")
    helpers.open_and_run_notebook(page, server, nb, name=f"bench_{name}.ipynb", timeout=600_000)
    src = f"inspector = sv.Inspector(model, mesh=sv.Mesh(shard={world}))\ninspector"
    times = [page.evaluate(_JS_FIRST_RENDER, [src, 120_000]) / 1000 for _ in range(renders)]
    page.wait_for_timeout(300)

    # open the tree down to the repeated blocks, then one block row
    blocks, block = BLOCKS.get(name, _LLAMA)
    parts = blocks.split(".")
    expand_ms = []
    for i in range(1, len(parts) + 1):
        fqn = ".".join(parts[:i])
        expand_ms.append(page.evaluate(_JS_EXPAND, [f'.sv-row[data-fqn="{fqn}"]', 30_000]))
    expand_ms.append(page.evaluate(_JS_EXPAND, [".sv-row.sv-kind-group", 30_000]))
    chart, rows = [], []
    for _ in range(toggles):
        c, r = page.evaluate(_JS_TOGGLE, [block, 30_000])
        chart.append(c)
        rows.append(r)
        page.wait_for_timeout(50)
    n_modules = page.evaluate(
        "() => [...document.querySelectorAll('.sv-inspector')].find(el => !el.dataset.old)"
        ".querySelector('.sv-summary').innerText.replace(/\\s+/g, ' ')"
    )
    return {
        "model": name,
        "world": world,
        "summary": n_modules,
        "first_render_cold_s": round(times[0], 3),
        "first_render_warm_median_s": round(statistics.median(times[1:]), 3) if len(times) > 1 else None,
        "first_render_all_s": [round(t, 3) for t in times],
        "expand_ms": [round(t, 1) for t in expand_ms],
        "round_trip_chart_median_ms": round(statistics.median(chart), 1),
        "round_trip_chart_max_ms": round(max(chart), 1),
        "round_trip_rows_median_ms": round(statistics.median(rows), 1),
        "round_trip_rows_max_ms": round(max(rows), 1),
        "toggles": toggles,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny_llama_lora", "llama3_70b", "nllb_moe_54b"],
                        help="zoo names (nllb_moe_54b is the zoo's largest MoE)")
    parser.add_argument("--renders", type=int, default=4, help="first-render runs per model (the first is cold)")
    parser.add_argument("--toggles", type=int, default=20)
    parser.add_argument("--out", default=str(helpers.ARTIFACTS_DIR / "bench_widget.json"))
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-widget-") as tmp:
        server = helpers.start_lab_server(Path(tmp) / "root", Path(tmp) / "home",
                                          helpers.ARTIFACTS_DIR / "jupyter-server-bench.log")
        try:
            with sync_playwright() as pw:
                browser = helpers.launch_chromium(pw)
                try:
                    for name in args.models:
                        context = browser.new_context(viewport={"width": 1400, "height": 1000})
                        page = context.new_page()
                        t0 = time.perf_counter()
                        res = bench_model(page, server, name, args.renders, args.toggles)
                        res["wall_s"] = round(time.perf_counter() - t0, 1)
                        results.append(res)
                        helpers.save_screenshot(page, f"bench_widget_{name}")
                        context.close()
                        helpers.shutdown_all_kernels(server)
                        print(json.dumps(res), flush=True)
                finally:
                    browser.close()
        finally:
            helpers.stop_lab_server(server)

    ok = True
    print()
    print(f"{'model':<18}{'first render cold':>19}{'warm (median)':>15}{'toggle->chart med/max':>24}{'toggle->rows med/max':>23}")
    for r in results:
        warm = f"{r['first_render_warm_median_s']:.2f} s" if r["first_render_warm_median_s"] is not None else "-"
        print(f"{r['model']:<18}{r['first_render_cold_s']:>17.2f} s{warm:>15}"
              f"{r['round_trip_chart_median_ms']:>15.0f} / {r['round_trip_chart_max_ms']:<4.0f}ms"
              f"{r['round_trip_rows_median_ms']:>14.0f} / {r['round_trip_rows_max_ms']:<4.0f}ms")
        target = TARGETS.get(r["model"])
        if target:
            fr_ok = r["first_render_cold_s"] <= target["first_render_s"]
            rt_ok = r["round_trip_chart_median_ms"] <= target["round_trip_ms"]
            ok &= fr_ok and rt_ok
            print(f"  target: first render <= {target['first_render_s']} s: {'met' if fr_ok else 'MISSED'}; "
                  f"round trip <= {target['round_trip_ms']:.0f} ms: {'met' if rt_ok else 'MISSED'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwritten {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
