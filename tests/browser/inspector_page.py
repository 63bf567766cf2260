"""Reading and driving the Inspector in the page: shared by the browser tests of the widget."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import time

from playwright.sync_api import expect

import shardviz as sv


def fmt_bytes(n: float) -> str:
    """The front end's fmtBytes, to compare the text it shows."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    v, i = float(n), 0
    while abs(v) >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    if i == 0:
        return f"{v:.0f} B"
    # JS toFixed rounds an exact tie (401.125) up, Python's format to even: round as JS does
    return f"{Decimal(v).quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)} {units[i]}"


def row(widget, fqn: str):
    return widget.locator(f'.sv-row[data-fqn="{fqn}"]')


def expand(widget, fqn: str) -> None:
    r = row(widget, fqn)
    expect(r).to_be_visible()
    caret = r.locator(".sv-caret")
    if caret.get_attribute("aria-label") == "expand":
        caret.click()
    expect(r.locator(".sv-caret")).to_have_attribute("aria-label", "collapse")


def expand_group(widget, label: str) -> None:
    g = widget.locator(f'.sv-row[data-group="{label}"]')
    expect(g).to_be_visible()
    if g.locator(".sv-caret").get_attribute("aria-label") == "expand":
        g.locator(".sv-caret").click()
    expect(g.locator(".sv-caret")).to_have_attribute("aria-label", "collapse")


def open_block(widget, block: str) -> None:
    """Expand the tiny Llama's tree down to ``block`` (inside the folded layers.0-1 group)."""
    for fqn in ("base_model", "base_model.model", "base_model.model.model", "base_model.model.model.layers"):
        expand(widget, fqn)
    expand_group(widget, "layers.0-1")
    expand(widget, block)


def saved_plan(server, plan_file: str, until=None, timeout: float = 20):
    """The plan the widget saved to ``plan_file`` (its plan_path), once ``until(plan)`` holds; the last
    plan read (None: no file) when ``timeout`` runs out first, for the caller's assertion to show."""
    path = server.root_dir / plan_file
    deadline = time.monotonic() + timeout
    plan = None
    while time.monotonic() < deadline:
        if path.exists():
            plan = sv.Plan.from_json(path.read_text())
            if until is None or until(plan):
                return plan
        time.sleep(0.1)
    return plan


# What must never happen to the page at any width (issue 19), read from the rendered widget:
# a box that scrolls sideways, a button or menu whose text is cut or that sits past the edge,
# a name cut without a mark or two siblings whose names read the same, the A vs B table over its
# charts, a chart label cut by its chart, and a limit label drawn over bars, points or values.
LAYOUT_PROBLEMS_JS = r"""
(root) => {
  const bad = [];
  const box = (e) => e.getBoundingClientRect();
  const visible = (e) => e.offsetParent !== null && !e.closest('[hidden]');
  const overlap = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  for (const e of root.querySelectorAll('.sv-tree, .sv-scroller, .sv-cmp-tablebox, .sv-cmp-diff-scroll, .sv-panel, .sv-inspector')) {
    if (visible(e) && e.scrollWidth > e.clientWidth + 1) bad.push(`${e.className} scrolls sideways: ${e.scrollWidth} > ${e.clientWidth}`);
  }
  const sc = root.querySelector('.sv-scroller');
  const edge = box(sc).left + sc.clientWidth;
  for (const b of root.querySelectorAll('button, select')) {
    if (!visible(b)) continue;
    if (b.scrollWidth > b.clientWidth + 1) bad.push(`"${b.textContent.slice(0, 30)}" cut: ${b.scrollWidth} > ${b.clientWidth}`);
    if (b.tagName === 'SELECT' && b.selectedIndex >= 0) {
      const st = getComputedStyle(b);
      const cv = document.createElement('canvas').getContext('2d');
      cv.font = `${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
      const room = b.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight) - 20;
      const text = b.options[b.selectedIndex].text;
      if (cv.measureText(text).width > room + 0.5) bad.push(`select "${text}" cut: ${cv.measureText(text).width.toFixed(0)} > ${room}`);
    }
    const inTree = b.closest('.sv-rows');
    if (inTree && box(b).right > edge + 1) bad.push(`"${b.textContent.slice(0, 30)}" past the tree's edge`);
    if (box(b).right > box(root).right + 1) bad.push(`"${b.textContent.slice(0, 30)}" past the widget's edge`);
  }
  const rows = [...root.querySelectorAll('.sv-rows .sv-row')].sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top));
  const stack = [];
  const kids = new Map();
  for (const r of rows) {
    const d = Number(r.dataset.depth);
    while (stack.length && Number(stack[stack.length - 1].dataset.depth) >= d) stack.pop();
    const parent = stack.length ? stack[stack.length - 1].dataset.id : '';
    const name = r.querySelector('.sv-name');
    if (!kids.has(parent)) kids.set(parent, []);
    kids.get(parent).push([name.textContent, name.dataset.full || name.textContent]);
    if (name.scrollWidth > name.clientWidth + 1) bad.push(`${r.dataset.id} name "${name.textContent}" cut without a mark`);
    for (const t of r.querySelectorAll('.sv-col-name .sv-tag')) {
      if (box(t).right > box(t.parentElement).right + 1) bad.push(`${r.dataset.id} tag "${t.textContent}" cut`);
    }
    for (const c of r.querySelectorAll('.sv-col-size, .sv-col-status, .sv-badge, .sv-col-local, .sv-col-bytes')) {
      if (c.scrollWidth > c.clientWidth + 1) bad.push(`${r.dataset.id} ${c.className}: "${c.textContent}" cut`);
    }
    stack.push(r);
  }
  for (const [parent, names] of kids) {
    const seen = new Map();
    for (const [shown, full] of names) {
      if (seen.has(shown) && seen.get(shown) !== full) bad.push(`under ${parent}: "${full}" and "${seen.get(shown)}" both read "${shown}"`);
      seen.set(shown, full);
    }
  }
  const grid = root.querySelector('.sv-cmp-grid');
  if (grid && visible(grid)) {
    const t = box(root.querySelector('.sv-cmp-table'));
    const c = box(root.querySelector('.sv-cmp-charts'));
    if (overlap(t, c)) bad.push(`A vs B table and charts overlap`);
    if (t.right > box(grid).right + 1) bad.push(`A vs B table past its box: ${t.right} > ${box(grid).right}`);
  }
  for (const svg of root.querySelectorAll('svg')) {
    if (!visible(svg)) continue;
    const s = box(svg);
    for (const t of svg.querySelectorAll('text')) {
      const b = box(t);
      if (b.width && (b.left < s.left - 1 || b.right > s.right + 1)) bad.push(`"${t.textContent}" cut by its chart`);
    }
    for (const lab of svg.querySelectorAll('text.sv-limit-label')) {
      for (const d of svg.querySelectorAll('rect.sv-seg, circle.sv-dot, text.sv-peak-label, text.sv-bar-label')) {
        if (overlap(box(lab), box(d))) { bad.push(`"${lab.textContent}" drawn over data`); break; }
      }
    }
  }
  return bad;
}
"""


