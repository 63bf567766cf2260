// shardviz Inspector front end (anywidget ESM; no npm, nothing fetched).
// base.js: the constants, the message schema check (kindOk, checkAction), the shared context
// (makeContext: the model and `send`) and small DOM helpers for the select and input elements.
//
// The front end is the ES modules of shardviz/widget/front/: each imports what it uses (from
// ../charts.js, the chart drawing shared with the report, and from its siblings) and exports what
// others use; inspector.js is the entry (`export default { render }`). widget/bundle.py bundles
// them, in Python, into the one string anywidget loads (and rebuilds it on save with
// ANYWIDGET_HMR=1): see CONTRIBUTING.md, "The front end".
//
// Python (shardviz/widget/inspector.py) is the single source of every number and writes every
// trait; the front end only draws what it is sent and sends back what the user did, as actions.
//   traits:   controls, summary, memory, traffic, findings, comparison, suggestions, code, verify_result,
//             messages, tab, torch_version, protocol (the message schema, protocol.py)
//   messages: {type:"rows", order?, rows, reset, matches}  visible rows that changed (virtualised)
//             {type:"reveal", id}                            scroll to a row and flash it
//             {type:"ack", req, ok, error}                    answer to each request
//   we send:  {type:"hello"} on render, {type:"action", action, args, req} on every user action,
//             each checked against the protocol first (checkAction) - Python checks it again.
//
// Layout: one top-level function per component (summary, messages, controls, tree, charts,
// compare, findings, suggest, export, tabs), each given what it needs explicitly (the shared `ctx`:
// model and send, plus callbacks), then `render` (inspector.js, the entry), which builds them and
// wires the traits to them.
// The exported code arrives highlighted (HTML from pygments, in Python): nothing is parsed here.

import { h } from "../charts.js";

export const ROW_H = 26;
export const OVERSCAN = 12;
export const MAX_TREE_H = 390;

// ---------------------------------------------------------------------------------------------
// the message schema (protocol.py, sent as the "protocol" trait): the same checks as Python's
// ---------------------------------------------------------------------------------------------
function kindOk(value, kind) {
  const kinds = kind.split("|");
  if (value === null || value === undefined) return kinds.includes("null") || kinds.includes("any");
  return kinds.some(
    (k) =>
      k === "any" ||
      (k === "str" && typeof value === "string") ||
      (k === "bool" && typeof value === "boolean") ||
      (k === "int" && Number.isInteger(value)) ||
      (k === "number" && typeof value === "number" && Number.isFinite(value)) ||
      (k === "list" && Array.isArray(value)),
  );
}

function checkAction(protocol, action, args) {
  const spec = ((protocol || {}).actions || {})[action];
  if (!spec) return `unknown action '${action}'`;
  const unknown = Object.keys(args).filter((a) => !(a in spec)).sort();
  if (unknown.length) return `action '${action}' takes no argument(s) ${JSON.stringify(unknown)}`;
  const missing = ((protocol.required || {})[action] || []).filter((a) => !(a in args));
  if (missing.length) return `action '${action}' needs argument(s) ${JSON.stringify(missing)}`;
  for (const [k, v] of Object.entries(args)) if (!kindOk(v, spec[k])) return `action '${action}': argument '${k}' must be ${spec[k]}`;
  return null;
}

// ---------------------------------------------------------------------------------------------
// the shared context: the model, and `send`, which checks an action and counts it as pending
// ---------------------------------------------------------------------------------------------
export function makeContext(model) {
  const ctx = { model, root: null, reqSeq: 0, pending: new Map(), onLocalError: () => {} };
  ctx.send = (action, args = {}, onAck = null) => {
    const problem = checkAction(model.get("protocol"), action, args);
    if (problem) {
      ctx.onLocalError(problem); // never sent: Python would refuse it the same way
      return null;
    }
    ctx.reqSeq += 1;
    const req = ctx.reqSeq;
    if (onAck) ctx.pending.set(req, onAck);
    ctx.root.classList.add("sv-busy");
    ctx.root.dataset.pending = String(Number(ctx.root.dataset.pending || 0) + 1);
    model.send({ type: "action", action, args, req });
    return req;
  };
  ctx.onAck = (msg) => {
    const cb = ctx.pending.get(msg.req);
    ctx.pending.delete(msg.req);
    const left = Math.max(0, Number(ctx.root.dataset.pending || 1) - 1);
    ctx.root.dataset.pending = String(left);
    if (!left) ctx.root.classList.remove("sv-busy");
    ctx.root.dataset.lastAck = String(msg.req);
    if (cb) cb(msg);
  };
  return ctx;
}

export function selectOf(cls, label, options) {
  return h("select", { class: cls, "aria-label": label }, ...options.map(([v, t]) => h("option", { value: v, text: t })));
}

export function fillSelect(sel, options) {
  const key = JSON.stringify(options);
  if (sel.dataset.options === key) return;
  sel.dataset.options = key;
  sel.replaceChildren(...options.map((o) => (Array.isArray(o) ? h("option", { value: o[0], text: o[1] }) : h("option", { value: o, text: o }))));
}

export function keepKeysFromLab(input) {
  input.addEventListener("keydown", (e) => e.stopPropagation()); // JupyterLab's notebook shortcuts stay out
}
