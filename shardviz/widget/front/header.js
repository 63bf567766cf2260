// header.js: the answer first. A card at the top of the widget: the verdict in words and colour
// (a.fit's word, never judged again here), one bar of the judged peak against the usable memory
// with the margin drawn, the step time, tokens/s and MFU, and the top finding with "apply fix"
// where its fix is a change of plan (sv.fix_plan, in Python). While an edit's numbers are being
// measured the card keeps the last full ones, dimmed, with a spinner: never a partial answer.
// An ES module of the Inspector's front end: it imports what it uses and exports what others use
// (widget/bundle.py bundles the modules into the one string anywidget loads).

import { fmt, fmtBytes, h } from "../charts.js";

// the verdict line: its word, the judged peak, its share of the usable memory and the margin
export function peakItem(sm, shown) {
  if (sm.pending) {
    // never a partial answer: the last full verdict stays, dimmed and marked as updating
    const last = shown.lastFull ? peakItem(shown.lastFull, shown) : h("span", { class: "sv-sum-item sv-sum-peak", text: "measuring the step…" });
    last.classList.add("sv-pending");
    last.title = sm.pending;
    last.append(h("span", { class: "sv-spinner", "aria-hidden": "true" }));
    return last;
  }
  shown.lastFull = sm;
  const use = sm.use;
  if (!use) {
    return h(
      "span",
      { class: "sv-sum-item sv-sum-peak", "data-bytes": sm.peak, title: `highest predicted peak of any rank (rank ${sm.worst_rank}); no device memory: no verdict` },
      h("b", { class: "sv-verdict-word sv-verdict-none", text: "no verdict" }),
      `: peak ${fmtBytes(sm.peak)} (rank ${sm.worst_rank}) · give the device memory to judge it`,
    );
  }
  return h(
    "span",
    { class: `sv-sum-item sv-sum-peak sv-verdict-${use.verdict}${use.over ? " sv-over" : ""}`, "data-bytes": use.judged, "data-verdict": use.verdict, title: `${use.text}; ${use.assumed}` },
    h("b", { class: "sv-verdict-word", text: use.word }),
    `: ${use.judged_name} ${fmtBytes(use.judged)} (rank ${sm.worst_rank}) · ${use.percent_text} of ${use.limit_text || fmtBytes(sm.limit)} · ${use.spare_text}`,
  );
}

// one bar: the judged peak against the usable memory, the margin (or the overflow) drawn after it
function fitBar(use) {
  if (!use || !(use.usable > 0)) return null;
  const top = Math.max(use.usable, use.judged) || 1;
  const pct = (x) => `${((100 * Math.max(0, x)) / top).toFixed(2)}%`;
  const bar = h(
    "div",
    { class: `sv-fit-bar sv-verdict-${use.verdict}`, role: "img", "aria-label": use.text, title: use.text },
    h("div", { class: "sv-fit-used", style: `width:${pct(Math.min(use.judged, use.usable))}`, "data-bytes": use.judged }),
    use.margin > 0 ? h("div", { class: "sv-fit-margin", style: `left:${pct(use.judged)};width:${pct(use.margin)}`, "data-bytes": use.margin }) : null,
    use.margin < 0 ? h("div", { class: "sv-fit-overflow", style: `left:${pct(use.usable)};width:${pct(-use.margin)}`, "data-bytes": -use.margin }) : null,
    h("div", { class: "sv-fit-limit", style: `left:${pct(use.usable)}` }),
  );
  const scale = h(
    "div",
    { class: "sv-fit-scale" },
    h("span", { class: "sv-fit-judged", text: `${use.judged_name} ${fmtBytes(use.judged)}` }),
    h("span", { class: `sv-fit-spare${use.over ? " sv-over" : ""}`, text: use.spare_text }),
    h("span", { class: "sv-fit-usable", text: `${fmtBytes(use.usable)} usable` }),
  );
  return h("div", { class: "sv-fit" }, bar, scale);
}

// the step's three figures, from the card (display.header_card: a.step, computed once in Python)
function stepFigures(card) {
  if (!card || card.step_time_s == null) return h("div", { class: "sv-card-step sv-muted", text: (card && card.untimed) || "step time: give a batch size" });
  const fig = (label, value, cls) => h("span", { class: `sv-card-fig ${cls}` }, h("span", { class: "sv-card-fig-label", text: label }), h("b", { text: value }));
  return h(
    "div",
    { class: "sv-card-step" },
    fig("step", fmt(card.step_time_s, "seconds"), "sv-card-steptime"),
    fig("tokens/s per rank", fmt(card.tokens_per_s, "rate"), "sv-card-tokens"),
    fig("MFU", fmt(card.mfu, "percent"), "sv-card-mfu"),
  );
}

// the card's top finding (display.header_card: errors first, "applies" where its fix is a plan change; its
// line is the headline, display.first_clause, the whole text its tooltip)
function topFinding(ctx, card, list, stale, openFindings) {
  const f = card && card.finding;
  const more = list.length > 1 ? h("a", { class: "sv-card-more", href: "#", text: `all ${fmt(list.length, "int")} findings`, onclick: (e) => (e.preventDefault(), openFindings()) }) : null;
  const busy = stale ? "updating" : f && f.pending ? "pricing the fixes" : null;
  const updating = busy ? h("span", { class: "sv-card-updating", role: "status" }, h("span", { class: "sv-spinner", "aria-hidden": "true" }), busy) : null;
  if (!f) return h("div", { class: `sv-card-finding sv-muted${stale ? " sv-stale" : ""}` }, "no findings: torch accepts this plan and nothing looks costly", updating);
  const apply = f.applies
    ? h("button", { class: "sv-btn sv-apply-fix", text: "apply fix", disabled: stale, title: `${f.fix} (one undo step)`, onclick: () => ctx.send("apply_fix", { code: f.code }) })
    : null;
  return h(
    "div",
    { class: `sv-card-finding${stale ? " sv-stale" : ""}`, "data-code": f.code },
    h("span", { class: `sv-sev sv-sev-${f.severity}`, text: f.severity }),
    h("b", { class: "sv-card-code", text: f.code, title: f.title || "" }),
    h("span", { class: "sv-card-finding-text", text: f.headline, title: f.fix ? `${f.message}\nfix: ${f.fix}` : f.message }),
    apply,
    more,
    updating,
  );
}

export function headerCard(ctx, { openFindings }) {
  const el = h("div", { class: "sv-card", role: "region", "aria-label": "the answer" });
  const shown = { lastFull: null, lastCard: null };
  function render() {
    const sm = ctx.model.get("summary") || {};
    if (!sm.model) return el.replaceChildren();
    const pending = !!sm.pending;
    // the card is null until full numbers are in: the last full card stays on screen meanwhile
    if (sm.card) shown.lastCard = sm.card;
    const card = sm.card || shown.lastCard;
    const full = pending && shown.lastFull ? shown.lastFull : sm;
    el.classList.toggle("sv-card-pending", pending);
    el.dataset.verdict = full.use ? full.use.verdict : "none";
    el.dataset.pending = String(pending);
    el.replaceChildren(
      h("div", { class: "sv-card-verdict" }, peakItem(sm, shown)),
      fitBar(full.use),
      stepFigures(card),
      topFinding(ctx, card, ctx.model.get("findings") || [], !!sm.findings_stale || !(card && card.findings_ready), openFindings),
    );
  }
  return { el, render };
}
