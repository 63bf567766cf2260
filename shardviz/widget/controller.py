"""The Inspector's controller: every action as a plain Python method, no browser needed.

``InspectorState`` owns one ``ModelTree`` (built once), the history of immutable states
(plan, mesh, training) for undo/redo, the current ``Analysis`` (``sv.analyze`` on the cached tree,
``strict=False`` so that a plan torch would refuse shows its reasons as findings), the tree view
(expansion, filters, chosen rank) and the plan file. The widget front end only sends these
actions and draws what ``rows()``, ``memory``, ``traffic``, ``findings`` and ``comparison`` return.

``pin()`` keeps the current (plan, mesh, training) and its analysis as "A"; ``comparison`` then
sets A against the current state ("B") with ``sv.Comparison``, updated after every change. Pinning
is view state, like the filters: not an undo step (undo moves B, A stays where it was pinned).

Every change either fully happens or raises ``ValueError`` and changes nothing: the new plan is
analysed before it becomes current. The plan edits themselves live in ``plan_actions.py`` (mixed
in), the plan's name after edits in ``plan_names.py``, the Suggest panel (``sv.search``) in ``suggest.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis import Analysis, analyze
from ..compare import Comparison
from ..files import write_text_atomic
from ..fsdp import Mesh
from ..plan import Plan, as_plan
from ..tree import ModelTree
from ..display import DEFAULT_TRAINING  # what the Inspector assumes when no training is given
from . import panels
from .plan_actions import PRESETS, PlanActions
from .plan_names import EDITED, Edit, PlanNames, base_name, plan_changes
from .planfile import PlanFile
from .suggest import SuggestActions
from .tree_view import ModuleStats, TreeView

__all__ = ["DEFAULT_TRAINING", "PRESETS", "InspectorState", "Snapshot", "base_name", "plan_changes"]

HISTORY_LIMIT = 1000


@dataclass(frozen=True)
class Snapshot:
    plan: Plan
    mesh: Mesh
    training: Any
    #: the user's edits since the plan's base (its name counts them; see plan_names.py)
    edits: tuple[Edit, ...] = field(default=(), compare=False)


class InspectorState(PlanActions, SuggestActions):
    """Plan, mesh and training being inspected, with undo/redo and an optional plan file."""

    def __init__(self, model, plan=None, mesh: Mesh | None = None, training=None, plan_path=None):
        t0 = time.perf_counter()
        if isinstance(model, ModelTree):
            self.model, self.tree = None, model
        else:
            self.model, self.tree = model, ModelTree(model)
        mesh = mesh if mesh is not None else Mesh(shard=8)
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
        #: the sequence length was given (a training passed in, or set since): only then is it
        #: checked against the model's positions (the default 2048 on a tiny model is not the user's)
        self.seq_len_set = training is not None
        training = training if training is not None else DEFAULT_TRAINING
        self.view = TreeView(self.tree)
        self.messages: list[dict] = []  # {id, level, text, at}; the widget shows the latest ones
        self._message_id = 0
        self.listeners: list[Callable[[set], None]] = []
        #: called before the current analysis or a derived view is replaced (the widget stops its
        #: background work there, so that nothing computed for the old state lands in the new one)
        self.before_change: list[Callable[[], object]] = []
        self.revision = 0
        self.timings: dict[str, float] = {}
        self._code_cache: dict = {}
        self.verify_result: dict | None = None
        self.last_reveal: str | None = None
        self.torch_version: str | None = None  # the export target; the findings follow it (set_torch_version)
        self.pinned: Snapshot | None = None  # "A" of the A vs B view (see pin())
        self._pinned_analysis: Analysis | None = None

        explicit = as_plan(plan) if plan is not None else None
        self.plan_file = PlanFile(plan_path) if plan_path is not None else None
        restored = None
        if self.plan_file is not None:
            result = self.plan_file.load(self.tree)
            restored = result.plan
            if restored is not None:
                try:  # names that exist can still form a plan torch cannot apply (no bottom-up order)
                    self._analyze(Snapshot(restored, mesh, training))
                except ValueError as exc:
                    restored = None
                    result = self.plan_file._refuse(
                        f"plan file {self.plan_file.path} holds a plan that cannot be applied to this model ({exc})")
            if restored is not None or result.level == "error":
                self._message(result.level, result.message)
        start = restored or explicit or Plan.auto(self.tree)
        self.names = PlanNames(self.tree)
        self.names.remember(start)
        self._history = [Snapshot(start, mesh, training, self.names.carried_edits(start) if EDITED in start.name else ())]
        self._pos = 0
        self._recompute(self._history[0])  # raises ValueError for an unusable explicit plan
        if self.plan_file is not None and restored is None and self.plan_file.writable:
            self.plan_file.save(start)  # a fresh file: the starting plan is on disk at once
        self.timings["init_s"] = time.perf_counter() - t0

    # ------------------------------------------------------------------------------------
    # current state
    # ------------------------------------------------------------------------------------
    @property
    def current(self) -> Snapshot:
        return self._history[self._pos]

    @property
    def plan(self) -> Plan:
        return self.current.plan

    @property
    def mesh(self) -> Mesh:
        return self.current.mesh

    @property
    def training(self):
        return self.current.training

    @property
    def can_undo(self) -> bool:
        return self._pos > 0

    @property
    def can_redo(self) -> bool:
        return self._pos < len(self._history) - 1

    def observe(self, callback: Callable[[set], None]) -> None:
        """``callback(changed)`` after every change; ``changed`` names what moved:
        "state" (plan/mesh/training: every view), "rows" (tree only), "messages", "verify"."""
        self.listeners.append(callback)

    def _notify(self, changed: set) -> None:
        for cb in list(self.listeners):
            cb(changed)

    def _before_change(self) -> None:
        for cb in list(self.before_change):
            cb()

    def _message(self, level: str, text: str) -> None:
        self._message_id += 1
        self.messages.append({"id": self._message_id, "level": level, "text": text, "at": time.time()})
        del self.messages[:-20]

    def dismiss_messages(self) -> None:
        """Clear the messages (the widget's "×"); a change that succeeds clears them too."""
        if self.messages:
            self.messages.clear()
            self._notify({"messages"})

    # ------------------------------------------------------------------------------------
    # recompute
    # ------------------------------------------------------------------------------------
    def _analyze(self, snap: Snapshot) -> Analysis:
        return analyze(self.tree, snap.plan, snap.mesh, snap.training, strict=False,
                       torch_version=self.torch_version)

    def set_torch_version(self, version: str | None) -> None:
        """The release the exported code targets ("2.6", ...; None or "": the installed torch).
        The findings follow it (SV101: ignored parameters before 2.7; SV110: groups before 2.5)."""
        version = version or None
        if version is not None:
            from ..fsdp import parse_version

            parse_version(version)  # ValueError for a bad string, nothing changed
        if version == self.torch_version:
            return
        self._before_change()
        self.torch_version = version
        self.analysis.torch_version = version
        self.analysis.__dict__.pop("findings", None)  # a cached_property: recomputed for the new release
        self._derived.pop("findings", None)
        self._notify({"findings"})

    def _recompute(self, snap: Snapshot, analysis: Analysis | None = None) -> None:
        """Make ``analysis`` current; every derived view is rebuilt lazily, on first use."""
        t0 = time.perf_counter()
        self._before_change()
        self.analysis = analysis if analysis is not None else self._analyze(snap)
        self._derived: dict[str, Any] = {}
        self.revision += 1
        self._code_cache.clear()
        self.verify_result = None
        if self.view.rank >= snap.mesh.world:
            self.view.rank = snap.mesh.world - 1
        self.timings["analyze_s"] = time.perf_counter() - t0

    def _lazy(self, key: str, build):
        if key not in self._derived:
            t0 = time.perf_counter()
            self._derived[key] = build()
            self.timings[f"{key}_s"] = time.perf_counter() - t0
        return self._derived[key]

    @property
    def stats(self) -> ModuleStats:
        """Per-module badges and bytes for the current layout."""
        return self._lazy("stats", lambda: ModuleStats(self.tree, self.analysis.layout, self.view.static))

    @property
    def memory(self) -> dict:
        """The memory chart's data: per-rank bars stacked by category, from ``analysis.memory``."""
        return self._lazy("memory", lambda: panels.memory_payload(self.analysis))

    @property
    def traffic(self) -> dict:
        """The traffic chart's data: bytes per step by collective and by call, from ``analysis.comm``."""
        return self._lazy("traffic", lambda: panels.traffic_payload(self.analysis))

    @property
    def timeline(self) -> dict:
        """The step's timeline (``panels.timeline_payload``): why there is none without a device or a batch."""
        return self._lazy("timeline", lambda: panels.timeline_payload(self.analysis))

    @property
    def findings(self) -> list[dict]:
        """``analysis.findings`` as dicts (code, severity, message, fqns, fix)."""
        return self._lazy("findings", lambda: panels.findings_payload(self.analysis))

    @property
    def comparison(self) -> dict:
        """The A vs B view's data (``panels.comparison_payload``); ``{"pinned": False}`` until ``pin()``."""
        return self._lazy("comparison", lambda: shortened_diff(
            panels.comparison_payload(self.pinned_comparison(), self.pinned, self.current)))

    def pinned_comparison(self) -> Comparison | None:
        """``sv.Comparison`` of the pinned state ("A") and the current one ("B"); None when nothing is pinned.

        Both analyses are ``sv.analyze(tree, plan, mesh, training, strict=False)`` on the cached tree,
        as ``sv.compare`` makes them, so ``table`` and ``diff("A", "B")`` are exactly compare's.
        """
        if self.pinned is None:
            return None
        return Comparison({"A": self._pinned_analysis, "B": self.analysis})

    def _commit(self, plan: Plan | None = None, mesh: Mesh | None = None, training=None, what: str = "",
                edit: bool = True, note: str | None = None) -> bool:
        """Make (plan, mesh, training) current as one undo step; False when nothing changed.

        ``edit``: the plan is one user edit of the current one (named after its base, see
        ``PlanNames.after_edit``); False for a plan that replaces it (a preset, ``set_plan``), which
        keeps its own name. A change that happens clears the earlier messages (they were about an
        earlier state); ``note`` is then the one message shown."""
        cur = self.current
        edits = cur.edits
        if plan is not None:
            if edit:
                plan, edits = self.names.after_edit(plan, cur.plan, cur.edits)
            else:
                self.names.remember(plan)
                edits = self.names.carried_edits(plan) if EDITED in plan.name else ()
        snap = Snapshot(plan if plan is not None else cur.plan,
                        mesh if mesh is not None else cur.mesh,
                        training if training is not None else cur.training, edits)
        if snap == cur and snap.plan.name == cur.plan.name:
            return False
        analysis = self._analyze(snap)  # raises ValueError: nothing has changed yet
        self.messages.clear()
        if note:
            self._message("info", note)
        del self._history[self._pos + 1:]
        self._history.append(snap)
        if len(self._history) > HISTORY_LIMIT:
            del self._history[0]
        self._pos = len(self._history) - 1
        self._recompute(snap, analysis)
        if snap.plan != cur.plan or snap.plan.name != cur.plan.name:
            self._autosave()
        self._notify({"state"})
        return True

    def _autosave(self) -> None:
        pf = self.plan_file
        if pf is None:
            return
        was_ok = pf.writable
        t0 = time.perf_counter()
        try:
            pf.save(self.plan)
        except OSError as exc:
            self._message("error", f"could not save the plan to {pf.path}: {exc}")
            self._notify({"messages"})
            return
        self.timings["save_s"] = time.perf_counter() - t0
        if was_ok and not pf.writable:
            self._message("error", pf.problem)
            self._notify({"messages"})

    # -- mesh and training ----------------------------------------------------------------
    def set_mesh(self, world: int | None = None, replicate: int | None = None, device_memory=...,
                 shard: int | None = None, **fields) -> None:
        """Change the mesh: ``world`` ranks in all, ``replicate`` HSDP copies (shard = world / replicate).

        ``device_memory``: bytes, "80GiB", or None for no limit. Other ``sv.Mesh`` fields pass through.
        """
        cur = self.mesh
        replicate = cur.replicate if replicate is None else int(replicate)
        tensor = int(fields.pop("tensor", cur.tensor))
        if tensor != cur.tensor:
            return self.set_tensor(tensor, world)
        if shard is None:
            world = cur.world if world is None else int(world)
            if world < 1:
                raise ValueError(f"world size {world}: give the number of ranks, 1 or more")
            if replicate < 1:
                raise ValueError(f"HSDP replicate {replicate}: give the number of copies, 1 or more (1: plain FSDP)")
            if world % (replicate * tensor):
                raise ValueError(f"world size {world} is not a multiple of the HSDP replicate size {replicate}"
                                 + (f" x the tensor degree {tensor}" if tensor > 1 else ""))
            shard = world // (replicate * tensor)
        changes = dict(shard=int(shard), replicate=replicate, **fields)
        if device_memory is not ...:
            changes["device_memory"] = device_memory
        self._commit(mesh=dataclasses.replace(cur, **changes))

    def set_tensor(self, tensor: int, world: int | None = None) -> None:
        """The tensor-parallel degree (the world kept): with T > 1 and a plan without tensor-parallel
        entries, the model's own plan is added (one undo step); T = 1 keeps the entries, unused."""
        from ..tp_presets import preset

        cur, tensor = self.mesh, int(tensor)
        world = cur.world if world is None else int(world)
        if tensor < 1 or world % (cur.replicate * tensor):
            raise ValueError(f"tensor degree {tensor}: give a divisor of world size {world} / replicate {cur.replicate}")
        plan = None
        if tensor > 1 and not self.plan.tensor_parallel:
            plan = self.plan.with_tensor_parallel(preset(self.tree, True))
        mesh = dataclasses.replace(cur, shard=world // (cur.replicate * tensor), tensor=tensor)
        self._commit(plan=plan, mesh=mesh)

    def set_training(self, **fields) -> None:
        """Change ``sv.Training`` fields (optimizer, param_dtype, reduce_dtype, offload, ...)."""
        cur = self.training
        if dataclasses.is_dataclass(cur):
            names = {f.name for f in dataclasses.fields(cur)}
            unknown = set(fields) - names
            if unknown:
                raise ValueError(f"Training has no field(s) {sorted(unknown)}; fields: {sorted(names)}")
            new = dataclasses.replace(cur, **fields)
        else:
            raise ValueError("the training object is not a dataclass; pass a new sv.Training instead")
        self._commit(training=new)

    def set_offload(self, on: bool, **fields) -> None:
        """CPU offload on (``Training.offload``) or off: off also for the plan's calls that offload
        (a Suggest row offloads by its calls), in one undo step; ``fields``: other training fields."""
        plan = self.plan
        if on or not any(u.offload for u in plan.units):
            self.set_training(**fields, offload=bool(on))
            return
        units = [dataclasses.replace(u, offload=False) for u in plan.units]
        fields["offload"] = False
        self._commit(plan=plan.with_units(units),
                     training=dataclasses.replace(self.training, **fields))

    # -- history --------------------------------------------------------------------------
    def undo(self) -> bool:
        if not self.can_undo:
            return False
        self._move(self._pos - 1)
        return True

    def redo(self) -> bool:
        if not self.can_redo:
            return False
        self._move(self._pos + 1)
        return True

    def _move(self, pos: int) -> None:
        before = self.current
        self._pos = pos
        self.messages.clear()  # they were about the state left behind
        self._recompute(self.current)
        if self.current.plan != before.plan or self.current.plan.name != before.plan.name:
            self._autosave()
        self._notify({"state"})

    # ------------------------------------------------------------------------------------
    # view (not undoable)
    # ------------------------------------------------------------------------------------
    def pin(self) -> None:
        """Keep the current plan, mesh and training as "A" (replacing an earlier pin); the current
        state, as it changes from now on, is "B" in ``comparison``."""
        self._before_change()
        self.pinned = self.current
        self._pinned_analysis = self.analysis
        self._derived.pop("comparison", None)
        self._notify({"pin"})

    def unpin(self) -> bool:
        """Forget "A"; False when nothing was pinned."""
        if self.pinned is None:
            return False
        self._before_change()
        self.pinned = None
        self._pinned_analysis = None
        self._derived.pop("comparison", None)
        self._notify({"pin"})
        return True

    def expand(self, target, open: bool = True) -> None:
        self.view.set_expanded(target, open)
        self._notify({"rows"})

    def collapse(self, target) -> None:
        self.expand(target, False)

    def collapse_all(self) -> None:
        self.view.collapse_all()
        self._notify({"rows"})

    def set_filter(self, text=None, status=None, role=None) -> None:
        self.view.set_filter(text, status, role)
        self._notify({"rows"})

    def filter_finding(self, code: str) -> None:
        """Show in the tree only what a finding is about: every name, not only those it lists."""
        found = [f for f in self.analysis.findings if f.code == code]
        if not found:
            raise ValueError(f"finding {code!r}: the current plan has no such finding")
        names = set().union(*(f.all_fqns for f in found))
        self.view.filter_to_names(names, f"{code}: {len(names):,} name{'' if len(names) == 1 else 's'}")
        self._notify({"rows"})

    def set_rank(self, rank: int) -> None:
        rank = int(rank)
        if not 0 <= rank < self.mesh.world:
            raise ValueError(f"rank {rank} is outside the mesh of {self.mesh.world} ranks")
        self.view.rank = rank
        self._notify({"rows"})

    def reveal(self, fqn: str) -> str:
        """Open the tree down to a module or parameter (clearing filters that hide it); its row id."""
        if self.view.filtering:
            self.view.set_filter("", "", "")
        row = self.view.expand_to(fqn)
        self.last_reveal = row
        self._notify({"rows", "reveal"})
        return row

    def rows(self) -> tuple[list[str], dict[str, dict]]:
        """Visible row ids in order and their payloads (what the tree shows now)."""
        return self.view.rows(self.stats)

    # ------------------------------------------------------------------------------------
    # export and verify
    # ------------------------------------------------------------------------------------
    def export_code(self, torch_version=None) -> str:
        """``sv.export_code`` for the current plan, mesh and training (cached until the next change)."""
        key = ("code", torch_version)
        if key not in self._code_cache:
            from ..codegen import export_code

            self._code_cache[key] = export_code(self.model if self.model is not None else self.tree, self.plan,
                                                mesh=self.mesh, training=self.training, torch_version=torch_version)
        return self._code_cache[key]

    def save_code(self, path, torch_version=None, overwrite: bool = False) -> Path:
        """Write the exported code to ``path``; an existing file needs ``overwrite=True``."""
        path = Path(path).expanduser()
        if path.is_dir():
            raise ValueError(f"{path} is a folder; give a file name such as {path / 'fsdp_plan.py'}")
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True (or confirm in the widget) to replace it")
        write_text_atomic(path, self.export_code(torch_version), parents=True)
        return path.resolve()  # the widget says where the file is, not only its name

    def verify(self) -> dict:
        """Run ``sv.verify``: torch's real ``fully_shard`` on a meta copy, compared with the prediction."""
        if self.model is None:
            raise ValueError("verify needs the nn.Module; this Inspector was built from a ModelTree")
        from .. import verify as sv_verify

        t0 = time.perf_counter()
        plan, mesh = self.plan, self.mesh
        try:
            df = sv_verify(self.model, plan, mesh=mesh, training=self.training)
        except Exception as exc:  # noqa: BLE001 - torch's refusal is the answer to show
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "rows": [], "n": 0,
                      "raised_by": raised_by(exc)}
        else:
            rows = df.head(50).astype(str).to_dict("records")
            result = {"ok": len(df) == 0, "error": None, "rows": rows, "n": len(df)}
        result["seconds"] = round(time.perf_counter() - t0, 2)
        result["revision"] = self.revision
        result["plan_json"] = plan.to_json(indent=None)
        self.verify_result = result
        self._notify({"verify"})
        return result

    # -- plan file -------------------------------------------------------------------------
    def overwrite_plan_file(self) -> None:
        """Replace the plan file with the current plan and switch autosave back on (explicit)."""
        if self.plan_file is None:
            raise ValueError("this Inspector has no plan_path")
        self.plan_file.overwrite(self.plan)
        self._message("info", f"saved the current plan to {self.plan_file.path}; autosave is on")
        self._notify({"messages"})

    def plan_file_status(self) -> dict | None:
        pf = self.plan_file
        if pf is None:
            return None
        return {"path": str(pf.path), "autosave": pf.writable, "problem": pf.problem, "saves": pf.saves}


def raised_by(exc: BaseException) -> str:
    """"torch" when the exception was raised inside torch (a refusal of the plan), else "shardviz"
    (the verification itself failed: the message must not blame torch)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return "torch" if frames and f"{os.sep}torch{os.sep}" in frames[-1].filename else "shardviz"


def shortened_diff(payload: dict) -> dict:
    """The A vs B diff with names a narrow table can show: each parameter without the dotted
    prefix every listed name shares ("self_attn.q_proj.lora_A.default.weight"), and each side
    as "sharded in layers.0"; the full names stay for the tooltip and for reveal."""
    diff = payload.get("diff") or []
    if not diff:
        return payload
    parts = [d["fqn"].split(".") for d in diff]
    k = 0
    while all(len(p) > k + 3 for p in parts) and len({p[k] for p in parts}) == 1:
        k += 1  # a shared part, and every name keeps at least its last three
    for d, p in zip(diff, parts):
        d["fqn_short"] = ".".join(p[k:])
        for side in ("a", "b"):
            unit = d[f"unit_{side}"]
            d[f"where_{side}"] = d[f"status_{side}"] + (f" in {short_unit_label(unit)}" if unit else "")
    return payload


def short_unit_label(name: str) -> str:
    """A call's name as the tree's badges show it: "layers.0" for "base_model.model.model.layers.0"."""
    if not name or name.startswith("["):
        return name or "<root>"
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]
