"""What the user asks for: which modules get a ``fully_shard`` call, which parameters stay out.

A ``Plan`` is an immutable value: every edit returns a new plan, so an error
can never leave a half-changed plan behind, and the widget's undo is a list.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, NamedTuple, Sequence, Union

from .checkpointing import FULL, POLICY_SPELLINGS, SELECTIVE, CheckpointPolicy
from .finding import Finding
from .tp import TensorParallel
from .model.tree import ModelTree, as_tree

SCHEMA = "shardviz.plan"
SCHEMA_VERSION = 2  # 2: may carry the run's "mesh" and "training" (run.setup), a capture's "prefetch" and "origin",
# the Inspector's "edited"
READ_VERSIONS = (1, 2)  # a plan with none of version 2's fields is written as version 1, as before
SETUP_FIELDS = ("mesh", "training")  # what a version-2 file records of the run (plain JSON objects)
CAPTURE_FIELDS = ("prefetch", "origin")  # what a captured plan adds (sv.capture)
EDITED_FIELDS = ("base", "edits")  # "edited": what an Inspector's name of an edited plan counts (Edited)
PREFETCH_DIRECTIONS = ("forward", "backward")
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
LORA_OPTIONS = ("sharded", "ignored", "separate")  # Plan.auto(lora=...): where LoRA parameters go
CHECKPOINT_POLICIES = POLICY_SPELLINGS  # checkpointing.CheckpointPolicy's spellings


def closest_hint(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """`` Closest existing names: 'a', 'b'.`` for an error message, or "" when nothing is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return f" Closest existing names: {', '.join(repr(m) for m in matches)}." if matches else ""



