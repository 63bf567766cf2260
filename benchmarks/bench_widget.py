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

``--python``: no browser, the widget's Python path alone (issue 37's edit list): Llama-3.1-70B +
LoRA, 64 x H100, ``sv.Training(batch_size=1, seq_len=8192)``, each edit made on ``InspectorState``
as the widget makes it, timed to the full numbers (memory, traffic, timeline: what the charts and
the header draw) then to the first findings (no what-if priced: what the Inspector shows at once) and to the priced ones (SV201's what-ifs), wall and CPU seconds; the Inspector's gc.freeze first (``--no-gc-freeze``: without). ``--ahead``
runs the widget's look-ahead (``look_ahead.look_ahead``) between edits, as the worker does while
the user reads the numbers. Targets: plan edits <= 300 ms, dtype / sequence / TP / HSDP <= 1 s,
first render <= 3 s, Suggest <= 5 s.

``--python --cell``: a notebook cell's own analysis while an Inspector on 70B looks ahead, against
the same alone (one step measured at a time per process: the cell's stops the look-ahead's).

``--python --suggest-only``: the same state, then Suggest alone: cold (only the current plan's step
measured, by the first render) and twice warm (every measurement cached; the search kept from the run
before is dropped first, so that the search itself is timed), wall and CPU seconds and the
cyclic gc's CPU seconds per generation (``gc.callbacks``); ``--profile FILE`` writes the cold run's
cProfile stats (``artifacts/bench_widget_suggest.json``).
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


#: (name, the edit on an InspectorState, its target in ms to the full numbers)
PLAN_MS, SETUP_MS = 300, 1000
PY_EDITS = [
    ("preset -> LoRA ignored", lambda st: st.apply_preset("ignored"), PLAN_MS),
    ("one block's checkpoint", lambda st: st.toggle_checkpoint(st.blocks()[1]), PLAN_MS),
    ("un-ignore LoRA on a block", lambda st: st.unignore_lora(st.blocks()[1]), PLAN_MS),
    ("checkpoint all blocks", lambda st: st.checkpoint_blocks(True), PLAN_MS),
    ("uncheckpoint all", lambda st: st.checkpoint_blocks(False), PLAN_MS),
    ("undo", lambda st: st.undo(), PLAN_MS),
    ("redo", lambda st: st.redo(), PLAN_MS),
    ("param dtype -> float32", lambda st: st.set_training(param_dtype="float32"), SETUP_MS),
    ("param dtype -> bfloat16", lambda st: st.set_training(param_dtype="bfloat16"), SETUP_MS),
    ("sequence 8192 -> 4096", lambda st: st.set_training(seq_len=4096), SETUP_MS),
    ("sequence 4096 -> 8192", lambda st: st.set_training(seq_len=8192), SETUP_MS),
    ("TP 1 -> 2", lambda st: st.set_tensor(2), SETUP_MS),
    ("TP 2 -> 1", lambda st: st.set_tensor(1), SETUP_MS),
    ("HSDP 1 -> 2", lambda st: st.set_mesh(replicate=2), SETUP_MS),
    ("undo (HSDP 2 -> 1)", lambda st: st.undo(), PLAN_MS),
]


def _clock():
    return time.perf_counter(), time.process_time()


def _since(t) -> tuple[float, float]:
    return time.perf_counter() - t[0], time.process_time() - t[1]


def bench_python(model_name: str = "llama3_70b", ahead: bool = False, suggest: bool = True,
                 gc_freeze: bool = True) -> list[dict]:
    """The widget's Python path, edit by edit (see the module docstring, ``--python``)."""
    t = _clock()
    import shardviz as sv
    from shardviz import collector, zoo
    from shardviz.widget import background, look_ahead
    from shardviz.widget.controller import InspectorState

    out = [{"edit": "import shardviz", "wall_s": _since(t)[0]}]
    t = _clock()
    model = zoo.build(model_name)
    out.append({"edit": "build the model on meta", "wall_s": _since(t)[0]})
    mesh, training = sv.Mesh(shard=64, device="H100"), sv.Training(batch_size=1, seq_len=8192)

    def numbers(st):
        for key in ("memory", "traffic", "timeline"):
            getattr(st, key)

    def timed(name, edit, target_ms, st=None):
        with collector.quiet():  # as the widget runs an edit and its worker's jobs (``collector``)
            t = _clock()
            st = edit(st) if st is None else (edit(st), st)[1]
            numbers(st)
            wall, cpu = _since(t)
            st.first_findings
            first, _ = _since(t)
            st.findings
            fwall, _ = _since(t)
        row = {"edit": name, "wall_s": wall, "cpu_s": cpu, "first_findings_s": first, "findings_s": fwall,
               "target_s": target_ms / 1000}
        out.append(row)
        print(f"  {name:<26}{1000 * wall:9.0f} ms{1000 * cpu:9.0f} ms cpu{1000 * first:8.0f} ms{1000 * fwall:9.0f} ms"
              f"   target {target_ms:5.0f} ms: {'met' if wall <= target_ms / 1000 else 'MISSED'}", flush=True)
        if ahead:
            look_ahead.look_ahead(st)
        return st

    print(f"{model_name} + LoRA, 64 x H100, 1 x 8192: to the full numbers (wall, cpu), to the first findings "
          "(no what-if priced), to the priced findings")
    if gc_freeze:  # as sv.Inspector does when it is made (background.freeze_long_lived)
        background.freeze_long_lived()
    st = timed("first render", lambda _: InspectorState(model, mesh=mesh, training=training), 3000)
    for name, edit, target in PY_EDITS:
        timed(name, edit, target, st)
    if suggest:
        t = _clock()
        st.suggest()
        wall, cpu = _since(t)
        out.append({"edit": "Suggest", "wall_s": wall, "cpu_s": cpu, "target_s": 5.0})
        print(f"  {'Suggest':<26}{1000 * wall:9.0f} ms{1000 * cpu:9.0f} ms cpu   target  5000 ms: "
              f"{'met' if wall <= 5 else 'MISSED'}", flush=True)
        timed("apply a suggestion", lambda s: s.apply_suggestion(0), PLAN_MS, st)
    return out


def bench_suggest(model_name: str = "llama3_70b", repeats: int = 3, profile: str | None = None,
                  gc_freeze: bool = True) -> list[dict]:
    """``--suggest-only``: build the state (first render), then time Suggest alone, cold (the
    activations of the current plan measured by the first render, nothing else) and warm (the same
    search again, every measurement cached); wall and CPU seconds, and the cyclic gc's share
    (``gc.callbacks``: CPU seconds spent in collections, per generation)."""
    import cProfile
    import gc

    import shardviz as sv
    from shardviz import zoo
    from shardviz.widget import background
    from shardviz.widget.controller import InspectorState

    model = zoo.build(model_name)
    mesh, training = sv.Mesh(shard=64, device="H100"), sv.Training(batch_size=1, seq_len=8192)
    if gc_freeze:  # as sv.Inspector does when it is made (background.freeze_long_lived)
        background.freeze_long_lived()
    t = _clock()
    st = InspectorState(model, mesh=mesh, training=training)
    for key in ("memory", "traffic", "timeline"):
        getattr(st, key)
    print(f"{model_name} + LoRA, 64 x H100, 1 x 8192: state built in {_since(t)[0]:.1f} s")
    gc_s, gc_n, started = [0.0, 0.0, 0.0], [0, 0, 0], {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = time.process_time()
        elif "t" in started:
            gc_s[info["generation"]] += time.process_time() - started.pop("t")
            gc_n[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    out = []
    try:
        for i in range(repeats):
            gc_s[:], gc_n[:] = [0.0, 0.0, 0.0], [0, 0, 0]
            prof = cProfile.Profile() if profile and i == 0 else None
            t = _clock()
            if prof:
                prof.enable()
            st.searched.clear()  # the search itself each time (a click finds a kept search at once)
            found = st.suggest()
            if prof:
                prof.disable()
                prof.dump_stats(profile)
            wall, cpu = _since(t)
            row = {"edit": f"Suggest ({'cold' if i == 0 else 'warm'})", "wall_s": wall, "cpu_s": cpu,
                   "gc_s": sum(gc_s), "gc_by_generation_s": list(gc_s), "gc_collections": list(gc_n),
                   "candidates": found.n_candidates, "analysed": found.n_analysed, "target_s": 5.0}
            out.append(row)
            print(f"  {row['edit']:<16}{1000 * wall:9.0f} ms{1000 * cpu:9.0f} ms cpu   gc {1000 * sum(gc_s):6.0f} ms cpu "
                  f"(collections by generation {gc_n}, gen 2 {1000 * gc_s[2]:.0f} ms)   "
                  f"{found.n_candidates} plans, {found.n_analysed} analysed   target 5000 ms: "
                  f"{'met' if wall <= 5 else 'MISSED'}", flush=True)
    finally:
        gc.callbacks.remove(on_gc)
    return out


def bench_memory(model_name: str = "llama3_70b", edits: int = 150) -> list[dict]:
    """``--python --memory``: the process's resident memory over ``edits`` edits that each make a new
    profile (one block's checkpoint toggled, blocks in turn), every 25 edits after a collection: what
    the kept profiles and measurements cost (``activations.measure``: the least recently used go past 64)."""
    import gc
    import os

    import shardviz as sv
    from shardviz import zoo
    from shardviz.widget.controller import InspectorState

    def rss_mib() -> float:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    model = zoo.build(model_name)
    st = InspectorState(model, mesh=sv.Mesh(shard=64, device="H100"), training=sv.Training(batch_size=1, seq_len=8192))
    st.memory  # noqa: B018
    gc.collect()
    start, out, blocks = rss_mib(), [], st.blocks()
    print(f"{model_name} + LoRA, 64 x H100, 1 x 8192: {start:.0f} MiB after the first render")
    for i in range(1, edits + 1):
        st.toggle_checkpoint(blocks[i % (len(blocks) - 1) + 1])
        for key in ("memory", "traffic", "timeline"):
            getattr(st, key)
        if i % 25 == 0:
            gc.collect()
            now = rss_mib()
            out.append({"edits": i, "rss_mib": now, "per_edit_mib": (now - start) / i})
            print(f"  {i:4d} edits {now:7.0f} MiB   {(now - start) / i:5.1f} MiB an edit", flush=True)
    return out


def bench_cell(model_name: str = "llama3_70b", edits: int = 4) -> list[dict]:
    """``--python --cell``: a notebook cell's own analysis (the zoo's tiny Llama + LoRA, a sequence not
    measured yet) run while an Inspector on ``model_name`` looks ahead after an edit (1.5 s after it),
    against the same analysis with nothing beside it: one step at a time per process
    (``measure_cache.one_step``), the look-ahead's measurement stopped for the cell's."""
    import shardviz as sv
    from shardviz import zoo
    from shardviz.widget import Inspector

    model, small = zoo.build(model_name), zoo.tiny_llama_lora()
    mesh, out = sv.Mesh(shard=4, device="H100"), []

    def cell(seq: int) -> float:
        t = time.perf_counter()
        sv.analyze(small, None, mesh, sv.Training(batch_size=1, seq_len=seq)).memory  # noqa: B018
        return time.perf_counter() - t

    cell(16)  # the imports a first step pays, once
    alone = [cell(20 + i) for i in range(edits)]
    ins = Inspector(model, mesh=sv.Mesh(shard=64, device="H100"), training=sv.Training(batch_size=1, seq_len=8192),
                    background=True)
    ins.pushes.ahead = True  # as with a front end
    ins.wait(300)
    beside = []
    for i in range(edits):
        ins.handle_action("set_training", {"seq_len": 4096 + 8 * i})
        time.sleep(1.5)
        beside.append(cell(40 + i))
    ins.pushes.cancel()
    for what, times in (("alone", alone), ("beside the look-ahead", beside)):
        out.append({"cell": what, "wall_s": times})
        print(f"  a cell's analysis {what:<22}" + " ".join(f"{1000 * t:6.0f} ms" for t in times), flush=True)
    return out


def python_main(args) -> int:
    """``--python``: no browser (the edits, ``--suggest-only`` or ``--memory``), written as JSON."""
    sys.path.insert(0, str(ROOT))
    if args.suggest_only:
        rows = bench_suggest(profile=args.profile, gc_freeze=not args.no_gc_freeze)
    elif args.memory:
        rows = bench_memory()
    elif args.cell:
        rows = bench_cell()
    else:
        rows = bench_python(ahead=args.ahead, suggest=not args.no_suggest, gc_freeze=not args.no_gc_freeze)
    kind = "suggest" if args.suggest_only else "memory" if args.memory else "cell" if args.cell else "python"
    out = Path(args.out).with_name(f"bench_widget_{kind}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"written {out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="store_true", help="no browser: the widget's Python path, edit by edit")
    parser.add_argument("--ahead", action="store_true", help="with --python: the look-ahead between edits")
    parser.add_argument("--no-suggest", action="store_true", help="with --python: leave Suggest out")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="with --python: without the Inspector's gc.freeze of what exists when it is made")
    parser.add_argument("--suggest-only", action="store_true",
                        help="with --python: build the state, then time Suggest alone, cold then warm, with gc's share")
    parser.add_argument("--profile", help="with --suggest-only: write the cold Suggest's cProfile stats here")
    parser.add_argument("--memory", action="store_true",
                        help="with --python: resident memory over 150 edits that each make a new profile")
    parser.add_argument("--cell", action="store_true",
                        help="with --python: a notebook cell's analysis while an Inspector looks ahead, and alone")
    parser.add_argument("--models", nargs="+", default=["tiny_llama_lora", "llama3_70b", "nllb_moe_54b"],
                        help="zoo names (nllb_moe_54b is the zoo's largest MoE)")
    parser.add_argument("--renders", type=int, default=4, help="first-render runs per model (the first is cold)")
    parser.add_argument("--toggles", type=int, default=20)
    parser.add_argument("--out", default=str(helpers.ARTIFACTS_DIR / "bench_widget.json"))
    args = parser.parse_args(argv)
    if args.python:
        return python_main(args)

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
