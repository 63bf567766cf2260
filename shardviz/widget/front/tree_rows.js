// tree_rows.js: one row of the tree (name, type, size, status, bytes, shard) and its actions.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, fmtBytes, fmtCount, fmtShape, h } from "../charts.js";

// ---------------------------------------------------------------------------------------------
// tree rows: the cells and action buttons of module, group and parameter rows (tree.js lists them)
// ---------------------------------------------------------------------------------------------
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

// reshard_after_forward of a call; the choices come from Python (controls.reshard_choices): the ints
// that divide the shard size
function reshardSelect(choices, value, onchange, mixed = false) {
  const sel = h(
    "select",
    { class: "sv-reshard", title: "reshard_after_forward of this call" },
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

// the name's tooltip: also what a narrow widget hides (the elements and status columns)
function rowTip(r) {
  const status = r.badge && r.badge.label ? ` · ${r.badge.label}` : "";
  const size = typeof r.numel === "number" ? ` · ${fmt(r.numel, "int")} elements` : "";
  if (r.kind === "group") return `${r.label}${size}${status}`;
  if (r.kind === "module") return `${r.fqn || "<root>"} · ${r.type}${size}${status}`;
  return `${r.fqn} · ${r.dtype}, ${r.trainable ? "trainable" : "frozen"}${size}${status}`;
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
export function buildRow(ctx, id, r, flashed, most = 0) {
  const row = h("div", {
    class: `sv-row sv-kind-${r.kind}${flashed ? " sv-flash" : ""}`,
    style: `--depth:${r.depth}`,
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
  const choices = (ctx.model.get("controls") || {}).reshard_choices || ["default", "true", "false"];
  const cells = r.kind === "module" ? moduleCells(r) : r.kind === "group" ? groupCells(r) : paramCells(r);
  name.append(...cells.name);
  const bytes = cells.middle.find((c) => c.classList.contains("sv-col-bytes"));
  if (bytes && most > 0) bytes.style.setProperty("--sv-fill", `${((100 * (r.bytes || 0)) / most).toFixed(1)}%`);
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
  const tied = r.tied_numel > 0 ? `; ${fmt(r.tied_numel, "int")} more in tied parameters, counted under their first module` : "";
  return {
    name: [h("span", { class: "sv-name", text: r.name })],
    middle: [
      // on a 2-D mesh, the module's tensor-parallel style after its type
      h("span", { class: "sv-col-type", text: r.tp ? `${r.type} · ${r.tp}` : r.type, title: r.tp ? `${r.type}; tensor parallel: ${r.tp}` : r.type }),
      h("span", {
        class: "sv-col-size",
        "data-numel": r.numel,
        text: r.numel === 0 && r.tied_numel > 0 ? "tied" : fmtCount(r.numel),
        title: `${fmt(r.numel, "int")} elements in ${r.n_params} parameters${tied}`,
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
      h("span", { class: "sv-col-size", text: fmtShape(r.shape), title: `${fmt(r.numel, "int")} elements` }),
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
    out.push(reshardSelect(choices, r.reshard_after_forward, (v) => send("set_reshard_after_forward", { fqn, value: v })));
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
    const mixed = r.reshard_after_forward === null || r.reshard_after_forward === undefined;
    out.push(reshardSelect(choices, r.reshard_after_forward ?? "default", (v) => many("set_reshard_after_forward", { value: v })(), mixed));
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
