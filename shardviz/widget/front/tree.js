// tree.js: the tree's filters and header, names fitted to their cell, and treeComponent, the
// virtualised list of the visible rows (built by tree_rows.js).
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, h } from "../charts.js";
import { MAX_TREE_H, OVERSCAN, ROW_H, selectOf } from "./base.js";
import { buildRow } from "./tree_rows.js";

// ---------------------------------------------------------------------------------------------
// tree: filters, a virtualised list of the visible rows (Python sends only the rows that changed)
// ---------------------------------------------------------------------------------------------
function treeFilters(ctx) {
  const text = h("input", { class: "sv-filter-text", type: "search", placeholder: "filter by name…", "aria-label": "filter by name" });
  const status = selectOf("sv-filter-status", "filter by status", [
    ["", "any status"],
    ["unit", "own unit"],
    ["sharded", "sharded params"],
    ["ignored", "ignored params"],
    ["unmanaged", "unmanaged params"],
    ["mixed", "mixed modules"],
  ]);
  const role = selectOf("sv-filter-role", "filter by role", [
    ["", "any role"],
    ["base", "base params"],
    ["lora", "LoRA params"],
  ]);
  const collapse = h("button", { class: "sv-btn sv-collapse-all", text: "collapse all", onclick: () => ctx.send("collapse_all") });
  const note = h("span", { class: "sv-filter-note" });
  const el = h("div", { class: "sv-tree-toolbar" }, text, status, role, collapse, note);

  let timer = null;
  const sendFilter = () => ctx.send("set_filter", { text: text.value, status: status.value, role: role.value });
  text.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(sendFilter, 250);
  });
  text.addEventListener("keydown", (e) => {
    e.stopPropagation(); // keep JupyterLab's notebook shortcuts out of the text box
    if (e.key === "Enter") {
      clearTimeout(timer);
      sendFilter();
    }
  });
  status.addEventListener("change", sendFilter);
  role.addEventListener("change", sendFilter);

  function show(fl) {
    if (document.activeElement !== text) text.value = fl.text || "";
    status.value = fl.status || "";
    role.value = fl.role || "";
  }
  const clear = h("button", { class: "sv-btn sv-filter-clear", text: "clear", title: "show the whole tree again", hidden: true, onclick: () => ctx.send("set_filter", { text: "", status: "", role: "" }) });
  el.append(clear);
  function showMatches(msg) {
    note.textContent =
      msg.filtering && msg.matches === 0
        ? "nothing matches this filter: no module or parameter has this name, status and role"
        : msg.truncated
          ? `${fmt(msg.truncated, "int")} more matches not shown: refine the filter`
          : msg.filter_label
            ? `showing ${msg.filter_label}`
            : "";
    note.dataset.matches = msg.filtering ? String(msg.matches) : "";
    clear.hidden = !msg.filtering;
  }
  return { el, show, showMatches };
}

function treeHeader() {
  return h(
    "div",
    { class: "sv-row sv-header" },
    h("span", { class: "sv-col-name", text: "module / parameter" }),
    h("span", { class: "sv-col-type", text: "type / dtype" }),
    h("span", { class: "sv-col-size", text: "elements", title: "number of elements (modules: every parameter under it, tied ones once) or shape (parameters)" }),
    h("span", { class: "sv-col-status", text: "status" }),
    h("span", { class: "sv-col-bytes", text: "per rank", title: "parameter bytes each rank allocates (padded shards; whole tensors for ignored and unmanaged)" }),
    h("span", { class: "sv-col-local", text: "local shard" }),
    h("span", { class: "sv-col-actions", text: "actions" }),
  );
}

// A name wider than its cell loses its middle, not its end: siblings differ at either end
// ("lora_embedding_A" / "lora_embedding_B", "input_layernorm" / "post_attention_layernorm").
const measureCanvas = document.createElement("canvas").getContext("2d");
// Every name's room and font read first, then every name written: one layout of the page for all
// the rows drawn, not one per row (a write between two reads makes the next read lay out again).
function fitNames(els) {
  const fits = els.map((el) => {
    const style = getComputedStyle(el);
    return [el, el.parentElement.clientWidth - (el.offsetLeft - el.parentElement.offsetLeft) - 4,
      `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`];
  });
  for (const [el, room, font] of fits) fitName(el, room, font);
}

