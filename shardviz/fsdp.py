"""The FSDP2 rules, in one place: what each ``fully_shard`` call owns and what each rank holds.

Every rule names the torch source it mirrors (torch 2.13, ``torch/distributed/fsdp/_fully_shard``):

- ownership (``_fsdp_init._get_managed_modules``): a call's DFS stops at modules that
  already carry FSDP state, so with calls applied bottom-up a module belongs to the
  call of its nearest enclosing unit module, and the parent call takes every leftover;
- ``ignored_params`` (``_get_managed_states``): never sharded, never reduced;
- sharding (``_fsdp_param.FSDPParam._init_sharded_param``): ``torch.chunk(param, S, dim=0)``
  padded to ``ceil(dim0 / S)`` rows on every rank; on HSDP the shard coordinate is the
  rank's index along the last mesh dim;
- refusals: 0-dim parameters (``_verify_managed_param``), a parameter managed by two
  groups (``FSDPState._lazy_init``, torch >= 2.13), trainable parameters of mixed dtype in
  one group (``FSDPParamGroup``: "FSDP expects uniform original parameter dtype"), a
  grouped call that ends up as a root (``_lazy_init``: "requires a single root module"), a
  ModuleList/ModuleDict without forward as a call (``_fsdp_init._validate_module``), a
  non-contiguous parameter (``FSDPParam._init_sharded_param``).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .finding import Finding, PlanError
from .plan import Plan, Unit, closest_hint
from .run.mesh import Mesh
from .model.tree import ModelTree, children_with_params, tree_index

# ---------------------------------------------------------------------------
# Release-by-release API facts (checked against torch's sources and PRs named below)
# ---------------------------------------------------------------------------
def parse_version(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if not match:
        raise ValueError(f"torch version {version!r}: expected something like '2.6' or '2.13.0'")
    return int(match.group(1)), int(match.group(2))


#: The first release of FSDP2 (``torch.distributed._composable.fsdp.fully_shard``).
MIN_TORCH = (2, 4)
#: ``fully_shard([a, b])`` as one group (PR 130949).
GROUPED_CALL = (2, 5)
#: ``torch.distributed.tensor`` public (2.4: ``torch.distributed._tensor``).
PUBLIC_DTENSOR = (2, 5)
#: ``torch.distributed.fsdp.fully_shard``, the public path (PR 141868).
PUBLIC_FSDP = (2, 6)
#: ``ignored_params`` (PR 146631); earlier releases raise TypeError.
IGNORED_PARAMS = (2, 7)

FSDP_PATHS = {MIN_TORCH: "torch.distributed._composable.fsdp", PUBLIC_FSDP: "torch.distributed.fsdp"}
DTENSOR_PATHS = {MIN_TORCH: "torch.distributed._tensor", PUBLIC_DTENSOR: "torch.distributed.tensor"}


def _path_for(paths: dict, version) -> str:
    release = parse_version(version)
    return paths[max(r for r in paths if r <= release)] if release >= MIN_TORCH else paths[MIN_TORCH]


def fully_shard_module_path(version) -> str:
    """Where ``fully_shard`` lives: the public path arrived in 2.6 (PR 141868)."""
    return _path_for(FSDP_PATHS, version)


def dtensor_module_path(version) -> str:
    """Where ``DTensor`` lives: ``torch.distributed.tensor`` from 2.5."""
    return _path_for(DTENSOR_PATHS, version)


def supports_ignored_params(version) -> bool:
    """``ignored_params`` arrived in 2.7 (PR 146631); earlier releases raise TypeError."""
    return parse_version(version) >= IGNORED_PARAMS


def supports_grouped_call(version) -> bool:
    """``fully_shard([a, b])`` as one group arrived in 2.5 (PR 130949)."""
    return parse_version(version) >= GROUPED_CALL


def release_label(release: tuple[int, int]) -> str:
    """(2, 6) -> "2.6"."""
    return f"{release[0]}.{release[1]}"


def effective_reshard_after_forward(unit: Unit, is_root: bool):
    """None means True for non-roots and False for the root (torch >= 2.8, ``_lazy_init``)."""
    if unit.reshard_after_forward is None:
        return not is_root
    return unit.reshard_after_forward


# ---------------------------------------------------------------------------
# Sharding arithmetic (``FSDPParam._init_sharded_param``)
# ---------------------------------------------------------------------------
def shard_rows(dim0: int, shard: int) -> int:
    """Rows of the padded shard every rank allocates: ceil(dim0 / shard)."""
    return -(-dim0 // shard)


def local_rows(dim0: int, shard: int, coord: int) -> int:
    """Rows ``torch.chunk(param, shard, dim=0)`` gives shard coordinate ``coord`` (0 past the last chunk)."""
    rows = shard_rows(dim0, shard)
    return max(0, min(rows, dim0 - coord * rows))


def local_rows_table(dim0, shard: int):
    """``local_rows`` for many parameters and every coordinate at once: ``rows[i, c]`` (numpy)."""
    dim0 = np.asarray(dim0, dtype=np.int64)
    rows = shard_rows(dim0, shard)
    coords = np.arange(shard, dtype=np.int64)
    return np.clip(dim0[:, None] - coords[None, :] * rows[:, None], 0, rows[:, None])


def padded_shard_numel(dim0, row_numel, shard):
    """Elements of the padded shard every rank allocates: ``ceil(dim0 / shard) * row_numel``.

    Works element-wise on numpy arrays too (the cost model and the widget price many parameters at once)."""
    return shard_rows(dim0, shard) * row_numel


# ---------------------------------------------------------------------------
# The layout of one plan on one model
# ---------------------------------------------------------------------------
@dataclass
class UnitLayout:
    index: int  # position in plan.units
    unit: Unit
    modules: tuple[int, ...]  # tree module indices
    params: list[int] = field(default_factory=list)  # sharded parameters this call manages
    order: int = 0  # position in bottom-up application order
    is_root: bool = False  # no enclosing unit: lazy init makes it a root
    reshard_after_forward: bool | int = True


class Layout:
    """Which call owns each parameter and what each rank holds, for one (tree, plan, mesh).

    Built in three steps: which call each module belongs to, which call manages each parameter,
    then every refusal of torch (``REFUSALS``, SV001-SV008) read off that ownership (``errors``)."""

    STATUS = ("sharded", "ignored", "unmanaged")

    def __init__(self, tree: ModelTree, plan: Plan, mesh: Mesh):
        self.tree, self.plan, self.mesh = tree, plan, mesh
        plan.validate(tree)
        self._assign_modules()
        self._assign_params()
        for ul in self.units:
            ul.reshard_after_forward = resolved_reshard(effective_reshard_after_forward(ul.unit, ul.is_root), mesh.shard)

    @cached_property
    def errors(self) -> list[Finding]:
        """Every refusal of torch (``REFUSALS``), found on first read: the Inspector draws memory and
        traffic after a change of plan before it checks the plan (on its worker)."""
        return [f for refusal in REFUSALS for f in refusal(self)]

    def _assign_modules(self) -> None:
        """Which unit each module opens, then the nearest enclosing unit: each unit module's
        subtree (a preorder slice), the outer ones first, so that the nearest one wins."""
        tree, index = self.tree, tree_index(self.tree)
        self.units = [UnitLayout(i, u, tuple([tree.module_index[m] for m in u.modules]))
                      for i, u in enumerate(self.plan.units)]
        modules = np.array([m for ul in self.units for m in ul.modules], dtype=np.int64)  # every call's modules
        opener = np.repeat(np.arange(len(self.units)), [len(ul.modules) for ul in self.units])
        own = np.full(tree.n_modules, -1, dtype=np.int64)
        own[modules] = opener
        owner = np.full(tree.n_modules, -1, dtype=np.int64)
        opened = np.nonzero(own >= 0)[0]
        opened = opened[np.argsort(index.depth[opened], kind="stable")]
        # as Python ints: a numpy scalar read per module costs more than the slice it fills
        for m, end, unit in zip(opened.tolist(), index.subtree_end[opened].tolist(), own[opened].tolist()):
            owner[m:end] = unit
        self._owner, self._own = owner, own
        self._order_units(modules, opener)

    @cached_property
    def module_unit(self) -> list[int]:
        """Per module: the call whose subtree holds it most closely (-1: none), as a list."""
        return self._owner.tolist()

    def _assign_params(self) -> None:
        """Each parameter: ignored, managed by the first call that reaches it, or under none."""
        tree, index = self.tree, tree_index(self.tree)
        unit = np.full(len(tree.params), -1, dtype=np.int64)
        unit[index.single] = self._owner[index.single_owner]  # the common case: its module's call
        self.shared_calls: dict[int, list[int]] = {}  # parameter -> the several calls that reach it (SV001)
        for p in index.several_names:
            calls = self._calls_reaching(tree.params[p])
            unit[p] = calls[0] if calls else -1  # the first call to reach it manages it
            if len(calls) > 1:
                self.shared_calls[p] = calls
        self.would_be_unit = unit.copy()  # per parameter (numpy): the call an ignored parameter sits in
        self._ignored = sorted(tree.param_indices(self.plan.ignored))
        for p in self._ignored:
            self.shared_calls.pop(p, None)
        unit[self._ignored] = -1
        self.param_unit_array = unit  # per parameter (numpy): the call that manages it (-1: none)
        self.sharded = unit >= 0  # per parameter, as a numpy mask: param_status == "sharded"
        sharded = np.nonzero(self.sharded)[0]
        by_unit = sharded[np.argsort(unit[sharded], kind="stable")]  # each call's parameters in tree order
        starts = np.searchsorted(unit[by_unit], np.arange(len(self.units) + 1)).tolist()
        by_unit = by_unit.tolist()  # sliced per call: one conversion, not one per call
        for ul in self.units:
            ul.params = by_unit[starts[ul.index]:starts[ul.index + 1]]

    @cached_property
    def param_unit(self) -> list[int]:
        """Per parameter: the call that manages it (-1: none), as a list (the tables read it one by one)."""
        return self.param_unit_array.tolist()

    @cached_property
    def status_code(self) -> np.ndarray:
        """Per parameter (numpy): its ``STATUS`` position (0 sharded, 1 ignored, 2 unmanaged)."""
        status = np.where(self.sharded, 0, 2)
        status[self._ignored] = 1
        return status

    @cached_property
    def param_status(self) -> list[str]:
        """Per parameter: "sharded", "ignored" or "unmanaged" (``STATUS``)."""
        return np.array(self.STATUS, dtype=object)[self.status_code].tolist()

    def _calls_reaching(self, p) -> list[int]:
        """The calls whose DFS reaches parameter ``p``, in bottom-up order."""
        if len(p.fqns) == 1:
            unit = self.module_unit[p.owners[0]]
            return [unit] if unit >= 0 else []
        # tied, or under a module reached along several paths: every name's enclosing call
        return sorted({u for u in map(self.enclosing_unit, p.fqns) if u >= 0}, key=lambda u: self.units[u].order)

    def _order_units(self, modules: np.ndarray, opener: np.ndarray) -> None:
        """Bottom-up order: a call runs after every call nested inside it (torch requires it).
        ``modules``: every call's modules, ``opener``: the call of each."""
        index, n = tree_index(self.tree), len(self.units)
        parent = index.parent[modules]
        outer = np.where(parent >= 0, self._owner[parent], -1)  # the call around each call's module
        first = index.parent[[min(ul.modules) for ul in self.units]]
        self.outer_call = np.where(first >= 0, self._owner[first], -1).tolist()  # around its first (roots climbs it)
        nested = (outer >= 0) & (outer != opener)
        self.calls_with_nested = frozenset(outer[nested].tolist())
        for ul, inside in zip(self.units, np.bincount(opener[outer >= 0], minlength=n).tolist()):
            ul.is_root = not inside
        depth = np.zeros(n, dtype=np.int64)
        np.maximum.at(depth, opener, index.depth[modules])  # a call's deepest module
        # The deepest call first, then plan order: without a grouped call that order already puts
        # every call after the calls nested in it, and it is then the one Kahn's algorithm returns.
        order = np.lexsort((np.arange(n), -depth))
        place = np.argsort(order)
        if (place[outer[nested]] > place[opener[nested]]).all():
            order = order.tolist()
        else:
            order = self._kahn(depth.tolist(), set(zip(outer[nested].tolist(), opener[nested].tolist())))
        for position, u in enumerate(order):
            self.units[u].order = position
        self.order = order

    def _kahn(self, depth: list[int], edges: set[tuple[int, int]]) -> list[int]:
        """Kahn's algorithm over the (outer, nested) ``edges``; among ready calls the deepest goes
        first, then plan order."""
        waiting = [0] * len(depth)  # per call: the nested calls not yet applied
        dependents: list[list[int]] = [[] for _ in depth]
        for o, u in sorted(edges):
            waiting[o] += 1
            dependents[u].append(o)
        ready = [(-d, u) for u, d in enumerate(depth) if not waiting[u]]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, u = heapq.heappop(ready)
            order.append(u)
            for v in dependents[u]:
                waiting[v] -= 1
                if not waiting[v]:
                    heapq.heappush(ready, (-depth[v], v))
        if len(order) < len(depth):
            names = [ul.unit.name for ul in self.units if waiting[ul.index]]
            raise ValueError(f"units {names} cannot be applied bottom-up: a grouped unit has modules both inside "
                             "and outside another unit; split the group or move the other unit")
        return order

    # -- per parameter ------------------------------------------------------------
    def shard_shape(self, p: int) -> tuple[int, ...]:
        """The padded shard every rank allocates for a sharded parameter."""
        shape = self.tree.params[p].shape
        return (shard_rows(shape[0], self.mesh.shard),) + shape[1:]

    def padded_shard_numel(self, p: int) -> int:
        info = self.tree.params[p]
        return padded_shard_numel(info.shape[0], info.row_numel, self.mesh.shard) if info.shape else 1

    @cached_property
    def padded_numel(self) -> np.ndarray:
        """Per parameter (numpy): ``padded_shard_numel``, the padded shard every rank allocates when sharded."""
        index = tree_index(self.tree)
        return padded_shard_numel(index.dim0, index.row, self.mesh.shard)

    def local_shape(self, fqn: str, rank: int) -> tuple[int, ...]:
        """``p.to_local().shape`` on global ``rank`` (the full shape when FSDP does not shard it)."""
        if fqn not in self.tree.param_index:
            raise ValueError(f"no parameter named {fqn!r}.{closest_hint(fqn, self.tree.param_index)}")
        p = self.tree.param_index[fqn]
        _, coord = self.mesh.coords(rank)
        shape = self.tree.params[p].dequantized_shape or self.tree.params[p].shape  # a torchao NF4Tensor's own shape
        if self.param_status[p] != "sharded":
            return shape
        return (local_rows(shape[0], self.mesh.shard, coord),) + shape[1:]

    def alias_unit(self, fqn: str) -> int:
        """The call that reaches parameter name ``fqn`` through its own module (-1: none).

        For a tied parameter the aliases can differ: torch swaps in the sharded DTensor only on
        the modules of the call that manages it; another call makes a second DTensor (SV001) and
        a module under no call keeps the original, unsharded parameter (SV006).
        """
        p = self.tree.param_index[fqn]
        if self.param_status[p] != "sharded":
            return -1
        if len(self.tree.params[p].fqns) == 1:
            return self.module_unit[self.tree.module_index[fqn.rpartition(".")[0]]]
        return self.enclosing_unit(fqn)

    def enclosing_unit(self, fqn: str) -> int:
        """The nearest call around parameter name ``fqn`` along that name's own path (-1: none).

        A module reached along two paths has one index but two enclosing calls; walking the name's
        prefixes finds the one this path meets, as torch's DFS from each call does."""
        path = fqn.rpartition(".")[0]
        while True:
            unit = int(self._own[self.tree.module_index[path]])
            if unit >= 0:
                return unit
            if not path:
                return -1
            path = path.rpartition(".")[0]

    def raise_for_errors(self) -> None:
        if self.errors:
            raise PlanError(self.errors)

    @cached_property
    def unit_numbers(self) -> list[dict]:
        """Per call: parameter count, unsharded and padded-shard bytes (what one all-gather moves)."""
        index, n = tree_index(self.tree), len(self.units)
        sharded = np.nonzero(self.sharded)[0]
        unit = self.param_unit_array[sharded]

        def per_call(values) -> list[int]:  # integer sums by call (float64 holds them exactly below 2**53)
            return np.rint(np.bincount(unit, weights=values[sharded], minlength=n)).astype(np.int64).tolist()

        numel, shard_bytes = index.numel, self.padded_numel * index.itemsize
        columns = (np.bincount(unit, minlength=n).tolist(), per_call(numel), per_call(numel * index.trainable),
                   per_call(numel * index.itemsize), per_call(shard_bytes))
        return [{"n_params": c, "numel": e, "trainable_numel": t, "unsharded_bytes": b,
                 "padded_unsharded_bytes": s * self.mesh.shard, "padded_shard_bytes": s} for c, e, t, b, s in zip(*columns)]


