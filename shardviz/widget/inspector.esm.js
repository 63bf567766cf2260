// shardviz Inspector front end (anywidget ESM; no build step, no imports, nothing fetched).
//
// Python (shardviz/widget/inspector.py) is the single source of every number: this file only
// draws what it is sent and sends back what the user clicked.
//   traits:   summary, memory, traffic, findings, comparison, code, verify_result, messages, tab,
//             torch_version
//   messages: {type:"rows", order?, rows, reset}  visible rows that changed (virtualised list)
//             {type:"reveal", id}                  scroll to a row and flash it
//             {type:"ack", req, ok, error}          answer to each request
//   we send:  {type:"hello"} on render, {type:"action", action, args, req} on every click

const ROW_H = 26;
const OVERSCAN = 12;
const MAX_TREE_H = 390;
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

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v.toFixed(0)} B` : `${v.toFixed(2)} ${units[i]}`;
}

// element counts: words, never a letter that reads as a byte unit ("70.76 bn", not "70.76B")
export function fmtCount(n) {
  if (n === null || n === undefined) return "–";
  const v = Number(n);
  if (v >= 1e12) return `${(v / 1e12).toFixed(2)} tn`;
  if (v >= 1e9) return `${(v / 1e9).toFixed(2)} bn`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(2)} mn`;
  if (v >= 1e4) return `${(v / 1e3).toFixed(1)} k`;
  return v.toLocaleString("en-US");
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

