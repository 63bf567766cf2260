"""FLOPs of the step: counted by torch's ``FlopCounterMode`` in the pass that measures the
activations, attributed to the module running when each op ran, spliced over the blocks with the
levels, then summed per module and per ``fully_shard`` call (unit)."""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

from . import stop
from .opcost import accumulate, combined, difference, frozen
from .profile import Rows, Timeline

PHASES = ("forward", "backward", "recompute")

_OPENS = {"pre_fw": "forward", "pre_bw": "backward", "pre_rc": "recompute"}
_CLOSES = {"post_fw": "forward", "post_bw": "backward", "post_rc": "recompute"}


class ModuleFlops(NamedTuple):
    """FLOPs of one module's own operations (its submodules' are theirs) in one step: its forward,
    its backward, and the forward recomputed in backward when it is checkpointed."""

    forward: int = 0
    backward: int = 0
    recompute: int = 0


def _raw(formula):
    """One of torch's registered (shape-wrapped) formulas, for ``custom_mapping`` as it is."""
    def count(*args, **kwargs):
        return formula(*args, **kwargs)
    count._get_raw = True
    return count


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``_grouped_mm`` (MoE experts): torch has no formula. Every output row of every group is a
    dot product over the contracted size: 2 x a's elements x b's last size, for 2-D/3-D operands
    alike (2-D x 2-D, the weight gradient, contracts over the ragged token dimension)."""
    numel = 1
    for s in a_shape:
        numel *= s
    return 2 * numel * b_shape[-1]


def flop_formulas() -> dict:
    """``FlopCounterMode(custom_mapping=...)``: the ops torch's registry misses on the CPU the
    measurement runs on. The CPU flash attention counts as torch counts flash attention (the
    same formula: what a GPU runs); ``_grouped_mm`` by ``_grouped_mm_flop``."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    out = {
        aten._scaled_dot_product_flash_attention_for_cpu: _raw(flop_registry[aten._scaled_dot_product_flash_attention]),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            _raw(flop_registry[aten._scaled_dot_product_flash_attention_backward]),
    }
    if hasattr(aten, "_grouped_mm"):
        out[aten._grouped_mm] = _grouped_mm_flop
    return out