def layout_problems(widget) -> list[str]:
    """Every layout problem of the widget as it is drawn now (empty: none)."""
    return widget.evaluate(LAYOUT_PROBLEMS_JS)


# WCAG AA (issue 24): text of the badges, tags, severities and summary items against the colour
# behind it (semi-transparent backgrounds composited up to the page), >= 4.5:1 at the sizes the
# widget uses (all under 18 px); and states that show: a pressed toggle looks unlike an unpressed
# one, a disabled button unlike an enabled one.
CONTRAST_JS = r"""
(root) => {
  const cv = document.createElement('canvas'); cv.width = cv.height = 1;
  const cx = cv.getContext('2d', { willReadFrequently: true });
  const rgba = (css) => { cx.clearRect(0, 0, 1, 1); cx.fillStyle = 'rgba(0,0,0,0)'; cx.fillStyle = css; cx.fillRect(0, 0, 1, 1);
    const d = cx.getImageData(0, 0, 1, 1).data; return [d[0], d[1], d[2], d[3] / 255]; };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const behind = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let bg = [255, 255, 255, 1];
    for (const c of layers.reverse()) bg = over(c, bg);
    return bg;
  };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const bad = [];
  const sel = '.sv-badge, .sv-sev, .sv-tag, .sv-sum-item, .sv-limit-label, .sv-pending-note, .sv-work, .sv-field-note, .sv-suggest-mesh';
  for (const el of root.querySelectorAll(sel)) {
    if (el.offsetParent === null || !el.textContent.trim() || el.closest('svg')) continue;
    const bg = behind(el);
    const r = ratio(over(rgba(getComputedStyle(el).color), bg), bg);
    if (r < 4.5) bad.push(`${el.className} "${el.textContent.trim().slice(0, 30)}": ${r.toFixed(2)}:1`);
  }
  const look = (el) => { const st = getComputedStyle(el); return [st.backgroundColor, st.color, st.borderStyle, st.borderColor].join(' '); };
  const on = root.querySelector('button.sv-btn[aria-pressed="true"]');
  const off = root.querySelector('button.sv-btn[aria-pressed="false"]');
  if (on && off && look(on) === look(off)) bad.push('a pressed toggle looks like an unpressed one');
  const disabled = root.querySelector('button.sv-btn:disabled');
  const enabled = root.querySelector('button.sv-btn:not(:disabled):not([aria-pressed="true"])');
  if (disabled && enabled && look(disabled) === look(enabled)) bad.push('a disabled button looks like an enabled one');
  return bad;
}
"""


def contrast_problems(widget) -> list[str]:
    """Text under WCAG AA contrast, and states that do not show (empty: none)."""
    return widget.evaluate(CONTRAST_JS)


def numbers_settled(widget, timeout: float = 60_000) -> None:
    """The full numbers of the last change are drawn (not the model state sent first while the
    activations are measured) and the background work after it is done (findings, A vs B)."""
    expect(widget.locator(".sv-memory")).not_to_have_attribute("data-pending", "true", timeout=timeout)
    expect(widget.locator(".sv-work")).to_have_count(0, timeout=timeout)