// ---------------------------------------------------------------------------------------------
// Python syntax highlighting (enough for the exported module), themed by JupyterLab's CSS vars
// ---------------------------------------------------------------------------------------------
const PY_KEYWORDS = new Set(
  ("False None True and as assert async await break class continue def del elif else except " +
    "finally for from global if import in is lambda nonlocal not or pass raise return try while with yield")
    .split(" "),
);
const PY_BUILTINS = new Set(
  "print len range isinstance dict list set tuple int float str bool getattr setattr hasattr super sorted enumerate zip id type object any all min max sum".split(" "),
);
const TOKEN_RE =
  /("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|(#[^\n]*)|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b)|(@[A-Za-z_][\w.]*)|([A-Za-z_]\w*)/g;

function escapeHtml(t) {
  return t.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

export function highlightPython(src) {
  let out = "";
  let last = 0;
  let prevWord = "";
  TOKEN_RE.lastIndex = 0;
  let m;
  while ((m = TOKEN_RE.exec(src)) !== null) {
    out += escapeHtml(src.slice(last, m.index));
    const [tok, str, com, num, deco, word] = m;
    let cls = null;
    if (str) cls = "sv-tok-str";
    else if (com) cls = "sv-tok-com";
    else if (num) cls = "sv-tok-num";
    else if (deco) cls = "sv-tok-deco";
    else if (word) {
      if (PY_KEYWORDS.has(word)) cls = "sv-tok-kw";
      else if (prevWord === "def" || prevWord === "class") cls = "sv-tok-def";
      else if (PY_BUILTINS.has(word)) cls = "sv-tok-builtin";
      prevWord = word;
    }
    out += cls ? `<span class="${cls}">${escapeHtml(tok)}</span>` : escapeHtml(tok);
    last = m.index + tok.length;
  }
  return out + escapeHtml(src.slice(last));
}

// ---------------------------------------------------------------------------------------------
// render
// ---------------------------------------------------------------------------------------------
function render({ model, el }) {
  const rowsById = new Map();
  let order = [];
  let reqSeq = 0;
  const pending = new Map(); // req -> callback(ack)
  let flashId = null;
  let disposed = false;

  const send = (action, args = {}, onAck = null) => {
    reqSeq += 1;
    const req = reqSeq;
    if (onAck) pending.set(req, onAck);
    root.classList.add("sv-busy");
    root.dataset.pending = String(Number(root.dataset.pending || 0) + 1);
    model.send({ type: "action", action, args, req });
    return req;
  };

  // -- skeleton -------------------------------------------------------------------------------
  const summaryEl = h("div", { class: "sv-summary" });
  const messagesEl = h("div", { class: "sv-messages" });
  const filterText = h("input", {
    class: "sv-filter-text",
    type: "search",
    placeholder: "filter by name…",
    "aria-label": "filter by name",
  });
  const filterStatus = h(
    "select",
    { class: "sv-filter-status", "aria-label": "filter by status" },
    ...[
      ["", "any status"],
      ["unit", "own unit"],
      ["sharded", "sharded params"],
      ["ignored", "ignored params"],
      ["unmanaged", "unmanaged params"],
      ["mixed", "mixed modules"],
    ].map(([v, t]) => h("option", { value: v, text: t })),
  );
  const filterRole = h(
    "select",
    { class: "sv-filter-role", "aria-label": "filter by role" },
    ...[
      ["", "any role"],
      ["base", "base params"],
      ["lora", "LoRA params"],
    ].map(([v, t]) => h("option", { value: v, text: t })),
  );
  const collapseBtn = h("button", {
    class: "sv-btn sv-collapse-all",
    text: "collapse all",
    onclick: () => send("collapse_all"),
  });
  const filterNote = h("span", { class: "sv-filter-note" });
  const treeToolbar = h("div", { class: "sv-tree-toolbar" }, filterText, filterStatus, filterRole, collapseBtn, filterNote);
  const treeHeader = h(
    "div",
    { class: "sv-row sv-header" },
    h("span", { class: "sv-col-name", text: "module / parameter" }),
    h("span", { class: "sv-col-type", text: "type / dtype" }),
    h("span", { class: "sv-col-size", text: "elements", title: "number of elements (modules: every parameter under it, tied ones once) or shape (parameters); bn = billion, mn = million, k = thousand" }),
    h("span", { class: "sv-col-status", text: "status" }),
    h("span", { class: "sv-col-bytes", text: "per rank", title: "parameter bytes each rank allocates (padded shards; whole tensors for ignored and unmanaged)" }),
    h("span", { class: "sv-col-local", text: "local shard" }),
    h("span", { class: "sv-col-actions", text: "actions" }),
  );
  const sizer = h("div", { class: "sv-sizer" });
  const rowsLayer = h("div", { class: "sv-rows" });
  const scroller = h("div", { class: "sv-scroller", tabindex: "0" }, sizer, rowsLayer);
  const tree = h("div", { class: "sv-tree" }, treeToolbar, treeHeader, scroller);

  const tabs = [
    ["charts", "Memory & traffic"],
    ["compare", "A vs B"],
    ["findings", "Findings"],
    ["export", "Export"],
  ];
  const tabButtons = tabs.map(([key, label]) =>
    h("button", {
      class: "sv-tab",
      "data-tab": key,
      text: label,
      onclick: () => {
        model.set("tab", key);
        model.save_changes();
        showTab(key);
      },
    }),
  );
  const memoryEl = h("div", { class: "sv-memory" });
  const trafficEl = h("div", { class: "sv-traffic" });
  const chartsPanel = h("div", { class: "sv-panel sv-panel-charts", "data-panel": "charts" }, memoryEl, trafficEl);
  const findingsPanel = h("div", { class: "sv-panel sv-panel-findings", "data-panel": "findings" });
  const exportPanel = h("div", { class: "sv-panel sv-panel-export", "data-panel": "export" });
  const comparePanel = h("div", { class: "sv-panel sv-panel-compare", "data-panel": "compare" });
  const pinBtn = h("button", {
    class: "sv-btn sv-pin",
    text: "pin as A",
    title: "keep the current plan, mesh and training as A; the A vs B tab then compares it with every later change (B)",
    onclick: () => send("pin"),
  });
  const unpinBtn = h("button", { class: "sv-btn sv-unpin", text: "unpin A", title: "forget A", hidden: true, onclick: () => send("unpin") });
  const viewsEl = h(
    "div",
    { class: "sv-views" },
    h("div", { class: "sv-tabs" }, h("div", { class: "sv-tablist", role: "tablist" }, tabButtons), h("span", { class: "sv-pin-box" }, pinBtn, unpinBtn)),
    chartsPanel,
    comparePanel,
    findingsPanel,
    exportPanel,
  );
  const root = h("div", { class: "sv-inspector" }, summaryEl, messagesEl, tree, viewsEl);
  el.append(root);

  // -- summary and messages --------------------------------------------------------------------
  function renderSummary() {
    const sm = model.get("summary") || {};
    summaryEl.replaceChildren();
    if (!sm.model) return;
    const over = sm.limit && sm.peak > sm.limit;
    const f = sm.findings;
    summaryEl.append(
      h("span", { class: "sv-sum-model", text: `${sm.model}` }),
      h("span", { class: "sv-sum-item sv-sum-size", title: `${(sm.numel || 0).toLocaleString()} parameter elements`, text: `${sm.n_modules.toLocaleString()} modules · ${fmtCount(sm.numel)} parameter elements` }),
      h("span", { class: "sv-sum-item", text: sm.mesh }),
      h("span", {
        class: "sv-sum-item sv-sum-plan",
        text: `${sm.n_units} calls · ${sm.n_ignored} ignored${sm.plan_name ? ` · ${sm.plan_name}` : ""}`,
      }),
      h(
        "span",
        {
          class: `sv-sum-item sv-sum-peak ${over ? "sv-over" : ""}`,
          "data-bytes": sm.peak,
          title: `highest predicted peak of any rank (rank ${sm.worst_rank})`,
        },
        `peak ${fmtBytes(sm.peak)}`,
        sm.limit ? ` / ${fmtBytes(sm.limit)}` : "",
      ),
      f
        ? h(
            "span",
            { class: `sv-sum-item sv-sum-findings${sm.findings_stale ? " sv-stale" : ""}`, title: sm.findings_stale ? "checking the new plan…" : "" },
            h("span", { class: "sv-sev sv-sev-error", text: `${f.error} errors` }),
            " ",
            h("span", { class: "sv-sev sv-sev-warning", text: `${f.warning} warnings` }),
          )
        : h("span", { class: "sv-sum-item sv-muted", text: "checking…" }),
    );
    const cmp = model.get("comparison") || {};
    const peak = cmp.pinned && cmp.available ? (cmp.rows || []).find((r) => r.key === "peak") : null;
    if (peak) {
      summaryEl.append(
        h("a", {
          class: "sv-sum-item sv-sum-pinned",
          href: "#",
          title: "A is pinned: open the A vs B tab",
          text: `A vs B: peak ${fmtDelta(peak.delta, "bytes")}, ${cmp.n_diff} params differ`,
          onclick: (e) => {
            e.preventDefault();
            model.set("tab", "compare");
            model.save_changes();
            showTab("compare");
          },
        }),
      );
    }
    if (sm.plan_file) {
      const pf = sm.plan_file;
      summaryEl.append(
        h("span", {
          class: `sv-sum-item sv-planfile ${pf.autosave ? "" : "sv-over"}`,
          title: pf.path,
          text: pf.autosave ? `autosave → ${pf.path.split("/").pop()}` : "autosave OFF",
        }),
      );
    }
    root.dataset.revision = String(sm.revision);
    const fl = sm.filter || {};
    if (document.activeElement !== filterText) filterText.value = fl.text || "";
    filterStatus.value = fl.status || "";
    filterRole.value = fl.role || "";
  }

  function renderMessages() {
    const msgs = model.get("messages") || [];
    const sm = model.get("summary") || {};
    messagesEl.replaceChildren();
    const pf = sm.plan_file;
    if (pf && !pf.autosave && pf.problem) {
      messagesEl.append(
        h(
          "div",
          { class: "sv-msg sv-msg-error sv-planfile-problem" },
          h("span", { text: pf.problem }),
          h("button", {
            class: "sv-btn sv-overwrite-planfile",
            text: "overwrite the plan file with the current plan",
            onclick: () => send("overwrite_plan_file"),
          }),
        ),
      );
    }
    const recent = msgs.filter((m) => !(pf && pf.problem && m.text === pf.problem)).slice(-2);
    for (const m of recent) {
      const box = h(
        "div",
        { class: `sv-msg sv-msg-${m.level}` },
        h("span", { text: m.text }),
        h("button", { class: "sv-msg-close", text: "×", title: "dismiss", onclick: () => box.remove() }),
      );
      messagesEl.append(box);
    }
  }

  // -- tree --------------------------------------------------------------------------------------
  function badge(b) {
    return h("span", { class: `sv-badge sv-badge-${b.kind}`, title: b.title || "", text: b.label });
  }

  function actionBtn(label, cls, title, onclick) {
    return h("button", { class: `sv-btn sv-act ${cls}`, text: label, title, onclick });
  }

  function rarSelect(value, onchange, mixed = false) {
    const sel = h(
      "select",
      { class: "sv-rar", title: "reshard_after_forward of this call" },
      ...(mixed ? [h("option", { value: "", text: "RAF mixed" })] : []),
      h("option", { value: "default", text: "RAF default" }),
      h("option", { value: "true", text: "RAF True" }),
      h("option", { value: "false", text: "RAF False" }),
    );
    const sm = model.get("summary") || {};
    const shard = sm.shard || 1;
    for (const d of [2, 4, 8, 16]) {
      if (d < shard && shard % d === 0) sel.append(h("option", { value: String(d), text: `RAF ${d}` }));
    }
    sel.value = mixed ? "" : value === "default" ? "default" : String(value).toLowerCase();
    sel.addEventListener("change", () => {
      if (sel.value) onchange(sel.value);
    });
    sel.addEventListener("click", (e) => e.stopPropagation());
    return sel;
  }

  function buildRow(id, r) {
    const indent = r.depth * 10;
    const caret = r.expandable
      ? h("button", {
          class: "sv-caret",
          text: r.open ? "▾" : "▸",
          "aria-label": r.open ? "collapse" : "expand",
          onclick: (e) => {
            e.stopPropagation();
            send("expand", { target: id, open: !r.open });
          },
        })
      : h("span", { class: "sv-caret sv-caret-none" });
    const row = h("div", {
      class: `sv-row sv-kind-${r.kind}${id === flashId ? " sv-flash" : ""}`,
      "data-id": id,
      "data-fqn": r.kind === "group" ? null : r.fqn,
      "data-group": r.kind === "group" ? r.name : null,
      "data-badge": r.badge.kind,
      role: "row",
    });
    const name = h("span", { class: "sv-col-name", style: `padding-left:${indent}px`, title: r.kind === "group" ? r.label : r.fqn || "(root)" }, caret);
    const actions = h("span", { class: "sv-col-actions" });
    if (r.kind === "module") {
      name.append(h("span", { class: "sv-name", text: r.name }));
      row.append(
        name,
        h("span", { class: "sv-col-type", text: r.type, title: r.type }),
        h("span", {
          class: "sv-col-size",
          "data-numel": r.numel,
          text: r.numel === 0 && r.tied_numel > 0 ? "tied" : fmtCount(r.numel),
          title: `${r.numel.toLocaleString()} elements in ${r.n_params} parameters${r.tied_numel > 0 ? `; ${r.tied_numel.toLocaleString()} more in tied parameters, counted under their first module` : ""}`,
        }),
        h("span", { class: "sv-col-status" }, badge(r.badge)),
        h("span", { class: "sv-col-bytes", text: fmtBytes(r.bytes), "data-bytes": r.bytes }),
        h("span", { class: "sv-col-local" }),
        actions,
      );
      if (r.is_unit)
        actions.append(
          actionBtn("− unit", "sv-act-unit sv-act-remove", r.grouped ? `remove the grouped call ${r.unit} (all its modules)` : "remove this fully_shard call", () =>
            send("toggle_unit", { fqn: r.fqn }),
          ),
        );
      else if (r.can_unit)
        actions.append(actionBtn("+ unit", "sv-act-unit sv-act-make", "give this module its own fully_shard call", () => send("toggle_unit", { fqn: r.fqn })));
      if (r.is_unit) actions.append(rarSelect(r.rar, (v) => send("set_reshard_after_forward", { fqn: r.fqn, value: v })));
      if (r.n_lora > 0) {
        const ignored = r.lora === "ignored";
        actions.append(
          ignored
            ? actionBtn("keep LoRA", "sv-act-lora sv-act-unignore-lora", "give the LoRA parameters under this module back to FSDP", () =>
                send("unignore_lora", { module_fqn: r.fqn }),
              )
            : actionBtn("ignore LoRA", "sv-act-lora sv-act-ignore-lora", `ignore the ${r.n_lora} LoRA parameters under this module`, () =>
                send("ignore_lora", { module_fqn: r.fqn }),
              ),
        );
      }
    } else if (r.kind === "group") {
      name.append(h("span", { class: "sv-name sv-group-label", text: r.label }));
      row.append(
        name,
        h("span", { class: "sv-col-type", text: `${r.count} × ${r.type}`, title: r.type }),
        h("span", { class: "sv-col-size", text: fmtCount(r.numel) }),
        h("span", { class: "sv-col-status" }, badge(r.badge)),
        h("span", { class: "sv-col-bytes", text: fmtBytes(r.bytes), "data-bytes": r.bytes }),
        h("span", { class: "sv-col-local" }),
        actions,
      );
      const all = r.n_units === r.count;
      actions.append(
        all
          ? actionBtn(`− ${r.count} units`, "sv-act-unit sv-act-remove", `remove the call of each of the ${r.count} blocks`, () =>
              send("apply_to_many", { targets: id, action: "remove_unit" }),
            )
          : actionBtn(`+ ${r.count} units`, "sv-act-unit sv-act-make", `give each of the ${r.count} blocks its own call`, () =>
              send("apply_to_many", { targets: id, action: "make_unit" }),
            ),
      );
      if (r.n_units > 0)
        actions.append(
          rarSelect(r.rar ?? "default", (v) => send("apply_to_many", { targets: id, action: "set_reshard_after_forward", value: v }), r.rar === null || r.rar === undefined),
        );
      if (r.n_lora > 0) {
        actions.append(
          r.lora === "ignored"
            ? actionBtn("keep LoRA", "sv-act-lora sv-act-unignore-lora", `give the LoRA parameters of all ${r.count} blocks back to FSDP`, () =>
                send("apply_to_many", { targets: id, action: "unignore_lora" }),
              )
            : actionBtn("ignore LoRA", "sv-act-lora sv-act-ignore-lora", `ignore the LoRA parameters of all ${r.count} blocks`, () =>
                send("apply_to_many", { targets: id, action: "ignore_lora" }),
              ),
        );
      }
    } else {
      name.append(
        ...[
          h("span", { class: "sv-name sv-param-name", text: r.name }),
          r.role === "lora" ? h("span", { class: "sv-tag sv-tag-lora", text: "LoRA" }) : null,
          r.tied ? h("span", { class: "sv-tag", text: "tied", title: `also ${r.canonical}` }) : null,
        ].filter(Boolean),
      );
      const local = fmtShape(r.local_shape);
      row.append(
        name,
        h(
          "span",
          { class: "sv-col-type" },
          `${r.dtype} `,
          h("span", { class: `sv-tag ${r.trainable ? "sv-tag-train" : "sv-tag-frozen"}`, text: r.trainable ? "trainable" : "frozen" }),
        ),
        h("span", { class: "sv-col-size", text: fmtShape(r.shape), title: `${r.numel.toLocaleString()} elements` }),
        h("span", { class: "sv-col-status" }, badge(r.badge)),
        h("span", { class: "sv-col-bytes", text: fmtBytes(r.bytes), "data-bytes": r.bytes }),
        h(
          "span",
          {
            class: "sv-col-local",
            title: r.status === "sharded" ? `p.to_local().shape on rank ${r.rank}; every rank allocates ${fmtShape(r.shard_shape)}` : "not sharded: the full tensor",
          },
          h("span", { class: "sv-local-shape", text: local }),
          r.padding > 0 ? h("span", { class: "sv-pad", text: ` +${fmtCount(r.padding)} pad` }) : null,
        ),
        actions,
      );
      actions.append(
        r.status === "ignored"
          ? actionBtn("un-ignore", "sv-act-ignore sv-act-unignore", "give this parameter back to FSDP", () => send("toggle_ignored", { fqn: r.fqn }))
          : actionBtn("ignore", "sv-act-ignore", "keep this parameter out of FSDP (ignored_params)", () => send("toggle_ignored", { fqn: r.fqn })),
      );
    }
    return row;
  }

  let renderQueued = false;
  function queueTree() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => {
      renderQueued = false;
      renderTree();
    });
  }

  function renderTree() {
    if (disposed) return;
    sizer.style.height = `${order.length * ROW_H}px`;
    scroller.style.height = `${Math.min(MAX_TREE_H, Math.max(order.length, 4) * ROW_H + 2)}px`;
    const top = scroller.scrollTop;
    const height = scroller.clientHeight || 420;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(order.length, Math.ceil((top + height) / ROW_H) + OVERSCAN);
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const id = order[i];
      const r = rowsById.get(id);
      if (!r) continue;
      const row = buildRow(id, r);
      row.style.top = `${i * ROW_H}px`;
      frag.append(row);
    }
    rowsLayer.replaceChildren(frag);
    tree.dataset.rows = String(order.length);
  }

  scroller.addEventListener("scroll", queueTree, { passive: true });

  function onRows(msg) {
    if (msg.reset) rowsById.clear();
    for (const [id, r] of Object.entries(msg.rows || {})) rowsById.set(id, r);
    if (msg.order) {
      order = msg.order;
      const keep = new Set(order);
      for (const id of rowsById.keys()) if (!keep.has(id)) rowsById.delete(id);
    }
    filterNote.textContent = msg.filtering && msg.matches === 0
      ? "nothing matches this filter: no module or parameter has this name, status and role"
      : msg.truncated
        ? `${msg.truncated.toLocaleString()} more matches not shown: refine the filter`
        : "";
    filterNote.dataset.matches = msg.filtering ? String(msg.matches) : "";
    renderTree();
    tree.dataset.revision = String(msg.revision);
  }

  function onReveal(id) {
    const i = order.indexOf(id);
    if (i < 0) return;
    flashId = id;
    const height = scroller.clientHeight || 420;
    scroller.scrollTop = Math.max(0, i * ROW_H - height / 2 + ROW_H);
    renderTree();
    setTimeout(() => {
      if (flashId === id) {
        flashId = null;
        queueTree();
      }
    }, 2500);
  }

  let filterTimer = null;
  const sendFilter = () => send("set_filter", { text: filterText.value, status: filterStatus.value, role: filterRole.value });
  filterText.addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(sendFilter, 250);
  });
  filterText.addEventListener("keydown", (e) => {
    e.stopPropagation(); // keep JupyterLab's notebook shortcuts out of the text box
    if (e.key === "Enter") {
      clearTimeout(filterTimer);
      sendFilter();
    }
  });
  filterStatus.addEventListener("change", sendFilter);
  filterRole.addEventListener("change", sendFilter);

  // -- memory chart (SVG) ------------------------------------------------------------------------
  function renderMemory() {
    const mem = model.get("memory") || {};
    memoryEl.replaceChildren();
    memoryEl.append(h("div", { class: "sv-chart-title", text: "Memory per rank at the peak" }));
    if (!mem.available) {
      memoryEl.append(h("div", { class: "sv-muted", text: mem.reason || "no memory estimate" }));
      return;
    }
    const bars = mem.bars || [];
    const cats = mem.categories || [];
    const W = 520;
    const H = 250;
    const padL = 56;
    const padR = 12;
    const padT = 22;
    const padB = 34;
    const limit = mem.limit || 0;
    // a limit far above every bar would squash them flat: then it is named, not drawn
    const limitOnScale = limit && limit <= 4 * (mem.max_peak || 0);
    const top = Math.max(mem.max_peak || 0, limitOnScale ? limit : 0) * 1.08 || 1;
    // axis unit: GiB, or MiB/KiB for small models
    const unit = top >= GIB ? [GIB, "GiB"] : top >= 1024 ** 2 ? [1024 ** 2, "MiB"] : [1024, "KiB"];
    const stepG = niceStep(top / unit[0]);
    const yOf = (b) => padT + (H - padT - padB) * (1 - b / top);
    const svg = s("svg", { class: "sv-svg sv-memory-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "memory per rank" });
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
        class: `sv-mem-bar${limit && b.peak > limit ? " sv-over" : ""}`,
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
        rect.append(s("title", { text: `${b.label} · ${c.label}: ${fmtBytes(v)} (${v.toLocaleString()} B)` }));
        g.append(rect);
        acc += v;
      }
      g.append(s("text", { class: "sv-bar-label sv-peak-label", x: x + bw / 2, y: yOf(b.peak) - 5, "text-anchor": "middle", "data-bytes": b.peak, text: fmtBytes(b.peak) }));
      const lab = b.label.length > 14 && n > 4 ? `${b.first}${b.first === b.last ? "" : "–" + b.last}` : b.label;
      g.append(s("text", { class: "sv-axis", x: x + bw / 2, y: H - padB + 14, "text-anchor": "middle", text: lab }));
      svg.append(g);
    });
    const use = mem.use;
    if (limit && !limitOnScale) {
      // named, not drawn: far above every bar. Red only when the peak does not fit.
      svg.append(s("text", { class: `sv-limit-label sv-limit-off${use && use.over ? " sv-over" : ""}`, x: W - padR, y: padT - 8, "text-anchor": "end", text: use ? use.text : `device ${fmtBytes(limit)}` }));
    }
    if (limitOnScale) {
      const y = yOf(limit);
      svg.append(s("line", { class: `sv-limit${use && use.over ? " sv-over" : ""}`, x1: padL, x2: W - padR, y1: y, y2: y }));
      svg.append(s("text", { class: `sv-limit-label${use && use.over ? " sv-over" : ""}`, x: W - padR, y: y - 4, "text-anchor": "end", text: use ? use.text : `device ${fmtBytes(limit)}` }));
    }
    memoryEl.dataset.revision = String(mem.revision);
    memoryEl.dataset.peak = String(mem.max_peak);
    memoryEl.append(svg);
    // legend = breakdown of the worst bar
    const worst = bars.reduce((a, b) => (a && a.peak >= b.peak ? a : b), null);
    if (worst) {
      const legend = h("div", { class: "sv-legend" });
      for (const c of cats) {
        legend.append(
          h(
            "span",
            { class: "sv-legend-item", "data-cat": c.key, title: c.help || c.label },
            h("span", { class: `sv-swatch ${CAT_CLASS[c.key] || ""}` }),
            `${c.label} `,
            h("b", { text: fmtBytes(worst.parts[c.key] || 0) }),
          ),
        );
      }
      memoryEl.append(
        legend,
        h("div", {
          class: "sv-chart-note sv-peak-moment",
          text: `${worst.label}: peak ${fmtBytes(worst.peak)} in ${worst.phase || "?"}${worst.unit ? ` of ${worst.unit}` : ""}${worst.module && worst.module !== worst.unit ? `, activations peak at ${worst.module}` : ""} · after the step: params ${fmtBytes(worst.params)}, grads ${fmtBytes(worst.grads)}, optimizer ${fmtBytes(worst.optimizer)}`,
        }),
      );
    }
  }

  // -- traffic chart (SVG) -----------------------------------------------------------------------
  function renderTraffic() {
    const tr = model.get("traffic") || {};
    trafficEl.replaceChildren();
    trafficEl.append(h("div", { class: "sv-chart-title", text: "Traffic per step (bytes each rank sends)" }));
    if (!tr.available) {
      trafficEl.append(h("div", { class: "sv-muted", text: tr.reason || "no traffic estimate" }));
      return;
    }
    const colls = tr.collectives || [];
    const byC = tr.by_collective || [];
    const maxC = Math.max(1, ...byC.map((c) => c.sent));
    const W = 520;
    const rowH = 20;
    const labelW = 170;
    const valueW = 120;
    const barW = W - labelW - valueW;
    const svg1 = s("svg", { class: "sv-svg sv-traffic-coll", viewBox: `0 0 ${W} ${byC.length * rowH + 6}`, role: "img", "aria-label": "traffic by collective" });
    byC.forEach((c, i) => {
      const y = 3 + i * rowH;
      const w = Math.max(1, (barW * c.sent) / maxC);
      const g = s("g", { class: "sv-coll-bar", "data-coll": c.collective, "data-bytes": c.sent });
      g.append(s("text", { class: "sv-axis", x: labelW - 6, y: y + 13, "text-anchor": "end", text: `${c.collective} ×${c.count}` }));
      const rect = s("rect", { class: `sv-seg ${COLL_CLASS[c.collective] || "sv-c5"}`, x: labelW, y: y + 2, width: w, height: rowH - 6 });
      rect.append(s("title", { text: `${c.collective}: ${c.count} calls, buffers ${fmtBytes(c.bytes)}, sent per rank ${fmtBytes(c.sent)}` }));
      g.append(rect, s("text", { class: "sv-bar-label", x: labelW + w + 4, y: y + 13, text: fmtBytes(c.sent) }));
      svg1.append(g);
    });
    const total = h("div", {
      class: "sv-chart-note",
      text: `total ${fmtBytes(tr.total_sent)} sent per rank per step (collective buffers ${fmtBytes(tr.total_bytes)})${tr.time_s ? ` · ≈ ${(tr.time_s * 1000).toFixed(1)} ms at the given bandwidths` : ""}`,
    });
    trafficEl.append(svg1, total);
    const units = tr.by_unit || [];
    if (units.length) {
      const maxU = Math.max(1, ...units.map((u) => u.total));
      const svg2 = s("svg", { class: "sv-svg sv-traffic-units", viewBox: `0 0 ${W} ${units.length * rowH + 6}`, role: "img", "aria-label": "traffic by call" });
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
          rect.append(s("title", { text: `${u.unit} · ${c}: ${fmtBytes(v)}` }));
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
          colls.map((c) => h("span", { class: "sv-legend-item" }, h("span", { class: `sv-swatch ${COLL_CLASS[c] || "sv-c5"}` }), c)),
        ),
      );
    }
    trafficEl.dataset.revision = String(tr.revision);
  }

  // -- A vs B (pinned plan against the current one) ----------------------------------------------------
  function fmtValue(v, kind) {
    return kind === "bytes" ? fmtBytes(v) : String(v);
  }

  function fmtDelta(d, kind) {
    if (!d) return "±0";
    return `${d > 0 ? "+" : "−"}${fmtValue(Math.abs(d), kind)}`;
  }

  function describe(side, label) {
    return h(
      "div",
      { class: `sv-cmp-side sv-cmp-side-${side.key}` },
      h("span", { class: `sv-swatch sv-pair-${side.key}` }),
      h("b", { text: label }),
      ` ${side.d.n_units} calls · ${side.d.n_ignored} ignored${side.d.plan_name ? ` · ${side.d.plan_name}` : ""} · ${side.d.mesh}`,
    );
  }

  // one pair of horizontal bars (A above B) per row, on one scale
  function pairedBars(title, rows, kind, limit) {
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
        rect.append(s("title", { text: `${side[1]} · ${r.label}: ${fmtValue(v, kind)}${kind === "bytes" ? ` (${v.toLocaleString()} B)` : ""}` }));
        g.append(rect, s("text", { class: "sv-bar-label", x: labelW + w + 4, y: yy + barH - 1, text: `${side[1]} ${fmtValue(v, kind)}` }));
      }
      svg.append(g);
    });
    if (limitOnScale) {
      const x = labelW + (barW * limit) / max;
      svg.append(s("line", { class: "sv-limit", x1: x, x2: x, y1: padT - 2, y2: H }));
      svg.append(s("text", { class: "sv-limit-label", x: x - 3, y: padT - 4, "text-anchor": "end", text: `device ${fmtBytes(limit)}` }));
    } else if (limit) {
      svg.append(s("text", { class: "sv-limit-label", x: W - 4, y: padT - 4, "text-anchor": "end", text: `device ${fmtBytes(limit)}` }));
    }
    return h("div", { class: "sv-cmp-chart" }, h("div", { class: "sv-chart-subtitle", text: title }), svg);
  }

  function renderCompare() {
    const c = model.get("comparison") || {};
    comparePanel.replaceChildren();
    comparePanel.dataset.pinned = String(!!c.pinned);
    comparePanel.dataset.revision = String(c.revision ?? "");
    pinBtn.textContent = c.pinned ? "re-pin as A" : "pin as A";
    unpinBtn.hidden = !c.pinned;
    const tabBtn = tabButtons.find((b) => b.dataset.tab === "compare");
    tabBtn.textContent = c.pinned && c.available ? `A vs B (${c.n_diff} differ)` : "A vs B";
    if (!c.pinned) {
      comparePanel.append(
        h(
          "div",
          { class: "sv-muted sv-cmp-empty" },
          "Nothing pinned. ",
          h("button", { class: "sv-btn sv-pin", text: "pin as A", onclick: () => send("pin") }),
          " keeps the current plan as A; change the plan afterwards and this tab shows A against the current plan (B).",
        ),
      );
      return;
    }
    const head = h("div", { class: "sv-cmp-head" }, describe({ key: "a", d: c.a }, "A (pinned)"), describe({ key: "b", d: c.b }, "B (current)"));
    if (!c.same_mesh || !c.same_training) {
      const what = [!c.same_mesh ? "mesh" : null, !c.same_training ? "training" : null].filter(Boolean).join(" and ");
      head.append(h("div", { class: "sv-chart-note sv-cmp-differs", title: `A: ${c.a.training}\nB: ${c.b.training}`, text: `A and B differ in ${what} as well as in the plan.` }));
    }
    comparePanel.append(head);
    if (!c.available) {
      comparePanel.append(h("div", { class: "sv-muted", text: c.reason || "no comparison" }));
      return;
    }
    const rows = c.rows || [];
    const table = h(
      "table",
      { class: "sv-cmp-table" },
      h("tr", {}, h("th", { text: "on the busiest rank / per step" }), h("th", { class: "sv-cmp-a", text: "A" }), h("th", { class: "sv-cmp-b", text: "B" }), h("th", { class: "sv-cmp-delta", text: "B − A" })),
    );
    let group = null;
    for (const r of rows) {
      if (r.group !== group) {
        group = r.group;
        table.append(h("tr", { class: "sv-cmp-group" }, h("td", { colspan: 4, text: group })));
      }
      const cls = r.delta === 0 ? "sv-cmp-same" : r.delta > 0 ? "sv-cmp-up" : "sv-cmp-down"; // more is costlier, for every row
      table.append(
        h(
          "tr",
          { class: `sv-cmp-row ${cls}`, "data-key": r.key },
          h("td", { class: "sv-cmp-label", text: r.label }),
          h("td", { class: "sv-cmp-a", "data-value": r.a, title: r.kind === "bytes" ? `${r.a.toLocaleString()} B` : "", text: fmtValue(r.a, r.kind) }),
          h("td", { class: "sv-cmp-b", "data-value": r.b, title: r.kind === "bytes" ? `${r.b.toLocaleString()} B` : "", text: fmtValue(r.b, r.kind) }),
          h("td", { class: "sv-cmp-delta", "data-value": r.delta, text: fmtDelta(r.delta, r.kind) }),
        ),
      );
    }
    const f = c.findings || {};
    const tableBox = h(
      "div",
      { class: "sv-cmp-tablebox" },
      table,
      h("div", { class: "sv-chart-note", text: `peak on rank ${c.peak_rank.a} (A) and rank ${c.peak_rank.b} (B) · finding codes A: ${f.a || "none"} · B: ${f.b || "none"}` }),
    );
    const by = (g) => rows.filter((r) => r.group === g);
    const charts = h(
      "div",
      { class: "sv-cmp-charts" },
      pairedBars("memory on the busiest rank", by("memory"), "bytes", c.limit && c.limit.b),
      pairedBars("traffic per step", by("traffic"), "bytes", null),
      pairedBars("collectives per step", by("collectives"), "count", null),
      h(
        "div",
        { class: "sv-legend" },
        h("span", { class: "sv-legend-item" }, h("span", { class: "sv-swatch sv-pair-a" }), "A (pinned)"),
        h("span", { class: "sv-legend-item" }, h("span", { class: "sv-swatch sv-pair-b" }), "B (current)"),
      ),
    );
    const diff = c.diff || [];
    const diffBox = h(
      "div",
      { class: "sv-cmp-diff", "data-n": c.n_diff },
      h("div", { class: "sv-chart-title", text: c.n_diff ? `${c.n_diff} parameters whose status or call differs` : "No parameter differs in status or call." }),
    );
    if (diff.length) {
      const dt = h("table", { class: "sv-cmp-diff-table" }, h("tr", {}, h("th", { text: "parameter" }), h("th", { text: "A" }), h("th", { text: "B" })));
      const where = (st, unit) => `${st}${unit ? ` in ${unit}` : ""}`;
      for (const d of diff) {
        dt.append(
          h(
            "tr",
            { class: "sv-cmp-diff-row", "data-fqn": d.fqn },
            h(
              "td",
              {},
              h("a", {
                class: "sv-reveal",
                href: "#",
                text: d.fqn,
                title: "reveal in the tree",
                onclick: (e) => {
                  e.preventDefault();
                  send("reveal", { fqn: d.fqn });
                },
              }),
            ),
            h("td", { class: "sv-cmp-diff-a", text: where(d.status_a, d.unit_a) }),
            h("td", { class: "sv-cmp-diff-b", text: where(d.status_b, d.unit_b) }),
          ),
        );
      }
      diffBox.append(h("div", { class: "sv-cmp-diff-scroll" }, dt));
      if (c.n_diff > diff.length) diffBox.append(h("div", { class: "sv-muted sv-cmp-more", text: `and ${c.n_diff - diff.length} more` }));
    }
    comparePanel.append(h("div", { class: "sv-cmp-grid" }, tableBox, charts), diffBox);
  }

  // -- findings -------------------------------------------------------------------------------------
  function renderFindings() {
    const list = model.get("findings") || [];
    findingsPanel.replaceChildren();
    const countBtn = tabButtons.find((b) => b.dataset.tab === "findings");
    const errors = list.filter((f) => f.severity === "error").length;
    countBtn.textContent = `Findings (${list.length})`;
    countBtn.classList.toggle("sv-has-errors", errors > 0);
    if (!list.length) {
      findingsPanel.append(h("div", { class: "sv-muted sv-no-findings", text: "No findings: torch accepts this plan and nothing looks costly." }));
      return;
    }
    for (const f of list) {
      const item = h(
        "div",
        {
          class: `sv-finding sv-finding-${f.severity}`,
          "data-code": f.code,
          title: f.fqns.length ? "click to reveal in the tree" : "",
          onclick: () => {
            if (f.fqns.length) send("reveal", { fqn: f.fqns[0] });
          },
        },
        h("div", { class: "sv-finding-head" }, h("span", { class: `sv-sev sv-sev-${f.severity}`, text: f.severity }), h("b", { text: f.code }), h("span", { text: f.message })),
        f.fix ? h("div", { class: "sv-finding-fix", text: `fix: ${f.fix}` }) : null,
      );
      if (f.fqns.length) {
        const where = h("div", { class: "sv-finding-fqns" });
        for (const q of f.fqns.slice(0, 4)) {
          where.append(
            h("a", {
              class: "sv-reveal",
              href: "#",
              text: q || "<root>",
              onclick: (e) => {
                e.preventDefault();
                e.stopPropagation();
                send("reveal", { fqn: q });
              },
            }),
          );
        }
        const listed = Math.min(4, f.fqns.length);
        if (f.n_fqns > listed)
          where.append(
            h("span", {
              class: "sv-muted sv-finding-more",
              "data-more": f.n_fqns - listed,
              text: ` and ${f.n_fqns_exact ? "" : "at least "}${(f.n_fqns - listed).toLocaleString()} more`,
            }),
          );
        item.append(where);
      }
      findingsPanel.append(item);
    }
  }

  // -- export -----------------------------------------------------------------------------------------
  const versionSel = h(
    "select",
    { class: "sv-torch-version", "aria-label": "target torch release" },
    ...(model.get("torch_releases") || [""]).map((v) => h("option", { value: v, text: v ? `torch ${v}` : "torch: detect at run time" })),
  );
  versionSel.value = model.get("torch_version") || "";
  versionSel.addEventListener("change", () => {
    model.set("torch_version", versionSel.value);
    model.save_changes();
  });
  const copyBtn = h("button", { class: "sv-btn sv-copy", text: "copy" });
  const pathInput = h("input", { class: "sv-save-path", type: "text", value: "fsdp_plan.py", "aria-label": "file to save the code to" });
  pathInput.addEventListener("keydown", (e) => e.stopPropagation());
  const saveBtn = h("button", { class: "sv-btn sv-save", text: "save" });
  const verifyBtn = h("button", { class: "sv-btn sv-verify", text: "verify with torch" });
  const exportStatus = h("div", { class: "sv-export-status" });
  const verifyEl = h("div", { class: "sv-verify-result" });
  const codeEl = h("pre", { class: "sv-code" }, h("code", {}));
  exportPanel.append(h("div", { class: "sv-export-toolbar" }, versionSel, copyBtn, pathInput, saveBtn, verifyBtn), exportStatus, verifyEl, codeEl);

  function setStatus(text, level = "info", extra = []) {
    exportStatus.replaceChildren(h("span", { class: `sv-status-${level}`, text }), ...extra);
  }

  copyBtn.addEventListener("click", async () => {
    const text = (model.get("code") || {}).text || "";
    if (!text) return;
    let ok = false;
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(text);
        ok = true;
      }
    } catch (_e) {
      ok = false;
    }
    if (!ok) {
      const ta = h("textarea", { class: "sv-offscreen" });
      ta.value = text;
      document.body.append(ta);
      ta.select();
      try {
        ok = document.execCommand("copy");
      } catch (_e) {
        ok = false;
      }
      ta.remove();
    }
    setStatus(ok ? `copied ${text.split("\n").length} lines to the clipboard` : "could not copy: select the code and copy it by hand", ok ? "ok" : "error");
  });

  function save(overwrite) {
    const path = pathInput.value.trim();
    if (!path) return;
    send("save_code", { path, overwrite }, (ack) => {
      if (ack.ok) setStatus(`saved to ${ack.path}`, "ok");
      else if (ack.exists)
        setStatus(`${path} exists.`, "warn", [
          h("button", { class: "sv-btn sv-confirm-overwrite", text: "overwrite", onclick: () => save(true) }),
          h("button", { class: "sv-btn sv-cancel-overwrite", text: "cancel", onclick: () => setStatus("not saved", "info") }),
        ]);
      else setStatus(ack.error, "error");
    });
  }
  saveBtn.addEventListener("click", () => save(false));
  verifyBtn.addEventListener("click", () => {
    verifyEl.replaceChildren(h("span", { class: "sv-muted sv-verifying", text: "running torch's fully_shard on a meta copy under a fake process group…" }));
    send("verify");
  });

  function renderCode() {
    const c = model.get("code") || {};
    const codeTag = codeEl.firstChild;
    exportPanel.dataset.revision = String(c.revision ?? "");
    if (c.stale) {
      codeTag.textContent = "";
      return;
    }
    if (c.error) {
      codeTag.textContent = "";
      setStatus(`cannot export: torch would refuse this plan.\n${c.error}`, "error");
      return;
    }
    codeTag.innerHTML = highlightPython(c.text || "");
    codeEl.dataset.chars = String((c.text || "").length);
    if (exportStatus.querySelector(".sv-status-error")) exportStatus.replaceChildren();
  }

  function renderVerify() {
    const v = model.get("verify_result") || {};
    if (v.ok === undefined) {
      if (!verifyEl.querySelector(".sv-verifying")) verifyEl.replaceChildren();
      return;
    }
    const cls = v.ok ? "sv-status-ok" : "sv-status-error";
    const text = v.error
      ? `torch raised ${v.error}`
      : v.ok
        ? `torch agrees: every parameter's status, call, local shape and placement match the prediction (${v.seconds}s)`
        : `${v.n} disagreement(s) with torch`;
    verifyEl.replaceChildren(h("div", { class: `sv-verify-line ${cls}`, "data-ok": String(v.ok), text }));
    if (v.rows && v.rows.length) {
      const table = h("table", { class: "sv-verify-table" }, h("tr", {}, ["rank", "fqn", "field", "predicted", "torch"].map((k) => h("th", { text: k }))));
      for (const r of v.rows) table.append(h("tr", {}, ["rank", "fqn", "field", "predicted", "torch"].map((k) => h("td", { text: r[k] }))));
      verifyEl.append(table);
    }
  }

  // -- tabs --------------------------------------------------------------------------------------------
  function showTab(key) {
    for (const b of tabButtons) b.classList.toggle("sv-active", b.dataset.tab === key);
    for (const p of [chartsPanel, comparePanel, findingsPanel, exportPanel]) p.hidden = p.dataset.panel !== key;
    root.dataset.tab = key;
  }

  // -- wiring -------------------------------------------------------------------------------------------
  const onCustom = (msg) => {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "rows") onRows(msg);
    else if (msg.type === "reveal") onReveal(msg.id);
    else if (msg.type === "ack") {
      const cb = pending.get(msg.req);
      pending.delete(msg.req);
      const left = Math.max(0, Number(root.dataset.pending || 1) - 1);
      root.dataset.pending = String(left);
      if (!left) root.classList.remove("sv-busy");
      root.dataset.lastAck = String(msg.req);
      if (cb) cb(msg);
    }
  };
  const handlers = [
    ["msg:custom", onCustom],
    ["change:summary", () => (renderSummary(), renderMessages())],
    ["change:messages", renderMessages],
    ["change:memory", renderMemory],
    ["change:traffic", renderTraffic],
    ["change:findings", renderFindings],
    ["change:comparison", () => (renderCompare(), renderSummary())],
    ["change:code", renderCode],
    ["change:verify_result", renderVerify],
    ["change:tab", () => showTab(model.get("tab"))],
    ["change:torch_version", () => (versionSel.value = model.get("torch_version") || "")],
  ];
  for (const [ev, fn] of handlers) model.on(ev, fn);

  renderSummary();
  renderMessages();
  renderMemory();
  renderTraffic();
  renderFindings();
  renderCompare();
  renderCode();
  renderVerify();
  showTab(model.get("tab") || "charts");
  model.send({ type: "hello", req: 0 });

  return () => {
    disposed = true;
    for (const [ev, fn] of handlers) model.off(ev, fn);
  };
}

export default { render };
