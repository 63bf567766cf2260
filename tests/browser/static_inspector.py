"""The Inspector's front end in a plain page, driven by a real ``sv.Inspector`` in the test's process:
no Jupyter server, no kernel (seconds instead of minutes on 2 cores).

The page loads the widget's own ``_esm`` (the bundle anywidget ships) and ``_css`` as anywidget does
(the module from a blob URL, ``render({model, el})``), with a model object that keeps the traits.
``model.send`` goes to Python through ``page.expose_binding``; Python runs the message as the widget
would (``Inspector._on_msg``, ``background=False``: every number at once) and answers with what it
did, in order: each trait it set (its value then) and each custom message (rows, acks). The page
applies them as anywidget would (``change:<trait>``, ``msg:custom``).

Themes: JupyterLab's CSS variables, light (the CSS's own fallbacks) or dark (JupyterLab Dark's values).
"""

from __future__ import annotations

import json

import traitlets

# JupyterLab Dark's values of the variables inspector.css reads
DARK = {
    "--jp-layout-color0": "#111111", "--jp-layout-color1": "#212121", "--jp-layout-color2": "#424242",
    "--jp-layout-color3": "#616161", "--jp-ui-font-color0": "rgba(255,255,255,1)",
    "--jp-ui-font-color1": "rgba(255,255,255,0.87)", "--jp-ui-font-color2": "rgba(255,255,255,0.54)",
    "--jp-border-color1": "#616161", "--jp-border-color2": "#424242", "--jp-brand-color1": "#1976d2",
    "--jp-brand-color3": "#0d47a1", "--jp-error-color1": "#d32f2f", "--jp-warn-color1": "#f57c00",
    "--jp-success-color1": "#388e3c", "--jp-info-color1": "#0097a7",
}
SKIP = {"_esm", "_css", "_anywidget_id", "_dom_classes", "layout", "tabbable", "tooltip", "comm", "keys", "log"}

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body { margin: 0; padding: 12px; font-family: system-ui, sans-serif; background: var(--jp-layout-color0, #fff); }
%(theme)s
</style><style>%(css)s</style></head><body><div id="host" style="width: %(width)spx"></div>
<script type="module">
const state = %(state)s;
const listeners = {};
const fire = (ev, arg) => (listeners[ev] || []).slice().forEach((fn) => fn(arg));
const apply = (events) => {
  for (const [kind, name, value] of events) {
    if (kind === "trait") { state[name] = value; fire(`change:${name}`); }
    else fire("msg:custom", value);
  }
};
const model = {
  get: (k) => state[k],
  on: (ev, fn) => (listeners[ev] = listeners[ev] || []).push(fn),
  off: (ev, fn) => (listeners[ev] = (listeners[ev] || []).filter((f) => f !== fn)),
  send: (msg) => { window.svSend(msg).then(apply); },
};
window.svModel = model;
window.svApply = apply;
const url = URL.createObjectURL(new Blob([%(esm)s], { type: "text/javascript" }));
const mod = await import(url);
mod.default.render({ model, el: document.getElementById("host") });
window.svReady = true;
</script></body></html>"""


class StaticInspector:
    """``ins`` (an ``sv.Inspector`` built with ``background=False``) drawn in ``page`` at ``width`` px."""

    def __init__(self, page, ins, width: int = 1240, dark: bool = False):
        self.page, self.ins = page, ins
        self.events: list[list] = []
        self.recording = False
        ins.send = self._record_msg  # the widget's custom messages (rows, acks) go to the page
        ins.observe(self._record_trait, names=traitlets.All)
        if not hasattr(page, "_sv_inspector"):  # one binding per page: it serves the latest inspector
            page.expose_binding("svSend", lambda _source, msg: page._sv_inspector.handle(msg))
        page._sv_inspector = self
        self.load(width, dark)

    def traits(self) -> dict:
        return {k: getattr(self.ins, k) for k in self.ins.trait_names(sync=True) if k not in SKIP}

    def load(self, width: int, dark: bool) -> None:
        theme = "body { %s }" % " ".join(f"{k}: {v};" for k, v in DARK.items()) if dark else ""
        html = PAGE % {"theme": theme, "css": self.ins._css, "width": width,
                       "state": json.dumps(self.traits()), "esm": json.dumps(self.ins._esm)}
        self.page.set_content(html)
        self.page.wait_for_function("window.svReady === true")
        self.widget = self.page.locator(".sv-inspector")

    def _record_msg(self, msg, buffers=None) -> None:
        self.events.append(["msg", None, json.loads(json.dumps(msg))])

    def _record_trait(self, change) -> None:
        if change["name"] not in SKIP:
            self.events.append(["trait", change["name"], json.loads(json.dumps(change["new"], default=str))])

    def handle(self, msg) -> list:
        """One message from the page, run as the widget runs it; what it did, in order."""
        self.events = []
        self.ins._on_msg(self.ins, msg, [])
        out, self.events = self.events, []
        return out

    def action(self, action: str, **args) -> None:
        """Run an action from Python (as a click would send it) and show its result in the page."""
        events = self.handle({"type": "action", "action": action, "args": args, "req": -1})
        self.page.evaluate("(ev) => window.svApply(ev)", events)
