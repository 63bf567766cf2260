"""Reading and driving the Inspector in the page: shared by the browser tests of the widget."""

from __future__ import annotations

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
    return f"{v:.0f} B" if i == 0 else f"{v:.2f} {units[i]}"


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
