"""``sv.Inspector``: the Jupyter widget, one anywidget.

The front end (the ES modules of ``front/``, which import ``charts.js`` and each other, bundled
into one ES module by ``bundle.py`` when this class is defined, and ``inspector.css``; shipped in
the package: no npm, nothing fetched at run time; with ``ANYWIDGET_HMR=1`` a saved edit reloads) draws the controls, the module tree, the memory and traffic charts
(SVG, the same drawing code as the HTML report), the findings, A vs B and the export. Every
number comes from ``InspectorState`` (``controller.py``), which takes them from ``sv.analyze``; the
front end formats them and sends back what the user did.

One set of traits, written only by Python:

- ``controls``: the mesh, training, rank and history as the controls show them, with their
  choices (presets, dtypes, optimizers, reshard_after_forward values);
- ``summary``, ``memory``, ``traffic``, ``findings``, ``comparison`` (A vs B, once a plan is
  pinned), ``suggestions`` (the Suggest panel: ``sv.search``'s top rows, ``suggest.py``), ``code``,
  ``verify_result``, ``messages``, ``tab``, ``torch_version``;
- ``protocol``: the message schema (``protocol.py``), so that both sides check every message
  against the same table.

The tree goes as custom messages holding only the rows that are visible (expanded) and changed
since the last message. After a change, the charts go first, then the rows, then the findings
(the slowest checks) and the A vs B comparison, so the chart never waits for the rest. With a
front end connected, what is slow (measuring activations, the findings' what-ifs, Suggest) runs
on a worker thread after the model-state numbers are sent (``background.py``); ``work`` says what
runs, the summary shows it with a cancel button.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anywidget
import traitlets
from comm import DummyComm

from .. import collector
from ..format import format_bytes, format_large_count, format_plural
from ..model.tree import model_name
from ..run.mesh import Mesh
from ..views.highlight import python_html
from ..presets import preset_key
from . import bundle, panels, protocol
from .background import BackgroundPush, freeze_long_lived
from .inputs import FieldError, field_error, mesh_fields, seq_len_note, training_fields, whole
from .controller import PRESETS, BlockAction, Change, InspectorState
from .panels import training_text
from .plan_names import shown_name

HERE = Path(__file__).parent
GIB = 1024**3

#: Releases offered in the export's "target torch" menu ("" = detected when the code runs).
TORCH_RELEASES = ["", "2.13", "2.12", "2.11", "2.10", "2.9", "2.8", "2.7", "2.6", "2.5", "2.4"]
DTYPES = [["", "model's dtype"], ["bfloat16", "bfloat16"], ["float16", "float16"], ["float32", "float32"]]


def _read_esm() -> str | Path:
    """The front end as anywidget loads it: the bundle of ``front/inspector.js`` and what it imports
    (``bundle.py``); in development (``ANYWIDGET_HMR=1``) a file that is rebuilt on every save."""
    return bundle.dev_bundle_path() if bundle.hot_reload_wanted() else bundle.bundle()


class Inspector(anywidget.AnyWidget):
    """Inspect and edit an FSDP2 plan interactively: ``sv.Inspector(model)`` in a notebook.

    ``plan``: the starting plan (default ``sv.Plan.auto(model)``). ``mesh``, ``training``: as for
    ``sv.analyze`` (default training: AdamW with bf16 parameters and fp32 reduction, as in the
    README's table). ``plan_path``: a JSON file the plan is saved to (atomically) after every
    change and restored from when an Inspector is created on the same path. ``background``
    (default: when a front end is connected): the slow work after a change on a worker thread;
    ``inspector.wait()`` waits for it, ``inspector.cancel()`` stops it.

    ``inspector.plan`` is always the current plan. Every action the controls call is a plain method
    of ``inspector.controller``, the one state object (an ``InspectorState``, usable without a
    browser): ``inspector.controller.make_unit(fqn)``, ``inspector.controller.undo()``, ...; the
    widget itself holds only what the front end needs (the traits, the messages, the background work).
    """

    _esm = _read_esm()
    _css = (HERE / "inspector.css").read_text()

    protocol = traitlets.Dict(protocol.schema()).tag(sync=True)
    controls = traitlets.Dict().tag(sync=True)
    summary = traitlets.Dict().tag(sync=True)
    memory = traitlets.Dict().tag(sync=True)
    traffic = traitlets.Dict().tag(sync=True)
    timeline = traitlets.Dict().tag(sync=True)
    findings = traitlets.List().tag(sync=True)
    comparison = traitlets.Dict({"pinned": False}).tag(sync=True)
    suggestions = traitlets.Dict().tag(sync=True)
    code = traitlets.Dict().tag(sync=True)
    verify_result = traitlets.Dict().tag(sync=True)
    messages = traitlets.List().tag(sync=True)
    tab = traitlets.Unicode("charts").tag(sync=True)
    torch_version = traitlets.Unicode("").tag(sync=True)
    torch_releases = traitlets.List(TORCH_RELEASES).tag(sync=True)
    #: what runs in the background after a change ({"busy", "label", "since"}): the summary shows it
    work = traitlets.Dict({"busy": False}).tag(sync=True)

    def __init__(self, model, plan=None, mesh: Mesh | None = None, training=None, plan_path=None,
                 background: bool | None = None, look_ahead: bool = True, **kwargs):
        t0 = time.perf_counter()
        freeze_long_lived()  # the collector's full walks of torch and the model cost ~0.45 s per edit at 70B
        controller = InspectorState(model, plan=plan, mesh=mesh, training=training, plan_path=plan_path)
        super().__init__(**kwargs)
        self.controller = controller
        #: slow work off the kernel's thread (default: when a front end is connected; see BackgroundPush)
        self.background = background if background is not None else not isinstance(self.comm, DummyComm)
        self.pushes = BackgroundPush(self)  # the pushes after a change, the slow part on a worker thread
        # measure likely next edits while idle (look_ahead.look_ahead); an edit stops it at its next check
        # (activations.stop), never by an injected exception (which crashed the kernel in the browser tests)
        self.pushes.ahead = look_ahead and self.background and not isinstance(self.comm, DummyComm)
        controller.before_change.append(self.pushes.stop)
        self._sent_order: list[str] | None = None
        self._sent_rows: dict[str, dict] = {}
        self._outbox: list[dict] = []  # custom messages, for tests (the last few)
        self._last_severities: dict | None = None
        controller.observe(self._on_change)
        self.on_msg(self._on_msg)
        self.observe(self._on_tab, names=["tab", "torch_version"])
        self.pushes.push_state(initial=True)
        controller.timings["widget_init_s"] = time.perf_counter() - t0

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

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the work after the last change (activations, findings, Suggest) is done and
        sent; True once nothing runs. Without a front end everything runs at once and this returns."""
        return self.pushes.wait(timeout)

    def cancel(self) -> bool:
        """Stop the work running in the background (the summary's "cancel"); True if something ran."""
        return self.pushes.cancel()

    def memory_figure(self):
        """The memory chart as a plotly figure (same payload as the widget's)."""
        return panels.memory_figure(self.controller.memory)

    def traffic_figure(self):
        """The traffic chart as a plotly figure (same payload as the widget's)."""
        return panels.traffic_figure(self.controller.traffic)

    # ------------------------------------------------------------------------------------
    # pushing state to the front end
    # ------------------------------------------------------------------------------------
    def controls_payload(self) -> dict:
        st = self.controller
        mesh, tr = st.mesh, st.training
        shard = mesh.shard
        from ..run.training import OPTIMIZERS

        opts = list(OPTIMIZERS)
        if str(tr.optimizer) not in opts:
            opts.append(str(tr.optimizer))
        blocks = st.blocks()
        ck = set(st.plan.checkpoint)
        offload = tr.offload or any(u.offload for u in st.plan.units)
        preset = preset_key(st.tree, st.plan)  # "" for an edited or custom plan: any preset in the menu applies
        return {
            "revision": st.revision,
            "world": mesh.world,
            "replicate": mesh.replicate,
            "tensor": mesh.tensor,
            "shard": shard,
            "rank": st.view.rank,
            "device_gib": round(mesh.device_memory / GIB, 3) if mesh.device_memory else None,
            # what the field shows: GiB as typed, or the size with its unit when it is not whole GiB
            "device_text": _device_text(mesh.device_memory),
            "optimizer": str(tr.optimizer),
            "param_dtype": tr.param_dtype or "",
            "reduce_dtype": tr.reduce_dtype or "",
            # on when the training offloads or the plan's calls do (a Suggest row's CPU offload)
            "offload": offload,
            "offload_text": self.pushes.host_ram_text if offload else "",  # the host RAM it needs, per rank and node
            "batch_size": tr.batch_size,
            "seq_len": tr.seq_len,
            # only for a length the user chose (the default 2048 is not flagged on a tiny model)
            "seq_len_note": seq_len_note(st.model, tr.seq_len) if st.seq_len_set else None,
            "can_undo": st.can_undo,
            "can_redo": st.can_redo,
            "presets": ([] if preset else [["", "custom or edited plan"]]) + [[k, v] for k, v in PRESETS.items()],
            "preset": preset,
            "dtypes": DTYPES,
            "optimizers": opts,
            # reshard_after_forward: default, True, False, or an int that divides the shard size
            "reshard_choices": ["default", "true", "false"] + [str(d) for d in (2, 4, 8, 16) if d < shard and shard % d == 0],
            "n_blocks": len(blocks),
            "n_blocks_checkpointed": sum(1 for b in blocks if b in ck),
        }

    def summary_payload(self) -> dict:
        st = self.controller
        mesh, tree = st.mesh, st.tree
        sev = {"error": 0, "warning": 0, "info": 0}
        findings = st.computed("findings")
        if findings is None:  # the first findings: no what-if priced yet
            findings = st.computed("first")
        if findings is not None:
            for f in findings:
                sev[f["severity"]] = sev.get(f["severity"], 0) + 1
            self._last_severities = sev
        stale = findings is None  # the checks of this change run after the charts and rows are sent
        mem = self.pushes.shown_memory if self.pushes.shown_memory is not None else st.memory
        tr = st.training
        return {
            "revision": st.revision,
            "model": model_name(tree),  # the model's one name (the report's and the export's): not the peft wrapper's
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
            "n_checkpointed": len(st.plan.checkpoint),
            "size_text": f"{format_plural(tree.n_modules, 'module')} · "
                         f"{format_large_count(st.view.static.numel[0] if tree.n_modules else 0)} parameter elements",
            "plan_text": ": " + " · ".join([format_plural(len(st.plan.units), "call"), f"{len(st.plan.ignored):,} ignored"]
                                          + ([f"{len(st.plan.checkpoint):,} checkpointed"] if st.plan.checkpoint else [])),
            "plan_name": shown_name(st.plan.name, mesh),  # a Suggest row's mesh words kept true
            "training": training_text(tr, st.plan),  # the plan's calls' own policies and offload said
            "findings": sev if not stale else self._last_severities,
            "findings_text": _severity_text(sev if not stale else self._last_severities),
            "findings_stale": stale,
            "peak": mem.get("max_peak"),
            "worst_rank": mem.get("worst_rank"),
            "use": mem.get("use"),
            "pending": mem.get("pending"),  # the activations are being measured: the peak is the model state's
            "limit": mesh.usable_memory,  # device memory less the reserve (Mesh.fit)
            "limit_text": mesh.limit_text,
            "can_undo": st.can_undo,
            "can_redo": st.can_redo,
            "plan_file": st.plan_file_status(),
            "filter": {"text": st.view.filter_text, "status": st.view.filter_status, "role": st.view.filter_role},
            "truncated": st.view.truncated,
            "has_model": st.model is not None,
            "optimizer": str(tr.optimizer),
            "pinned": st.pinned is not None,
            # the header card (display.header_card, the report's too): only from full numbers, never
            # computed here (the main thread measures nothing); None until they are in
            "card": st.card() if (st.computed("memory") or {}).get("available") else None,
            "findings_pricing": findings is not None and st.computed("findings") is None,  # what-ifs still run
        }

    def push_messages(self) -> None:
        self.messages = [dict(m) for m in self.controller.messages[-5:]]

    def _send_msg(self, msg: dict) -> None:
        self._outbox.append(msg)
        del self._outbox[:-20]
        self.send(msg)

    def push_rows(self, reset: bool = False) -> None:
        """Send the visible rows that changed since the last message (all of them on reset)."""
        t0 = time.perf_counter()
        st = self.controller
        order, rows = st.rows()
        if reset:
            changed = rows
        else:
            sent = self._sent_rows
            changed = {rid: row for rid, row in rows.items() if sent.get(rid) != row}
        msg = {"type": "rows", "revision": st.revision, "reset": reset, "rows": changed,
               "truncated": st.view.truncated, "filtering": st.view.filtering, "matches": st.view.matches,
               "filter_label": st.view.filter_label}
        if reset or order != self._sent_order:
            msg["order"] = order
        self._sent_order = order
        self._sent_rows = rows
        if changed or "order" in msg:
            self._send_msg(msg)
        st.timings["rows_s"] = time.perf_counter() - t0
        st.timings["rows_sent"] = len(changed)

    def push_code(self) -> None:
        st = self.controller
        version = self.torch_version or None
        try:
            text = st.export_code(version)
            self.code = {"text": text, "html": python_html(text), "n_lines": len(text.splitlines()),
                         "torch_version": self.torch_version, "revision": st.revision, "error": None}
        except ValueError as exc:  # PlanError is a ValueError: torch would refuse the plan
            self.code = {"text": "", "torch_version": self.torch_version, "revision": st.revision, "error": str(exc)}

    def _on_change(self, changed: Change) -> None:
        if Change.STATE in changed:
            self.pushes.push_state()
            return
        if Change.ROWS in changed:
            with self.pushes.lock, self.hold_sync():
                self.push_rows()
                self.summary = self.summary_payload()
                self.controls = self.controls_payload()  # the rank
        if self.pushes.interrupted and changed & (Change.PIN | Change.FINDINGS):
            self.pushes.interrupted = False
            self.pushes.push_state()  # the work a pin or a target release stopped, again for the new view
            return
        if Change.PIN in changed:
            with self.hold_sync():
                self.comparison = {**self.controller.comparison, "revision": self.controller.revision}
                self.summary = self.summary_payload()
        if Change.SUGGEST in changed:  # at once, not held: "searching N plans…" shows while the search runs
            with self.pushes.lock:
                self.suggestions = {**self.controller.suggestions, "revision": self.controller.revision}
                self.work = self.pushes.work_state()
        if Change.REVEAL in changed:
            self._send_msg({"type": "reveal", "id": self.controller.last_reveal})
        if Change.MESSAGES in changed:
            self.push_messages()
            self.summary = self.summary_payload()
        if Change.VERIFY in changed:
            self.verify_result = dict(self.controller.verify_result or {})
        if Change.FINDINGS in changed:  # the target release changed: same plan, other findings
            self.findings = self.controller.findings
            self.summary = self.summary_payload()

    def _on_tab(self, change) -> None:
        if change["name"] == "torch_version":
            # the findings follow the export's target release (SV101 before 2.7, SV110 before 2.5)
            self.verify_result = {}  # a verdict for another release ("torch agrees") would sit under its refusal
            try:
                self.controller.set_torch_version(self.torch_version or None)
            except ValueError as exc:
                self.controller.say("error", str(exc), notify=False)
                self.push_messages()
        if self.tab == "export":
            self.push_code()

    # ------------------------------------------------------------------------------------
    # messages from the front end
    # ------------------------------------------------------------------------------------
    def _on_msg(self, _widget, content, _buffers) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        req = content.get("req")
        if kind == "hello":
            self.push_rows(reset=True)
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
        problem = protocol.check_action(action, args)
        if problem:
            ack.update(ok=False, error=problem)
        else:
            try:
                with collector.quiet():  # an edit's analysis: no full collection inside it (``collector``)
                    result = ACTION_HANDLERS[action](self, dict(args))
                if action == "save_code":
                    ack["path"] = str(result)  # the export panel shows it
            except FileExistsError as exc:
                ack.update(ok=False, error=str(exc), exists=True, path=str(args.get("path")))
            except FieldError as exc:  # the front end highlights the control (its key: exc.field)
                ack.update(ok=False, error=str(exc), field=exc.field)
            except (ValueError, OSError, KeyError, TypeError) as exc:
                ack.update(ok=False, error=str(exc).strip("'\""))
            except Exception as exc:  # noqa: BLE001 - a bug must not leave the page waiting
                ack.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        if not ack["ok"] and not ack.get("exists"):
            self.controller.say("error", ack["error"], notify=False)
            self.push_messages()
            self.controls = self.controls_payload()  # a refused edit: the controls show the state again
        ack["ms"] = round((time.perf_counter() - t0) * 1000, 1)
        self._send_msg(ack)
        return ack



# ------------------------------------------------------------------------------------
# what each front-end action runs: one handler per action of the protocol (protocol.ACTIONS)
# ------------------------------------------------------------------------------------
#: A handler gets the widget and the action's checked arguments; what it returns goes in the ack.
ActionHandler = Callable[[Inspector, dict], object]


def _set_mesh(ins: Inspector, kw: dict) -> None:
    """One mesh control's value; what the engine then refuses is said as a message about that
    control, by its one name (``inputs.FIELD_NAMES``), and the front end highlights it."""
    fields = mesh_fields(kw, ins.controller.mesh)  # FieldError: the control's own check
    field = next((k for k in ("tensor", "replicate", "world", "device_memory") if k in kw), "world")
    try:
        return ins.controller.set_mesh(**fields)
    except ValueError as exc:
        raise field_error(field, exc) from None


def _set_training(ins: Inspector, kw: dict) -> None:
    st = ins.controller
    fields = training_fields(kw, st.training)
    st.seq_len_set = st.seq_len_set or "seq_len" in fields
    if fields.get("offload") is False and any(u.offload for u in st.plan.units):
        return st.set_offload(False, **fields)  # the box showed the plan's offload: off for its calls too
    return st.set_training(**fields)


def _set_tab(ins: Inspector, kw: dict) -> None:
    if kw["tab"] not in protocol.TABS:
        raise ValueError(f"tab {kw['tab']!r}: expected one of {protocol.TABS}")
    ins.tab = kw["tab"]  # _on_tab computes the code when the export opens


def _set_torch_version(ins: Inspector, kw: dict) -> None:
    if kw["version"] not in TORCH_RELEASES:
        raise ValueError(f"torch release {kw['version']!r}: expected one of {TORCH_RELEASES}")
    ins.torch_version = kw["version"]


def _verify(ins: Inspector, kw: dict) -> dict:
    ins.pushes.worker.wait(300)  # torch's fully_shard never runs beside a measurement (it patches nn.Module.to)
    ins.pushes.worker.cancel()  # nor beside the look-ahead's
    ins.pushes.worker.stop_aside()  # nor beside one an edit set aside
    return ins.controller.verify(**kw)


def _suggest(ins: Inspector, kw: dict) -> None:
    st = ins.controller
    if not (ins.background and st.mesh.device_memory is not None):
        return st.suggest(**kw)

    def job():
        st.suggest(**kw)
        with ins.pushes.lock:
            ins.work = ins.pushes.work_state(done=True)

    ins.pushes.worker.start(job, "searching plans")
    ins.work = ins.pushes.work_state()
    return None


def _apply_fix(ins: Inspector, kw: dict) -> None:
    """The fix of finding ``code`` (the header card's "apply"), as one undo step (``InspectorState.apply_fix``)."""
    ins.controller.apply_fix(kw["code"])


def _block_action_args(kw: dict) -> dict:
    """The front end's block action by name, as a type from here on; no value when it sent null."""
    kw["action"] = BlockAction.parse(kw["action"])
    if kw.get("value", 0) is None:
        del kw["value"]
    return kw


ACTION_HANDLERS: dict[str, ActionHandler] = {
    # the plan
    "toggle_unit": lambda ins, kw: ins.controller.toggle_unit(**kw),
    "make_unit": lambda ins, kw: ins.controller.make_unit(**kw),
    "remove_unit": lambda ins, kw: ins.controller.remove_unit(**kw),
    "set_reshard_after_forward": lambda ins, kw: ins.controller.set_reshard_after_forward(**kw),
    "toggle_ignored": lambda ins, kw: ins.controller.toggle_ignored(**kw),
    "ignore": lambda ins, kw: ins.controller.ignore(**kw),
    "unignore": lambda ins, kw: ins.controller.unignore(**kw),
    "ignore_lora": lambda ins, kw: ins.controller.ignore_lora(**kw),
    "unignore_lora": lambda ins, kw: ins.controller.unignore_lora(**kw),
    "toggle_checkpoint": lambda ins, kw: ins.controller.toggle_checkpoint(**kw),
    "checkpoint_blocks": lambda ins, kw: ins.controller.checkpoint_blocks(**kw),
    "apply_to_many": lambda ins, kw: ins.controller.apply_to_many(**_block_action_args(kw)),
    "apply_to_type": lambda ins, kw: ins.controller.apply_to_type(**_block_action_args(kw)),
    "apply_preset": lambda ins, kw: ins.controller.apply_preset(**kw),
    # mesh and training
    "set_mesh": lambda ins, kw: _set_mesh(ins, kw),
    "set_training": _set_training,
    "apply_suggestion": lambda ins, kw: ins.controller.apply_suggestion(**kw),
    "apply_fix": _apply_fix,
    "undo": lambda ins, kw: ins.controller.undo(),
    "redo": lambda ins, kw: ins.controller.redo(),
    # the view
    "expand": lambda ins, kw: ins.controller.expand(**kw),
    "collapse_all": lambda ins, kw: ins.controller.collapse_all(),
    "set_filter": lambda ins, kw: ins.controller.set_filter(**kw),
    "filter_finding": lambda ins, kw: ins.controller.filter_finding(**kw),
    "set_rank": lambda ins, kw: ins.controller.set_rank(whole("rank", kw["rank"], 0, ins.controller.mesh.world - 1)),
    "reveal": lambda ins, kw: ins.controller.reveal(**kw),
    "pin": lambda ins, kw: ins.controller.pin(),
    "suggest": _suggest,
    "cancel": lambda ins, kw: ins.cancel(),
    "unpin": lambda ins, kw: ins.controller.unpin(),
    # export
    "set_tab": _set_tab,
    "set_torch_version": _set_torch_version,
    "save_code": lambda ins, kw: ins.controller.save_code(**kw, torch_version=ins.torch_version or None),
    "verify": _verify,
    "overwrite_plan_file": lambda ins, kw: ins.controller.overwrite_plan_file(),
    "dismiss_messages": lambda ins, kw: ins.controller.dismiss_messages(),
}


def _device_text(size: int | None) -> str:
    if not size:
        return ""
    gib = size / GIB
    return f"{gib:g}" if gib >= 1 and round(gib, 3) == gib else format_bytes(size)


def _severity_text(counts: dict | None) -> dict | None:
    """"1 error", "2 warnings": the summary's counts as the front end shows them; ``total``: every
    finding ("3 findings"), the count the Findings tab shows too (one count of the same list)."""
    if counts is None:
        return None
    return {**{k: format_plural(n, k, "info" if k == "info" else None) for k, n in counts.items()},
            "total": format_plural(sum(counts.values()), "finding")}


