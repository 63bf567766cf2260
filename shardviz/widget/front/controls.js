// controls.js: the mesh, training, rank and history controls, drawn from the "controls" trait.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { h } from "../charts.js";
import { fillSelect, keepKeysFromLab } from "./base.js";

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
    tensor: numberInput("sv-tensor", { min: 1, "aria-label": "TP" }),
    device: h("input", { class: "sv-input sv-device", type: "text", inputmode: "decimal", placeholder: "no limit", "aria-label": "device memory" }),
    paramDtype: h("select", { class: "sv-param-dtype", "aria-label": "param dtype" }),
    reduceDtype: h("select", { class: "sv-reduce-dtype", "aria-label": "reduce dtype" }),
    optimizer: h("select", { class: "sv-optimizer", "aria-label": "optimizer" }),
    offload: h("input", { class: "sv-offload", type: "checkbox", "aria-label": "CPU offload" }),
    batch: numberInput("sv-batch", { min: 1, placeholder: "none", "aria-label": "batch size" }),
    seq: numberInput("sv-seq", { min: 1, "aria-label": "sequence length" }),
    seqNote: h("span", { class: "sv-field-note sv-seq-note" }),
    offloadNote: h("span", { class: "sv-muted sv-offload-note" }),
    more: h("button", { class: "sv-btn sv-more", text: "more settings", "aria-expanded": "false", title: "reduce dtype, optimizer, CPU offload, the rank the tree shows" }),
  };
}

// one row of the controls an edit usually needs; the rest in a drawer ("more settings")
function controlsLayout(ctl) {
  const field = (label, input, title) => h("label", { class: "sv-field", title }, h("span", { class: "sv-field-label", text: label }), input);
  const drawer = h(
    "div",
    { class: "sv-controls-row sv-drawer", hidden: true },
    field("reduce dtype", ctl.reduceDtype, "MixedPrecisionPolicy(reduce_dtype): the dtype gradients are reduced in"),
    field("optimizer", ctl.optimizer),
    field("CPU offload", ctl.offload),
    ctl.offloadNote,
    field("rank", ctl.rank, "the rank whose local shard shapes the tree shows"),
  );
  ctl.more.addEventListener("click", () => {
    drawer.hidden = !drawer.hidden;
    ctl.more.setAttribute("aria-expanded", String(!drawer.hidden));
    ctl.more.textContent = drawer.hidden ? "more settings" : "fewer settings";
  });
  return h(
    "div",
    { class: "sv-controls" },
    h(
      "div",
      { class: "sv-controls-row sv-controls-main" },
      field("preset", ctl.preset),
      h("span", { class: "sv-history" }, ctl.undo, ctl.redo),
      ctl.ckptBlocks,
      field("world size", ctl.world),
      field("HSDP replicate", ctl.replicate, "HSDP: copies of the sharded model (shard size = world / replicate)"),
      field("TP", ctl.tensor, "tensor-parallel ranks inside a node (shard size = world / (replicate x TP)); > 1 adds the model's own TP plan"),
      field("device memory", ctl.device, "device memory per rank: a number of GiB, or a size with its unit (80GiB, 96GB); empty: no limit"),
      field("param dtype", ctl.paramDtype, "MixedPrecisionPolicy(param_dtype): the dtype parameters are all-gathered and computed in"),
      field("batch size", ctl.batch, "micro-batch per rank; empty: the peak counts the model state only (no activations)"),
      field("sequence length", ctl.seq, "tokens per sample"),
      ctl.seqNote,
      ctl.more,
    ),
    drawer,
  );
}

function wireControls(ctx, ctl, showState) {
  const { send, model } = ctx;
  // the number as typed: Python refuses one that is not whole (naming the field), never rounded here
  const intOrNull = (el) => (el.value.trim() === "" ? null : Number(el.value));
  // the control a refusal is about (ack.field, inputs.FIELD_NAMES' key): highlighted until it is edited
  const byField = { world: ctl.world, replicate: ctl.replicate, tensor: ctl.tensor, device_memory: ctl.device, batch_size: ctl.batch, seq_len: ctl.seq, rank: ctl.rank };
  const onRefused = (ack) => {
    if (ack.ok) return;
    showState(); // refused: the control shows the current state again
    const bad = byField[ack.field];
    if (!bad) return;
    bad.classList.add("sv-bad-input");
    bad.setAttribute("aria-invalid", "true");
    bad.title = ack.error;
  };
  for (const input of Object.values(byField)) {
    input.addEventListener("input", () => {
      input.classList.remove("sv-bad-input");
      input.removeAttribute("aria-invalid");
    });
  }
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
  ctl.tensor.addEventListener("change", () => send("set_mesh", { tensor: intOrNull(ctl.tensor) ?? 1 }, onRefused));
  // each training field sends only itself: a box shown on by the plan's own offload is not sent back
  const trainingField = [
    [ctl.optimizer, "optimizer", () => ctl.optimizer.value],
    [ctl.paramDtype, "param_dtype", () => ctl.paramDtype.value || null],
    [ctl.reduceDtype, "reduce_dtype", () => ctl.reduceDtype.value || null],
    [ctl.offload, "offload", () => ctl.offload.checked],
    [ctl.batch, "batch_size", () => intOrNull(ctl.batch)],
    [ctl.seq, "seq_len", () => intOrNull(ctl.seq) ?? 0],
  ];
  for (const [c, name, value] of trainingField) c.addEventListener("change", () => send("set_training", { [name]: value() }, onRefused));
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
  ctl.tensor.value = String(c.tensor || 1);
  ctl.rank.value = String(c.rank);
  ctl.rank.max = String(c.world - 1);
  ctl.device.value = c.device_text || "";
  ctl.paramDtype.value = c.param_dtype;
  ctl.reduceDtype.value = c.reduce_dtype;
  ctl.optimizer.value = c.optimizer;
  ctl.offload.checked = !!c.offload;
  ctl.offloadNote.textContent = c.offload && c.offload_text ? c.offload_text : "";
  ctl.batch.value = text(c.batch_size);
  ctl.seq.value = text(c.seq_len);
  ctl.seq.classList.toggle("sv-warn-input", !!c.seq_len_note);
  ctl.seqNote.textContent = c.seq_len_note ? "above the model's positions" : "";
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

export function controlsComponent(ctx, { onRafChoices }) {
  const ctl = controlInputs();
  const el = controlsLayout(ctl);
  function showState() {
    const c = ctx.model.get("controls") || {};
    if (c.world === undefined) return;
    showControls(ctl, c);
    el.dataset.revision = String(c.revision);
  }
  wireControls(ctx, ctl, showState);
  let reshardKey = "";
  function render() {
    showState();
    // the rows' reshard_after_forward menus list controls.reshard_choices: redraw them only when those change
    const key = JSON.stringify((ctx.model.get("controls") || {}).reshard_choices || []);
    if (key !== reshardKey) {
      reshardKey = key;
      onRafChoices();
    }
  }
  return { el, render };
}
