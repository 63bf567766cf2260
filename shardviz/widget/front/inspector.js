// inspector.js: the charts panel, the tabs, and render (the anywidget entry point), which builds
// the components and wires the traits and messages to them. The entry module: `export default`.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { drawMemory, drawTimeline, drawTraffic, h } from "../charts.js";
import { makeContext } from "./base.js";
import { headerCard } from "./header.js";
import { messagesComponent, summaryComponent } from "./summary.js";
import { controlsComponent } from "./controls.js";
import { treeComponent } from "./tree.js";
import { comparePanel } from "./compare.js";
import { findingsPanel } from "./findings.js";
import { suggestPanel } from "./suggest.js";
import { exportPanel } from "./export.js";

// ---------------------------------------------------------------------------------------------
// charts: charts.js draws them (the report uses the same functions)
// ---------------------------------------------------------------------------------------------
function chartsPanel(ctx) {
  const memoryEl = h("div", { class: "sv-memory" });
  const trafficEl = h("div", { class: "sv-traffic" });
  const timelineEl = h("div", { class: "sv-timeline" });
  const el = h("div", { class: "sv-panel sv-panel-charts", "data-panel": "charts" }, memoryEl, trafficEl, timelineEl);
  let lastFull = null; // the last memory payload with every number measured
  let drawnMem = null; // the memory payload drawn (a pending one keeps the last full one: no redraw)
  // the charts are drawn at the width they are shown (charts.js: chartWidth): again when it changes
  // (a tab shown, the file browser opened), so that their text stays 11 px
  let drawnWidth = 0;
  const redraw = (w) => {
    if (!w || Math.abs(w - drawnWidth) < 8) return;
    drawnWidth = w;
    drawnMem = null;
    panel.renderMemory();
    panel.renderTraffic();
    panel.renderTimeline();
  };
  if (typeof ResizeObserver !== "undefined") {
    new ResizeObserver(() => {
      const w = el.clientWidth; // read here, just after the page's layout (in the next frame it could force one)
      requestAnimationFrame(() => redraw(w));
    }).observe(el);
  }
  const panel = {
    el,
    renderTimeline: () => drawTimeline(timelineEl, ctx.model.get("timeline") || {}),
    renderMemory: () => {
      const mem = ctx.model.get("memory") || {};
      // never a partial answer: while the activations are measured, the last full numbers stay,
      // dimmed, on their own axis, with what is being measured; before any, no numbers at all
      if (!mem.pending) lastFull = mem;
      if (mem.pending && lastFull) {
        if (drawnMem !== lastFull) drawMemory(memoryEl, lastFull);
        drawnMem = lastFull;
      } else if (mem.pending) {
        memoryEl.replaceChildren(h("div", { class: "sv-chart-title", text: "Memory per rank at the peak" }));
        drawnMem = null;
      } else {
        drawMemory(memoryEl, mem);
        drawnMem = mem;
      }
      memoryEl.dataset.revision = String(mem.revision ?? "");
      memoryEl.dataset.pending = mem.pending ? "true" : "false";
      memoryEl.classList.toggle("sv-updating", !!mem.pending);
      if (mem.pending) memoryEl.firstChild.after(pendingNote(lastFull && lastFull !== mem ? `updating: ${mem.pending}` : mem.pending));
    },
    renderTraffic: () => drawTraffic(trafficEl, ctx.model.get("traffic") || {}),
  };
  return panel;
}

// a status line with a CSS spinner (no emoji: it needs a font that may not be installed)
function pendingNote(text) {
  return h("div", { class: "sv-pending-note", role: "status" }, h("span", { class: "sv-spinner", "aria-hidden": "true" }), text);
}

// ---------------------------------------------------------------------------------------------
// tabs: the panels under the tree, and the pin buttons of A vs B
// ---------------------------------------------------------------------------------------------
const TABS = [
  ["charts", "Memory & traffic"],
  ["compare", "A vs B"],
  ["findings", "Findings"],
  ["suggest", "Suggest"],
  ["export", "Export"],
];

