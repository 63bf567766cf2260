// shardviz charts: one drawing of each chart, shared by the Inspector (its modules in front/ import
// from here; widget/bundle.py reads this classic script's top-level declarations as its exports) and
// the standalone HTML report (inlined in a <script>). Plain functions, no imports, nothing fetched. They draw the payloads Python computes (shardviz/views/display.py:
// memory_payload, traffic_payload, comparison rows); they never compute a number of their own.
// Colours and text follow JupyterLab's theme variables (light and dark), with fallbacks.

const GIB = 1024 ** 3;
// the parts of the peak (views.PEAK_PARTS, in Python), bottom to top
const CAT_CLASS = {
  "sharded params": "sv-c0",
  "whole params": "sv-c1",
  buffers: "sv-c2",
  "optimizer states": "sv-c3",
  gradients: "sv-c4",
  "unsharded params": "sv-c5",
  "communication buffers": "sv-c6",
  activations: "sv-c7",
  temporaries: "sv-c8",
};
const COLL_CLASS = { all_gather: "sv-c0", reduce_scatter: "sv-c3", all_reduce: "sv-c4" };

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------
// a collective or lane as the payload names it (format.format_kind: one spelling on every chart)
const kindName = (names, k) => (names && names[k]) || String(k);

function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "title") el.title = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

const SVGNS = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, ...kids) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, String(v));
  }
  for (const kid of kids.flat()) if (kid) el.append(kid);
  return el;
}

// the one number style of every view (the Inspector, the report, the charts), the same as
// shardviz/format.py's (format_bytes, format_large_count, format_duration, format_percent,
// format_count, format_rate; tests/test_widget_front_end.py runs both): bytes in binary units with two decimals,
// counts in words ("70.55 billion"; never "bn" or "B", which reads as bytes), times in s / ms / µs
function fmt(v, kind) {
  if (v === null || v === undefined || Number.isNaN(Number(v))) return "–";
  const n = Number(v);
  if (kind === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let x = n;
    let i = 0;
    while (Math.abs(x) >= 1024 && i < units.length - 1) {
      x /= 1024;
      i += 1;
    }
    return i === 0 ? `${x.toFixed(0)} B` : `${x.toFixed(2)} ${units[i]}`;
  }
  if (kind === "count") {
    for (const [div, name] of [[1e12, "trillion"], [1e9, "billion"], [1e6, "million"]]) if (Math.abs(n) >= div) return `${(Math.trunc(n) / div).toFixed(2)} ${name}`;
    return Math.trunc(n).toLocaleString("en-US");
  }
  if (kind === "int") return Math.trunc(n).toLocaleString("en-US");
  if (kind === "rate") return Math.round(n).toLocaleString("en-US");
  if (kind === "seconds") {
    if (n >= 0.1 || n === 0) return `${n.toFixed(3)} s`;
    return n >= 1e-4 ? `${(n * 1e3).toFixed(2)} ms` : `${(n * 1e6).toFixed(1)} µs`;
  }
  if (kind === "percent") {
    const pct = 100 * n;
    if (pct > 0 && pct < 0.1) return "<0.1%";
    return pct < 10 ? `${pct.toFixed(1)}%` : `${pct.toFixed(0)}%`;
  }
  return String(v);
}
const fmtBytes = (n) => fmt(n, "bytes");
const fmtCount = (n) => fmt(n, "count");

// an axis's ticks in one unit, picked for the axis's end, no trailing zeros ("0 s, 0.5 s, 1.5 s",
// not "0.000 s, 2.500 s" nor "1500 ms")
function fmtTick(v, end, kind) {
  const units = kind === "seconds" ? [[1, "s"], [1e-3, "ms"], [1e-6, "µs"]] : [[1, ""]];
  const [div, name] = units.find(([d]) => end >= d) || units[units.length - 1];
  return `${+(v / div).toFixed(3)}${name ? " " + name : ""}`;
}