function fitName(el, room, font) {
  const full = el.dataset.full || el.textContent;
  el.dataset.full = full;
  measureCanvas.font = font;
  if (room <= 0 || measureCanvas.measureText(full).width <= room) {
    el.textContent = full;
    delete el.dataset.shortened;
    return;
  }
  let keep = full.length - 1;
  const cut = (k) => `${full.slice(0, Math.ceil(k * 0.4))}…${full.slice(full.length - Math.floor(k * 0.6))}`;
  while (keep > 2 && measureCanvas.measureText(cut(keep)).width > room) keep -= 1;
  el.textContent = cut(keep);
  el.dataset.shortened = "1";
}

// Redraw (and fit the names again) when the widget gets wider or narrower (the file browser opened
// or closed) and when the theme changes, which can change the font but not the size.
function watchWidthAndTheme(el, redraw) {
  const resized = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(redraw);
  if (resized) resized.observe(el);
  const themed = new MutationObserver(() => setTimeout(redraw, 150));
  themed.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-name", "data-jp-theme-light"] });
  return () => {
    if (resized) resized.disconnect();
    themed.disconnect();
  };
}

export function treeComponent(ctx) {
  const rowsById = new Map();
  let order = [];
  let flashId = null;
  let queued = false;
  let disposed = false;
  const filters = treeFilters(ctx);
  const sizer = h("div", { class: "sv-sizer" });
  const rowsLayer = h("div", { class: "sv-rows" });
  const scroller = h("div", { class: "sv-scroller", tabindex: "0" }, sizer, rowsLayer);
  const el = h("div", { class: "sv-tree" }, filters.el, treeHeader(), scroller);

  // only the rows on screen (and a few more) exist in the page; a row's height is the CSS's
  // (--sv-row-h: three lines in a narrow widget, numbers under the name)
  let rowH = ROW_H;
  function draw() {
    if (disposed) return;
    rowH = parseFloat(getComputedStyle(el).getPropertyValue("--sv-row-h")) || ROW_H;
    const ROW_H_NOW = rowH;
    // each row's bytes drawn as a bar in its cell, against the largest row sent (the root's total)
    let most = 1;
    for (const r of rowsById.values()) most = Math.max(most, r.bytes || 0);
    sizer.style.height = `${order.length * ROW_H_NOW}px`;
    scroller.style.height = `${Math.min(MAX_TREE_H, Math.max(order.length, 2) * ROW_H_NOW + 2)}px`;
    const top = scroller.scrollTop;
    const height = scroller.clientHeight || 420;
    const first = Math.max(0, Math.floor(top / ROW_H_NOW) - OVERSCAN);
    const last = Math.min(order.length, Math.ceil((top + height) / ROW_H_NOW) + OVERSCAN);
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const id = order[i];
      const r = rowsById.get(id);
      if (!r) continue;
      const row = buildRow(ctx, id, r, id === flashId, most);
      row.style.top = `${i * ROW_H_NOW}px`;
      frag.append(row);
    }
    rowsLayer.replaceChildren(frag);
    fitNames([...rowsLayer.querySelectorAll(".sv-name")]);
    el.dataset.rows = String(order.length);
  }
  function queue() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      draw();
    });
  }
  scroller.addEventListener("scroll", queue, { passive: true });
  const unwatch = watchWidthAndTheme(scroller, queue);

  function onRows(msg) {
    if (msg.reset) rowsById.clear();
    for (const [id, r] of Object.entries(msg.rows || {})) rowsById.set(id, r);
    if (msg.order) {
      order = msg.order;
      const keep = new Set(order);
      for (const id of rowsById.keys()) if (!keep.has(id)) rowsById.delete(id);
    }
    filters.showMatches(msg);
    draw();
    el.dataset.revision = String(msg.revision);
  }
  function onReveal(id) {
    const i = order.indexOf(id);
    if (i < 0) return;
    flashId = id;
    const height = scroller.clientHeight || 420;
    scroller.scrollTop = Math.max(0, i * rowH - height / 2 + rowH);
    draw();
    setTimeout(() => {
      if (flashId === id) {
        flashId = null;
        queue();
      }
    }, 2500);
  }
  const dispose = () => {
    disposed = true;
    unwatch();
  };
  return { el, onRows, onReveal, queue, showFilter: filters.show, dispose };
}