class _GlobalOnly:
    """In place of ``FlopCounterMode``'s module tracker: every count goes to "Global" only. The
    tracker's backward hooks hold gradients until all of a module's have arrived, which would
    change the memory measured in the same pass; the events attribute FLOPs to modules instead."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def flop_counter(run=None):
    """torch's ``FlopCounterMode`` with ``flop_formulas``, silent, counting the step's total;
    ``run(func, args, kwargs)``: how it runs the ops it does not decompose (``patches.balanced_routing``:
    the answers fake tensors cannot give, counted as torch would count them one mode below)."""
    counter = _cheap_counter_class()(display=False, custom_mapping=flop_formulas())
    counter.mod_tracker = _GlobalOnly()
    counter.run_op = run if run is not None else (lambda func, args, kwargs: func(*args, **kwargs))
    return counter


@functools.cache
def _cheap_counter_class():
    """``FlopCounterMode`` whose mode runs and counts an op it would not decompose without first
    trying to (a mode pushed and popped per op: a quarter of the counter's cost), as torch's
    ``_FlopCounterMode.__torch_dispatch__`` does next; every other op goes to torch's dispatch.
    Whether an op decomposes is ``OpOverload.decompose``'s own test, asked per op."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

    aten, device = torch.ops.aten, torch.ops.prim.device.default
    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    # the queries torch's mode answers NotImplemented (its own list)
    queries = frozenset({aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
                         aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default,
                         aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
                         aten.storage_offset.default, aten.sym_storage_offset.default, aten.numel.default,
                         aten.sym_numel.default, aten.dim.default, torch.ops.prim.layout.default})

    class CheapMode(_FlopCounterMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counter = self.counter
            if isinstance(func, torch._ops.OpOverload) and func not in queries and (
                    func in counter.flop_registry or func is device
                    or (implicit not in func.py_kernels and not has_kernel(func.name(), implicit))):
                kwargs = kwargs if kwargs else {}
                out = counter.run_op(func, args, kwargs)
                return counter._count_flops(func._overloadpacket, out, args, kwargs)
            return super().__torch_dispatch__(func, types, args, kwargs)

    class CheapCounter(FlopCounterMode):
        def __enter__(self):  # FlopCounterMode.__enter__ with the mode above
            self.flop_counts.clear()
            self.mod_tracker.__enter__()
            self.mode = CheapMode(self)
            self.mode.__enter__()
            return self

    return CheapCounter


def _spans(timeline: Timeline, ends: dict[str, int]) -> list[tuple[int, int, str, str]]:
    """(open, close, fqn, phase) of every module's forward, backward and recomputation, each close
    matched with the latest open of the same module and kind. Opens left unmatched are instants,
    not spans (the next block's first events, spliced at the end of a run with no change); a
    backward torch never closes (none of the module's inputs requires grad) ends with its subtree."""
    opened: dict[tuple[str, str], list[int]] = {}
    spans = []
    for j, (kind, key) in enumerate(zip(timeline.kinds, timeline.keys)):
        if kind in _OPENS:
            opened.setdefault((key, _OPENS[kind]), []).append(j)
        elif kind in _CLOSES and opened.get((key, _CLOSES[kind])):
            spans.append((opened[(key, _CLOSES[kind])].pop(), j, key, _CLOSES[kind]))
    closed = {span[2] for span in spans if span[3] == "backward"}
    for (fqn, phase), starts in opened.items():
        if phase == "backward" and starts and fqn not in closed:
            spans.append((starts[-1], ends.get(fqn, starts[-1]), fqn, phase))
    return [s for s in spans if s[1] > s[0]]  # an instant holds no operation


def _owned(timeline: Timeline, ends: dict[str, int]):
    """(fqn, phase, flops, cost) of every event that carries work: what ran since the previous event
    belongs to the innermost (shortest) span running then, in its phase (torch opens a module's
    backward and its parent's at one instant: the order they open in does not say which is inside)."""
    opens: dict[int, list] = {}
    closes: dict[int, list] = {}
    for span in _spans(timeline, ends):
        opens.setdefault(span[0], []).append(span)
        closes.setdefault(span[1], []).append(span)
    running: list[tuple] = []
    for j, (phase, flops, cost) in enumerate(zip(timeline.phases, timeline.flops, timeline.costs)):
        if not j & 4095:
            stop.check()  # every 4,096 events (about 20,000 at 70B): the next edit stops it here
        if flops or cost:
            inner = min(running, key=lambda span: span[1] - span[0], default=None)
            yield (*inner[2:], flops, cost) if inner else ("", "backward" if phase == "bw" else "forward", flops, cost)
        for span in closes.get(j, ()):
            running.remove(span)
        running.extend(opens.get(j, ()))


def module_sums(timeline: Timeline, ends: dict[str, int]) -> tuple[Rows, dict[str, tuple]]:
    """fqn -> its own FLOPs (``""``: the root, and whatever ran outside every module), and fqn ->
    (forward, backward, recompute) ``opcost`` costs of its own ops: both from one ``_owned`` walk."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    column = {phase: k for k, phase in enumerate(PHASES)}
    flops: dict[str, list] = {}
    costs: dict[str, list] = {}
    for fqn, phase, n, cost in _owned(timeline, ends):
        k = column[phase]
        if n:
            row = flops.get(fqn)
            if row is None:
                row = flops[fqn] = [0, 0, 0]
            row[k] += n
        if cost:
            row = costs.get(fqn)
            if row is None:
                row = costs[fqn] = [{}, {}, {}]
            accumulate(row[k], cost)
    same: dict[tuple, tuple] = {}  # one kept row per distinct row: the 80 blocks' modules repeat a few
    return (Rows(ModuleFlops, {fqn: same.setdefault(kept := tuple(row), kept) for fqn, row in flops.items()}),
            {fqn: same.setdefault(kept := _frozen_row(row), kept) for fqn, row in costs.items()})


def _frozen_row(costs) -> tuple:
    """A row of costs (forward, backward, recompute) as kept with a profile (``opcost.frozen``)."""
    return tuple(map(frozen, costs))


def unit_of(fqn: str, unit_modules: dict[str, int]) -> int | None:
    """The unit whose module is ``fqn`` or its nearest ancestor (None: outside every unit)."""
    parts = fqn.split(".") if fqn else []
    for k in range(len(parts), -1, -1):
        u = unit_modules.get(".".join(parts[:k]))
        if u is not None:
            return u
    return None


class FlopIndex(NamedTuple):
    """What ``unit_flops`` needs of a profile, whatever the plan: computed once per profile
    (``ActivationProfile.flop_index``) so that a change of plan only walks its units."""

    subtree: dict  # fqn -> [forward, backward, recompute] of the module and everything under it
    first_forward: dict  # fqn -> index in the timeline of its first forward
    length: int  # events in the timeline


def _subtrees(per_module, zero, add, keep=tuple) -> dict:
    """fqn -> (forward, backward, recompute) of the module and everything under it: its own sums
    plus its children's subtrees, deepest first. ``zero()``: an empty sum; ``add(a, b)``: a + b
    (costs: into ``a``, ``opcost.accumulate``); ``keep``: what each finished row is kept as (a tuple;
    costs frozen, ``_frozen_row``).

    Each sum is made once per distinct (own row, children's rows): the 80 blocks of 70B are a few
    variants repeated, so their 6,600 modules' sums are a few hundred (integer sums: exact)."""
    stop.check()  # before each loop (6,600 modules at 70B, tens of ms in all): the next edit stops it here
    own = dict(per_module.items())
    children: dict[str, list[str]] = {}
    links = []  # (parent, child), each module once
    for fqn in own:
        node = fqn
        while node not in children:  # up to the first module already seen: its ancestors are too
            children[node] = []
            if not node:
                break
            parent = node.rpartition(".")[0]
            links.append((parent, node))
            node = parent
    for parent, node in links:
        children[parent].append(node)
    stop.check()
    subtree: dict[str, tuple] = {}
    made: dict[tuple, tuple] = {}  # (own row, children's rows) -> the kept sum
    for fqn in sorted(children, key=lambda q: q.count(".") if q else -1, reverse=True):
        parts = (own.get(fqn), *(subtree[c] for c in children[fqn]))
        row = made.get(parts)
        if row is None:
            acc = [zero(), zero(), zero()]
            for part in parts:
                if part:
                    for k in range(3):
                        acc[k] = add(acc[k], part[k])
            row = made[parts] = keep(acc)
        subtree[fqn] = row
    return subtree  # kept with the profile: plain tuples (``profile.Timeline``)


def flop_index(profile) -> FlopIndex:
    first: dict[str, int] = {}
    tl = profile.timeline
    for j, (kind, key) in enumerate(zip(tl.kinds, tl.keys)):
        if kind == "pre_fw":
            first.setdefault(key, j)
    return FlopIndex(_subtrees(profile.module_flops, int, operator.add), first, len(profile.timeline))


def cost_subtrees(profile) -> dict:
    """``_subtrees`` of the profile's ``module_costs`` (``ActivationProfile.cost_index``)."""
    return _subtrees(profile.module_costs, dict, accumulate, _frozen_row)


FLOP_COLUMNS = ("unit", "forward_flops", "backward_flops", "recompute_flops")


def _unit_sums(subtree: dict, index: FlopIndex, units, zero, add, sub) -> list[tuple]:
    """(unit name or None, forward, backward, recompute) per unit in forward order, its modules'
    own sums (a nested unit's are its own); a last row with None for what is outside every unit.

    A unit module's subtree, less the subtrees of the unit modules nearest under it, is what
    ``unit_of`` gives that unit (integer sums: the same numbers as summing module by module)."""
    unit_modules = {m: i for i, u in enumerate(units) for m in u.modules}
    sums = [[zero, zero, zero] for _ in units]
    outside = list(subtree.get("", (zero, zero, zero)))
    for m, i in unit_modules.items():
        below = subtree.get(m, (zero, zero, zero))
        parent = unit_of(m.rpartition(".")[0], unit_modules) if m else None
        above = sums[parent] if parent is not None else outside
        for k, n in enumerate(below):
            sums[i][k] = add(sums[i][k], n)
            above[k] = sub(above[k], n)
    first = {}
    for m, i in unit_modules.items():
        j = index.first_forward.get(m)
        if j is not None and j < first.get(i, index.length):
            first[i] = j
    order = sorted(range(len(units)), key=lambda i: first.get(i, index.length))
    rows = [(units[i].name, *sums[i]) for i in order]
    if any(outside):
        rows.append((None, *outside))
    return rows


#: Sums kept per profile (``_kept_sums``); an Inspector session makes a new plan at every edit.
KEPT_SUMS = 64


def _kept_sums(profile, units, what: str) -> list[tuple]:
    """``_unit_sums`` of the profile's FLOPs (``what`` "flops") or op costs ("costs") per unit, kept
    with the profile: they read only the units' names and modules, so the plans with the same calls
    (a search's HSDP splits, reshard and offload options of one layout) share one sum."""
    key = (what, tuple((u.name, tuple(u.modules)) for u in units))
    kept = profile.unit_sums
    rows = kept.get(key)
    if rows is None:
        index = profile.flop_index
        rows = (_unit_sums(index.subtree, index, units, 0, lambda a, b: a + b, lambda a, b: a - b) if what == "flops"
                else [(r[0], *_frozen_row(r[1:])) for r in
                      _unit_sums(profile.cost_index, index, units, None, combined, difference)])
        if len(kept) >= KEPT_SUMS:
            kept.clear()
        kept[key] = rows
    return rows


def unit_flops(profile, units) -> list[dict]:
    """One row per unit (``sv.Unit``s: ``name``, ``modules``) in forward order, its modules' own
    FLOPs summed (a nested unit's are its own): unit, forward_flops, backward_flops,
    recompute_flops; a last row with unit None for FLOPs outside every unit, if any."""
    return [dict(zip(FLOP_COLUMNS, r)) for r in _kept_sums(profile, units, "flops")]


def op_costs_per_call(profile, units) -> dict:
    """unit name (None: outside every unit) -> {"forward", "backward", "recompute"} ``opcost``
    costs of its modules' own ops, as ``unit_flops`` sums FLOPs."""
    return {r[0]: dict(zip(PHASES, r[1:])) for r in _kept_sums(profile, units, "costs")}
