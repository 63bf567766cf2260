"""``sv.Inspector``: the Jupyter widget. ipywidgets controls on top, one anywidget below.

The anywidget (``inspector.esm.js`` + ``inspector.css``, shipped in the package: no build step,
nothing fetched at run time) draws the module tree, the memory and traffic charts (SVG), the
findings and the export. All numbers come from ``InspectorState`` (``state.py``), which takes them
from ``sv.analyze``.

Traffic to the front end is kept small, whatever the model's size:

- small synced traits: ``summary``, ``memory``, ``traffic``, ``findings``, ``comparison`` (A vs B,
  once a plan is pinned), ``code``, ``verify``, ``messages``;
- the tree goes as custom messages ``{"type": "rows", "order": [...], "rows": {...}}`` holding
  only the rows that are visible (expanded) *and* changed since the last message;
- after a toggle, the charts go first, then the rows, then the findings (the slowest checks) and
  the A vs B comparison (it needs the findings), so the chart never waits for the rest.

The front end sends ``{"type": "action", "action": name, "args": {...}, "req": n}``; every name is
a method of ``InspectorState`` listed in ``FRONT_END_ACTIONS`` (anything else is refused), and
every request is answered with ``{"type": "ack", "req": n, "ok": bool, "error": str|None}``.
"""

from __future__ import annotations

import time
from pathlib import Path

import anywidget
import ipywidgets as widgets
import traitlets

from ..fsdp import Mesh
from . import views
from .state import PRESETS, InspectorState

HERE = Path(__file__).parent
GIB = 1024**3

#: Methods of InspectorState the front end may call, with the arguments it may pass.
FRONT_END_ACTIONS = {
    "toggle_unit": ("fqn",),
    "make_unit": ("fqn",),
    "remove_unit": ("fqn",),
    "set_reshard_after_forward": ("fqn", "value"),
    "toggle_ignored": ("fqn",),
    "ignore": ("fqns",),
    "unignore": ("fqns",),
    "ignore_lora": ("module_fqn",),
    "unignore_lora": ("module_fqn",),
    "apply_to_many": ("targets", "action", "value"),
    "apply_to_type": ("type_or_fqn", "action", "within", "value"),
    "apply_preset": ("name",),
    "undo": (),
    "redo": (),
    "expand": ("target", "open"),
    "collapse_all": (),
    "set_filter": ("text", "status", "role"),
    "set_rank": ("rank",),
    "reveal": ("fqn",),
    "save_code": ("path", "torch_version", "overwrite"),
    "verify": (),
    "overwrite_plan_file": (),
    "pin": (),
    "unpin": (),
}
#: Releases offered in the export's "target torch" menu ("" = detected when the code runs).
TORCH_RELEASES = ["", "2.13", "2.12", "2.11", "2.10", "2.9", "2.8", "2.7", "2.6", "2.5", "2.4"]


class InspectorView(anywidget.AnyWidget):
    """The anywidget half of the Inspector (tree, charts, findings, export)."""

    _esm = HERE / "inspector.esm.js"
    _css = HERE / "inspector.css"

    summary = traitlets.Dict().tag(sync=True)
    memory = traitlets.Dict().tag(sync=True)
    traffic = traitlets.Dict().tag(sync=True)
    findings = traitlets.List().tag(sync=True)
    comparison = traitlets.Dict({"pinned": False}).tag(sync=True)
    code = traitlets.Dict().tag(sync=True)
    verify_result = traitlets.Dict().tag(sync=True)
    messages = traitlets.List().tag(sync=True)
    tab = traitlets.Unicode("charts").tag(sync=True)
    torch_version = traitlets.Unicode("").tag(sync=True)
    torch_releases = traitlets.List(TORCH_RELEASES).tag(sync=True)


