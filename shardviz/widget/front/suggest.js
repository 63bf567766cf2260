// suggest.js: the Suggest panel, sv.search's best plans for this model, mesh and training, each
// with one button that applies it (one undo step). Every figure arrives as text from Python
// (widget/suggest.py); nothing is computed here.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, h } from "../charts.js";

// ---------------------------------------------------------------------------------------------
// suggest: the search's top rows, "searching N plans…" while it runs, what is missing, the errors
// ---------------------------------------------------------------------------------------------
// a row's judged peak as a bar against the usable memory (the summary's limit: one device for every row)
function peakBar(r, limit) {
  if (!(limit > 0) || r.peak == null) return null;
  const frac = Math.min(1, r.peak / limit);
  return h(
    "div",
    { class: `sv-suggest-bar${r.fits ? "" : " sv-over"}`, role: "img", "aria-label": `${r.peak_text} of ${fmt(limit, "bytes")} usable`, title: `${r.peak_text} of ${fmt(limit, "bytes")} usable` },
    h("div", { class: "sv-suggest-bar-fill", style: `width:${(100 * frac).toFixed(1)}%`, "data-bytes": r.peak }),
  );
}

function suggestRow(send, r, stale, limit) {
  const apply = h("button", {
    class: "sv-btn sv-suggest-apply",
    text: r.current ? "current" : "apply",
    disabled: r.current || stale,
    title: r.current ? "this row is the current plan" : `apply ${r.applies.join(", ")} (one undo step)`,
    onclick: () => send("apply_suggestion", { index: r.index }),
  });
  const fits = h("span", { class: `sv-suggest-fits sv-suggest-fits-${r.fits ? "yes" : "no"}`, text: r.fits_text });
  return h(
    "tr",
    { class: "sv-suggest-row", "data-index": r.index, "data-fits": String(r.fits), "data-current": String(r.current) },
    h("td", { class: "sv-suggest-rank", text: r.number }),
    h(
      "td",
      { class: "sv-suggest-plan" },
      h("div", {}, h("b", { class: "sv-suggest-name", text: r.name }), " ", fits),
      h("div", { class: "sv-suggest-why", text: r.why }),
      h("div", { class: "sv-suggest-mesh sv-muted", text: r.mesh_text }),
      h("div", { class: "sv-suggest-applies", text: `applies: ${r.applies.join("; ")}` }),
    ),
    h("td", { class: "sv-suggest-peak", "data-value": r.peak ?? "" }, h("div", { text: r.peak_text }), peakBar(r, limit), h("div", { class: "sv-suggest-sub", text: r.margin_text })),
    h("td", { class: "sv-suggest-step", "data-value": r.step_time_s ?? "", title: r.step_title, text: r.step_text }),
    h("td", { class: "sv-suggest-tokens" }, h("div", { text: r.tokens_text }), h("div", { class: "sv-suggest-sub", text: r.mfu_text })),
    h("td", { class: "sv-suggest-act" }, apply),
  );
}

function suggestTable(send, d, limit) {
  const head = h(
    "tr",
    {},
    ["#", "plan (why it is below the row above)", "judged peak per rank", "step", "throughput per rank", ""].map((t) => h("th", { text: t })),
  );
  return h("table", { class: "sv-suggest-table" }, head, (d.rows || []).map((r) => suggestRow(send, r, d.stale, limit)));
}

function suggestStatus(d, waiting) {
  if (waiting && d.state !== "running") return "starting the search…";
  if (d.state === "running") return d.text;
  if (d.state === "error") return d.needs_memory ? "needs the device memory" : "the search stopped";
  if (d.state === "cancelled") return "cancelled";
  if (d.rows) return d.summary;
  return "not searched yet";
}

const RUN_TITLE = "search the plans a user would try (LoRA layout, checkpointing, reshard, HSDP split, offload, micro-batch) and rank those that fit";

export function suggestPanel(ctx) {
  const el = h("div", { class: "sv-panel sv-panel-suggest", "data-panel": "suggest" });
  let waiting = false;
  const run = h("button", {
    class: "sv-btn sv-suggest-run",
    text: "Suggest plans",
    title: RUN_TITLE,
    onclick: () => {
      waiting = true;
      render();
      ctx.send("suggest", {}, () => ((waiting = false), render()));
    },
  });
  function render() {
    const d = ctx.model.get("suggestions") || {};
    el.dataset.state = waiting && d.state !== "running" ? "starting" : d.state || "idle";
    el.dataset.revision = String(d.revision ?? "");
    // without the device memory there is nothing to fit: the button says why instead of failing
    run.disabled = waiting || d.state === "running" || !!d.needs_memory;
    run.title = d.needs_memory ? "give the device memory first (the device field above)" : RUN_TITLE;
    run.textContent = d.rows ? "Search again" : "Suggest plans";
    const status = h("span", { class: "sv-suggest-status", text: suggestStatus(d, waiting) });
    const cancel = h("button", { class: "sv-btn sv-suggest-cancel", text: "cancel", hidden: d.state !== "running", onclick: () => ctx.send("cancel") });
    el.replaceChildren(
      h("div", { class: "sv-suggest-head" }, run, cancel, status),
      h("div", { class: "sv-muted sv-suggest-inputs", text: `for ${d.inputs || ""}` }),
    );
    for (const m of d.missing || []) el.append(h("div", { class: "sv-suggest-missing", text: m }));
    if (d.state === "error" || d.state === "cancelled") el.append(h("div", { class: "sv-suggest-error", role: "alert", text: d.error }));
    if (!d.rows) return;
    if (d.stale) el.append(h("div", { class: "sv-suggest-stale", text: "The mesh or training changed since this search: its rows are for the earlier one. Search again to apply one." }));
    el.append(h("div", { class: "sv-suggest-explain", text: d.explain }));
    if (d.note) el.append(h("div", { class: "sv-muted sv-suggest-note", text: d.note }));
    el.append(h("div", { class: "sv-suggest-scroll" }, suggestTable(ctx.send, d, (ctx.model.get("summary") || {}).limit)));
  }
  return { el, render };
}
