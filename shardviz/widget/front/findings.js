// findings.js: the findings panel, each finding with its fix and a link into the tree.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, h } from "../charts.js";
import { revealLink } from "./compare.js";

// ---------------------------------------------------------------------------------------------
// findings: what is wrong or wasteful, each with its fix; a click reveals it in the tree
// ---------------------------------------------------------------------------------------------
function findingItem(send, f) {
  const item = h(
    "div",
    {
      class: `sv-finding sv-finding-${f.severity}${f.pending ? " sv-finding-pending" : ""}`,
      "data-code": f.code,
      title: f.fqns.length ? "click to reveal in the tree" : "",
      onclick: () => {
        if (f.fqns.length) send("reveal", { fqn: f.fqns[0] });
      },
    },
    h(
      "div",
      { class: "sv-finding-head" },
      h("span", { class: `sv-sev sv-sev-${f.severity}`, text: f.severity }),
      h("b", { text: f.code }),
      h("span", { text: f.message }),
      // its what-ifs still run on the worker: the priced finding replaces this one
      f.pending ? h("span", { class: "sv-finding-pricing", role: "status" }, h("span", { class: "sv-spinner", "aria-hidden": "true" }), "being priced") : null,
    ),
    // the fix says what it is ("cheapest fix: ..."): a "fix:" label only where it does not
    f.fix ? h("div", { class: "sv-finding-fix", text: /^[^:]{0,20}fix:/.test(f.fix) ? f.fix : `fix: ${f.fix}` }) : null,
  );
  if (!f.fqns.length) return item;
  const where = h("div", { class: "sv-finding-fqns" }, f.fqns.slice(0, 4).map((q) => revealLink(send, q, q || "<root>")));
  const listed = Math.min(4, f.fqns.length);
  if (f.n_fqns > listed) {
    where.append(
      h("span", { class: "sv-muted sv-finding-more", "data-more": f.n_fqns - listed, text: ` and ${fmt(f.n_fqns - listed, "int")} more` }),
      h("button", {
        class: "sv-btn sv-finding-filter",
        text: `show all ${fmt(f.n_fqns, "int")} in the tree`,
        title: "filter the tree to every name this finding is about",
        onclick: (e) => {
          e.stopPropagation();
          send("filter_finding", { code: f.code });
        },
      }),
    );
  }
  item.append(where);
  return item;
}

export function findingsPanel(ctx, { tabButton }) {
  const el = h("div", { class: "sv-panel sv-panel-findings", "data-panel": "findings" });
  function render() {
    const list = ctx.model.get("findings") || [];
    el.replaceChildren();
    const btn = tabButton("findings");
    btn.textContent = `Findings (${list.length})`;
    btn.classList.toggle("sv-has-errors", list.some((f) => f.severity === "error"));
    if (!list.length) {
      el.append(h("div", { class: "sv-muted sv-no-findings", text: "No findings: torch accepts this plan and nothing looks costly." }));
      return;
    }
    for (const f of list) el.append(findingItem(ctx.send, f));
  }
  return { el, render };
}