# ---------------------------------------------------------------------------
# What torch refuses, read off a Layout's ownership (one function per refusal)
# ---------------------------------------------------------------------------
def reshard_group_ok(reshard, shard: int) -> bool:
    """An int ``reshard_after_forward`` is a group size to reshard to (``_get_post_forward_mesh_info``):
    a divisor of the shard size."""
    return isinstance(reshard, bool) or (reshard <= shard and shard % reshard == 0)


def resolved_reshard(reshard, shard: int):
    """The effective value as torch reads it: an int of 1 means False and the shard size means True;
    a refused int (SV005) is shown as True."""
    if isinstance(reshard, bool):
        return reshard
    if not reshard_group_ok(reshard, shard):
        return True
    return reshard == shard if reshard in (1, shard) else reshard


def _sharded_params(lay: Layout, among):
    """The sharded ones of the parameters ``among`` (indices, in tree order)."""
    return [lay.tree.params[p] for p in among if lay.sharded[p]]


def refuse_shared_across_calls(lay: Layout) -> list[Finding]:
    """SV001: a parameter reached by several calls, each making its own sharded copy."""
    out = []
    for index, calls in lay.shared_calls.items():
        p = lay.tree.params[index]
        names = [lay.units[u].unit.name for u in calls]
        # One module reached along two paths: the second call finds the first call's DTensor.
        rooted = any("" in u.unit.modules for u in lay.units)  # lazy init sees every group: 2.13 checks them
        when = ("torch raises RuntimeError at the second fully_shard call ('Cannot concatenate overlapping meshes')"
                if len(p.owners) == 1 else "torch >= 2.13 raises ValueError at the first forward" if rooted else
                "with no root call torch raises nothing: a step runs and the copies train apart (seen on 2.13)")
        out.append(Finding(
            "SV001", "error",
            f"parameter {p.fqn!r} (also {', '.join(p.fqns[1:]) or 'reached through a shared module'}) "
            f"is managed by {len(calls)} fully_shard calls: {', '.join(names)}; each call makes its own "
            f"sharded copy, so the tie is broken; {when}",
            p.fqns,
            f"put the modules that share it in one grouped unit, e.g. {[lay.units[u].unit.modules[0] for u in calls]}",
        ))
    return out