class Inspector(widgets.VBox):
    """Inspect and edit an FSDP2 plan interactively: ``sv.Inspector(model)`` in a notebook.

    ``plan``: the starting plan (default ``sv.Plan.auto(model)``). ``mesh``, ``training``: as for
    ``sv.analyze``. ``plan_path``: a JSON file the plan is saved to (atomically) after every change
    and restored from when an Inspector is created on the same path.

    ``inspector.plan`` is always the current plan; ``inspector.controller`` holds every action as a
    plain method (also reachable here: ``inspector.make_unit(fqn)``, ``inspector.undo()``, ...).
    """

    def __init__(self, model, plan=None, mesh: Mesh | None = None, training=None, plan_path=None):
        t0 = time.perf_counter()
        self.controller = InspectorState(model, plan=plan, mesh=mesh, training=training, plan_path=plan_path)
        self.view = InspectorView()
        self._sent_order: list[str] | None = None
        self._sent_rows: dict[str, dict] = {}
        self._syncing = False
        self._outbox: list[dict] = []  # custom messages, for tests (the last few)
        self._last_severities: dict | None = None
        self._controls = self._build_controls()
        super().__init__([self._controls, self.view])
        self.add_class("sv-inspector-box")
        self.controller.observe(self._on_change)
        self.view.on_msg(self._on_msg)
        self.view.observe(self._on_tab, names="tab")
        self.view.observe(self._on_torch_version, names="torch_version")
        self._push_state(initial=True)
        self.controller.timings["widget_init_s"] = time.perf_counter() - t0

    # ------------------------------------------------------------------------------------
    # the Python API
    # ------------------------------------------------------------------------------------
    @property
    def plan(self):
        """The current plan (an immutable ``sv.Plan``)."""
        return self.controller.plan

    @property
    def mesh(self) -> Mesh:
        return self.controller.mesh

    @property
    def training(self):
        return self.controller.training

    @property
    def analysis(self):
        """``sv.analyze`` of the current plan, mesh and training (on the cached tree)."""
        return self.controller.analysis

    def memory_figure(self):
        """The memory chart as a plotly figure (same data as the widget's)."""
        return views.memory_figure(self.controller.memory)

    def traffic_figure(self):
        """The traffic chart as a plotly figure (same data as the widget's)."""
        return views.traffic_figure(self.controller.traffic)

    def __getattr__(self, name):
        # Delegate the controller's actions (make_unit, ignore_lora, undo, export_code, ...).
        if name in _DELEGATED:
            return getattr(self.__dict__["controller"], name) if "controller" in self.__dict__ else None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | _DELEGATED)

    # ------------------------------------------------------------------------------------
    # ipywidgets controls
    # ------------------------------------------------------------------------------------
    def _build_controls(self) -> widgets.Box:
        st = self.controller
        narrow = {"description_width": "initial"}
        self.w_preset = widgets.Dropdown(options=[(v, k) for k, v in PRESETS.items()], value="auto-sharded",
                                         description="preset", style=narrow, layout=widgets.Layout(width="260px"))
        self.w_apply = widgets.Button(description="apply preset", layout=widgets.Layout(width="110px"),
                                      tooltip="replace the plan with the preset (undoable)")
        self.w_undo = widgets.Button(description="undo", icon="undo", layout=widgets.Layout(width="80px"))
        self.w_redo = widgets.Button(description="redo", icon="repeat", layout=widgets.Layout(width="80px"))
        self.w_world = widgets.BoundedIntText(value=st.mesh.world, min=1, max=1 << 20, description="world size",
                                              style=narrow, layout=widgets.Layout(width="150px"))
        self.w_replicate = widgets.BoundedIntText(value=st.mesh.replicate, min=1, max=1 << 20, description="HSDP replicate",
                                                  style=narrow, layout=widgets.Layout(width="160px"))
        self.w_rank = widgets.BoundedIntText(value=0, min=0, max=st.mesh.world - 1, description="rank",
                                             style=narrow, layout=widgets.Layout(width="110px"),
                                             tooltip="the rank whose local shard shapes the tree shows")
        mem = st.mesh.device_memory
        self.w_device = widgets.FloatText(value=round(mem / GIB, 3) if mem else 0.0, description="device GiB",
                                          style=narrow, layout=widgets.Layout(width="150px"),
                                          tooltip="device memory per rank in GiB (0: no limit)")
        dtypes = [("model's", ""), ("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32")]
        tr = st.training
        self.w_param_dtype = widgets.Dropdown(options=dtypes, value=getattr(tr, "param_dtype", None) or "",
                                              description="param dtype", style=narrow, layout=widgets.Layout(width="190px"))
        self.w_reduce_dtype = widgets.Dropdown(options=dtypes, value=getattr(tr, "reduce_dtype", None) or "",
                                               description="reduce dtype", style=narrow, layout=widgets.Layout(width="195px"))
        from ..cost import OPTIMIZERS

        opts = list(OPTIMIZERS)
        current_opt = getattr(tr, "optimizer", "adamw")
        if current_opt not in opts:
            opts.append(current_opt)
        self.w_optimizer = widgets.Dropdown(options=opts, value=current_opt, description="optimizer",
                                            style=narrow, layout=widgets.Layout(width="200px"))
        self.w_offload = widgets.Checkbox(value=bool(getattr(tr, "offload", False)), description="CPU offload",
                                          indent=False, layout=widgets.Layout(width="110px"))
        self.w_apply.on_click(lambda _: self._guard(lambda: self.controller.apply_preset(self.w_preset.value)))
        self.w_undo.on_click(lambda _: self._guard(self.controller.undo))
        self.w_redo.on_click(lambda _: self._guard(self.controller.redo))
        for w in (self.w_world, self.w_replicate, self.w_device):
            w.observe(self._on_mesh_control, names="value")
        for w in (self.w_param_dtype, self.w_reduce_dtype, self.w_optimizer, self.w_offload):
            w.observe(self._on_training_control, names="value")
        self.w_rank.observe(self._on_rank_control, names="value")
        for w, cls in ((self.w_apply, "sv-apply-preset"), (self.w_undo, "sv-undo"), (self.w_redo, "sv-redo"),
                       (self.w_world, "sv-world"), (self.w_replicate, "sv-replicate"), (self.w_rank, "sv-rank"),
                       (self.w_device, "sv-device"), (self.w_preset, "sv-preset"), (self.w_optimizer, "sv-optimizer"),
                       (self.w_param_dtype, "sv-param-dtype"), (self.w_reduce_dtype, "sv-reduce-dtype"),
                       (self.w_offload, "sv-offload")):
            w.add_class(cls)
        row1 = widgets.HBox([self.w_preset, self.w_apply, self.w_undo, self.w_redo, self.w_rank],
                            layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        row2 = widgets.HBox([self.w_world, self.w_replicate, self.w_device, self.w_param_dtype, self.w_reduce_dtype,
                             self.w_optimizer, self.w_offload],
                            layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        box = widgets.VBox([row1, row2])
        box.add_class("sv-controls")
        return box

    def _guard(self, fn) -> bool:
        try:
            fn()
            return True
        except (ValueError, FileExistsError, OSError) as exc:
            self._error(str(exc))
            return False

    def _error(self, text: str) -> None:
        self.controller._message("error", text)
        self._push_messages()

    def _on_mesh_control(self, change) -> None:
        if self._syncing:
            return
        gib = self.w_device.value
        ok = self._guard(lambda: self.controller.set_mesh(
            world=self.w_world.value, replicate=self.w_replicate.value,
            device_memory=int(gib * GIB) if gib and gib > 0 else None))
        if not ok:
            self._sync_controls()

    def _on_training_control(self, change) -> None:
        if self._syncing:
            return
        fields = {"optimizer": self.w_optimizer.value, "param_dtype": self.w_param_dtype.value or None,
                  "reduce_dtype": self.w_reduce_dtype.value or None, "offload": self.w_offload.value}
        ok = self._guard(lambda: self.controller.set_training(**fields))
        if not ok:
            self._sync_controls()

    def _on_rank_control(self, change) -> None:
        if self._syncing:
            return
        self._guard(lambda: self.controller.set_rank(self.w_rank.value))

    def _sync_controls(self) -> None:
        """Show the current mesh and training in the controls (after undo, redo, errors)."""
        st = self.controller
        self._syncing = True
        try:
            mesh, tr = st.mesh, st.training
            self.w_world.value = mesh.world
            self.w_replicate.value = mesh.replicate
            self.w_rank.max = mesh.world - 1
            self.w_rank.value = st.view.rank
            self.w_device.value = round(mesh.device_memory / GIB, 3) if mesh.device_memory else 0.0
            self.w_param_dtype.value = getattr(tr, "param_dtype", None) or ""
            self.w_reduce_dtype.value = getattr(tr, "reduce_dtype", None) or ""
            if getattr(tr, "optimizer", None) in self.w_optimizer.options:
                self.w_optimizer.value = tr.optimizer
            self.w_offload.value = bool(getattr(tr, "offload", False))
            self.w_undo.disabled = not st.can_undo
            self.w_redo.disabled = not st.can_redo
        finally:
            self._syncing = False

    # ------------------------------------------------------------------------------------
    # pushing state to the front end
    # ------------------------------------------------------------------------------------
    def _summary(self) -> dict:
        st = self.controller
        mesh, tree = st.mesh, st.tree
        sev = {"error": 0, "warning": 0, "info": 0}
        findings = st._derived.get("findings")
        if findings is not None:
            for f in findings:
                sev[f["severity"]] = sev.get(f["severity"], 0) + 1
            self._last_severities = sev
        stale = findings is None  # the checks of this change run after the charts and rows are sent
        mem = st.memory
        return {
            "revision": st.revision,
            "model": tree.root_type,
            "n_modules": tree.n_modules,
            "n_params": len(tree.params),
            "numel": st.view.static.numel[0] if tree.n_modules else 0,
            "mesh": str(mesh),
            "world": mesh.world,
            "shard": mesh.shard,
            "replicate": mesh.replicate,
            "rank": st.view.rank,
            "n_units": len(st.plan.units),
            "n_ignored": len(st.plan.ignored),
            "plan_name": st.plan.name,
            "findings": sev if not stale else self._last_severities,
            "findings_stale": stale,
            "peak": mem.get("max_peak"),
            "worst_rank": mem.get("worst_rank"),
            "limit": mesh.device_memory,
            "can_undo": st.can_undo,
            "can_redo": st.can_redo,
            "plan_file": st.plan_file_status(),
            "filter": {"text": st.view.filter_text, "status": st.view.filter_status, "role": st.view.filter_role},
            "truncated": st.view.truncated,
            "has_model": st.model is not None,
            "optimizer": str(getattr(st.training, "optimizer", "")),
            "pinned": st.pinned is not None,
        }

    def _push_state(self, initial: bool = False) -> None:
        """After a change of plan, mesh or training: charts first, then rows, then findings."""
        st, v = self.controller, self.view
        rev = st.revision
        with v.hold_sync():
            v.memory = {**st.memory, "revision": rev}
            v.traffic = {**st.traffic, "revision": rev}
            v.summary = self._summary()
        self._push_rows(reset=initial)
        v.findings = st.findings
        with v.hold_sync():
            v.comparison = {**st.comparison, "revision": rev}
            v.summary = self._summary()
            v.verify_result = {}
            if v.tab == "export":
                self._push_code()
            else:
                v.code = {"stale": True, "revision": rev}
        self._push_messages()
        self._sync_controls()

    def _push_messages(self) -> None:
        self.view.messages = [dict(m) for m in self.controller.messages[-5:]]

    def _send_msg(self, msg: dict) -> None:
        self._outbox.append(msg)
        del self._outbox[:-20]
        self.view.send(msg)

    def _push_rows(self, reset: bool = False) -> None:
        """Send the visible rows that changed since the last message (all of them on reset)."""
        t0 = time.perf_counter()
        order, rows = self.controller.rows()
        if reset:
            changed = rows
        else:
            sent = self._sent_rows
            changed = {rid: row for rid, row in rows.items() if sent.get(rid) != row}
        msg = {"type": "rows", "revision": self.controller.revision, "reset": reset, "rows": changed,
               "truncated": self.controller.view.truncated, "filtering": self.controller.view.filtering,
               "matches": self.controller.view.matches}
        if reset or order != self._sent_order:
            msg["order"] = order
        self._sent_order = order
        self._sent_rows = rows
        if changed or "order" in msg:
            self._send_msg(msg)
        self.controller.timings["rows_s"] = time.perf_counter() - t0
        self.controller.timings["rows_sent"] = len(changed)

    def _push_code(self) -> None:
        st, v = self.controller, self.view
        version = v.torch_version or None
        try:
            text = st.export_code(version)
            v.code = {"text": text, "torch_version": v.torch_version, "revision": st.revision, "error": None}
        except ValueError as exc:  # PlanError is a ValueError: torch would refuse the plan
            v.code = {"text": "", "torch_version": v.torch_version, "revision": st.revision, "error": str(exc)}

    def _on_change(self, changed: set) -> None:
        if "state" in changed:
            self._push_state()
            return
        if "rows" in changed:
            self._push_rows()
            with self.view.hold_sync():
                self.view.summary = self._summary()
        if "pin" in changed:
            with self.view.hold_sync():
                self.view.comparison = {**self.controller.comparison, "revision": self.controller.revision}
                self.view.summary = self._summary()
        if "reveal" in changed:
            self._send_msg({"type": "reveal", "id": self.controller.last_reveal})
        if "messages" in changed:
            self._push_messages()
            self.view.summary = self._summary()
        if "verify" in changed:
            self.view.verify_result = dict(self.controller.verify_result or {})

    def _on_tab(self, change) -> None:
        if change["new"] == "export":
            self._push_code()

    def _on_torch_version(self, change) -> None:
        if self.view.tab == "export":
            self._push_code()

    # ------------------------------------------------------------------------------------
    # messages from the front end
    # ------------------------------------------------------------------------------------
    def _on_msg(self, _widget, content, _buffers) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        req = content.get("req")
        if kind == "hello":
            self._push_rows(reset=True)
            self._send_msg({"type": "ack", "req": req, "ok": True, "error": None})
            return
        if kind != "action":
            self._send_msg({"type": "ack", "req": req, "ok": False, "error": f"unknown message type {kind!r}"})
            return
        self.handle_action(content.get("action"), content.get("args") or {}, req)

    def handle_action(self, action: str, args: dict, req=None) -> dict:
        """Run one front-end action (what a click sends); returns the ack that is sent back."""
        t0 = time.perf_counter()
        ack = {"type": "ack", "req": req, "ok": True, "error": None, "action": action}
        allowed = FRONT_END_ACTIONS.get(action)
        if allowed is None:
            ack.update(ok=False, error=f"unknown action {action!r}")
        else:
            unknown = set(args) - set(allowed)
            if unknown:
                ack.update(ok=False, error=f"action {action!r} takes no argument(s) {sorted(unknown)}")
            else:
                try:
                    kwargs = dict(args)
                    if action == "save_code":
                        kwargs.setdefault("torch_version", self.view.torch_version or None)
                        if kwargs.get("torch_version") == "":
                            kwargs["torch_version"] = None
                    if action in ("apply_to_many", "apply_to_type") and "value" in kwargs and kwargs["value"] is None:
                        del kwargs["value"]
                    result = getattr(self.controller, action)(**kwargs)
                    if action == "save_code":
                        ack["path"] = str(result)  # the export panel shows it
                except FileExistsError as exc:
                    ack.update(ok=False, error=str(exc), exists=True, path=str(args.get("path")))
                except (ValueError, OSError, KeyError, TypeError) as exc:
                    ack.update(ok=False, error=str(exc).strip("'\""))
                except Exception as exc:  # noqa: BLE001 - a bug must not leave the page waiting
                    ack.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        if not ack["ok"] and not ack.get("exists"):
            self.controller._message("error", ack["error"])
            self._push_messages()
        ack["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        self._send_msg(ack)
        return ack


_DELEGATED = frozenset({
    "make_unit", "make_group_unit", "remove_unit", "toggle_unit", "set_reshard_after_forward", "set_unit_options",
    "ignore", "unignore", "toggle_ignored", "ignore_lora", "unignore_lora", "lora_params", "apply_to_many",
    "apply_to_type", "apply_preset", "set_plan", "set_mesh", "set_training", "undo", "redo", "can_undo", "can_redo",
    "expand", "collapse", "collapse_all", "set_filter", "set_rank", "reveal", "rows", "export_code", "save_code",
    "verify", "overwrite_plan_file", "plan_file_status", "tree", "memory", "traffic", "findings", "stats",
    "pin", "unpin", "pinned", "comparison", "pinned_comparison",
    "timings", "messages", "revision",
})
