"""The Inspector's controller: every action as a plain Python method, no browser needed.

``InspectorState`` owns one ``ModelTree`` (built once), the history of immutable states
(plan, mesh, training) for undo/redo, the current ``Analysis`` (``sv.analyze`` on the cached tree,
``strict=False`` so that a plan torch would refuse shows its reasons as findings), the tree view
(expansion, filters, chosen rank) and the plan file. The widget front end only sends these
actions and draws what ``rows()``, ``memory``, ``traffic``, ``findings`` and ``comparison`` return.

``pin()`` keeps the current (plan, mesh, training) and its analysis as "A"; ``comparison`` then
sets A against the current state ("B") with ``sv.Comparison``, updated after every change. Pinning
is view state, like the filters: not an undo step (undo moves B, A stays where it was pinned).

Every change either fully happens or raises ``ValueError`` and changes nothing (an ``Analysis`` is
never changed once made). The edits are plain functions of this state in ``plan_actions.py`` and
``setup_actions.py`` (the methods here make their result current), the plan's name after edits in
``plan_names.py``, Suggest (``sv.search``) in ``suggest.py``. Listeners hear a ``Change`` (a flag).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Flag, auto
from pathlib import Path
from typing import Any

from ..analysis import Analysis, analyze
from ..compare import Comparison
from ..files import write_text_atomic
from ..run.mesh import Mesh
from ..plan import Plan, as_plan
from ..model.tree import ModelTree
from ..views.display import DEFAULT_TRAINING, header_card  # DEFAULT_TRAINING: what the Inspector assumes
from . import panels, plan_actions, setup_actions, suggest
from .panels import shortened_diff
from .plan_actions import PRESETS, BlockAction
from .plan_names import Edit, NamedPlan, PlanNames, plan_changes
from .planfile import PlanFile
from .tree_view import ModuleStats, TreeView

__all__ = ["DEFAULT_TRAINING", "PRESETS", "BlockAction", "Change", "InspectorState", "Snapshot", "plan_changes"]

HISTORY_LIMIT = 1000


@dataclass(frozen=True)
class Snapshot:
    plan: Plan
    mesh: Mesh
    training: Any
    #: the user's edits since the plan's base (its name counts them; see plan_names.py)
    edits: tuple[Edit, ...] = field(default=(), compare=False)
    #: the name of the known plan (a preset, a plan the user set) the edits count from
    base: str = field(default="", compare=False)

    @property
    def named(self) -> NamedPlan:
        return NamedPlan(self.plan, self.base, self.edits)


class Change(Flag):
    """What a change moved, as listeners hear it (``InspectorState.observe``)."""

    STATE = auto()  # plan, mesh or training: every view
    ROWS = auto()  # the tree only (expansion, filters, rank)
    REVEAL = auto()  # the tree opened down to ``last_reveal``
    MESSAGES = auto()
    VERIFY = auto()
    PIN = auto()  # "A" of A vs B pinned or forgotten
    SUGGEST = auto()  # the Suggest panel's search state
    FINDINGS = auto()  # same plan, other findings (the target release)


class InspectorState:
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
        self.listeners: list[Callable[[Change], None]] = []
        #: called before the current analysis or a derived view is replaced (the widget stops its
        #: background work there, so that nothing computed for the old state lands in the new one)
        self.before_change: list[Callable[[Snapshot | None], object]] = []
        self.revision = 0
        self.timings: dict[str, float] = {}
        self._code_cache: dict = {}
        self.verify_result: dict | None = None
        self.last_reveal: str | None = None
        self.torch_version: str | None = None  # the export target; the findings follow it (set_torch_version)
        self.pinned: Snapshot | None = None  # "A" of the A vs B view (see pin())
        self._pinned_analysis: Analysis | None = None
        self._blocks: tuple[str, ...] | None = None
        #: the Suggest panel (suggest.py): its search's state, rows shown, and the last search
        self.suggest_status: dict = {"state": "idle"}
        self.suggest_top = suggest.DEFAULT_TOP
        self.found: suggest.FoundPlans | None = None
        self.searched: dict[tuple, suggest.FoundPlans] = {}  # by suggest.ahead_key: Suggest's or the look-ahead's
        self.search_parts: dict[tuple, dict] = {}  # by suggest.ahead_key: the rows of a search stopped midway

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
                    result = self.plan_file.refuse(
                        f"plan file {self.plan_file.path} holds a plan that cannot be applied to this model ({exc})")
            if restored is not None or result.level == "error":
                self.say(result.level, result.message, notify=False)
        start = restored or explicit or Plan.auto(self.tree)
        self.names = PlanNames(self.tree)
        named = self.names.arrived(start)
        self._history = [Snapshot(start, mesh, training, named.edits, named.base)]
        self._pos = 0
        self._recompute(self._history[0])  # raises ValueError for an unusable explicit plan
        if self.plan_file is not None and restored is None and self.plan_file.writable:
            self.plan_file.save(start)  # a fresh file: the starting plan is on disk at once
        self.timings["init_s"] = time.perf_counter() - t0

    # -- current state -----------------------------------------------------------------------
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

    def observe(self, callback: Callable[[Change], None]) -> None:
        """``callback(changed)`` after every change (a ``Change`` says what moved)."""
        self.listeners.append(callback)

    def _notify(self, changed: Change) -> None:
        for cb in list(self.listeners):
            cb(changed)

    def _before_change(self, to: Snapshot | None = None) -> None:
        """Before the state changes (to ``to``, when it is a new plan, mesh or training)."""
        for cb in list(self.before_change):
            cb(to)

    def say(self, level: str, text: str, notify: bool = True) -> None:
        """A message ("info" or "error") between changes (a change clears them); ``notify``: tell the listeners."""
        self._message_id += 1
        self.messages.append({"id": self._message_id, "level": level, "text": text, "at": time.time()})
        del self.messages[:-20]
        if notify:
            self._notify(Change.MESSAGES)

    def dismiss_messages(self) -> None:
        """Clear the messages (the widget's "×"); a change that succeeds clears them too."""
        if self.messages:
            self.messages.clear()
            self._notify(Change.MESSAGES)

    # -- recompute ---------------------------------------------------------------------------
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
        self.analysis = self._analyze(self.current)  # a new analysis: the findings follow the release
        self._derived.pop("findings", None)  # the numbers do not depend on it
        self._notify(Change.FINDINGS)

    def _recompute(self, snap: Snapshot, analysis: Analysis | None = None) -> None:
        """Make ``analysis`` current; every derived view is rebuilt lazily, on first use."""
        t0 = time.perf_counter()
        self._before_change(snap)
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

    def computed(self, key: str):
        """A derived view ("findings", "memory", ...) if it is built already, else None (nothing runs)."""
        return self._derived.get(key)

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
    def first_findings(self) -> list[dict]:
        """``findings`` once built, else ``analysis.first_findings`` (no what-if priced: shown while they run)."""
        if "findings" in self._derived:  # the priced ones, even when none: never the first ones after them
            return self._derived["findings"]
        return self._lazy("first", lambda: panels.findings_payload(self.analysis, True))

    def card(self) -> dict:  # the header card (display.header_card, the report's too), with the findings sent so far
        which = next((k for k in ("findings", "first") if k in self._derived), None)
        return self._lazy(f"card_{which}", lambda: header_card(self.analysis, None if which is None else (
            self.analysis.findings if which == "findings" else self.analysis.first_findings)))

    def apply_fix(self, code: str) -> None:  # a finding's fix that is a change of plan, mesh or training, as one undo step
        self._commit(**plan_actions.finding_fix(self, code), edit=False, note=f"applied the fix of {code}; undo goes back")

    @property
    def comparison(self) -> dict:
        """The A vs B view's data (``panels.comparison_payload``); ``{"pinned": False}`` until ``pin()``."""
        return self._lazy("comparison", lambda: shortened_diff(
            panels.comparison_payload(self.pinned_comparison(), self.pinned, self.current)))

    def pinned_comparison(self) -> Comparison | None:
        """``sv.Comparison`` of the pinned state ("A") and the current one ("B"), None when nothing is pinned:
        both analysed on the cached tree as ``sv.compare`` does, so ``table`` and ``diff`` are compare's."""
        if self.pinned is None:
            return None
        return Comparison({"A": self._pinned_analysis, "B": self.analysis})

    def _commit(self, plan: Plan | NamedPlan | None = None, mesh: Mesh | None = None, training=None, edit: bool = True,
                note: str | None = None) -> bool:
        """Make (plan, mesh, training) current as one undo step; False when nothing changed.

        ``edit``: the plan is one user edit of the current one (named after its base, ``PlanNames.after_edit``);
        False for a plan that replaces it (``set_plan``, a suggestion), or a ``NamedPlan`` named already.
        A change clears the earlier messages; ``note`` is then the one message shown."""
        cur = self.current
        if isinstance(plan, Plan):
            named = self.names.after_edit(plan, cur.named) if edit else self.names.arrived(plan)
        else:
            named = plan or cur.named  # a NamedPlan named already, or the current plan
        snap = Snapshot(named.plan, mesh if mesh is not None else cur.mesh,
                        training if training is not None else cur.training, named.edits, named.base)
        if snap == cur and snap.plan.name == cur.plan.name:
            return False
        analysis = self._analyze(snap)  # raises ValueError: nothing has changed yet
        self.messages.clear()
        if note:
            self.say("info", note, notify=False)
        del self._history[self._pos + 1:]
        self._history.append(snap)
        if len(self._history) > HISTORY_LIMIT:
            del self._history[0]
        self._pos = len(self._history) - 1
        self._recompute(snap, analysis)
        if snap.plan != cur.plan or snap.plan.name != cur.plan.name:
            self._autosave()
        self._notify(Change.STATE)
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
            self.say("error", f"could not save the plan to {pf.path}: {exc}")
            return
        self.timings["save_s"] = time.perf_counter() - t0
        if was_ok and not pf.writable:
            self.say("error", pf.problem)

    # -- the plan: each edit is a plain function of this state (plan_actions.py), one undo step here
    def make_unit(self, fqn: str, **options) -> None:
        """Give module ``fqn`` its own ``fully_shard`` call (``options``: ``sv.Unit`` keywords)."""
        self._commit(plan=plan_actions.make_unit(self, fqn, **options))

    def make_group_unit(self, fqns: Iterable[str], **options) -> None:
        """One grouped call ``fully_shard([a, b, ...])``."""
        self._commit(plan=plan_actions.make_group_unit(self, fqns, **options))

    def remove_unit(self, fqn: str) -> None:
        """Drop the call that contains module ``fqn`` (the whole group if it is grouped)."""
        self._commit(plan=plan_actions.remove_unit(self, fqn))

    def toggle_unit(self, fqn: str) -> None:
        self._commit(plan=plan_actions.toggle_unit(self, fqn))

    def set_reshard_after_forward(self, fqn: str, value) -> None:
        """``reshard_after_forward`` of the call containing ``fqn``: None (torch's default), bool or int."""
        self._commit(plan=plan_actions.set_unit_options(self, fqn, reshard_after_forward=value))

    def set_unit_options(self, fqn: str, **options) -> None:
        """Any ``sv.Unit`` option of the call containing ``fqn`` (param_dtype, reduce_dtype, offload, ...)."""
        self._commit(plan=plan_actions.set_unit_options(self, fqn, **options))

    def ignore(self, fqns) -> None:
        """Keep these parameters out of FSDP (``ignored_params``)."""
        self._commit(plan=plan_actions.ignore(self, fqns))

    def unignore(self, fqns) -> None:
        """Give these parameters back to FSDP (every alias of a tied parameter)."""
        self._commit(plan=plan_actions.unignore(self, fqns))

    def toggle_ignored(self, fqn: str) -> None:
        self._commit(plan=plan_actions.toggle_ignored(self, fqn))

    def lora_params(self, module_fqn: str = "") -> list[str]:
        """Canonical FQNs of the LoRA parameters under a module (the whole model by default)."""
        return plan_actions.lora_params(self.tree, module_fqn)

    def ignore_lora(self, module_fqn: str = "") -> None:
        """Ignore every LoRA parameter under ``module_fqn``."""
        self._commit(plan=plan_actions.ignore_lora(self, module_fqn))

    def unignore_lora(self, module_fqn: str = "") -> None:
        """Give every LoRA parameter under ``module_fqn`` back to FSDP."""
        self._commit(plan=plan_actions.unignore_lora(self, module_fqn))

    def checkpoint(self, fqns) -> None:
        """Wrap these modules in ``checkpoint_wrapper`` (their activations are recomputed in backward)."""
        self._commit(plan=plan_actions.checkpoint(self, fqns))

    def uncheckpoint(self, fqns) -> None:
        self._commit(plan=plan_actions.uncheckpoint(self, fqns))

    def toggle_checkpoint(self, fqn: str) -> None:
        self._commit(plan=plan_actions.toggle_checkpoint(self, fqn))

    def blocks(self) -> list[str]:
        """The repeated blocks ``Plan.auto(model, checkpoint="blocks")`` checkpoints."""
        if self._blocks is None:
            self._blocks = plan_actions.repeated_blocks(self.tree)
        return list(self._blocks)

    def checkpoint_blocks(self, on: bool = True) -> None:
        """Checkpoint every repeated block (``on``), or none of them; one undo step."""
        self._commit(plan=plan_actions.checkpoint_blocks(self, on))

    def apply_to_many(self, targets, action: BlockAction | str, **kw) -> None:
        """Repeat one ``BlockAction`` over many modules as ONE undo step (``plan_actions.apply_to_many``)."""
        self._commit(plan=plan_actions.apply_to_many(self, targets, action, **kw))

    def apply_to_type(self, type_or_fqn: str, action: BlockAction | str, within: str = "", **kw) -> None:
        """Apply a block action to every module of one class (given by name or by one of its FQNs)."""
        self._commit(plan=plan_actions.apply_to_type(self, type_or_fqn, action, within, **kw))

    def apply_preset(self, name: str) -> None:
        """Replace the plan's calls and ignored parameters with a preset (``PRESETS``), keeping the
        current checkpointing; a message says what was kept (undo goes back)."""
        plan, note = plan_actions.preset_keeping_checkpointing(self, name)
        self._commit(plan=plan, edit=False, note=note)

    def set_plan(self, plan) -> None:
        """Replace the plan (a ``Plan``, JSON text or dict); validated against the model."""
        self._commit(plan=plan_actions.validated_plan(self.tree, plan), edit=False)

    # -- mesh and training ----------------------------------------------------------------
    def set_mesh(self, world: int | None = None, replicate: int | None = None, device_memory=...,
                 shard: int | None = None, **fields) -> None:
        """Change the mesh: ``world`` ranks in all, ``replicate`` HSDP copies (shard = world / replicate).

        ``device_memory``: bytes, "80GiB", or None for no limit. Other ``sv.Mesh`` fields pass through.
        """
        self._commit(*setup_actions.mesh_edit(self, world, replicate, device_memory, shard, **fields))

    def set_tensor(self, tensor: int, world: int | None = None) -> None:
        """The tensor-parallel degree (the world kept): with T > 1 and a plan without tensor-parallel
        entries, the model's own plan is added (one undo step); T = 1 keeps the entries, unused."""
        self._commit(*setup_actions.tensor_edit(self, tensor, world))

    def set_training(self, **fields) -> None:
        """Change ``sv.Training`` fields (optimizer, param_dtype, reduce_dtype, offload, ...)."""
        self._commit(*setup_actions.training_edit(self, **fields))

    def set_offload(self, on: bool, **fields) -> None:
        """CPU offload on (``Training.offload``) or off: off also for the plan's calls that offload
        (a Suggest row offloads by its calls), in one undo step; ``fields``: other training fields."""
        self._commit(*setup_actions.offload_edit(self, on, **fields))

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
        self._notify(Change.STATE)

    # -- view (not undoable) -----------------------------------------------------------------
    def pin(self) -> None:
        """Keep the current plan, mesh and training as "A" (replacing an earlier pin); the current
        state, as it changes from now on, is "B" in ``comparison``."""
        self._before_change()
        self.pinned = self.current
        self._pinned_analysis = self.analysis
        self._derived.pop("comparison", None)
        self._notify(Change.PIN)

    def unpin(self) -> bool:
        """Forget "A"; False when nothing was pinned."""
        if self.pinned is None:
            return False
        self._before_change()
        self.pinned = None
        self._pinned_analysis = None
        self._derived.pop("comparison", None)
        self._notify(Change.PIN)
        return True

    def expand(self, target, open: bool = True) -> None:
        self.view.set_expanded(target, open)
        self._notify(Change.ROWS)

    def collapse(self, target) -> None:
        self.expand(target, False)

    def collapse_all(self) -> None:
        self.view.collapse_all()
        self._notify(Change.ROWS)

    def set_filter(self, text=None, status=None, role=None) -> None:
        self.view.set_filter(text, status, role)
        self._notify(Change.ROWS)

    def filter_finding(self, code: str) -> None:
        """Show in the tree only what a finding is about: every name, not only those it lists."""
        found = [f for f in self.analysis.findings if f.code == code]
        if not found:
            raise ValueError(f"finding {code!r}: the current plan has no such finding")
        names = set().union(*(f.all_fqns for f in found))
        self.view.filter_to_names(names, f"{code}: {len(names):,} name{'' if len(names) == 1 else 's'}")
        self._notify(Change.ROWS)

    def set_rank(self, rank: int) -> None:
        if not 0 <= (rank := int(rank)) < self.mesh.world:
            raise ValueError(f"rank {rank} is outside the mesh of {self.mesh.world} ranks")
        self.view.rank = rank
        self._notify(Change.ROWS)

    def reveal(self, fqn: str) -> str:
        """Open the tree down to a module or parameter (clearing filters that hide it); its row id."""
        if self.view.filtering:
            self.view.set_filter("", "", "")
        row = self.view.expand_to(fqn)
        self.last_reveal = row
        self._notify(Change.ROWS | Change.REVEAL)
        return row

    def rows(self) -> tuple[list[str], dict[str, dict]]:
        """Visible row ids in order and their payloads (what the tree shows now)."""
        return self.view.rows(self.stats)

    # -- the Suggest panel (suggest.py) ----------------------------------------------------
    def set_suggest_status(self, status: dict) -> None:
        self.suggest_status = status
        self._notify(Change.SUGGEST)

    def suggest(self, top: int = suggest.DEFAULT_TOP):
        """Run ``sv.search`` for the current model, mesh and training; the panel shows its ``top`` rows."""
        return suggest.run_search(self, top)

    @property
    def suggestion_search(self):
        """The last ``sv.search`` the panel ran (None before the first)."""
        return self.found.search if self.found is not None else None

    def apply_suggestion(self, index: int) -> None:
        """Make row ``index`` (0: the best) of the last search current, as one undo step: its plan,
        HSDP split and micro-batch together; a message says what changed besides the plan."""
        plan, mesh, training, note = suggest.suggestion(self, index)
        if not self._commit(plan=plan, mesh=mesh, training=training, edit=False, note=note):
            self.say("info", f"suggestion {int(index) + 1} is already the current plan")

    @property
    def suggestions(self) -> dict:
        """The Suggest panel's data (``suggest.suggestions_payload``)."""
        return suggest.suggestions_payload(self)

    # -- export and verify -------------------------------------------------------------------
    def export_code(self, torch_version=None) -> str:
        """``sv.export_code`` for the current plan, mesh and training (cached until the next change)."""
        key = ("code", torch_version)
        if key not in self._code_cache:
            from ..export.codegen import export_code

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
        result = panels.verify_payload(self.model, self.plan, self.mesh, self.training)
        result["revision"] = self.revision
        self.verify_result = result
        self._notify(Change.VERIFY)
        return result

    # -- plan file -------------------------------------------------------------------------
    def overwrite_plan_file(self) -> None:
        """Replace the plan file with the current plan and switch autosave back on (explicit)."""
        if self.plan_file is None:
            raise ValueError("this Inspector has no plan_path")
        self.plan_file.overwrite(self.plan)
        self.say("info", f"saved the current plan to {self.plan_file.path}; autosave is on")

    def plan_file_status(self) -> dict | None:
        pf = self.plan_file
        if pf is None:
            return None
        return {"path": str(pf.path), "autosave": pf.writable, "problem": pf.problem, "saves": pf.saves}