def refuse_scalars(lay: Layout) -> list[Finding]:
    """SV002: a 0-dim parameter cannot be sharded on dim 0 (``_verify_managed_param``)."""
    return [Finding(
        "SV002", "error",
        f"parameter {p.fqn!r} is a scalar (0-dim); fully_shard raises ValueError: it cannot be sharded on dim 0",
        p.fqns, "reshape it to a 1-D tensor of one element, or list it in the plan's ignored parameters",
    ) for p in _sharded_params(lay, tree_index(lay.tree).scalars)]


def refuse_loose_aliases(lay: Layout) -> list[Finding]:
    """SV006: a tied parameter sharded by one call while one of its names is under no call."""
    out = []
    for p in _sharded_params(lay, tree_index(lay.tree).several_names):
        loose = [f for f in p.fqns if lay.alias_unit(f) < 0]
        if loose:
            out.append(Finding(
                "SV006", "error",
                f"tied parameter {p.fqn!r} is sharded by {lay.units[lay.param_unit[p.index]].unit.name} but its alias "
                f"{', '.join(repr(f) for f in loose)} is under no fully_shard call: that module keeps the "
                "original unsharded tensor and the tie is broken",
                p.fqns, "add the root module \"\" as a unit, or group the modules that share it",
            ))
    return out