function tabsComponent(ctx) {
  const buttons = TABS.map(([key, label]) => h("button", { class: "sv-tab", "data-tab": key, text: label, onclick: () => open(key) }));
  const pin = h("button", {
    class: "sv-btn sv-pin",
    text: "pin as A",
    title: "keep the current plan, mesh and training as A; the A vs B tab then compares it with every later change (B)",
    onclick: () => ctx.send("pin"),
  });
  const unpin = h("button", { class: "sv-btn sv-unpin", text: "unpin A", title: "forget A", hidden: true, onclick: () => ctx.send("unpin") });
  const el = h("div", { class: "sv-tabs" }, h("div", { class: "sv-tablist", role: "tablist" }, buttons), h("span", { class: "sv-pin-box" }, pin, unpin));
  let panels = [];
  function show(key) {
    for (const b of buttons) b.classList.toggle("sv-active", b.dataset.tab === key);
    for (const p of panels) p.hidden = p.dataset.panel !== key;
    ctx.root.dataset.tab = key;
  }
  function open(key) {
    show(key);
    ctx.send("set_tab", { tab: key });
  }
  const tabButton = (key) => buttons.find((b) => b.dataset.tab === key);
  const setPanels = (list) => (panels = list);
  return { el, show, open, tabButton, setPanels, pinButtons: { pin, unpin } };
}

// ---------------------------------------------------------------------------------------------
// render: build the components, then wire the traits and messages to them
// ---------------------------------------------------------------------------------------------
function render({ model, el }) {
  const ctx = makeContext(model);
  const tabs = tabsComponent(ctx);
  const summary = summaryComponent(ctx, { openCompare: () => tabs.open("compare") });
  const card = headerCard(ctx, { openFindings: () => tabs.open("findings") });
  const messages = messagesComponent(ctx);
  ctx.onLocalError = messages.localError;
  const tree = treeComponent(ctx);
  const controls = controlsComponent(ctx, { onRafChoices: tree.queue });
  const charts = chartsPanel(ctx);
  const compare = comparePanel(ctx, { pinButtons: tabs.pinButtons, setTabLabel: (text) => (tabs.tabButton("compare").textContent = text) });
  const findings = findingsPanel(ctx, { tabButton: tabs.tabButton });
  const suggest = suggestPanel(ctx);
  const exporter = exportPanel(ctx);
  tabs.setPanels([charts.el, compare.el, findings.el, suggest.el, exporter.el]);
  const views = h("div", { class: "sv-views" }, tabs.el, charts.el, compare.el, findings.el, suggest.el, exporter.el);
  ctx.root = h("div", { class: "sv-inspector" }, card.el, summary.el, controls.el, messages.el, tree.el, views);
  el.append(ctx.root);

  const renderSummary = () => {
    card.render();
    summary.render();
    tree.showFilter((model.get("summary") || {}).filter || {});
  };
  const onCustom = (msg) => {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "rows") tree.onRows(msg);
    else if (msg.type === "reveal") tree.onReveal(msg.id);
    else if (msg.type === "ack") ctx.onAck(msg);
  };
  const handlers = [
    ["msg:custom", onCustom],
    ["change:summary", () => (renderSummary(), messages.render())],
    ["change:work", renderSummary],
    ["change:controls", controls.render],
    ["change:messages", messages.render],
    ["change:memory", charts.renderMemory],
    ["change:traffic", charts.renderTraffic],
    ["change:timeline", () => (charts.renderTimeline(), card.render())],
    ["change:findings", () => (findings.render(), card.render())],
    ["change:comparison", () => (compare.render(), renderSummary())],
    ["change:suggestions", suggest.render],
    ["change:code", exporter.renderCode],
    ["change:verify_result", exporter.renderVerify],
    ["change:tab", () => tabs.show(model.get("tab"))],
    ["change:torch_version", exporter.showVersion],
  ];
  for (const [ev, fn] of handlers) model.on(ev, fn);

  renderSummary();
  controls.render();
  messages.render();
  charts.renderMemory();
  charts.renderTraffic();
  charts.renderTimeline();
  findings.render();
  compare.render();
  suggest.render();
  exporter.renderCode();
  exporter.renderVerify();
  tabs.show(model.get("tab") || "charts");
  model.send({ type: "hello", req: 0 });

  return () => {
    tree.dispose();
    for (const [ev, fn] of handlers) model.off(ev, fn);
  };
}

export default { render };
