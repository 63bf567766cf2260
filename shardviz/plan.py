"""What the user asks for: which modules get a ``fully_shard`` call, which parameters stay out.

A ``Plan`` is an immutable value: every edit returns a new plan, so an error
can never leave a half-changed plan behind, and the widget's undo is a list.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence, Union

from .tp import TensorParallel
from .tree import ModelTree, as_tree

SCHEMA = "shardviz.plan"
SCHEMA_VERSION = 1
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
LORA_LAYOUTS = ("sharded", "ignored", "separate")
CHECKPOINT_PRESETS = (None, "blocks", "every k", "selective")  # "every k": "every 2", "every 3", ...
CHECKPOINT_POLICIES = ("full", "selective")


def closest_hint(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """`` Closest existing names: 'a', 'b'.`` for an error message, or "" when nothing is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return f" Closest existing names: {', '.join(repr(m) for m in matches)}." if matches else ""



class Checkpoints(tuple):
    """The modules a plan checkpoints: a tuple of module FQNs (iterating, ``in``, ``len`` and
    comparing with a tuple of names work as before), each with its policy: ``"full"`` (torch's
    ``checkpoint_wrapper``) or ``"selective"`` (op-level selective checkpointing inside it).

    Built from a list/tuple of names (every one ``"full"``), a mapping name -> policy, or another
    ``Checkpoints``. Equal to a plain tuple of names only when every policy is ``"full"``."""

    policies: tuple[str, ...]

    def __new__(cls, entries=()):
        if isinstance(entries, Checkpoints):
            return entries
        if isinstance(entries, str):
            entries = [entries]
        pairs = entries.items() if hasattr(entries, "items") else ((name, "full") for name in entries)
        merged: dict[str, str] = {}
        for name, policy in pairs:
            if not isinstance(name, str):
                raise ValueError(f"checkpoint entries must be module FQNs (str), got {name!r}")
            if policy not in CHECKPOINT_POLICIES:
                raise ValueError(f"checkpoint[{name!r}]: policy {policy!r} is not one of {CHECKPOINT_POLICIES}")
            merged.setdefault(name, policy)  # the first entry of a repeated name wins, as before
        self = super().__new__(cls, merged)
        self.policies = tuple(merged.values())
        return self

    def policy(self, name: str) -> str:
        """``"full"`` or ``"selective"``; KeyError for a module that is not checkpointed."""
        for n, p in zip(self, self.policies):
            if n == name:
                return p
        raise KeyError(f"checkpoint: module {name!r} is not checkpointed")

    def items(self) -> list[tuple[str, str]]:
        return list(zip(self, self.policies))

    @property
    def selective(self) -> tuple[str, ...]:
        """The modules checkpointed with the selective policy."""
        return tuple(n for n, p in zip(self, self.policies) if p == "selective")

    def to_obj(self):
        """JSON: a list of names when every policy is "full" (schema v1 as before), else a mapping."""
        return dict(self.items()) if self.selective else list(self)

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
        return (Checkpoints, (dict(self.items()),))

    def __repr__(self):
        return repr(tuple(self)) if not self.selective else f"Checkpoints({dict(self.items())!r})"


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
        rar = reshard_after_forward
        if rar is not None and not isinstance(rar, (bool, int)):
            raise ValueError(f"reshard_after_forward of unit {list(modules)} must be None, a bool or an int, got {rar!r}")
        if not isinstance(rar, bool) and isinstance(rar, int) and rar < 1:
            raise ValueError(f"reshard_after_forward={rar} of unit {list(modules)}: an int is a group size, a divisor of the shard size")
        for key, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if value is not None and value not in DTYPE_NAMES:
                raise ValueError(f"{key}={value!r} of unit {list(modules)}: expected one of {DTYPE_NAMES}")
        object.__setattr__(self, "modules", modules)
        object.__setattr__(self, "reshard_after_forward", rar)
        object.__setattr__(self, "param_dtype", param_dtype)
        object.__setattr__(self, "reduce_dtype", reduce_dtype)
        object.__setattr__(self, "offload", bool(offload))

    @property
    def name(self) -> str:
        """A label for tables: the FQN, '<root>' for "", or '[a, b]' for a group."""
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
    tensor_parallel: TensorParallel = TensorParallel()

    def __init__(self, units: Sequence = (), ignored: Iterable[str] = (), name: str = "",
                 checkpoint: Iterable[str] | dict = (), tensor_parallel=()):
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
        # module FQN or pattern -> style (shardviz.tp): parallelize_module on the mesh's "tensor" dim
        object.__setattr__(self, "tensor_parallel", TensorParallel(tensor_parallel))

    # -- edits (each returns a new plan) ------------------------------------
    def unit_of(self, fqn: str) -> Unit | None:
        for unit in self.units:
            if fqn in unit.modules:
                return unit
        return None

    def with_units(self, units) -> "Plan":
        """The same plan (ignored, checkpointed, name) with these calls instead."""
        return Plan(units, self.ignored, self.name, self.checkpoint, self.tensor_parallel)

    def with_unit(self, unit) -> "Plan":
        unit = Unit.from_obj(unit)
        return Plan(self.units + (unit,), self.ignored, self.name, self.checkpoint, self.tensor_parallel)

    def without_unit(self, fqn: str) -> "Plan":
        """Drop the call that contains module ``fqn`` (the whole group, if grouped)."""
        if self.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any unit of this plan")
        return Plan([u for u in self.units if fqn not in u.modules], self.ignored, self.name, self.checkpoint, self.tensor_parallel)

    def with_unit_options(self, fqn: str, **options) -> "Plan":
        unit = self.unit_of(fqn)
        if unit is None:
            raise ValueError(f"module {fqn!r} is not in any unit of this plan")
        new = replace(unit, **options)  # Unit.__init__ checks the new options
        return Plan([new if u is unit else u for u in self.units], self.ignored, self.name, self.checkpoint, self.tensor_parallel)

    def with_ignored(self, fqns: Iterable[str]) -> "Plan":
        return Plan(self.units, self.ignored + tuple(fqns), self.name, self.checkpoint, self.tensor_parallel)

    def without_ignored(self, fqns: Iterable[str]) -> "Plan":
        drop = set(fqns)
        return Plan(self.units, [f for f in self.ignored if f not in drop], self.name, self.checkpoint, self.tensor_parallel)

    def with_checkpoint(self, fqns: Iterable[str] | dict, policy: str = "full") -> "Plan":
        """Also wrap these modules in ``checkpoint_wrapper`` with ``policy`` (a mapping gives each
        its own); a module already checkpointed takes the new policy."""
        added = Checkpoints(fqns if hasattr(fqns, "items") else {f: policy for f in ([fqns] if isinstance(fqns, str) else fqns)})
        merged = dict(self.checkpoint.items())
        merged.update(added.items())
        return Plan(self.units, self.ignored, self.name, merged, self.tensor_parallel)

    def without_checkpoint(self, fqns: Iterable[str]) -> "Plan":
        drop = set(fqns)
        return Plan(self.units, self.ignored, self.name, {f: p for f, p in self.checkpoint.items() if f not in drop},
                    self.tensor_parallel)

    def with_tensor_parallel(self, entries) -> "Plan":
        """These tensor-parallel entries (module FQN or ``layers.*`` pattern -> style) instead."""
        return Plan(self.units, self.ignored, self.name, self.checkpoint, entries)

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
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "name": self.name,
            "units": [u.to_obj() for u in self.units],
            "ignored": list(self.ignored),
            **({"checkpoint": self.checkpoint.to_obj()} if self.checkpoint else {}),
            **({"tensor_parallel": self.tensor_parallel.to_obj()} if self.tensor_parallel else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"plan JSON is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("plan JSON must be an object with 'schema', 'version', 'units' and 'ignored'")
        if obj.get("schema") != SCHEMA:
            raise ValueError(f"plan JSON: field 'schema' must be {SCHEMA!r}, got {obj.get('schema')!r}")
        version = obj.get("version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"plan JSON: field 'version' is {version!r}; this shardviz reads version {SCHEMA_VERSION}"
            )
        unknown = set(obj) - {"schema", "version", "name", "units", "ignored", "checkpoint", "tensor_parallel"}
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
        tensor_parallel = obj.get("tensor_parallel", {})
        if not isinstance(tensor_parallel, dict):
            raise ValueError("plan JSON: field 'tensor_parallel' must be an object module FQN -> style")
        return cls(units, ignored, name, checkpoint, tensor_parallel)

    # -- presets -------------------------------------------------------------
    @classmethod
    def auto(cls, model, lora: str = "sharded", checkpoint: str | None = None, tensor_parallel=None) -> "Plan":
        """Per-block preset: every repeated block, the embeddings, [final norm, lm_head], the root.

        ``lora``: "sharded" keeps LoRA in its block's call; "ignored" lists every LoRA
        parameter in ``ignored``; "separate" gives each LoRA adapter module its own call.
        ``checkpoint``: None; "blocks" wraps every block in ``checkpoint_wrapper``; "every k"
        (``"every 2"``, ...) every k-th block, as torchtitan's "selective layer" option does
        (its 1-based block counter: blocks k-1, 2k-1, ... counting from 0); "selective" every
        block with the "selective" policy (torchtitan's "selective op").
        ``tensor_parallel``: None; True: the model's own plan (what transformers'
        ``from_pretrained(tp_plan="auto")`` applies); "torchtitan": torchtitan's Llama-family plan
        (``shardviz.tp``); or a mapping module FQN -> style.
        """
        from .presets import auto_plan

        if lora not in LORA_LAYOUTS:
            raise ValueError(f"lora={lora!r}: expected one of {LORA_LAYOUTS}")
        checkpoint_preset(checkpoint)  # a bad value fails before the walk
        tree = as_tree(model)
        plan = auto_plan(tree, lora, checkpoint)
        if tensor_parallel is None or tensor_parallel is False:
            return plan
        from .tp_presets import preset

        return plan.with_tensor_parallel(preset(tree, tensor_parallel))

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        n_sel = len(self.checkpoint.selective)
        ckpt = (f", {len(self.checkpoint)} checkpointed" + (f" ({n_sel} selective)" if n_sel else "")
                if self.checkpoint else "")
        tp = f", {len(self.tensor_parallel)} tensor-parallel" if self.tensor_parallel else ""
        return f"Plan({label}{len(self.units)} units, {len(self.ignored)} ignored{ckpt}{tp})"


def checkpoint_preset(checkpoint: str | None) -> tuple[str, int] | None:
    """``Plan.auto``'s ``checkpoint`` -> (policy, k): every k-th block with that policy; None: none."""
    if checkpoint is None:
        return None
    expected = "expected None, 'blocks', 'every k' (k a positive int, e.g. 'every 2') or 'selective'"
    if not isinstance(checkpoint, str):
        raise ValueError(f"checkpoint={checkpoint!r}: {expected}")
    words = checkpoint.split()
    if checkpoint == "blocks":
        return "full", 1
    if checkpoint == "selective":
        return "selective", 1
    if len(words) == 2 and words[0] == "every":
        if not words[1].isdigit() or int(words[1]) < 1:
            raise ValueError(f"checkpoint={checkpoint!r}: k in 'every k' must be a positive int "
                             "(checkpoint every k-th block, torchtitan's selective layer option); "
                             f"got {words[1]!r}")
        return "full", int(words[1])
    raise ValueError(f"checkpoint={checkpoint!r}: {expected}")


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