def refuse_non_contiguous(lay: Layout) -> list[Finding]:
    """SV008: ``FSDPParam._init_sharded_param`` refuses non-contiguous parameters."""
    return [Finding(
        "SV008", "error",
        f"parameter {p.fqn!r} {p.shape} is not contiguous (a transposed or strided view); fully_shard "
        "raises NotImplementedError: FSDP does not support non-contiguous parameters",
        p.fqns, "make it contiguous before fully_shard (module.x = nn.Parameter(module.x.contiguous())), "
        "or list it in the plan's ignored parameters",
    ) for p in _sharded_params(lay, tree_index(lay.tree).non_contiguous)]


def refuse_bare_containers(lay: Layout) -> list[Finding]:
    """SV007: a ModuleList/ModuleDict without forward as a call (``_fsdp_init._validate_module``)."""
    tree, out = lay.tree, []
    for ul in lay.units:
        module = tree.modules[ul.modules[0]]
        if ul.unit.is_grouped or not module.bare_container:
            continue
        children = [tree.modules[c].fqn for c in children_with_params(tree, module.index)]
        shown = ", ".join(repr(c) for c in children[:4]) + (", ..." if len(children) > 4 else "")
        out.append(Finding(
            "SV007", "error",
            f"module {ul.unit.name!r} is a {module.type_name} without forward; fully_shard raises "
            f"ValueError: it does not support containers that do not implement forward",
            ul.unit.modules,
            f"give each of its children that hold parameters its own unit ({shown})" if children else
            "drop the unit: nothing under it holds a parameter",
        ))
    return out


