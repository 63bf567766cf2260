// export.js: the export panel, the fully_shard code, copy, save and torch's verification.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { h } from "../charts.js";
import { keepKeysFromLab, selectOf } from "./base.js";

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
    ? v.raised_by === "shardviz"
      ? `shardviz's verification failed (not torch; please report it): ${v.error}`
      : `torch raised ${v.error}`
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

export function exportPanel(ctx) {
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
