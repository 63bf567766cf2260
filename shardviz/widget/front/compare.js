// compare.js: the A vs B panel, the pinned plan against the current one.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, fmtDelta, fmtValue, h, pairedBars } from "../charts.js";

// ---------------------------------------------------------------------------------------------
// A vs B: the pinned plan against the current one
// ---------------------------------------------------------------------------------------------
function compareSide(key, d, label) {
  return h(
    "div",
    { class: `sv-cmp-side sv-cmp-side-${key}` },
    h("span", { class: `sv-swatch sv-pair-${key}` }),
    h("b", { text: label }),
    ` ${d.n_units} calls · ${d.n_ignored} ignored${d.plan_name ? ` · ${d.plan_name}` : ""} · ${d.mesh}`,
  );
}

function compareHead(c) {
  const head = h("div", { class: "sv-cmp-head" }, compareSide("a", c.a, "A (pinned)"), compareSide("b", c.b, "B (current)"));
  if (!c.same_mesh || !c.same_training) {
    const what = [!c.same_mesh ? "mesh" : null, !c.same_training ? "training" : null].filter(Boolean).join(" and ");
    head.append(h("div", { class: "sv-chart-note sv-cmp-differs", title: `A: ${c.a.training}\nB: ${c.b.training}`, text: `A and B differ in ${what} as well as in the plan.` }));
  }
  return head;
}

function compareTable(c) {
  const table = h(
    "table",
    { class: "sv-cmp-table" },
    h("tr", {}, h("th", { text: "on the busiest rank / per step" }), h("th", { class: "sv-cmp-a", text: "A" }), h("th", { class: "sv-cmp-b", text: "B" }), h("th", { class: "sv-cmp-delta", text: "B − A" })),
  );
  let group = null;
  for (const r of c.rows || []) {
    if (r.group !== group) {
      group = r.group;
      table.append(h("tr", { class: "sv-cmp-group" }, h("td", { colspan: 4, text: group })));
    }
    const cls = r.delta === 0 ? "sv-cmp-same" : r.delta > 0 ? "sv-cmp-up" : "sv-cmp-down"; // more is costlier, for every row
    const exact = (v) => (r.kind === "bytes" ? `${fmt(v, "int")} B` : "");
    table.append(
      h(
        "tr",
        { class: `sv-cmp-row ${cls}`, "data-key": r.key },
        h("td", { class: "sv-cmp-label", text: r.label }),
        h("td", { class: "sv-cmp-a", "data-value": r.a, title: exact(r.a), text: fmtValue(r.a, r.kind) }),
        h("td", { class: "sv-cmp-b", "data-value": r.b, title: exact(r.b), text: fmtValue(r.b, r.kind) }),
        h("td", { class: "sv-cmp-delta", "data-value": r.delta, text: fmtDelta(r.delta, r.kind) }),
      ),
    );
  }
  const f = c.findings || {};
  const v = c.verdict || {};
  const note = `verdict A: ${v.a} · B: ${v.b} · peak on rank ${c.peak_rank.a} (A) and rank ${c.peak_rank.b} (B) · finding codes A: ${f.a || "none"} · B: ${f.b || "none"}`;
  return h("div", { class: "sv-cmp-tablebox" }, table, h("div", { class: "sv-chart-note", text: note }));
}

function compareCharts(c) {
  const by = (g) => (c.rows || []).filter((r) => r.group === g);
  return h(
    "div",
    { class: "sv-cmp-charts" },
    pairedBars("memory on the busiest rank", by("memory"), "bytes", c.limit && c.limit.b, c.limit_text && c.limit_text.b),
    pairedBars("traffic per step", by("traffic"), "bytes", null),
    pairedBars("collectives per step", by("collectives"), "count", null),
    h(
      "div",
      { class: "sv-legend" },
      h("span", { class: "sv-legend-item" }, h("span", { class: "sv-swatch sv-pair-a" }), "A (pinned)"),
      h("span", { class: "sv-legend-item" }, h("span", { class: "sv-swatch sv-pair-b" }), "B (current)"),
    ),
  );
}

export function revealLink(send, fqn, text, title) {
  return h("a", {
    class: "sv-reveal",
    href: "#",
    text,
    title,
    onclick: (e) => {
      e.preventDefault();
      e.stopPropagation();
      send("reveal", { fqn });
    },
  });
}

function compareDiff(send, c) {
  const diff = c.diff || [];
  const box = h(
    "div",
    { class: "sv-cmp-diff", "data-n": c.n_diff },
    h("div", { class: "sv-chart-title", text: c.n_diff ? `${c.n_diff} parameters whose status or call differs` : "No parameter differs in status or call." }),
  );
  if (!diff.length) return box;
  const table = h("table", { class: "sv-cmp-diff-table" }, h("tr", {}, h("th", { text: "parameter" }), h("th", { text: "A" }), h("th", { text: "B" })));
  const full = (st, unit) => `${st}${unit ? ` in ${unit}` : ""}`;
  for (const d of diff) {
    table.append(
      h(
        "tr",
        { class: "sv-cmp-diff-row", "data-fqn": d.fqn },
        h("td", {}, revealLink(send, d.fqn, d.fqn_short, `${d.fqn}: reveal in the tree`)),
        h("td", { class: "sv-cmp-diff-a", text: d.where_a, title: full(d.status_a, d.unit_a) }),
        h("td", { class: "sv-cmp-diff-b", text: d.where_b, title: full(d.status_b, d.unit_b) }),
      ),
    );
  }
  box.append(h("div", { class: "sv-cmp-diff-scroll" }, table));
  if (c.n_diff > diff.length) box.append(h("div", { class: "sv-muted sv-cmp-more", text: `and ${c.n_diff - diff.length} more` }));
  return box;
}

export function comparePanel(ctx, { pinButtons, setTabLabel }) {
  const el = h("div", { class: "sv-panel sv-panel-compare", "data-panel": "compare" });
  function render() {
    const c = ctx.model.get("comparison") || {};
    el.replaceChildren();
    el.dataset.pinned = String(!!c.pinned);
    el.dataset.revision = String(c.revision ?? "");
    pinButtons.pin.textContent = c.pinned ? "re-pin as A" : "pin as A";
    pinButtons.unpin.hidden = !c.pinned;
    // what differs: the figures of the table and the parameters' status or call, both counted
    setTabLabel(c.pinned && c.available ? `A vs B (${c.n_changed} figures, ${c.n_diff} params differ)` : "A vs B");
    if (!c.pinned) {
      el.append(
        h(
          "div",
          { class: "sv-muted sv-cmp-empty" },
          "Nothing pinned. ",
          h("button", { class: "sv-btn sv-pin", text: "pin as A", onclick: () => ctx.send("pin") }),
          " keeps the current plan as A; change the plan afterwards and this tab shows A against the current plan (B).",
        ),
      );
      return;
    }
    el.append(compareHead(c));
    if (!c.available) {
      el.append(h("div", { class: "sv-muted", text: c.reason || "no comparison" }));
      return;
    }
    el.append(h("div", { class: "sv-cmp-grid" }, compareTable(c), compareCharts(c)), compareDiff(ctx.send, c));
  }
  return { el, render };
}