def refuse_mixed_dtypes(lay: Layout) -> list[Finding]:
    """SV003: trainable parameters of one group must share one original dtype (``FSDPParamGroup``)."""
    tree, index, out = lay.tree, tree_index(lay.tree), []
    if index.trained_dtypes < 2:  # the whole tree trains one dtype: no call can mix two
        return out
    trainable = lay.sharded & index.trainable
    has_dtype = np.zeros((len(lay.units), len(index.dtypes)), dtype=bool)  # per call: the dtypes it trains
    has_dtype[lay.param_unit_array[trainable], index.dtype_code[trainable]] = True
    for ul in (lay.units[u] for u in np.nonzero(has_dtype.sum(axis=1) > 1)[0].tolist()):
        trainable = [tree.params[p] for p in ul.params if tree.params[p].requires_grad]
        dtypes = {p.dtype for p in trainable}
        out.append(Finding(
            "SV003", "error",
            f"call {ul.unit.name} manages trainable parameters of dtypes "
            f"{sorted(str(d).replace('torch.', '') for d in dtypes)}; FSDP expects one original dtype "
            "per group (AssertionError at the first forward)",
            [p.fqn for p in trainable][:20],
            "cast them to one dtype before fully_shard, give each dtype its own unit, or list the "
            "trainable parameters of the other dtypes as ignored",
        ))
    return out