function fmtShape(shape) {
  return `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;
}

function niceStep(max, ticks = 5) {
  if (!(max > 0)) return 1;
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// one byte unit per axis, following the largest value (a 10^9-token sequence reads in PiB, not
// "15000000 GiB")
function axisUnit(top) {
  for (const [div, name] of [[1024 ** 5, "PiB"], [1024 ** 4, "TiB"], [GIB, "GiB"], [1024 ** 2, "MiB"]]) if (top >= div) return [div, name];
  return [1024, "KiB"];
}

// A chart is drawn at the width it is shown (its container's, within [lo, hi]), so that its
// 11 px text stays 11 px: a 820-wide drawing shown 400 px wide read 6 px (issue 37). The width is
// read once, then kept by a ResizeObserver (its callback runs after the page's layout), so that
// drawing a chart never forces JupyterLab's whole layout in the middle of an edit's redraw (three
// charts an edit, each read after its own changes did).
const CHART_WIDTHS = new WeakMap();
const CHART_WIDTH_WATCH = typeof ResizeObserver === "undefined" ? null
  : new ResizeObserver((entries) => { for (const e of entries) CHART_WIDTHS.set(e.target, e.target.clientWidth); });
function chartWidth(el, fallback, lo, hi) {
  let w = el ? CHART_WIDTHS.get(el) : 0;
  if (w === undefined) {
    w = el.clientWidth || 0;
    if (CHART_WIDTH_WATCH) {
      CHART_WIDTHS.set(el, w);
      CHART_WIDTH_WATCH.observe(el);
    }
  }
  return Math.round(Math.min(hi, Math.max(lo, w || fallback)));
}

// ---------------------------------------------------------------------------------------------

function drawMemory(memoryEl, mem, title = "Memory per rank at the peak") {
  memoryEl.replaceChildren();
  memoryEl.append(h("div", { class: "sv-chart-title", text: title }));
  if (!mem.available) {
    memoryEl.append(h("div", { class: "sv-muted", text: mem.reason || "no memory estimate" }));
    return;
  }
  const bars = mem.bars || [];
  const cats = mem.categories || [];
  const W = chartWidth(memoryEl, 520, 320, 720);
  const H = 250;
  const padL = 56;
  const padR = 12;
  const padT = 22;
  const padB = 34;
  const hasLimit = mem.limit != null; // 0 too: a reserve as large as the device leaves nothing usable
  const limit = mem.limit || 0;
  // a limit far above every bar would squash them flat: then it is named, not drawn
  // each bar's cap is its reserved peak (what the caching allocator holds, what the verdict judges)
  const capTop = Math.max(0, ...bars.map((b) => b.reserved || 0));
  const highest = Math.max(mem.max_peak || 0, capTop);
  const limitOnScale = hasLimit && limit <= 4 * highest;
  const top = Math.max(highest, limitOnScale ? limit : 0) * 1.08 || 1;
  const unit = axisUnit(top);
  const stepG = niceStep(top / unit[0]);
  const yOf = (b) => padT + (H - padT - padB) * (1 - b / top);
  const svg = s("svg", { class: "sv-svg sv-memory-svg", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": "memory per rank" });
  for (let g = 0; g * unit[0] <= top; g += stepG) {
    const y = yOf(g * unit[0]);
    svg.append(s("line", { class: "sv-grid", x1: padL, x2: W - padR, y1: y, y2: y }));
    svg.append(s("text", { class: "sv-axis", x: padL - 6, y: y + 4, "text-anchor": "end", text: `${+g.toFixed(2)} ${unit[1]}` }));
  }
  const n = Math.max(bars.length, 1);
  const slot = (W - padL - padR) / n;
  const bw = Math.min(90, slot * 0.7);
  bars.forEach((b, i) => {
    const x = padL + slot * i + (slot - bw) / 2;
    const g = s("g", {
      class: `sv-mem-bar${b.verdict === "over" ? " sv-over" : ""}`,
      "data-verdict": b.verdict || "",
      "data-reserved": b.reserved || 0,
      "data-first": b.first,
      "data-last": b.last,
      "data-peak": b.peak,
    });
    let acc = 0;
    for (const c of cats) {
      const v = b.parts[c.key] || 0;
      if (v <= 0) continue;
      const y1 = yOf(acc + v);
      const y0 = yOf(acc);
      const rect = s("rect", {
        class: `sv-seg ${CAT_CLASS[c.key] || ""}`,
        x,
        y: y1,
        width: bw,
        height: Math.max(0.5, y0 - y1),
        "data-cat": c.key,
        "data-bytes": v,
      });
      rect.append(s("title", { text: `${b.label} · ${c.label}: ${fmtBytes(v)} (${fmt(v, "int")} B)` }));
      g.append(rect);
      acc += v;
    }
    if (b.reserved > b.peak) {
      // the reserved peak as a hollow cap on the allocated stack: the bar's top is what is judged
      const cap = s("rect", { class: "sv-reserved-cap", x, y: yOf(b.reserved), width: bw, height: Math.max(0.5, yOf(b.peak) - yOf(b.reserved)), "data-bytes": b.reserved });
      cap.append(s("title", { text: `${b.label} · reserved by the caching allocator: ${fmtBytes(b.reserved)} (allocated ${fmtBytes(b.peak)})` }));
      g.append(cap);
    }
    const shown = Math.max(b.peak, b.reserved || 0);
    g.append(s("text", { class: "sv-bar-label sv-peak-label", x: x + bw / 2, y: yOf(shown) - 5, "text-anchor": "middle", "data-bytes": shown, text: fmtBytes(shown) }));
    const lab = b.label.length > 14 && n > 4 ? `${b.first}${b.first === b.last ? "" : "–" + b.last}` : b.label;
    g.append(s("text", { class: "sv-axis", x: x + bw / 2, y: H - padB + 14, "text-anchor": "middle", text: lab }));
    svg.append(g);
  });
  const use = mem.use;
  // the limit in words, above the chart: a line of text that wraps (in the chart it was cut at
  // 848 px: "peak uses 300% of 79.00 GiB usable (...)"); red only when the peak does not fit
  const limitWords = hasLimit
    ? h("div", { class: `sv-limit-label${limitOnScale ? "" : " sv-limit-off"}${use && use.over ? " sv-over" : ""}`, text: use ? `${use.text}${limitOnScale ? ` · dashed line: ${use.limit_text}` : ""}` : (mem.limit_text || `device ${fmtBytes(limit)}`) + (limitOnScale ? " (dashed line)" : "") })
    : null;
  if (limitOnScale) {
    const y = yOf(limit);
    svg.append(s("line", { class: `sv-limit${use && use.over ? " sv-over" : ""}`, x1: padL, x2: W - padR, y1: y, y2: y }));
  }
  memoryEl.dataset.revision = String(mem.revision);
  memoryEl.dataset.peak = String(mem.max_peak);
  if (limitWords) memoryEl.append(limitWords);
  memoryEl.append(svg);
  // legend: the breakdown of the worst bar; with one bar per layout (sv.compare) each bar has its
  // own numbers, so the legend names the parts and a note per layout gives its peak
  const worst = bars.reduce((a, b) => (a && a.peak >= b.peak ? a : b), null);
  if (worst) {
    const legend = h("div", { class: "sv-legend" });
    for (const c of cats) {
      if (!mem.by_layout && !(worst.parts[c.key] > 0)) continue; // a 0 B part is not in the bar: not in the legend
      legend.append(
        h(
          "span",
          { class: "sv-legend-item", "data-cat": c.key, title: c.help || c.label },
          h("span", { class: `sv-swatch ${CAT_CLASS[c.key] || ""}` }),
          `${c.label} `,
          mem.by_layout ? null : h("b", { text: fmtBytes(worst.parts[c.key] || 0) }),
        ),
      );
    }
    if (bars.some((b) => b.reserved > b.peak)) {
      legend.append(h("span", { class: "sv-legend-item", "data-cat": "reserved", title: "what PyTorch's caching allocator holds at the peak: the figure the verdict judges" }, h("span", { class: "sv-swatch sv-reserved-swatch" }), "reserved (cap) ", mem.by_layout ? null : h("b", { text: fmtBytes(worst.reserved) })));
    }
    memoryEl.append(legend, ...(mem.by_layout ? bars : [worst]).map(peakMoment));
    if (mem.training) memoryEl.append(h("div", { class: "sv-chart-note sv-chart-training", text: `training: ${mem.training}` }));
  }
}

function peakMoment(b) {
  return h("div", {
    class: "sv-chart-note sv-peak-moment",
    text: `${b.label}: peak ${fmtBytes(b.peak)} allocated${b.reserved ? `, ${fmtBytes(b.reserved)} reserved` : ""} in ${b.phase || "?"}${b.unit ? ` of ${b.unit}` : ""}${b.module && b.module !== b.unit ? `, activations peak at ${b.module}` : ""} · after the step: params ${fmtBytes(b.params)}, grads ${fmtBytes(b.grads)}, optimizer ${fmtBytes(b.optimizer)}`,
  });
}

function drawTraffic(trafficEl, tr) {
  trafficEl.replaceChildren();
  trafficEl.append(h("div", { class: "sv-chart-title", text: "Traffic per step (bytes each rank sends)" }));
  if (!tr.available) {
    trafficEl.append(h("div", { class: "sv-muted", text: tr.reason || "no traffic estimate" }));
    return;
  }
  const colls = tr.collectives || [];
  const byC = tr.by_collective || [];
  const maxC = Math.max(1, ...byC.map((c) => c.sent));
  const W = chartWidth(trafficEl, 520, 320, 760);
  const rowH = 20;
  const labelW = 170;
  const valueW = 120;
  const barW = W - labelW - valueW;
  const svg1 = s("svg", { class: "sv-svg sv-traffic-coll", viewBox: `0 0 ${W} ${byC.length * rowH + 6}`, width: W, height: byC.length * rowH + 6, role: "img", "aria-label": "traffic by collective" });
  byC.forEach((c, i) => {
    const y = 3 + i * rowH;
    const w = Math.max(1, (barW * c.sent) / maxC);
    const g = s("g", { class: "sv-coll-bar", "data-coll": c.collective, "data-bytes": c.sent });
    g.append(s("text", { class: "sv-axis", x: labelW - 6, y: y + 13, "text-anchor": "end", text: `${kindName(tr.names, c.collective)} ×${c.count}` }));
    const rect = s("rect", { class: `sv-seg ${COLL_CLASS[c.collective] || "sv-c5"}`, x: labelW, y: y + 2, width: w, height: rowH - 6 });
    rect.append(s("title", { text: `${kindName(tr.names, c.collective)}: ${c.count} calls, buffers ${fmtBytes(c.bytes)}, sent per rank ${fmtBytes(c.sent)}` }));
    g.append(rect, s("text", { class: "sv-bar-label", x: labelW + w + 4, y: y + 13, text: fmtBytes(c.sent) }));
    svg1.append(g);
  });
  const total = h("div", {
    class: "sv-chart-note",
    text: `total ${fmtBytes(tr.total_sent)} sent per rank per step (${fmtBytes(tr.total_bytes)} moved per step)${tr.time_s ? ` · ≈ ${tr.time_text} at the given bandwidths` : ""}`,
  });
  trafficEl.append(svg1, total);
  const units = tr.by_unit || [];
  if (units.length) {
    const maxU = Math.max(1, ...units.map((u) => u.total));
    const svg2 = s("svg", { class: "sv-svg sv-traffic-units", viewBox: `0 0 ${W} ${units.length * rowH + 6}`, width: W, height: units.length * rowH + 6, role: "img", "aria-label": "traffic by call" });
    units.forEach((u, i) => {
      const y = 3 + i * rowH;
      const g = s("g", { class: "sv-unit-bar", "data-unit": u.unit, "data-bytes": u.total });
      const short = u.label || u.unit; // shortened in Python: common prefix dropped, the end kept
      const label = s("text", { class: "sv-axis", x: labelW - 6, y: y + 13, "text-anchor": "end", text: short });
      label.append(s("title", { text: u.unit }));
      g.append(label);
      let x = labelW;
      for (const c of colls) {
        const v = u.values[c] || 0;
        if (!v) continue;
        const w = Math.max(0.5, (barW * v) / maxU);
        const rect = s("rect", { class: `sv-seg ${COLL_CLASS[c] || "sv-c5"}`, x, y: y + 2, width: w, height: rowH - 6 });
        rect.append(s("title", { text: `${u.unit} · ${kindName(tr.names, c)}: ${fmtBytes(v)}` }));
        g.append(rect);
        x += w;
      }
      g.append(s("text", { class: "sv-bar-label", x: x + 4, y: y + 13, text: fmtBytes(u.total) }));
      svg2.append(g);
    });
    trafficEl.append(
      h("div", { class: "sv-chart-subtitle", text: `by fully_shard call (${tr.n_units} with traffic)` }),
      h("div", { class: "sv-units-scroll" }, svg2),
      h(
        "div",
        { class: "sv-legend" },
        colls.map((c) => h("span", { class: "sv-legend-item" }, h("span", { class: `sv-swatch ${COLL_CLASS[c] || "sv-c5"}` }), kindName(tr.names, c))),
      ),
    );
  }
  trafficEl.dataset.revision = String(tr.revision);
}

const fmtValue = fmt;

function fmtDelta(d, kind) {
  if (!d) return "±0";
  return `${d > 0 ? "+" : "−"}${fmtValue(Math.abs(d), kind)}`;
}

// one pair of horizontal bars (A above B) per row, on one scale
function pairedBars(title, rows, kind, limit, limitText) {
  const W = 520;
  const labelW = 150;
  const valueW = 90;
  const barH = 11;
  const rowH = 2 * barH + 10;
  const barW = W - labelW - valueW;
  const top = Math.max(1, ...rows.flatMap((r) => [r.a, r.b]));
  // a limit far above every bar would squash them flat: then it is named, not drawn
  const limitOnScale = limit && limit <= 4 * top;
  const max = Math.max(top, limitOnScale ? limit : 0);
  const padT = limit ? 14 : 2;
  const H = rows.length * rowH + padT + 2;
  const svg = s("svg", { class: "sv-svg sv-cmp-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  rows.forEach((r, i) => {
    const y = padT + i * rowH;
    const g = s("g", { class: "sv-cmp-pair", "data-key": r.key });
    g.append(s("text", { class: "sv-axis", x: labelW - 6, y: y + barH + 4, "text-anchor": "end", text: r.label }));
    for (const [j, side] of [["a", "A"], ["b", "B"]].entries()) {
      const v = r[side[0]];
      const w = v > 0 ? Math.max(1, (barW * v) / max) : 0;
      const yy = y + j * (barH + 2);
      const rect = s("rect", { class: `sv-seg sv-pair-${side[0]}`, x: labelW, y: yy, width: w, height: barH, "data-side": side[0], "data-value": v });
      rect.append(s("title", { text: `${side[1]} · ${r.label}: ${fmtValue(v, kind)}${kind === "bytes" ? ` (${fmt(v, "int")} B)` : ""}` }));
      g.append(rect, s("text", { class: "sv-bar-label", x: labelW + w + 4, y: yy + barH - 1, text: `${side[1]} ${fmtValue(v, kind)}` }));
    }
    svg.append(g);
  });
  if (limitOnScale) {
    const x = labelW + (barW * limit) / max;
    svg.append(s("line", { class: "sv-limit", x1: x, x2: x, y1: padT - 2, y2: H }));
  }
  // the limit in words under the title, where it wraps (drawn in the chart it was cut at 848 px)
  const words = limit ? h("div", { class: "sv-limit-label", text: `${limitText || `device ${fmtBytes(limit)}`}${limitOnScale ? " (dashed line)" : ""}` }) : null;
  return h("div", { class: "sv-cmp-chart" }, h("div", { class: "sv-chart-subtitle", text: title }), words, svg);
}

// lines against a log2 x axis (sweep: peak memory and bytes sent per rank against world size).
// payload: {title, x_label, y_label, series: [{name, x: [...], y: [...]}], limit, limit_text}
function drawLines(el, p) {
  el.replaceChildren(h("div", { class: "sv-chart-title", text: p.title || "" }));
  const series = p.series || [];
  const xs = [...new Set(series.flatMap((q) => q.x))].sort((a, b) => a - b);
  const ymax = Math.max(1, ...series.flatMap((q) => q.y));
  const limit = p.limit || 0;
  const limitOnScale = limit && limit <= 4 * ymax; // far above every point: named, not drawn
  const top = Math.max(ymax, limitOnScale ? limit : 0) * 1.08;
  const W = chartWidth(el, 520, 320, 720), H = 250, padL = 62, padR = 12, padT = 22, padB = 36;
  const unit = axisUnit(top);
  const lx = (x) => Math.log2(x);
  const x0 = lx(xs[0] || 1), x1 = lx(xs[xs.length - 1] || 2);
  const xOf = (x) => padL + ((W - padL - padR) * (lx(x) - x0)) / Math.max(x1 - x0, 1);
  const yOf = (y) => padT + (H - padT - padB) * (1 - y / top);
  const svg = s("svg", { class: "sv-svg sv-lines-svg", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": p.title || "chart" });
  const step = niceStep(top / unit[0]);
  for (let g = 0; g * unit[0] <= top; g += step) {
    const y = yOf(g * unit[0]);
    svg.append(s("line", { class: "sv-grid", x1: padL, x2: W - padR, y1: y, y2: y }));
    svg.append(s("text", { class: "sv-axis", x: padL - 6, y: y + 4, "text-anchor": "end", text: `${+g.toFixed(2)} ${unit[1]}` }));
  }
  for (const x of xs) svg.append(s("text", { class: "sv-axis", x: xOf(x), y: H - padB + 14, "text-anchor": "middle", text: String(x) }));
  svg.append(s("text", { class: "sv-axis", x: (W + padL) / 2, y: H - 4, "text-anchor": "middle", text: p.x_label || "" }));
  series.forEach((q, i) => {
    const cls = `sv-line sv-l${i % 6}`;
    const d = q.x.map((x, j) => `${j ? "L" : "M"}${xOf(x).toFixed(1)},${yOf(q.y[j]).toFixed(1)}`).join(" ");
    const g = s("g", { class: "sv-series", "data-name": q.name });
    g.append(s("path", { class: cls, d }));
    q.x.forEach((x, j) => {
      const dot = s("circle", { class: `sv-dot sv-l${i % 6}`, cx: xOf(x), cy: yOf(q.y[j]), r: 3, "data-x": x, "data-y": q.y[j] });
      dot.append(s("title", { text: `${q.name}, ${x}: ${fmtBytes(q.y[j])}` }));
      g.append(dot);
    });
    svg.append(g);
  });
  if (limitOnScale) {
    const y = yOf(limit);
    svg.append(s("line", { class: "sv-limit", x1: padL, x2: W - padR, y1: y, y2: y }));
    svg.append(s("text", { class: "sv-limit-label", x: W - padR, y: padT - 8, "text-anchor": "end", text: p.limit_text || `device ${fmtBytes(limit)}` }));
  } else if (limit) {
    svg.append(s("text", { class: "sv-limit-label sv-limit-off", x: W - padR, y: padT - 8, "text-anchor": "end", text: p.limit_text || `device ${fmtBytes(limit)}` }));
  }
  el.append(svg);
  el.append(h("div", { class: "sv-legend" }, series.map((q, i) => h("span", { class: "sv-legend-item" }, h("span", { class: `sv-swatch sv-l${i % 6}` }), q.name))));
}

// one entry point for the report and the notebook chart widget
function drawChart(el, kind, payload, title) {
  if (kind === "memory") drawMemory(el, payload, title);
  else if (kind === "traffic") drawTraffic(el, payload);
  else if (kind === "timeline") drawTimeline(el, payload, title);
  else if (kind === "lines") drawLines(el, title ? { ...payload, title: `${title}: ${payload.title}` } : payload);
  else el.replaceChildren(h("div", { class: "sv-muted", text: `unknown chart ${kind}` }));
}

// the step's timeline (views.timeline_payload): one lane per stream, a bar per event; the compute
// stream's waits on communication (exposed) drawn in red on the compute lane
// the same colours as steptime.timeline_figure (plotly); red is kept for the waits
const TL_CLASS = { forward: "sv-c0", backward: "sv-c3", recompute: "sv-c5", optimizer: "sv-c4", all_gather: "sv-c6", reduce_scatter: "sv-c7", all_reduce: "sv-c2", ignored_all_reduce: "sv-c2", h2d: "sv-c8", d2h: "sv-c8" };
const fmtSeconds = (x) => fmt(x, "seconds");
function drawTimeline(el, p, title = "One step, stream by stream") {
  el.replaceChildren(h("div", { class: "sv-chart-title", text: title }));
  if (!p || !p.available) {
    el.append(h("div", { class: "sv-muted sv-timeline-none", text: (p && p.reason) || "no step time" }));
    return;
  }
  const streams = p.streams || [];
  const events = p.events || [];
  const labels = p.labels || {};
  // as wide as the panel (it was 520 wide at most 620 px: 80 blocks' calls a few pixels each)
  const W = chartWidth(el, 820, 320, 1100), laneH = 30, padL = 104, padR = 24, padT = 6, padB = 30;
  const H = padT + streams.length * laneH + padB;
  const end = p.step_time_s || 1;
  const xOf = (t) => padL + ((W - padL - padR) * t) / end;
  const svg = s("svg", { class: "sv-svg sv-timeline-svg", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": "step timeline" });
  streams.forEach((st, i) => {
    const y = padT + i * laneH;
    svg.append(s("text", { class: "sv-axis", x: padL - 6, y: y + laneH / 2 + 4, "text-anchor": "end", text: kindName(p.names, st) }));
    svg.append(s("line", { class: "sv-grid", x1: padL, x2: W - padR, y1: y + laneH, y2: y + laneH }));
  });
  const step = niceStep(end);
  for (let t = 0; t <= end * 1.0001; t += step) {
    svg.append(s("text", { class: "sv-axis sv-tick", x: xOf(t), y: H - padB + 14, "text-anchor": "middle", text: fmtTick(t, end, "seconds") }));
  }
  for (const e of events) {
    const lane = streams.indexOf(e.stream);
    const y = padT + lane * laneH + 4;
    const x0 = xOf(e.start_s);
    const w = Math.max(0.4, xOf(e.end_s) - x0);
    const name = e.unit ? labels[e.unit] || e.unit : "step";
    const rect = s("rect", { class: `sv-seg sv-tl-event ${TL_CLASS[e.kind] || "sv-c7"}${e.exposed ? " sv-tl-exposed" : ""}`, x: x0, y, width: w, height: laneH - 8, "data-kind": e.kind, "data-unit": e.unit || "", "data-start": e.start_s, "data-end": e.end_s });
    rect.append(s("title", { text: `${name} · ${kindName(p.names, e.kind)} (${e.phase}): ${fmtSeconds(e.end_s - e.start_s)}${e.exposed ? ` · compute waits ${fmtSeconds(e.exposed_s)} for it` : ""}` }));
    svg.append(rect);
    if (e.exposed) {
      const yc = padT + streams.indexOf("compute") * laneH + 4;
      const wait = s("rect", { class: "sv-tl-wait", x: xOf(e.end_s - e.exposed_s), y: yc, width: Math.max(0.6, xOf(e.end_s) - xOf(e.end_s - e.exposed_s)), height: laneH - 8, fill: "#d62728", "data-exposed": e.exposed_s });
      wait.append(s("title", { text: `compute waits ${fmtSeconds(e.exposed_s)} for the ${kindName(p.names, e.kind)} of ${name}` }));
      svg.append(wait);
    }
  }
  el.append(svg);
  const kinds = [...new Set(events.map((e) => e.kind))];
  el.append(
    h("div", { class: "sv-legend" },
      kinds.map((k) => h("span", { class: "sv-legend-item" }, h("span", { class: `sv-swatch ${TL_CLASS[k] || "sv-c7"}` }), kindName(p.names, k))),
      h("span", { class: "sv-legend-item" }, h("span", { class: "sv-swatch", style: "background:#d62728" }), "exposed (compute waits)")),
    h("div", { class: "sv-chart-note sv-timeline-summary", text: p.summary || "" }),
  );
  if (p.note) el.append(h("div", { class: "sv-chart-note", text: p.note }));
}