class Checkpoints(tuple):
    """The modules a plan checkpoints: a tuple of module FQNs (iterating, ``in``, ``len`` and
    comparing with a tuple of names work as before), each with its ``CheckpointPolicy``: ``FULL``
    (torch's ``checkpoint_wrapper``) or ``SELECTIVE`` (op-level selective checkpointing inside it).

    Built from a list/tuple of names (every one ``"full"``), a mapping name -> policy, or another
    ``Checkpoints``. Equal to a plain tuple of names only when every policy is ``"full"``."""

    policies: tuple[CheckpointPolicy, ...]

    def __new__(cls, entries=()):
        if isinstance(entries, Checkpoints):
            return entries
        if entries is None:  # Plan(checkpoint=None): nothing checkpointed, as Plan.auto(checkpoint=None)
            entries = ()
        if isinstance(entries, str):
            entries = [entries]
        if not hasattr(entries, "__iter__"):
            raise ValueError(f"checkpoint must be module FQNs (a list, or a mapping name -> policy), got {entries!r}")
        pairs = entries.items() if hasattr(entries, "items") else ((name, FULL) for name in entries)
        merged: dict[str, CheckpointPolicy] = {}
        for name, policy in pairs:
            if not isinstance(name, str):
                raise ValueError(f"checkpoint entries must be module FQNs (str), got {name!r}")
            merged.setdefault(name, CheckpointPolicy.parse(policy, f"checkpoint[{name!r}]"))  # the first entry of a repeated name wins, as before
        self = super().__new__(cls, merged)
        self.policies = tuple(merged.values())
        return self

    def policy(self, name: str) -> CheckpointPolicy:
        """``FULL`` or ``SELECTIVE``; KeyError for a module that is not checkpointed."""
        for n, p in zip(self, self.policies):
            if n == name:
                return p
        raise KeyError(f"checkpoint: module {name!r} is not checkpointed")

    def items(self) -> list[tuple[str, CheckpointPolicy]]:
        return list(zip(self, self.policies))

    @property
    def selective(self) -> tuple[str, ...]:
        """The modules checkpointed with the selective policy."""
        return tuple(n for n, p in zip(self, self.policies) if p is SELECTIVE)

    def to_obj(self):
        """JSON: a list of names when every policy is "full" (schema v1 as before), else a mapping."""
        return {n: p.value for n, p in self.items()} if self.selective else list(self)

    def __eq__(self, other):
        if isinstance(other, Checkpoints):
            return tuple(self) == tuple(other) and self.policies == other.policies
        if isinstance(other, tuple):
            return not self.selective and tuple(self) == other
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(tuple(self)) if not self.selective else hash((tuple(self), self.policies))

    def __reduce__(self):
        return (Checkpoints, (self.to_obj(),))

    def __repr__(self):
        return repr(tuple(self)) if not self.selective else f"Checkpoints({self.to_obj()!r})"


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` call: one module, or several grouped into one call."""

    modules: tuple[str, ...]
    reshard_after_forward: Union[bool, int, None] = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    offload: bool = False

    def __init__(self, modules, reshard_after_forward=None, param_dtype=None, reduce_dtype=None, offload=False):
        if isinstance(modules, str):
            modules = (modules,)
        modules = tuple(modules)
        if not modules:
            raise ValueError("Unit needs at least one module FQN")
        for m in modules:
            if not isinstance(m, str):
                raise ValueError(f"Unit module names must be strings, got {m!r}")
        if len(set(modules)) != len(modules):
            raise ValueError(f"Unit {list(modules)} lists a module twice")
        reshard = reshard_after_forward
        if reshard is not None and not isinstance(reshard, (bool, int)):
            raise ValueError(f"reshard_after_forward of unit {list(modules)} must be None, a bool or an int, got {reshard!r}")
        if not isinstance(reshard, bool) and isinstance(reshard, int) and reshard < 1:
            raise ValueError(f"reshard_after_forward={reshard} of unit {list(modules)}: an int is a group size, a divisor of the shard size")
        for key, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if value is not None and value not in DTYPE_NAMES:
                raise ValueError(f"{key}={value!r} of unit {list(modules)}: expected one of {DTYPE_NAMES}")
        object.__setattr__(self, "modules", modules)
        object.__setattr__(self, "reshard_after_forward", reshard)
        object.__setattr__(self, "param_dtype", param_dtype)
        object.__setattr__(self, "reduce_dtype", reduce_dtype)
        object.__setattr__(self, "offload", bool(offload))

    @cached_property
    def name(self) -> str:
        """A label for tables: the FQN, '<root>' for "", or '[a, b]' for a group (once per unit: every
        analysis of a plan reads each call's)."""
        labels = [m if m else "<root>" for m in self.modules]
        return labels[0] if len(labels) == 1 else "[" + ", ".join(labels) + "]"

    @property
    def is_grouped(self) -> bool:
        return len(self.modules) > 1

    def options(self) -> dict:
        out = {}
        for key in ("reshard_after_forward", "param_dtype", "reduce_dtype"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.offload:
            out["offload"] = True
        return out

    def to_obj(self):
        if not self.options():
            return self.modules[0] if len(self.modules) == 1 else list(self.modules)
        return {"modules": list(self.modules), **self.options()}

    @classmethod
    def from_obj(cls, obj, where: str = "unit") -> "Unit":
        if isinstance(obj, Unit):
            return obj
        if isinstance(obj, str):
            return cls(obj)
        if isinstance(obj, (list, tuple)):
            return cls(tuple(obj))
        if isinstance(obj, dict):
            unknown = set(obj) - {"modules", "reshard_after_forward", "param_dtype", "reduce_dtype", "offload"}
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
            if "modules" not in obj:
                raise ValueError(f"{where}: missing field 'modules'")
            return cls(**obj)
        raise ValueError(f"{where}: expected a module FQN, a list of FQNs or a Unit, got {obj!r}")


@dataclass(frozen=True)
class Origin:
    """Where a captured plan came from (``sv.capture``, ``Plan.from_accelerate``) and what the capture
    saw that the calls alone do not say. Not part of a plan's equality: the same calls are the same plan.

    ``kind``: "capture" | "accelerate" | "trainer" | "torchtune" | "axolotl"; ``source``: the function ("my_train.apply_fsdp") or config
    ("fsdp.yaml"); ``release``: what made it ("accelerate 1.15.0", "torch 2.13.0"); ``findings``: what
    the capture found (the function raised, a policy shardviz does not model, ...); ``fixes``: (code, text)
    pairs, the fix of an engine finding said in the user's terms (a YAML key, a line of their code);
    ``call_sites``: (unit name, "file:line") of each ``fully_shard`` call; ``checkpoint_policies``:
    (module, name) for checkpoint policies shardviz does not model (priced as "full")."""

    kind: str
    source: str
    release: str = ""
    findings: tuple = ()
    fixes: tuple = ()
    call_sites: tuple = ()
    checkpoint_policies: tuple = ()

    @property
    def label(self) -> str:
        """The plan's name: "accelerate 1.15: fsdp.yaml", "captured: my_train.apply_fsdp"."""
        if self.kind == "accelerate":
            short = ".".join(self.release.split()[-1].split(".")[:2]) if self.release else ""
            return f"accelerate {short}: {self.source}".replace("  ", " ")
        if self.kind in ("trainer", "torchtune", "axolotl"):
            return f"{'Trainer' if self.kind == 'trainer' else self.kind}: {self.source}"
        return f"captured: {self.source}"

    def fix_for(self, code: str) -> str:
        return " ".join(text for c, text in self.fixes if c == code)

    def to_obj(self) -> dict:
        return {"kind": self.kind, "source": self.source, "release": self.release,
                "findings": [{"code": f.code, "severity": f.severity, "message": f.message, "fqns": list(f.fqns),
                              "fix": f.fix, "n_fqns": f.n_fqns} for f in self.findings],
                "fixes": [list(x) for x in self.fixes], "call_sites": [list(x) for x in self.call_sites],
                "checkpoint_policies": [list(x) for x in self.checkpoint_policies]}

    @classmethod
    def from_obj(cls, obj) -> "Origin":
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str) or not isinstance(obj.get("source"), str):
            raise ValueError("plan JSON: field 'origin' must be an object with 'kind' and 'source' strings")
        unknown = set(obj) - {"kind", "source", "release", "findings", "fixes", "call_sites", "checkpoint_policies"}
        if unknown:
            raise ValueError(f"plan JSON: origin: unknown field(s) {sorted(unknown)}")
        findings = tuple(Finding(f["code"], f["severity"], f["message"], tuple(f.get("fqns", ())), f.get("fix", ""),
                                 f.get("n_fqns")) for f in obj.get("findings", ()))
        pairs = {k: tuple(tuple(x) for x in obj.get(k, ())) for k in ("fixes", "call_sites", "checkpoint_policies")}
        return cls(obj["kind"], obj["source"], obj.get("release", ""), findings, **pairs)


class Edited(NamedTuple):
    """The name an Inspector gives an edited plan ("<base>, edited: 3 changes"), as data: the known
    plan (a preset, a plan the user set) its edits count from, and how many. It travels with the plan
    (the plan file), so that an Inspector reading the plan back counts on without parsing the name."""

    base: str
    edits: int

    @classmethod
    def from_obj(cls, obj) -> "Edited":
        if (not isinstance(obj, dict) or set(obj) != set(EDITED_FIELDS) or not isinstance(obj["base"], str)
                or not isinstance(obj["edits"], int) or isinstance(obj["edits"], bool) or obj["edits"] < 0):
            raise ValueError("plan JSON: field 'edited' must be an object with 'base' (the name the edits count "
                             f"from) and 'edits' (how many, >= 0), got {obj!r}")
        return cls(obj["base"], obj["edits"])


def _prefetch(prefetch) -> tuple:
    """``{module: {"forward": [...], "backward": [...]}}`` -> sorted ((module, direction, targets), ...)."""
    if isinstance(prefetch, tuple):
        return prefetch
    out = []
    for module, by_direction in dict(prefetch or {}).items():
        for direction, targets in dict(by_direction).items():
            if direction not in PREFETCH_DIRECTIONS:
                raise ValueError(f"prefetch[{module!r}]: direction {direction!r} is not one of {PREFETCH_DIRECTIONS}")
            out.append((module, direction, tuple(targets)))
    return tuple(out)


@dataclass(frozen=True)
class Plan:
    """``units``: one entry per ``fully_shard`` call; ``ignored``: parameter FQNs kept out of FSDP;
    ``checkpoint``: modules wrapped in torch's ``checkpoint_wrapper`` before any ``fully_shard``
    call, as torchtitan does: a list of FQNs (full activation checkpointing) or a mapping
    FQN -> ``"full"`` | ``"selective"``; stored as ``Checkpoints`` (a tuple of the FQNs that also
    knows each one's policy)."""

    units: tuple[Unit, ...] = ()
    ignored: tuple[str, ...] = ()
    name: str = field(default="", compare=False)
    checkpoint: Checkpoints = Checkpoints()
    # set_modules_to_forward/backward_prefetch overrides: ((module, direction, (targets...)), ...).
    # Recorded and exported; the step-time model keeps torch's default prefetch (not modelled).
    prefetch: tuple = ()
    origin: Origin | None = field(default=None, compare=False)
    # what ``name`` counts when an Inspector named the plan after its edits (None otherwise)
    edited: Edited | None = field(default=None, compare=False, repr=False)
    # what the plan file it was read from says of the run ({"mesh": {...}, "training": {...}}, as
    # ``run.setup`` writes them); not part of the plan: edits and comparisons ignore it
    setup: dict = field(default_factory=dict, compare=False, repr=False, init=False)

    # module FQN or pattern -> style (shardviz.tp): parallelize_module on the mesh's "tensor" dim
    tensor_parallel: TensorParallel = TensorParallel()

    def __init__(self, units: Sequence = (), ignored: Iterable[str] = (), name: str = "",
                 checkpoint: Iterable[str] | dict = (), tensor_parallel=(), *, prefetch=(),
                 origin: Origin | None = None, edited: Edited | None = None):
        if isinstance(units, (str, Unit)):
            units = [units]
        parsed = tuple(Unit.from_obj(u, where=f"units[{i}]") for i, u in enumerate(units))
        if isinstance(ignored, str):
            ignored = [ignored]
        ignored = tuple(dict.fromkeys(ignored))  # keep order, drop repeats
        for name_ in ignored:
            if not isinstance(name_, str):
                raise ValueError(f"ignored entries must be parameter FQNs (str), got {name_!r}")
        seen: dict[str, int] = {}
        for i, unit in enumerate(parsed):
            for m in unit.modules:
                if m in seen:
                    raise ValueError(
                        f"module {m!r} is in two units (units[{seen[m]}] and units[{i}]); "
                        "a module can be passed to fully_shard once"
                    )
                seen[m] = i
        checkpoint = Checkpoints(checkpoint)
        object.__setattr__(self, "units", parsed)
        object.__setattr__(self, "ignored", ignored)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "checkpoint", checkpoint)
        object.__setattr__(self, "prefetch", _prefetch(prefetch))
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "edited", edited)
        object.__setattr__(self, "tensor_parallel", TensorParallel(tensor_parallel))
        object.__setattr__(self, "setup", {})

    # -- edits (each returns a new plan) ------------------------------------
    def _edited(self, units=None, ignored=None, checkpoint=None, tensor_parallel=None, name=None,
                edited: Edited | None = None) -> "Plan":
        """A new plan with these parts changed; the tensor-parallel entries, prefetch and origin carry over
        (edits start from a capture), and ``edited`` with the name it describes, unless renamed."""
        return Plan(self.units if units is None else units, self.ignored if ignored is None else ignored,
                    self.name if name is None else name,
                    self.checkpoint if checkpoint is None else checkpoint,
                    self.tensor_parallel if tensor_parallel is None else tensor_parallel,
                    prefetch=self.prefetch, origin=self.origin, edited=self.edited if name is None else edited)

    def renamed(self, name: str, edited: Edited | None = None) -> "Plan":
        """The same plan (tensor-parallel entries, prefetch and origin too) under another name, and
        what that name counts when it says the plan was edited (``Edited``)."""
        return self._edited(name=name, edited=edited)

    def with_setup(self, setup: dict) -> "Plan":
        """The same plan carrying ``setup`` (a plan file's "mesh" and "training", see ``from_json``)."""
        _check_setup(setup)
        plan = self._edited()
        object.__setattr__(plan, "setup", dict(setup))
        return plan

    def unit_of(self, fqn: str) -> Unit | None:
        for unit in self.units:
            if fqn in unit.modules:
                return unit
        return None

    def with_units(self, units) -> "Plan":
        """The same plan (ignored, checkpointed, name) with these calls instead."""
        return self._edited(units=units)

    def with_unit(self, unit) -> "Plan":
        unit = Unit.from_obj(unit)
        return self._edited(units=self.units + (unit,))

    def without_unit(self, fqn: str) -> "Plan":
        """Drop the call that contains module ``fqn`` (the whole group, if grouped)."""
        if self.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any unit of this plan")
        return self._edited(units=[u for u in self.units if fqn not in u.modules])

    def with_unit_options(self, fqn: str, **options) -> "Plan":
        unit = self.unit_of(fqn)
        if unit is None:
            raise ValueError(f"module {fqn!r} is not in any unit of this plan")
        new = replace(unit, **options)  # Unit.__init__ checks the new options
        return self._edited(units=[new if u is unit else u for u in self.units])

    def with_ignored(self, fqns: Iterable[str]) -> "Plan":
        return self._edited(ignored=self.ignored + tuple(fqns))

    def without_ignored(self, fqns: Iterable[str]) -> "Plan":
        drop = set(fqns)
        return self._edited(ignored=[f for f in self.ignored if f not in drop])

    def with_checkpoint(self, fqns: Iterable[str] | dict, policy: CheckpointPolicy | str = FULL) -> "Plan":
        """Also wrap these modules in ``checkpoint_wrapper`` with ``policy`` (a mapping gives each
        its own); a module already checkpointed takes the new policy."""
        added = Checkpoints(fqns if hasattr(fqns, "items") else {f: policy for f in ([fqns] if isinstance(fqns, str) else fqns)})
        merged = dict(self.checkpoint.items())
        merged.update(added.items())
        return self._edited(checkpoint=merged)

    def without_checkpoint(self, fqns: Iterable[str]) -> "Plan":
        drop = set(fqns)
        return self._edited(checkpoint={f: p for f, p in self.checkpoint.items() if f not in drop})

    def with_tensor_parallel(self, entries) -> "Plan":
        """These tensor-parallel entries (module FQN or ``layers.*`` pattern -> style) instead."""
        return self._edited(tensor_parallel=entries)

    # -- validation against a model ------------------------------------------
    def validate(self, model_or_tree) -> ModelTree:
        """Check every name against the model; raise ValueError naming the first bad entry."""
        tree = as_tree(model_or_tree)
        owner: dict[int, str] = {}
        for i, unit in enumerate(self.units):
            for m in unit.modules:
                if m not in tree.module_index:
                    hint = closest_hint(m, tree.module_index) if m not in tree.param_index else (
                        f" {m!r} is a parameter; units name modules (did you mean {m.rsplit('.', 1)[0]!r}?)"
                    )
                    raise ValueError(f"units[{i}]: no module named {m!r} in {tree.root_type}.{hint}")
                index = tree.module_index[m]
                if index in owner:
                    raise ValueError(
                        f"units[{i}]: module {m!r} is the same module as {owner[index]!r}, already in a unit; "
                        "a module can be passed to fully_shard once"
                    )
                owner[index] = m
        for name in self.checkpoint:
            if name not in tree.module_index:
                raise ValueError(f"checkpoint: no module named {name!r} in {tree.root_type}.{closest_hint(name, tree.module_index)}")
            if name == "":
                raise ValueError("checkpoint: the root module cannot be wrapped in checkpoint_wrapper; "
                                 "list its blocks (Plan.auto(model, checkpoint='blocks'))")
        inside = [(a, b) for a in self.checkpoint for b in self.checkpoint
                  if a != b and tree.is_inside(tree.module_index[a], tree.module_index[b])]
        if inside:
            a, b = inside[0]
            raise ValueError(f"checkpoint: module {a!r} is inside {b!r}, which is already checkpointed; list one of them")
        for module, direction, targets in self.prefetch:
            for name in (module, *targets):
                if name not in tree.module_index:
                    raise ValueError(f"prefetch ({direction}): no module named {name!r} in {tree.root_type}."
                                     f"{closest_hint(name, tree.module_index)}")
        for name in self.ignored:
            if name not in tree.param_index:
                hint = (
                    f" {name!r} is a module; list its parameters (e.g. {name + '.weight'!r})"
                    if name in tree.module_index
                    else closest_hint(name, tree.param_index)
                )
                raise ValueError(f"ignored: no parameter named {name!r} in {tree.root_type}.{hint}")
        return tree

    # -- JSON -------------------------------------------------------------------
    def to_dict(self, setup: dict | None = None) -> dict:
        """The plan as JSON data; ``setup`` ({"mesh": {...}, "training": {...}}, see ``run.setup``) is
        recorded with it, and a captured plan's prefetch and origin (version 2); with none of them the
        file is version 1, as before."""
        setup = {k: v for k, v in (setup or {}).items() if v is not None}
        _check_setup(setup)
        captured = {}
        if self.prefetch:
            captured["prefetch"] = {}
            for module, direction, targets in self.prefetch:
                captured["prefetch"].setdefault(module, {})[direction] = list(targets)
        if self.origin is not None:
            captured["origin"] = self.origin.to_obj()
        edited = {"edited": dict(zip(EDITED_FIELDS, self.edited))} if self.edited is not None else {}
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION if setup or captured or edited or self.tensor_parallel else 1,
            "name": self.name,
            **edited,
            "units": [u.to_obj() for u in self.units],
            "ignored": list(self.ignored),
            **({"checkpoint": self.checkpoint.to_obj()} if self.checkpoint else {}),
            **({"tensor_parallel": self.tensor_parallel.to_obj()} if self.tensor_parallel else {}),
            **captured,
            **setup,
        }

    def to_json(self, indent: int | None = 2, setup: dict | None = None) -> str:
        return json.dumps(self.to_dict(setup), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A plan file (versions 1 and 2) -> the plan; what a version-2 file records of the run is in
        ``plan.setup`` (plain JSON objects; ``run.setup`` turns them into a Mesh and a Training)."""
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"plan JSON is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("plan JSON must be an object with 'schema', 'version', 'units' and 'ignored'")
        if obj.get("schema") != SCHEMA:
            raise ValueError(f"plan JSON: field 'schema' must be {SCHEMA!r}, got {obj.get('schema')!r}")
        version = obj.get("version")
        if version not in READ_VERSIONS:
            raise ValueError(
                f"plan JSON: field 'version' is {version!r}; this shardviz reads versions 1 and 2"
            )
        known = {"schema", "version", "name", "units", "ignored", "checkpoint", "tensor_parallel"}
        if version >= 2:
            known |= set(SETUP_FIELDS) | set(CAPTURE_FIELDS) | {"edited"}
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"plan JSON: unknown field(s) {sorted(unknown)}")
        units, ignored = obj.get("units", []), obj.get("ignored", [])
        if not isinstance(units, list):
            raise ValueError("plan JSON: field 'units' must be a list")
        if not isinstance(ignored, list) or not all(isinstance(x, str) for x in ignored):
            raise ValueError("plan JSON: field 'ignored' must be a list of parameter FQNs")
        name = obj.get("name", "")
        if not isinstance(name, str):
            raise ValueError("plan JSON: field 'name' must be a string")
        checkpoint = obj.get("checkpoint", [])
        if not isinstance(checkpoint, (list, dict)) or not all(isinstance(x, str) for x in checkpoint):
            raise ValueError("plan JSON: field 'checkpoint' must be a list of module FQNs or an object "
                             f"module FQN -> policy, one of {CHECKPOINT_POLICIES}")
        try:
            checkpoint = Checkpoints(checkpoint)
        except ValueError as exc:
            raise ValueError(f"plan JSON: field {exc}") from None
        prefetch = obj.get("prefetch", {})
        if not isinstance(prefetch, dict) or not all(isinstance(v, dict) for v in prefetch.values()):
            raise ValueError("plan JSON: field 'prefetch' must be an object module FQN -> {direction: [module FQNs]}")
        origin = Origin.from_obj(obj["origin"]) if "origin" in obj else None
        tensor_parallel = obj.get("tensor_parallel", {})
        if not isinstance(tensor_parallel, dict):
            raise ValueError("plan JSON: field 'tensor_parallel' must be an object module FQN -> style")
        edited = Edited.from_obj(obj["edited"]) if "edited" in obj else None
        plan = cls(units, ignored, name, checkpoint, tensor_parallel, prefetch=prefetch, origin=origin, edited=edited)
        return plan.with_setup({k: obj[k] for k in SETUP_FIELDS if k in obj})

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        n_sel = len(self.checkpoint.selective)
        ckpt = (f", {len(self.checkpoint)} checkpointed" + (f" ({n_sel} selective)" if n_sel else "")
                if self.checkpoint else "")
        tp = f", {len(self.tensor_parallel)} tensor-parallel" if self.tensor_parallel else ""
        return f"Plan({label}{len(self.units)} units, {len(self.ignored)} ignored{ckpt}{tp})"


def _check_setup(setup: dict) -> None:
    """A plan file's "mesh" and "training": JSON objects (their fields are checked where they are read)."""
    for key, value in setup.items():
        if key not in SETUP_FIELDS:
            raise ValueError(f"plan JSON: unknown field {key!r}; a plan file records {SETUP_FIELDS}")
        if not isinstance(value, dict):
            raise ValueError(f"plan JSON: field {key!r} must be an object of {key} fields, got {value!r}")


def as_plan(plan) -> Plan:
    if plan is None:
        return Plan()
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str):
        return Plan.from_json(plan)
    if isinstance(plan, dict):
        return Plan.from_json(json.dumps(plan))
    raise ValueError(f"expected a shardviz Plan, got {type(plan).__name__}")
