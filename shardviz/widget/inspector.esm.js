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
//
// Layout of this file: one top-level function per component (summary, messages, controls, tree,
// charts, compare, findings, export, tabs), each given what it needs explicitly (the shared `ctx`:
// model and send, plus callbacks), then `render`, which builds them and wires the traits to them.
// The exported code arrives highlighted (HTML from pygments, in Python): nothing is parsed here.

const ROW_H = 26;
const OVERSCAN = 12;
const MAX_TREE_H = 390;

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
function makeContext(model) {
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

function selectOf(cls, label, options) {
  return h("select", { class: cls, "aria-label": label }, ...options.map(([v, t]) => h("option", { value: v, text: t })));
}

function fillSelect(sel, options) {
  const key = JSON.stringify(options);
  if (sel.dataset.options === key) return;
  sel.dataset.options = key;
  sel.replaceChildren(...options.map((o) => (Array.isArray(o) ? h("option", { value: o[0], text: o[1] }) : h("option", { value: o, text: o }))));
}

function keepKeysFromLab(input) {
  input.addEventListener("keydown", (e) => e.stopPropagation()); // JupyterLab's notebook shortcuts stay out
}

// ---------------------------------------------------------------------------------------------
// summary: model, mesh, training, the plan's name, the peak, the findings' counts
// ---------------------------------------------------------------------------------------------
function summaryComponent(ctx, { openCompare }) {
  const el = h("div", { class: "sv-summary" });
  function render() {
    const sm = ctx.model.get("summary") || {};
    el.replaceChildren();
    if (!sm.model) return;
    el.append(
      h("span", { class: "sv-sum-model", text: `${sm.model}` }),
      h("span", { class: "sv-sum-item sv-sum-size", title: `${(sm.numel || 0).toLocaleString()} parameter elements`, text: `${sm.n_modules.toLocaleString()} modules · ${fmtCount(sm.numel)} parameter elements` }),
      h("span", { class: "sv-sum-item sv-sum-mesh", text: sm.mesh }),
      h("span", { class: "sv-sum-item sv-sum-training", title: "what the numbers assume (change it below)", text: sm.training }),
      planItem(sm),
      peakItem(sm),
      findingsItem(sm),
    );
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
    `: ${sm.n_units} calls · ${sm.n_ignored} ignored${sm.n_checkpointed ? ` · ${sm.n_checkpointed} checkpointed` : ""}`,
  );
}

function peakItem(sm) {
  const over = !!(sm.use && sm.use.over);
  return h(
    "span",
    { class: `sv-sum-item sv-sum-peak ${over ? "sv-over" : ""}`, "data-bytes": sm.peak, title: `highest predicted peak of any rank (rank ${sm.worst_rank})` },
    `peak ${fmtBytes(sm.peak)} (rank ${sm.worst_rank})`,
    sm.use ? ` · ${sm.use.percent_text} of ${fmtBytes(sm.limit)}` : "",
  );
}

function findingsItem(sm) {
  const f = sm.findings_text;
  if (!f) return h("span", { class: "sv-sum-item sv-muted", text: "checking…" });
  return h(
    "span",
    { class: `sv-sum-item sv-sum-findings${sm.findings_stale ? " sv-stale" : ""}`, title: sm.findings_stale ? "checking the new plan…" : "" },
    h("span", { class: "sv-sev sv-sev-error", text: f.error }),
    " ",
    h("span", { class: "sv-sev sv-sev-warning", text: f.warning }),
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
function messagesComponent(ctx) {
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

// ---------------------------------------------------------------------------------------------
// controls: drawn here, state from the "controls" trait; every edit is an action
// ---------------------------------------------------------------------------------------------
function controlInputs() {
  const numberInput = (cls, attrs = {}) => h("input", { class: `sv-input ${cls}`, type: "number", ...attrs });
  return {
    preset: h("select", { class: "sv-preset", "aria-label": "preset", title: "choosing a preset replaces the plan's calls and ignored parameters (undo goes back); the checkpointing stays" }),
    undo: h("button", { class: "sv-btn sv-undo", text: "↶ undo", title: "undo the last change of plan, mesh or training" }),
    redo: h("button", { class: "sv-btn sv-redo", text: "↷ redo" }),
    ckptBlocks: h("button", { class: "sv-btn sv-ckpt-blocks", text: "checkpoint all blocks" }),
    rank: numberInput("sv-rank", { min: 0, "aria-label": "rank" }),
    world: numberInput("sv-world", { min: 1, "aria-label": "world size" }),
    replicate: numberInput("sv-replicate", { min: 1, "aria-label": "HSDP replicate" }),
    device: h("input", { class: "sv-input sv-device", type: "text", inputmode: "decimal", placeholder: "no limit", "aria-label": "device memory in GiB" }),
    paramDtype: h("select", { class: "sv-param-dtype", "aria-label": "param dtype" }),
    reduceDtype: h("select", { class: "sv-reduce-dtype", "aria-label": "reduce dtype" }),
    optimizer: h("select", { class: "sv-optimizer", "aria-label": "optimizer" }),
    offload: h("input", { class: "sv-offload", type: "checkbox", "aria-label": "CPU offload" }),
    batch: numberInput("sv-batch", { min: 1, placeholder: "none", "aria-label": "batch size" }),
    seq: numberInput("sv-seq", { min: 1, "aria-label": "sequence length" }),
    seqNote: h("span", { class: "sv-field-note sv-seq-note" }),
  };
}

function controlsLayout(ctl) {
  const field = (label, input, title) => h("label", { class: "sv-field", title }, h("span", { class: "sv-field-label", text: label }), input);
  return h(
    "div",
    { class: "sv-controls" },
    h(
      "div",
      { class: "sv-controls-row" },
      field("preset", ctl.preset),
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
      field("device GiB", ctl.device, "device memory per rank: a number of GiB, or a size with its unit (80GiB, 96GB); empty: no limit"),
      field("param dtype", ctl.paramDtype, "MixedPrecisionPolicy(param_dtype): the dtype parameters are all-gathered and computed in"),
      field("reduce dtype", ctl.reduceDtype, "MixedPrecisionPolicy(reduce_dtype): the dtype gradients are reduced in"),
      field("optimizer", ctl.optimizer),
      field("CPU offload", ctl.offload),
      field("batch", ctl.batch, "micro-batch per rank; empty: the peak counts the model state only (no activations)"),
      field("seq len", ctl.seq, "tokens per sample"),
      ctl.seqNote,
    ),
  );
}

function wireControls(ctx, ctl, showState) {
  const { send, model } = ctx;
  const intOrNull = (el) => (el.value.trim() === "" ? null : Math.round(Number(el.value)));
  const onRefused = (ack) => {
    if (!ack.ok) showState(); // refused: the control shows the current state again
  };
  ctl.preset.addEventListener("change", () => {
    if (ctl.preset.value) send("apply_preset", { name: ctl.preset.value }, onRefused);
  });
  ctl.undo.addEventListener("click", () => send("undo"));
  ctl.redo.addEventListener("click", () => send("redo"));
  ctl.ckptBlocks.addEventListener("click", () => {
    const c = model.get("controls") || {};
    send("checkpoint_blocks", { on: c.n_blocks_checkpointed < c.n_blocks });
  });
  ctl.rank.addEventListener("change", () => send("set_rank", { rank: intOrNull(ctl.rank) ?? 0 }, onRefused));
  // each field sends only itself: a shown value ("89.41 GiB") is never sent back rounded
  const sendRanks = () => send("set_mesh", { world: intOrNull(ctl.world) ?? 0, replicate: intOrNull(ctl.replicate) ?? 0 }, onRefused);
  for (const c of [ctl.world, ctl.replicate]) c.addEventListener("change", sendRanks);
  ctl.device.addEventListener("change", () => send("set_mesh", { device_memory: ctl.device.value.trim() }, onRefused));
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
      onRefused,
    );
  for (const c of [ctl.paramDtype, ctl.reduceDtype, ctl.optimizer, ctl.offload, ctl.batch, ctl.seq]) c.addEventListener("change", sendTraining);
  for (const c of Object.values(ctl)) if (c.tagName === "INPUT") keepKeysFromLab(c);
}

function showControls(ctl, c) {
  fillSelect(ctl.preset, c.presets || []);
  ctl.preset.value = c.preset || ""; // the plan's own preset, or "custom or edited plan"
  fillSelect(ctl.paramDtype, c.dtypes || []);
  fillSelect(ctl.reduceDtype, c.dtypes || []);
  fillSelect(ctl.optimizer, c.optimizers || []);
  const text = (v) => (v === null || v === undefined ? "" : String(v));
  ctl.world.value = String(c.world);
  ctl.replicate.value = String(c.replicate);
  ctl.rank.value = String(c.rank);
  ctl.rank.max = String(c.world - 1);
  ctl.device.value = c.device_text || "";
  ctl.paramDtype.value = c.param_dtype;
  ctl.reduceDtype.value = c.reduce_dtype;
  ctl.optimizer.value = c.optimizer;
  ctl.offload.checked = !!c.offload;
  ctl.batch.value = text(c.batch_size);
  ctl.seq.value = text(c.seq_len);
  ctl.seq.classList.toggle("sv-warn-input", !!c.seq_len_note);
  ctl.seqNote.textContent = c.seq_len_note ? "⚠ above the model's positions" : "";
  ctl.seqNote.title = c.seq_len_note || "";
  ctl.undo.disabled = !c.can_undo;
  ctl.redo.disabled = !c.can_redo;
  showCheckpointBlocks(ctl.ckptBlocks, c);
}

function showCheckpointBlocks(btn, c) {
  btn.hidden = !c.n_blocks;
  const all = c.n_blocks && c.n_blocks_checkpointed === c.n_blocks;
  btn.textContent = all ? `uncheckpoint all ${c.n_blocks} blocks` : `checkpoint all ${c.n_blocks} blocks`;
  btn.title = c.batch_size
    ? "wrap every repeated block in checkpoint_wrapper: its activations are recomputed in backward"
    : "wrap every repeated block in checkpoint_wrapper (activations count once a batch size is given)";
  btn.classList.toggle("sv-on", !!all);
}

function controlsComponent(ctx, { onRafChoices }) {
  const ctl = controlInputs();
  const el = controlsLayout(ctl);
  function showState() {
    const c = ctx.model.get("controls") || {};
    if (c.world === undefined) return;
    showControls(ctl, c);
    el.dataset.revision = String(c.revision);
  }
  wireControls(ctx, ctl, showState);
  let rafKey = "";
  function render() {
    showState();
    // the rows' reshard_after_forward menus list controls.raf_choices: redraw them only when those change
    const key = JSON.stringify((ctx.model.get("controls") || {}).raf_choices || []);
    if (key !== rafKey) {
      rafKey = key;
      onRafChoices();
    }
  }
  return { el, render };
}

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
          ? `${msg.truncated.toLocaleString()} more matches not shown: refine the filter`
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
    h("span", { class: "sv-col-size", text: "elements", title: "number of elements (modules: every parameter under it, tied ones once) or shape (parameters); bn = billion, mn = million, k = thousand" }),
    h("span", { class: "sv-col-status", text: "status" }),
    h("span", { class: "sv-col-bytes", text: "per rank", title: "parameter bytes each rank allocates (padded shards; whole tensors for ignored and unmanaged)" }),
    h("span", { class: "sv-col-local", text: "local shard" }),
    h("span", { class: "sv-col-actions", text: "actions" }),
  );
}

function badge(b) {
  return h("span", { class: `sv-badge sv-badge-${b.kind}`, title: b.title || "", text: b.label });
}

function actionBtn(label, cls, title, onclick) {
  return h("button", { class: `sv-btn sv-act ${cls}`, text: label, title, onclick });
}

// an on/off action: one label, the state shown by its colour (sv-on) and aria-pressed, so the
// actions column keeps one width
function toggleBtn(label, on, cls, title, onclick) {
  const b = actionBtn(label, `${cls}${on ? " sv-on" : ""}`, title, onclick);
  b.setAttribute("aria-pressed", String(!!on));
  return b;
}

// reshard_after_forward of a call; the choices come from Python (controls.raf_choices): the ints
// that divide the shard size
function rarSelect(choices, value, onchange, mixed = false) {
  const sel = h(
    "select",
    { class: "sv-rar", title: "reshard_after_forward of this call" },
    ...(mixed ? [h("option", { value: "", text: "RAF mixed" })] : []),
    h("option", { value: "default", text: "RAF default" }),
    h("option", { value: "true", text: "RAF True" }),
    h("option", { value: "false", text: "RAF False" }),
  );
  for (const v of choices.slice(3)) sel.append(h("option", { value: v, text: `RAF ${v}` }));
  sel.value = mixed ? "" : value === "default" ? "default" : String(value).toLowerCase();
  sel.addEventListener("change", () => {
    if (sel.value) onchange(sel.value);
  });
  sel.addEventListener("click", (e) => e.stopPropagation());
  return sel;
}

function rowTip(r) {
  if (r.kind === "group") return r.label;
  if (r.kind === "module") return `${r.fqn || "(root)"} · ${r.type}`;
  return `${r.fqn} · ${r.dtype}, ${r.trainable ? "trainable" : "frozen"}`;
}

function caretOf(ctx, id, r) {
  if (!r.expandable) return h("span", { class: "sv-caret sv-caret-none" });
  return h("button", {
    class: "sv-caret",
    text: r.open ? "▾" : "▸",
    "aria-label": r.open ? "collapse" : "expand",
    onclick: (e) => {
      e.stopPropagation();
      ctx.send("expand", { target: id, open: !r.open });
    },
  });
}

// one tree row: name, type, size, status, bytes per rank, local shard, actions
function buildRow(ctx, id, r, flashed) {
  const row = h("div", {
    class: `sv-row sv-kind-${r.kind}${flashed ? " sv-flash" : ""}`,
    "data-id": id,
    "data-fqn": r.kind === "group" ? null : r.fqn,
    "data-group": r.kind === "group" ? r.name : null,
    "data-badge": r.badge.kind,
    "data-depth": r.depth,
    role: "row",
  });
  // the indent per level is CSS (--sv-indent: less in a narrow widget); the full name is the tooltip
  const name = h("span", { class: "sv-col-name", style: `--depth:${r.depth}`, title: rowTip(r) }, caretOf(ctx, id, r));
  const actions = h("span", { class: "sv-col-actions" });
  const choices = (ctx.model.get("controls") || {}).raf_choices || ["default", "true", "false"];
  const cells = r.kind === "module" ? moduleCells(r) : r.kind === "group" ? groupCells(r) : paramCells(r);
  name.append(...cells.name);
  row.append(name, ...cells.middle, actions);
  const send = ctx.send;
  const acts = r.kind === "module" ? moduleActions(send, r, choices) : r.kind === "group" ? groupActions(send, id, r, choices) : paramActions(send, r);
  actions.append(...acts);
  return row;
}

function bytesCell(r) {
  return h("span", { class: "sv-col-bytes", text: fmtBytes(r.bytes), "data-bytes": r.bytes });
}

function moduleCells(r) {
  const tied = r.tied_numel > 0 ? `; ${r.tied_numel.toLocaleString()} more in tied parameters, counted under their first module` : "";
  return {
    name: [h("span", { class: "sv-name", text: r.name })],
    middle: [
      h("span", { class: "sv-col-type", text: r.type, title: r.type }),
      h("span", {
        class: "sv-col-size",
        "data-numel": r.numel,
        text: r.numel === 0 && r.tied_numel > 0 ? "tied" : fmtCount(r.numel),
        title: `${r.numel.toLocaleString()} elements in ${r.n_params} parameters${tied}`,
      }),
      h("span", { class: "sv-col-status" }, badge(r.badge)),
      bytesCell(r),
      h("span", { class: "sv-col-local" }),
    ],
  };
}

function groupCells(r) {
  return {
    name: [h("span", { class: "sv-name sv-group-label", text: r.name }), h("span", { class: "sv-group-kind", text: ` · ${r.count} × ${r.type}` })],
    middle: [
      h("span", { class: "sv-col-type", text: `${r.count} × ${r.type}`, title: r.type }),
      h("span", { class: "sv-col-size", text: fmtCount(r.numel) }),
      h("span", { class: "sv-col-status" }, badge(r.badge)),
      bytesCell(r),
      h("span", { class: "sv-col-local" }),
    ],
  };
}

function paramCells(r) {
  const localTitle = r.status === "sharded" ? `p.to_local().shape on rank ${r.rank}; every rank allocates ${fmtShape(r.shard_shape)}` : "not sharded: the full tensor";
  return {
    name: [
      h("span", { class: "sv-name sv-param-name", text: r.name }),
      r.role === "lora" ? h("span", { class: "sv-tag sv-tag-lora", text: "LoRA" }) : null,
      r.tied ? h("span", { class: "sv-tag", text: "tied", title: `also ${r.canonical}` }) : null,
    ].filter(Boolean),
    middle: [
      h(
        "span",
        { class: "sv-col-type" },
        `${r.dtype} `,
        h("span", { class: `sv-tag ${r.trainable ? "sv-tag-train" : "sv-tag-frozen"}`, text: r.trainable ? "trainable" : "frozen" }),
      ),
      h("span", { class: "sv-col-size", text: fmtShape(r.shape), title: `${r.numel.toLocaleString()} elements` }),
      h("span", { class: "sv-col-status" }, badge(r.badge)),
      bytesCell(r),
      h(
        "span",
        { class: "sv-col-local", title: localTitle },
        h("span", { class: "sv-local-shape", text: fmtShape(r.local_shape) }),
        r.padding > 0 ? h("span", { class: "sv-pad", text: ` +${fmtCount(r.padding)} pad` }) : null,
      ),
    ],
  };
}

function moduleActions(send, r, choices) {
  const out = [];
  const fqn = r.fqn;
  if (r.is_unit) {
    const title = r.grouped ? `remove the grouped call ${r.unit} (all its modules)` : "remove this fully_shard call";
    out.push(actionBtn("− unit", "sv-act-unit sv-act-remove", title, () => send("toggle_unit", { fqn })));
    out.push(rarSelect(choices, r.rar, (v) => send("set_reshard_after_forward", { fqn, value: v })));
  } else if (r.can_unit) {
    out.push(actionBtn("+ unit", "sv-act-unit sv-act-make", "give this module its own fully_shard call", () => send("toggle_unit", { fqn })));
  }
  if (r.can_checkpoint) {
    const title = r.checkpointed ? "checkpointed (checkpoint_wrapper): click to keep its activations instead" : "wrap in checkpoint_wrapper: recompute its activations in backward";
    out.push(toggleBtn("ckpt", r.checkpointed, "sv-act-ckpt", title, () => send("toggle_checkpoint", { fqn })));
  }
  if (r.n_lora > 0) {
    out.push(
      r.lora === "ignored"
        ? actionBtn("un-ignore LoRA", "sv-act-lora sv-act-unignore-lora", "stop ignoring the LoRA parameters under this module: give them back to FSDP", () => send("unignore_lora", { module_fqn: fqn }))
        : actionBtn("ignore LoRA", "sv-act-lora sv-act-ignore-lora", `ignore the ${r.n_lora} LoRA parameters under this module`, () => send("ignore_lora", { module_fqn: fqn })),
    );
  }
  return out;
}

function groupActions(send, id, r, choices) {
  const many = (action, extra = {}) => () => send("apply_to_many", { targets: id, action, ...extra });
  const out = [];
  out.push(
    r.n_units === r.count
      ? actionBtn("− units", "sv-act-unit sv-act-remove", `remove the call of each of the ${r.count} blocks`, many("remove_unit"))
      : actionBtn("+ units", "sv-act-unit sv-act-make", `give each of the ${r.count} blocks its own call`, many("make_unit")),
  );
  const allCk = r.n_checkpointed === r.count;
  const ckTitle = allCk ? `stop checkpointing the ${r.count} blocks` : `checkpoint each of the ${r.count} blocks (${r.n_checkpointed} now)`;
  out.push(toggleBtn("ckpt", allCk, "sv-act-ckpt", ckTitle, many(allCk ? "uncheckpoint" : "checkpoint")));
  if (r.n_units > 0) {
    const mixed = r.rar === null || r.rar === undefined;
    out.push(rarSelect(choices, r.rar ?? "default", (v) => many("set_reshard_after_forward", { value: v })(), mixed));
  }
  if (r.n_lora > 0) {
    out.push(
      r.lora === "ignored"
        ? actionBtn("un-ignore LoRA", "sv-act-lora sv-act-unignore-lora", `stop ignoring the LoRA parameters of all ${r.count} blocks: give them back to FSDP`, many("unignore_lora"))
        : actionBtn("ignore LoRA", "sv-act-lora sv-act-ignore-lora", `ignore the LoRA parameters of all ${r.count} blocks`, many("ignore_lora")),
    );
  }
  return out;
}

function paramActions(send, r) {
  const toggle = () => send("toggle_ignored", { fqn: r.fqn });
  return [
    r.status === "ignored"
      ? actionBtn("un-ignore", "sv-act-ignore sv-act-unignore", "give this parameter back to FSDP", toggle)
      : actionBtn("ignore", "sv-act-ignore", "keep this parameter out of FSDP (ignored_params)", toggle),
  ];
}

// A name wider than its cell loses its middle, not its end: siblings differ at either end
// ("lora_embedding_A" / "lora_embedding_B", "input_layernorm" / "post_attention_layernorm").
const measureCanvas = document.createElement("canvas").getContext("2d");
function fitName(el) {
  const full = el.dataset.full || el.textContent;
  el.dataset.full = full;
  const room = el.parentElement.clientWidth - (el.offsetLeft - el.parentElement.offsetLeft) - 4;
  const style = getComputedStyle(el);
  measureCanvas.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
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

function treeComponent(ctx) {
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

  // only the rows on screen (and a few more) exist in the page
  function draw() {
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
      const row = buildRow(ctx, id, r, id === flashId);
      row.style.top = `${i * ROW_H}px`;
      frag.append(row);
    }
    rowsLayer.replaceChildren(frag);
    for (const n of rowsLayer.querySelectorAll(".sv-name")) fitName(n);
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
    scroller.scrollTop = Math.max(0, i * ROW_H - height / 2 + ROW_H);
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

// ---------------------------------------------------------------------------------------------
// charts: charts.js draws them (the report uses the same functions)
// ---------------------------------------------------------------------------------------------
function chartsPanel(ctx) {
  const memoryEl = h("div", { class: "sv-memory" });
  const trafficEl = h("div", { class: "sv-traffic" });
  const timelineEl = h("div", { class: "sv-timeline" });
  const el = h("div", { class: "sv-panel sv-panel-charts", "data-panel": "charts" }, memoryEl, trafficEl, timelineEl);
  return {
    el,
    renderTimeline: () => drawTimeline(timelineEl, ctx.model.get("timeline") || {}),
    renderMemory: () => drawMemory(memoryEl, ctx.model.get("memory") || {}),
    renderTraffic: () => drawTraffic(trafficEl, ctx.model.get("traffic") || {}),
  };
}

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
    const exact = (v) => (r.kind === "bytes" ? `${v.toLocaleString()} B` : "");
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
  const note = `peak on rank ${c.peak_rank.a} (A) and rank ${c.peak_rank.b} (B) · finding codes A: ${f.a || "none"} · B: ${f.b || "none"}`;
  return h("div", { class: "sv-cmp-tablebox" }, table, h("div", { class: "sv-chart-note", text: note }));
}

function compareCharts(c) {
  const by = (g) => (c.rows || []).filter((r) => r.group === g);
  return h(
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
}

function revealLink(send, fqn, text, title) {
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

function comparePanel(ctx, { pinButtons, setTabLabel }) {
  const el = h("div", { class: "sv-panel sv-panel-compare", "data-panel": "compare" });
  function render() {
    const c = ctx.model.get("comparison") || {};
    el.replaceChildren();
    el.dataset.pinned = String(!!c.pinned);
    el.dataset.revision = String(c.revision ?? "");
    pinButtons.pin.textContent = c.pinned ? "re-pin as A" : "pin as A";
    pinButtons.unpin.hidden = !c.pinned;
    setTabLabel(c.pinned && c.available ? `A vs B (${c.n_diff} differ)` : "A vs B");
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

// ---------------------------------------------------------------------------------------------
// findings: what is wrong or wasteful, each with its fix; a click reveals it in the tree
// ---------------------------------------------------------------------------------------------
function findingItem(send, f) {
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
  if (!f.fqns.length) return item;
  const where = h("div", { class: "sv-finding-fqns" }, f.fqns.slice(0, 4).map((q) => revealLink(send, q, q || "<root>")));
  const listed = Math.min(4, f.fqns.length);
  if (f.n_fqns > listed) {
    where.append(
      h("span", { class: "sv-muted sv-finding-more", "data-more": f.n_fqns - listed, text: ` and ${(f.n_fqns - listed).toLocaleString()} more` }),
      h("button", {
        class: "sv-btn sv-finding-filter",
        text: `show all ${f.n_fqns.toLocaleString()} in the tree`,
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

function findingsPanel(ctx, { tabButton }) {
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

// ---------------------------------------------------------------------------------------------
// export: the fully_shard code for a torch release (highlighted by Python), copy, save, verify
// ---------------------------------------------------------------------------------------------
async function copyText(text) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch (_e) {
    // fall back to the textarea below
  }
  const ta = h("textarea", { class: "sv-offscreen" });
  ta.value = text;
  document.body.append(ta);
  ta.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch (_e) {
    ok = false;
  }
  ta.remove();
  return ok;
}

function verifyView(v) {
  const cls = v.ok ? "sv-status-ok" : "sv-status-error";
  const text = v.error
    ? `torch raised ${v.error}`
    : v.ok
      ? `torch agrees: every parameter's status, call, local shape and placement match the prediction (${v.seconds}s)`
      : `${v.n} disagreement(s) with torch`;
  const out = [h("div", { class: `sv-verify-line ${cls}`, "data-ok": String(v.ok), text })];
  if (v.rows && v.rows.length) {
    const keys = ["rank", "fqn", "field", "predicted", "torch"];
    const table = h("table", { class: "sv-verify-table" }, h("tr", {}, keys.map((k) => h("th", { text: k }))));
    for (const r of v.rows) table.append(h("tr", {}, keys.map((k) => h("td", { text: r[k] }))));
    out.push(table);
  }
  return out;
}

function exportToolbar(model, send) {
  const versionSel = selectOf(
    "sv-torch-version",
    "target torch release",
    (model.get("torch_releases") || [""]).map((v) => [v, v ? `torch ${v}` : "torch: detect at run time"]),
  );
  versionSel.value = model.get("torch_version") || "";
  versionSel.addEventListener("change", () => send("set_torch_version", { version: versionSel.value }));
  const pathInput = h("input", { class: "sv-save-path", type: "text", value: "fsdp_plan.py", "aria-label": "file to save the code to" });
  keepKeysFromLab(pathInput);
  return {
    versionSel,
    pathInput,
    copyBtn: h("button", { class: "sv-btn sv-copy", text: "copy" }),
    saveBtn: h("button", { class: "sv-btn sv-save", text: "save" }),
    verifyBtn: h("button", { class: "sv-btn sv-verify", text: "verify with torch" }),
  };
}

function exportPanel(ctx) {
  const { model, send } = ctx;
  const { versionSel, pathInput, copyBtn, saveBtn, verifyBtn } = exportToolbar(model, send);
  const status = h("div", { class: "sv-export-status" });
  const verifyEl = h("div", { class: "sv-verify-result" });
  const codeEl = h("pre", { class: "sv-code" }, h("code", {}));
  const el = h(
    "div",
    { class: "sv-panel sv-panel-export", "data-panel": "export" },
    h("div", { class: "sv-export-toolbar" }, versionSel, copyBtn, pathInput, saveBtn, verifyBtn),
    status,
    verifyEl,
    codeEl,
  );
  const setStatus = (text, level = "info", extra = []) => status.replaceChildren(h("span", { class: `sv-status-${level}`, text }), ...extra);

  copyBtn.addEventListener("click", async () => {
    const c = model.get("code") || {};
    if (!c.text) return;
    const ok = await copyText(c.text);
    setStatus(ok ? `copied ${c.n_lines} lines to the clipboard` : "could not copy: select the code and copy it by hand", ok ? "ok" : "error");
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
    el.dataset.revision = String(c.revision ?? "");
    if (c.stale || c.error) {
      codeTag.textContent = "";
      if (c.error) setStatus(`cannot export: torch would refuse this plan.\n${c.error}`, "error");
      return;
    }
    codeTag.innerHTML = c.html || ""; // pygments' HTML, escaped in Python
    codeEl.dataset.chars = String((c.text || "").length);
    if (status.querySelector(".sv-status-error")) status.replaceChildren();
  }
  function renderVerify() {
    const v = model.get("verify_result") || {};
    if (v.ok === undefined) {
      if (!verifyEl.querySelector(".sv-verifying")) verifyEl.replaceChildren();
      return;
    }
    verifyEl.replaceChildren(...verifyView(v));
  }
  const showVersion = () => (versionSel.value = model.get("torch_version") || "");
  return { el, renderCode, renderVerify, showVersion };
}

// ---------------------------------------------------------------------------------------------
// tabs: the panels under the tree, and the pin buttons of A vs B
// ---------------------------------------------------------------------------------------------
const TABS = [
  ["charts", "Memory & traffic"],
  ["compare", "A vs B"],
  ["findings", "Findings"],
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
  const messages = messagesComponent(ctx);
  ctx.onLocalError = messages.localError;
  const tree = treeComponent(ctx);
  const controls = controlsComponent(ctx, { onRafChoices: tree.queue });
  const charts = chartsPanel(ctx);
  const compare = comparePanel(ctx, { pinButtons: tabs.pinButtons, setTabLabel: (text) => (tabs.tabButton("compare").textContent = text) });
  const findings = findingsPanel(ctx, { tabButton: tabs.tabButton });
  const exporter = exportPanel(ctx);
  tabs.setPanels([charts.el, compare.el, findings.el, exporter.el]);
  const views = h("div", { class: "sv-views" }, tabs.el, charts.el, compare.el, findings.el, exporter.el);
  ctx.root = h("div", { class: "sv-inspector" }, summary.el, controls.el, messages.el, tree.el, views);
  el.append(ctx.root);

  const renderSummary = () => {
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
    ["change:controls", controls.render],
    ["change:messages", messages.render],
    ["change:memory", charts.renderMemory],
    ["change:traffic", charts.renderTraffic],
    ["change:timeline", charts.renderTimeline],
    ["change:findings", findings.render],
    ["change:comparison", () => (compare.render(), renderSummary())],
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