def refuse_grouped_roots(lay: Layout) -> list[Finding]:
    """SV004: a grouped call with no enclosing unit becomes a root (``_lazy_init``: a single root module)."""
    return [Finding(
        "SV004", "error",
        f"grouped call {ul.unit.name} has no enclosing unit, so lazy init makes it a root; "
        "torch raises 'requires a single root module' at the first forward",
        ul.unit.modules, "add the root module \"\" as a unit (the usual last call)",
    ) for ul in lay.units if ul.is_root and ul.unit.is_grouped]


def refuse_bad_reshard_groups(lay: Layout) -> list[Finding]:
    """SV005: an int ``reshard_after_forward`` that does not divide the shard size."""
    out = []
    for ul in lay.units:
        reshard = effective_reshard_after_forward(ul.unit, ul.is_root)
        if not reshard_group_ok(reshard, lay.mesh.shard):
            out.append(Finding(
                "SV005", "error",
                f"call {ul.unit.name}: reshard_after_forward={reshard} is not a divisor of the shard size "
                f"{lay.mesh.shard}; fully_shard raises ValueError",
                ul.unit.modules, "use True, False or a divisor of the shard size such as the ranks per node",
            ))
    return out


#: Every refusal, in the order the findings list them.
REFUSALS = (
    refuse_shared_across_calls,
    refuse_scalars,
    refuse_loose_aliases,
    refuse_non_contiguous,
    refuse_bare_containers,
    refuse_mixed_dtypes,
    refuse_grouped_roots,
    refuse_bad_reshard_groups,
)
