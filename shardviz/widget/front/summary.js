// summary.js: the summary line under the header card (model, mesh, training, plan, findings, A vs B,
// plan file)
// and the messages (errors and notes).
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, fmtBytes, fmtDelta, h } from "../charts.js";

// ---------------------------------------------------------------------------------------------
// summary: model, mesh, training, the plan's name, the findings' counts (the verdict: header.js)
// ---------------------------------------------------------------------------------------------
export function summaryComponent(ctx, { openCompare }) {
  const el = h("div", { class: "sv-summary" });
  function render() {
    const sm = ctx.model.get("summary") || {};
    el.replaceChildren();
    if (!sm.model) return;
    el.append(
      h("span", { class: "sv-sum-model", text: `${sm.model}` }),
      h("span", { class: "sv-sum-item sv-sum-size", title: `${fmt(sm.numel || 0, "int")} parameter elements`, text: sm.size_text }),
      h("span", { class: "sv-sum-item sv-sum-mesh", text: sm.mesh }),
      h("span", { class: "sv-sum-item sv-sum-training", title: "what the numbers assume (change it below)", text: sm.training }),
      planItem(sm),
      findingsItem(sm),
    );
    const work = workItem(ctx);
    if (work) el.append(work);
    const pinned = pinnedItem(ctx.model.get("comparison") || {}, openCompare);
    if (pinned) el.append(pinned);
    if (sm.plan_file) el.append(planFileItem(sm.plan_file));
    ctx.root.dataset.revision = String(sm.revision);
  }
  return { el, render };
}

function planItem(sm) {
  return h(
    "span",
    { class: "sv-sum-item sv-sum-plan", title: "the plan's name: the preset it started from, and how many edits since" },
    h("b", { class: "sv-plan-name", text: sm.plan_name || "custom plan" }),
    sm.plan_text,
  );
}

// what runs in the background after a change (measuring, checking, searching): its time, and cancel
let workTimer = null;
function workItem(ctx) {
  const w = ctx.model.get("work") || {};
  clearInterval(workTimer);
  if (!w.busy) return null;
  const clock = h("span", { class: "sv-work-clock" });
  const tick = () => (clock.textContent = ` ${Math.max(0, Date.now() / 1000 - w.since).toFixed(1)} s`);
  tick();
  workTimer = setInterval(() => (clock.isConnected ? tick() : clearInterval(workTimer)), 200);
  return h(
    "span",
    { class: "sv-sum-item sv-work", role: "status", title: "runs in the background: the numbers above are already for the current state" },
    h("span", { class: "sv-spinner", "aria-hidden": "true" }),
    `${w.label}…`,
    clock,
    h("button", { class: "sv-btn sv-work-cancel", text: "cancel", title: "stop it; the numbers shown stay", onclick: () => ctx.send("cancel") }),
  );
}

function findingsItem(sm) {
  const f = sm.findings_text;
  if (!f) return h("span", { class: "sv-sum-item sv-muted", text: "checking…" });
  // a count of 0 is not an entry ("0 errors 0 warnings 0 info" said nothing the total does not)
  const counts = sm.findings || {};
  const sev = (k) => (counts[k] > 0 ? [" ", h("span", { class: `sv-sev sv-sev-${k}`, text: f[k] })] : []);
  return h(
    "span",
    { class: `sv-sum-item sv-sum-findings${sm.findings_stale ? " sv-stale" : ""}`, title: sm.findings_stale ? "checking the new plan…" : "" },
    h("span", { class: "sv-sum-findings-total", text: Object.values(counts).some((n) => n > 0) ? `${f.total}:` : f.total }),
    ...sev("error"),
    ...sev("warning"),
    ...sev("info"),
  );
}

function pinnedItem(cmp, openCompare) {
  const peak = cmp.pinned && cmp.available ? (cmp.rows || []).find((r) => r.key === "peak") : null;
  if (!peak) return null;
  return h("a", {
    class: "sv-sum-item sv-sum-pinned",
    href: "#",
    title: "A is pinned: open the A vs B tab",
    text: `A vs B: peak ${fmtDelta(peak.delta, "bytes")}, ${cmp.n_diff} params differ`,
    onclick: (e) => {
      e.preventDefault();
      openCompare();
    },
  });
}

function planFileItem(pf) {
  return h("span", {
    class: `sv-sum-item sv-planfile ${pf.autosave ? "" : "sv-over"}`,
    title: pf.path,
    text: pf.autosave ? `autosave → ${pf.path.split("/").pop()}` : "autosave OFF",
  });
}

// ---------------------------------------------------------------------------------------------
// messages: the latest errors and notes, and a plan file that stopped saving
// ---------------------------------------------------------------------------------------------
export function messagesComponent(ctx) {
  const el = h("div", { class: "sv-messages" });
  function render() {
    const msgs = ctx.model.get("messages") || [];
    const pf = (ctx.model.get("summary") || {}).plan_file;
    el.replaceChildren();
    if (pf && !pf.autosave && pf.problem) {
      el.append(
        h(
          "div",
          { class: "sv-msg sv-msg-error sv-planfile-problem" },
          h("span", { text: pf.problem }),
          h("button", { class: "sv-btn sv-overwrite-planfile", text: "overwrite the plan file with the current plan", onclick: () => ctx.send("overwrite_plan_file") }),
        ),
      );
    }
    const recent = msgs.filter((m) => !(pf && pf.problem && m.text === pf.problem)).slice(-2);
    for (const m of recent) {
      const box = h(
        "div",
        { class: `sv-msg sv-msg-${m.level}`, "data-id": m.id },
        h("span", { text: m.text }),
        h("button", { class: "sv-msg-close", text: "×", title: "dismiss", onclick: () => (box.remove(), ctx.send("dismiss_messages")) }),
      );
      el.append(box);
    }
  }
  function localError(text) {
    el.append(h("div", { class: "sv-msg sv-msg-error sv-local-error" }, h("span", { text })));
  }
  return { el, render, localError };
}
