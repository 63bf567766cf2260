// shardviz Inspector front end (anywidget ESM; no build step, no imports, nothing fetched).
// charts.js is concatenated in front of this file by Python (inspector.py): the chart drawing.
//
// Python (shardviz/widget/inspector.py) is the single source of every number and writes every
// trait; this file only draws what it is sent and sends back what the user did, as actions.
//   traits:   controls, summary, memory, traffic, findings, comparison, code, verify_result,
//             messages, tab, torch_version, protocol (the message schema, protocol.py)
//   messages: {type:"rows", order?, rows, reset, matches}  visible rows that changed (virtualised)
//             {type:"reveal", id}                            scroll to a row and flash it
//             {type:"ack", req, ok, error}                    answer to each request
//   we send:  {type:"hello"} on render, {type:"action", action, args, req} on every user action,
//             each checked against the protocol first (checkAction) - Python checks it again.


const ROW_H = 26;
const OVERSCAN = 12;
const MAX_TREE_H = 390;

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

function highlightPython(src) {
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
    const problem = checkAction(model.get("protocol"), action, args);
    if (problem) {
      // never sent: Python would refuse it the same way
      localError(problem);
      return null;
    }
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

  // -- controls (drawn here, state from the "controls" trait; every edit is an action) ------------
  const ctl = {};
  const field = (label, input, title) => h("label", { class: "sv-field", title }, h("span", { class: "sv-field-label", text: label }), input);
  const numberInput = (cls, attrs = {}) => h("input", { class: `sv-input ${cls}`, type: "number", ...attrs });
  ctl.preset = h("select", { class: "sv-preset", "aria-label": "preset" });
  ctl.apply = h("button", { class: "sv-btn sv-apply-preset", text: "apply preset", title: "replace the plan with the preset (undoable)" });
  ctl.undo = h("button", { class: "sv-btn sv-undo", text: "↶ undo", title: "undo the last change of plan, mesh or training" });
  ctl.redo = h("button", { class: "sv-btn sv-redo", text: "↷ redo" });
  ctl.ckptBlocks = h("button", { class: "sv-btn sv-ckpt-blocks", text: "checkpoint all blocks" });
  ctl.rank = numberInput("sv-rank", { min: 0, "aria-label": "rank" });
  ctl.world = numberInput("sv-world", { min: 1, "aria-label": "world size" });
  ctl.replicate = numberInput("sv-replicate", { min: 1, "aria-label": "HSDP replicate" });
  ctl.device = numberInput("sv-device", { min: 0, step: "any", placeholder: "no limit", "aria-label": "device memory in GiB" });
  ctl.paramDtype = h("select", { class: "sv-param-dtype", "aria-label": "param dtype" });
  ctl.reduceDtype = h("select", { class: "sv-reduce-dtype", "aria-label": "reduce dtype" });
  ctl.optimizer = h("select", { class: "sv-optimizer", "aria-label": "optimizer" });
  ctl.offload = h("input", { class: "sv-offload", type: "checkbox", "aria-label": "CPU offload" });
  ctl.batch = numberInput("sv-batch", { min: 1, placeholder: "none", "aria-label": "batch size" });
  ctl.seq = numberInput("sv-seq", { min: 1, "aria-label": "sequence length" });
  const controlsEl = h(
    "div",
    { class: "sv-controls" },
    h(
      "div",
      { class: "sv-controls-row" },
      field("preset", ctl.preset),
      ctl.apply,
      ctl.undo,
      ctl.redo,
      ctl.ckptBlocks,
      field("rank", ctl.rank, "the rank whose local shard shapes the tree shows"),
    ),
    h(
      "div",
      { class: "sv-controls-row" },
      field("world size", ctl.world),
      field("HSDP replicate", ctl.replicate, "HSDP: copies of the sharded model (shard size = world / replicate)"),
      field("device GiB", ctl.device, "device memory per rank in GiB (empty: no limit)"),
      field("param dtype", ctl.paramDtype, "MixedPrecisionPolicy(param_dtype): the dtype parameters are all-gathered and computed in"),
      field("reduce dtype", ctl.reduceDtype, "MixedPrecisionPolicy(reduce_dtype): the dtype gradients are reduced in"),
      field("optimizer", ctl.optimizer),
      field("CPU offload", ctl.offload),
      field("batch", ctl.batch, "micro-batch per rank; empty: the peak counts the model state only (no activations)"),
      field("seq len", ctl.seq, "tokens per sample"),
    ),
  );
  const intOrNull = (el) => (el.value.trim() === "" ? null : Math.round(Number(el.value)));
  ctl.apply.addEventListener("click", () => send("apply_preset", { name: ctl.preset.value }));
  ctl.undo.addEventListener("click", () => send("undo"));
  ctl.redo.addEventListener("click", () => send("redo"));
  ctl.ckptBlocks.addEventListener("click", () => {
    const c = model.get("controls") || {};
    send("checkpoint_blocks", { on: c.n_blocks_checkpointed < c.n_blocks });
  });
  ctl.rank.addEventListener("change", () => send("set_rank", { rank: intOrNull(ctl.rank) ?? 0 }, renderControlsOnError));
  const sendMesh = () =>
    send(
      "set_mesh",
      { world: intOrNull(ctl.world) ?? 0, replicate: intOrNull(ctl.replicate) ?? 0, device_gib: ctl.device.value.trim() === "" ? null : Number(ctl.device.value) },
      renderControlsOnError,
    );
  for (const c of [ctl.world, ctl.replicate, ctl.device]) c.addEventListener("change", sendMesh);
  const sendTraining = () =>
    send(
      "set_training",
      {
        optimizer: ctl.optimizer.value,
        param_dtype: ctl.paramDtype.value || null,
        reduce_dtype: ctl.reduceDtype.value || null,
        offload: ctl.offload.checked,
        batch_size: intOrNull(ctl.batch),
        seq_len: intOrNull(ctl.seq) ?? 0,
      },
      renderControlsOnError,
    );
  for (const c of [ctl.paramDtype, ctl.reduceDtype, ctl.optimizer, ctl.offload, ctl.batch, ctl.seq]) c.addEventListener("change", sendTraining);
  for (const c of Object.values(ctl)) if (c.tagName === "INPUT") c.addEventListener("keydown", (e) => e.stopPropagation());

  function fillSelect(sel, options) {
    const key = JSON.stringify(options);
    if (sel.dataset.options === key) return;
    sel.dataset.options = key;
    sel.replaceChildren(...options.map((o) => (Array.isArray(o) ? h("option", { value: o[0], text: o[1] }) : h("option", { value: o, text: o }))));
  }

  function renderControls() {
    const c = model.get("controls") || {};
    if (c.world === undefined) return;
    fillSelect(ctl.preset, c.presets || []);
    if (c.preset && c.preset !== ctl.preset.dataset.shown) ctl.preset.value = ctl.preset.dataset.shown = c.preset; // the plan's own preset
    fillSelect(ctl.paramDtype, c.dtypes || []);
    fillSelect(ctl.reduceDtype, c.dtypes || []);
    fillSelect(ctl.optimizer, c.optimizers || []);
    ctl.world.value = String(c.world);
    ctl.replicate.value = String(c.replicate);
    ctl.rank.value = String(c.rank);
    ctl.rank.max = String(c.world - 1);
    ctl.device.value = c.device_gib === null ? "" : String(c.device_gib);
    ctl.paramDtype.value = c.param_dtype;
    ctl.reduceDtype.value = c.reduce_dtype;
    ctl.optimizer.value = c.optimizer;
    ctl.offload.checked = !!c.offload;
    ctl.batch.value = c.batch_size === null || c.batch_size === undefined ? "" : String(c.batch_size);
    ctl.seq.value = c.seq_len === null || c.seq_len === undefined ? "" : String(c.seq_len);
    ctl.undo.disabled = !c.can_undo;
    ctl.redo.disabled = !c.can_redo;
    ctl.ckptBlocks.hidden = !c.n_blocks;
    const all = c.n_blocks && c.n_blocks_checkpointed === c.n_blocks;
    ctl.ckptBlocks.textContent = all ? `uncheckpoint all ${c.n_blocks} blocks` : `checkpoint all ${c.n_blocks} blocks`;
    ctl.ckptBlocks.title = c.batch_size
      ? "wrap every repeated block in checkpoint_wrapper: its activations are recomputed in backward"
      : "wrap every repeated block in checkpoint_wrapper (activations count once a batch size is given)";
    ctl.ckptBlocks.classList.toggle("sv-on", !!all);
    controlsEl.dataset.revision = String(c.revision);
  }
  let rafKey = "";
  function onControls() {
    renderControls();
    // the rows' reshard_after_forward menus list controls.raf_choices: redraw them only when those change
    const key = JSON.stringify((model.get("controls") || {}).raf_choices || []);
    if (key !== rafKey) {
      rafKey = key;
      queueTree();
    }
  }
  function renderControlsOnError(ack) {
    if (!ack.ok) renderControls(); // refused: the control shows the current state again
  }

  function localError(text) {
    messagesEl.append(h("div", { class: "sv-msg sv-msg-error sv-local-error" }, h("span", { text })));
  }
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
        showTab(key);
        send("set_tab", { tab: key });
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
  const root = h("div", { class: "sv-inspector" }, summaryEl, controlsEl, messagesEl, tree, viewsEl);
  el.append(root);

  // -- summary and messages --------------------------------------------------------------------
  function renderSummary() {
    const sm = model.get("summary") || {};
    summaryEl.replaceChildren();
    if (!sm.model) return;
    const over = !!(sm.use && sm.use.over);
    const f = sm.findings;
    summaryEl.append(
      h("span", { class: "sv-sum-model", text: `${sm.model}` }),
      h("span", { class: "sv-sum-item sv-sum-size", title: `${(sm.numel || 0).toLocaleString()} parameter elements`, text: `${sm.n_modules.toLocaleString()} modules · ${fmtCount(sm.numel)} parameter elements` }),
      h("span", { class: "sv-sum-item sv-sum-mesh", text: sm.mesh }),
      h("span", { class: "sv-sum-item sv-sum-training", title: "what the numbers assume (change it below)", text: sm.training }),
      h(
        "span",
        { class: "sv-sum-item sv-sum-plan", title: "the plan's name: the preset it started from, and how many edits since" },
        h("b", { class: "sv-plan-name", text: sm.plan_name || "custom plan" }),
        `: ${sm.n_units} calls · ${sm.n_ignored} ignored${sm.n_checkpointed ? ` · ${sm.n_checkpointed} checkpointed` : ""}`,
      ),
      h(
        "span",
        {
          class: `sv-sum-item sv-sum-peak ${over ? "sv-over" : ""}`,
          "data-bytes": sm.peak,
          title: `highest predicted peak of any rank (rank ${sm.worst_rank})`,
        },
        `peak ${fmtBytes(sm.peak)} (rank ${sm.worst_rank})`,
        sm.use ? ` · ${sm.use.percent_text} of ${fmtBytes(sm.limit)}` : "",
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
            showTab("compare");
            send("set_tab", { tab: "compare" });
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
    // the choices come from Python (controls.raf_choices): the ints that divide the shard size
    const choices = (model.get("controls") || {}).raf_choices || ["default", "true", "false"];
    for (const v of choices.slice(3)) sel.append(h("option", { value: v, text: `RAF ${v}` }));
    sel.value = mixed ? "" : value === "default" ? "default" : String(value).toLowerCase();
    sel.addEventListener("change", () => {
      if (sel.value) onchange(sel.value);
    });
    sel.addEventListener("click", (e) => e.stopPropagation());
    return sel;
  }

  function buildRow(id, r) {
    const indent = r.depth * 6; // deep names keep room at 1280 px (the full name is the tooltip)
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
    const tip =
      r.kind === "group" ? r.label : r.kind === "module" ? `${r.fqn || "(root)"} · ${r.type}` : `${r.fqn} · ${r.dtype}, ${r.trainable ? "trainable" : "frozen"}`;
    const name = h("span", { class: "sv-col-name", style: `padding-left:${indent}px`, title: tip }, caret);
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
      if (r.can_checkpoint)
        actions.append(
          actionBtn(
            r.checkpointed ? "✓ ckpt" : "ckpt",
            `sv-act-ckpt${r.checkpointed ? " sv-on" : ""}`,
            r.checkpointed ? "checkpointed (checkpoint_wrapper): click to keep its activations instead" : "wrap in checkpoint_wrapper: recompute its activations in backward",
            () => send("toggle_checkpoint", { fqn: r.fqn }),
          ),
        );
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
          ? actionBtn("− units", "sv-act-unit sv-act-remove", `remove the call of each of the ${r.count} blocks`, () =>
              send("apply_to_many", { targets: id, action: "remove_unit" }),
            )
          : actionBtn("+ units", "sv-act-unit sv-act-make", `give each of the ${r.count} blocks its own call`, () =>
              send("apply_to_many", { targets: id, action: "make_unit" }),
            ),
      );
      const allCk = r.n_checkpointed === r.count;
      actions.append(
        actionBtn(
          allCk ? "✓ ckpt" : "ckpt",
          `sv-act-ckpt${allCk ? " sv-on" : ""}`,
          allCk ? `stop checkpointing the ${r.count} blocks` : `checkpoint each of the ${r.count} blocks (${r.n_checkpointed} now)`,
          () => send("apply_to_many", { targets: id, action: allCk ? "uncheckpoint" : "checkpoint" }),
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

  // -- charts (charts.js draws them; the report uses the same functions) ----------------------
  function renderMemory() {
    drawMemory(memoryEl, model.get("memory") || {});
  }

  function renderTraffic() {
    drawTraffic(trafficEl, model.get("traffic") || {});
  }

  // -- A vs B (pinned plan against the current one) ----------------------------------------------------

  function describe(side, label) {
    return h(
      "div",
      { class: `sv-cmp-side sv-cmp-side-${side.key}` },
      h("span", { class: `sv-swatch sv-pair-${side.key}` }),
      h("b", { text: label }),
      ` ${side.d.n_units} calls · ${side.d.n_ignored} ignored${side.d.plan_name ? ` · ${side.d.plan_name}` : ""} · ${side.d.mesh}`,
    );
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
              text: ` and ${(f.n_fqns - listed).toLocaleString()} more`,
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
    send("set_torch_version", { version: versionSel.value });
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
    ["change:controls", onControls],
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
  onControls();
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
