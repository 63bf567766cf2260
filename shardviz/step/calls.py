"""One ``Call`` per ``fully_shard`` call, keyed by its index in ``plan.units`` (``OUTSIDE``: what
runs outside every call): where its hooks run in the step (positions in the module walk), which it
gets, its state after forward, and, when it manages parameters (one ``FSDPParamGroup``), its buffers
in bytes per rank. The one record the bytes model (``simulation``), the seconds model (``schedule``)
and the tables read.

And FSDP2's hook rules, one function each: which call is a root, which hooks a call gets, which call
a hook prefetches, which post-backwards the root's final callback runs. ``step_events``, the one walk
of the hooks that both models of the step fold (``step.simulation`` in bytes, ``schedule`` in
seconds), calls them; so do ``build_calls`` and ``step.timing``, which build their inputs. Each cites
the torch 2.13 code it mirrors (``torch/distributed/fsdp/_fully_shard``); the table is in
``docs/step-rules.md``. Positions are whatever orders the hooks of one pass (``Position`` in the
module walk)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Hashable, Iterable, NamedTuple, Sequence

import numpy as np

from ..run.training import itemsize
from .params import ShardedParams, WholeParams, code_names, dtype_code, n_dtype_codes, sum_per_unit
from .walk import Walk

#: The call index of what runs outside every ``fully_shard`` call (and of parameters under none).
OUTSIDE = -1


# ---------------------------------------------------------------------------
# FSDP2's hook rules, one function each
# ---------------------------------------------------------------------------
def roots(layout) -> list[int]:
    """The root call above each call of ``layout`` (itself for a root), by plan unit index.

    ``FSDPState._lazy_init``: the first state to run forward is a root and shares one
    ``FSDPCommContext`` with every state below it; a call under no other call is a root
    (``fsdp.Layout`` sets ``is_root``), and a plan without a call on the whole model has several."""
    outer = layout.outer_call  # per call, the call around its first module
    root_of = [-1] * len(layout.units)
    for ul in layout.units:
        chain, u = [], ul.index
        while root_of[u] < 0:
            chain.append(u)
            up = outer[u]
            if up < 0 or up == u:
                root_of[u] = u
                break
            u = up
        for c in chain:
            root_of[c] = root_of[u]
    return root_of


def enclosing_root(layout) -> int | None:
    """The one root call every call sits under (one communication context), on one module; None
    when the plan has several roots. Its forward runs first and ends last: the schedule runs its own
    compute (norm, LM head) after every other call's."""
    root_of = roots(layout)
    if not root_of or len(set(root_of)) != 1:
        return None
    root = root_of[0]
    return root if len(layout.units[root].modules) == 1 else None


def output_needs_grad(trainable_from, post_forward) -> bool:
    """The call gets a pre-backward hook: its output needs a gradient, which it does when a
    trainable parameter ran before the call ended (``FSDPState._post_forward`` ->
    ``_register_pre_backward_hook`` hooks only outputs that require grad). Without it the call
    computes nothing in backward and its post-backward waits for the final callback.
    The order modules run stands in for data flow."""
    return trainable_from < post_forward


def input_needs_grad(trainable_from, pre_forward) -> bool:
    """The call's post-backward runs in backward: its input needs a gradient, which it does when a
    trainable parameter ran before the call started (``FSDPParamGroup._register_post_backward_hook``
    hooks only inputs that require grad; else ``_root_post_backward_final_callback`` runs it)."""
    return trainable_from < pre_forward


def backward_prefetch_targets(post_forward_order: Sequence[Hashable], context_of=None) -> dict:
    """The call each call's pre-backward prefetches by default (none: absent): the one before it in
    its context's post-forward order (``FSDPParamGroup._backward_prefetch``:
    ``comm_ctx.post_forward_order[curr_index - 1]``, with ``_record_post_forward`` appending each
    call as its forward ends). ``context_of``: call -> its root context (None: one context). An
    explicit ``set_modules_to_backward_prefetch`` list replaces it (``FSDPState._pre_backward``)."""
    before, last_in_context = {}, {}
    for call in post_forward_order:
        context = context_of(call) if context_of is not None else None
        if context in last_in_context:
            before[call] = last_in_context[context]
        last_in_context[context] = call
    return before


def post_backward_in_backward(out_grad: bool, in_grad: bool) -> bool:
    """Autograd runs the call's post-backward during backward: only with both hooks registered
    (``output_needs_grad`` and ``input_needs_grad``)."""
    return out_grad and in_grad


def final_callback_order(registration_order: Iterable, done) -> list:
    """The calls whose post-backward the root's final callback runs, in the order it runs them:
    those backward did not reach (``done(call)`` False), in registration order
    (``FSDPState._root_post_backward_final_callback`` walks ``_state_ctx.all_states``, which
    ``_lazy_init`` fills from the root's ``named_modules()``)."""
    return [call for call in registration_order if not done(call)]


# ---------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------

class ParamState(Enum):
    """A call's parameters during the step (``FSDPParamGroup``'s sharded state)."""

    SHARDED = "sharded"
    UNSHARDED = "unsharded"
    POST_FORWARD_SHARD = "post-forward shard"  # int reshard_after_forward: a smaller shard kept after forward


class Edge(IntEnum):
    """What happens at a position of the module walk; at one index, in this order."""

    LEAVE = 0  # a module returns (its subtree is done)
    ENTER = 1  # a module starts
    GRADIENTS = 2  # (backward) the gradients of the parameters a module owns


class Position(NamedTuple):
    """A point of the forward walk over the modules in preorder; backward walks it in reverse."""

    index: int  # preorder index (for LEAVE: the end of the module's subtree)
    edge: Edge
    inner_first: int = 0  # LEAVE: minus the depth, so that the inner of two modules ending together leaves first

    @classmethod
    def enter(cls, walk: Walk, m: int) -> "Position":
        return cls(walk.enter[m], Edge.ENTER)

    @classmethod
    def leave(cls, walk: Walk, m: int) -> "Position":
        return cls(walk.end[m], Edge.LEAVE, -walk.depth[m])

    @classmethod
    def gradients(cls, walk: Walk, m: int) -> "Position":
        return cls(walk.enter[m], Edge.GRADIENTS)


class GradientsAt(NamedTuple):
    """Part of a call's gradients: those of the parameters one module owns."""

    module: int  # tree index of the owning module
    position: Position  # where autograd computes them
    unsharded: int  # unsharded gradient bytes (param dtype)
    whole: int  # gradients of trainable whole parameters
    # the modules whose backward runs after the call's previous gradients (in backward) and before these
    # are accumulated: the module itself and those forward ran between it and the call's next owner
    span: tuple[int, ...] = ()


class Call(NamedTuple):
    """One ``fully_shard`` call: where its hooks run, which of them torch registers
    (the hook rules above), the state its post-forward leaves its parameters in and, when it manages
    parameters (``managed``: one ``FSDPParamGroup``), its buffers in bytes per rank (zero
    otherwise: a call with no parameters has no group, no buffers, no collectives), and its seconds
    in one step once timed (``step.timing``): the one record of a call for the whole step.
    A NamedTuple built positionally (``_make``): one is built per call on every change of plan,
    several times faster than a frozen dataclass of as many fields."""

    unit: int  # its index in plan.units (OUTSIDE: what runs outside every call)
    first: int  # registration order (the final callback's): the tree index of its first module
    pre_forward: tuple  # its pre-forward's position (first module entered; any ordered value)
    post_forward: tuple  # its post-forward's position (last module left)
    out_grad: bool  # gets a pre-backward hook (output_needs_grad)
    in_grad: bool  # its post-backward runs in backward (input_needs_grad)
    root: Hashable  # the root call whose communication context it shares (roots)
    after_forward: ParamState = ParamState.SHARDED  # effective reshard_after_forward: True, an int, False
    reduces: bool = True  # its post-backward reduces gradients (it has trainable parameters)
    # -- its parameter group, in bytes per rank (the bytes model's)
    name: str = ""
    managed: bool = False  # it manages parameters (an FSDPParamGroup)
    reshard_after_forward: bool | int = True  # effective reshard_after_forward (an int: the post-forward group size)
    offload: bool = False
    gather: int = 0  # all-gather output, also the unsharded parameters (padded, param dtype)
    staged: int = 0  # all-gather input staged before the collective
    gather_dtype: str = ""  # one dtype, or uint8 when the inputs differ
    trainable: bool = False
    reduce_dtype: str = ""
    rs_input: int = 0  # reduce-scatter input (padded, reduce dtype, the whole group's)
    rs_output: int = 0  # reduce-scatter output: this rank's slice
    sharded_grads: int = 0  # padded, original dtype
    cast: bool = False  # reduce dtype differs from the original: the sharded gradients are a new buffer
    unsharded_grads: int = 0  # what autograd computes for the unsharded parameters (unpadded, param dtype)
    # kept from one micro-batch to the next without gradient sync: the unsharded gradients, cast to
    # the reduce dtype when it differs from theirs (FSDPParam.to_accumulated_grad_if_needed)
    accumulated_grads: int = 0
    converts_grads: bool = False  # that cast happens: the accumulated gradients are a second buffer
    whole_grads: int = 0  # gradients of trainable whole parameters under this call
    modules: tuple[int, ...] = ()  # its modules (tree indices)
    # per module that owns its parameters, when other calls are nested inside it (their backward
    # runs in between) or when activations are counted (each module's backward has its own
    # level); None: all at once
    grads_at: tuple[GradientsAt, ...] | None = None
    # -- its seconds in one step, per rank, one micro-batch (the seconds model's: ``step.timing`` sets
    # them, ``schedule.timed`` for rows made by hand); zero until timed
    forward_s: float = 0.0
    backward_s: float = 0.0
    recompute_s: float = 0.0
    all_gather_forward_s: float = 0.0
    all_gather_backward_s: float = 0.0
    reduce_scatter_s: float | None = None  # None: no reduce-scatter (no gradient)
    all_reduce_s: float | None = None  # None: no HSDP all-reduce
    h2d_s: float = 0.0  # CPU offload: the parameters' copy to the device before each all-gather
    d2h_s: float = 0.0  # and the gradient shard's to the host after the reduction


#: ``Call``'s fields past the hooks' (``call_hooks``): its buffers in bytes, then its seconds
HOOK_FIELDS = 9
SECONDS_FIELDS = ("forward_s", "backward_s", "recompute_s", "all_gather_forward_s", "all_gather_backward_s",
                  "reduce_scatter_s", "all_reduce_s", "h2d_s", "d2h_s")
BYTES_FIELDS = Call._fields[HOOK_FIELDS:len(Call._fields) - len(SECONDS_FIELDS)]
_UNTIMED = tuple(Call._field_defaults[f] for f in SECONDS_FIELDS)


def first_module(walk: Walk, indices) -> int:
    """The module whose start begins the call: the first one forward enters."""
    if len(indices) == 1:  # most calls wrap one module (and this runs per call on every change of plan)
        return indices[0]
    return min(indices, key=lambda m: walk.enter[m])


def last_module(walk: Walk, indices) -> int:
    """The module whose return ends the call: the last subtree to end, the outermost on a tie."""
    if len(indices) == 1:
        return indices[0]
    return max(indices, key=lambda m: (walk.end[m], -walk.depth[m]))


def first_trainable(arr, walk: Walk) -> int:
    """Where forward enters the first module holding a trainable parameter (past the end: none)."""
    owners = arr.owner[arr.trainable]
    return int(walk.enter_array[owners].min()) if owners.size else len(walk.enter)


def root_post_forwards(layout, walk: Walk) -> list[tuple[Position, int]]:
    """(post-forward position, plan unit index) of every root call: ``FSDPState._post_forward``
    of a root frees its context's last all-gather output."""
    return [(Position.leave(walk, last_module(walk, ul.modules)), ul.index) for ul in layout.units if ul.is_root]


def calls_with_nested_calls(layout) -> set[int]:
    """Plan unit indices of the calls with other calls nested inside them (``fsdp.Layout`` finds
    them while it orders the calls bottom-up)."""
    return set(layout.calls_with_nested)


def gradient_positions(arr, layout, modules, walk: Walk, sh: ShardedParams, whole: WholeParams,
                       every_call: bool) -> dict[int, tuple[GradientsAt, ...]]:
    """Per call, its gradients by the module that owns the parameters, where backward needs to see
    them appear one module at a time: in a call with other calls nested inside it (their backward
    runs in between), and in every call when activations are counted (``every_call``: each
    gradient appears while its module's backward runs, at that module's activation level)."""
    calls = None if every_call else calls_with_nested_calls(layout)
    if calls is not None and not calls:
        return {}
    # the calls wanted, by plan unit index; the last entry stands for OUTSIDE (a whole parameter under no call)
    wanted = np.zeros(len(layout.units) + 1, dtype=bool)
    wanted[:-1] = calls is None
    wanted[list(calls or ())] = True
    s_keep = sh.trainable & wanted[sh.unit]
    w_keep = whole.trainable & wanted[whole.unit]
    units = np.concatenate([sh.unit[s_keep], whole.unit[w_keep]])
    if not units.size:
        return {}
    owners = arr.owner[np.concatenate([sh.index[s_keep], whole.index[w_keep]])]
    n_s, n_w = int(s_keep.sum()), int(w_keep.sum())
    ug = np.concatenate([(sh.numel * sh.grad_itemsize)[s_keep], np.zeros(n_w, dtype=np.int64)])
    wg = np.concatenate([np.zeros(n_s, dtype=np.int64), whole.nbytes[w_keep]])
    # the distinct (call, owner) pairs, sorted by call then owner: one integer key each (np.unique
    # over rows is several times slower)
    n = len(modules)
    keys, inverse = np.unique(units * n + owners, return_inverse=True)
    inverse = inverse.reshape(-1)
    ug_at = sum_per_unit(inverse, ug, len(keys))
    wg_at = sum_per_unit(inverse, wg, len(keys))
    out: dict[int, list] = {}
    for u, module, a, b in zip((keys // n).tolist(), (keys % n).tolist(), ug_at.tolist(), wg_at.tolist()):
        out.setdefault(u, []).append((module, a, b))
    places = call_places(arr, walk)
    return {u: places.gradients(v) for u, v in out.items()}


def _with_spans(parts: list[tuple[int, int, int]], walk: Walk) -> tuple[GradientsAt, ...]:
    """Each part (owner, unsharded, whole bytes) as a ``GradientsAt`` with its ``span``: a module
    forward ran between two owners (GPT-2's activation, between ``c_fc`` and ``c_proj``) runs its
    backward after the later owner's gradients exist and before the earlier one's: its level
    counts with them."""
    owners = sorted(parts, key=lambda p: walk.enter[p[0]])
    out = []
    for (module, unsharded, whole), nxt in zip(owners, [p[0] for p in owners[1:]] + [None]):
        between = [] if nxt is None else [  # not the next owner's ancestors (their backward holds it)
            m for m in walk.by_position[walk.enter[module] + 1: walk.enter[nxt]] if walk.end[m] <= walk.enter[nxt]]
        out.append(GradientsAt(module, Position.gradients(walk, module), unsharded, whole, (module, *between)))
    return tuple(out)


@dataclass(frozen=True)
class _PerUnit:
    """Sums over each call's sharded parameters and its reduce-scatter (``Call``'s fields of
    the same names), as Python lists indexed by plan unit: read one call at a time, as ints."""

    n_params: list[int]
    gather: list[int]  # all-gather output bytes
    staged: list[int]  # all-gather input staged before the collective
    unsharded_grads: list[int]
    gather_dtype: list[str]  # one dtype, or uint8 when the inputs differ (foreach_all_gather)
    reduction: "_Reductions"


def _per_unit(sh: ShardedParams, policies, shard: int, reduces: np.ndarray) -> _PerUnit:
    """``reduces``: per call, it has trainable parameters (``Call.reduces``, read, not derived again)."""
    n_units, u = len(policies), sh.unit
    # all-gather inputs staged before the collective: the foreach copy into param dtype
    # (_get_param_all_gather_inputs), or the host-to-device copy of an offloaded shard
    staged = np.where(sh.offload, sh.padded * sh.itemsize + np.where(sh.cast, sh.padded * sh.pd_itemsize, 0),
                      np.where(sh.has_policy, sh.padded * sh.pd_itemsize, 0))
    tr = sh.trainable.astype(np.float64)
    n_codes = n_dtype_codes()

    def codes(dcodes, weights=None):  # per call and dtype code: how many of its parameters (weighted)
        return np.bincount(u * n_codes + dcodes, weights, minlength=n_units * n_codes).reshape(n_units, n_codes)

    names = code_names()
    gathered = codes(sh.pd_dtype) > 0
    one_dtype, first_dtype = (gathered.sum(axis=1) == 1).tolist(), gathered.argmax(axis=1).tolist()
    trained = codes(sh.dtype, tr)  # per call and dtype code: its trainable parameters
    unsharded_grads = sum_per_unit(u, sh.numel * sh.grad_itemsize * tr, n_units)
    reduction = _reductions(policies, shard, reduces, trained.argmax(axis=1),
                            codes(sh.grad_dtype, tr).argmax(axis=1), sum_per_unit(u, sh.padded * tr, n_units),
                            sum_per_unit(u, sh.numel * tr, n_units), unsharded_grads)
    return _PerUnit(
        n_params=np.bincount(u, minlength=n_units).tolist(),
        gather=(sum_per_unit(u, sh.padded * sh.pd_itemsize, n_units) * shard).tolist(),
        staged=sum_per_unit(u, staged, n_units).tolist(),
        unsharded_grads=unsharded_grads.tolist(),
        gather_dtype=[names[c] if one else "uint8" for one, c in zip(one_dtype, first_dtype)],
        reduction=reduction,
    )


@dataclass(frozen=True)
class _Reductions:
    """Each call's reduce-scatter (``Call``'s fields of the same names), lists indexed by plan
    unit; a call without trainable parameters reduces nothing: False, "" and zeros."""

    trainable: list[bool]
    reduce_dtype: list[str]
    rs_input: list[int]  # padded, reduce dtype, the whole group's
    rs_output: list[int]  # this rank's slice
    sharded_grads: list[int]  # padded, original dtype
    cast: list[bool]
    accumulated_grads: list[int]
    converts_grads: list[bool]


def _reductions(policies, shard: int, trainable, orig, grad_dtype, padded_trainable, trainable_numel,
                unsharded_grads) -> _Reductions:
    """Every call's reduce-scatter (``foreach_reduce``), from numpy arrays per call: whether it has
    trainable parameters, their original and gradient (param) dtype codes, their padded shard
    elements, elements and unsharded gradient bytes. One numpy expression over the calls, not a
    Python function per call (a change of plan prices every call)."""
    # FSDPParam.init_dtype_attrs drops reduce_dtype equal to param_dtype; foreach_reduce then
    # reduces in the gradient's dtype, the param dtype
    asked = np.array([dtype_code(p.reduce_dtype) if p.reduce_dtype and p.reduce_dtype != p.param_dtype else -1
                      for p in policies], dtype=np.int64)
    names = code_names()
    size = np.array([itemsize(n) for n in names], dtype=np.int64)  # per dtype code
    rd = np.where(asked >= 0, asked, grad_dtype)
    output = np.where(trainable, padded_trainable * size[rd], 0)
    converts = trainable & (rd != grad_dtype)
    accumulated = np.where(converts, trainable_numel * size[rd], np.where(trainable, unsharded_grads, 0))
    return _Reductions(
        trainable=trainable.tolist(), reduce_dtype=[names[c] if t else "" for t, c in zip(trainable.tolist(), rd.tolist())],
        rs_input=(output * shard).tolist(), rs_output=output.tolist(),
        sharded_grads=np.where(trainable, padded_trainable * size[orig], 0).tolist(),
        cast=(trainable & (rd != orig)).tolist(), accumulated_grads=accumulated.tolist(), converts_grads=converts.tolist())


def after_forward(reshard_after_forward: bool | int) -> ParamState:
    """The state a call's post-forward leaves its parameters in (``FSDPParamGroup.post_forward``):
    sharded (True), a post-forward shard (an int, the smaller group's size), unsharded (False)."""
    if reshard_after_forward is True:
        return ParamState.SHARDED
    return ParamState.UNSHARDED if reshard_after_forward is False else ParamState.POST_FORWARD_SHARD


class CallPlace(NamedTuple):
    """Where a call's hooks run in the walk, which depends on its modules alone (``Call``'s
    fields of the same names; ``first``: its first module in registration order)."""

    first: int
    pre_forward: Position
    post_forward: Position
    out_grad: bool
    in_grad: bool


class CallPlaces:
    """The ``CallPlace`` of every call's modules on one walk of one tree, and where each call's
    gradient parts appear (``gradients``), each computed on first use: they depend on the tree and
    the walk only, so every plan of one model shares them (a change of plan keeps most of its calls)."""

    def __init__(self, arr, walk: Walk):
        self.walk, self.trainable_from = walk, first_trainable(arr, walk)
        self._places: dict[tuple[int, ...], CallPlace] = {}
        self._gradients: dict[tuple, tuple[GradientsAt, ...]] = {}

    def gradients(self, parts: list[tuple[int, int, int]]) -> tuple[GradientsAt, ...]:
        """``_with_spans`` of a call's parts (owner module, unsharded and whole gradient bytes)."""
        key = tuple(parts)
        found = self._gradients.get(key)
        if found is None:
            found = self._gradients[key] = _with_spans(parts, self.walk)
        return found

    def of(self, modules: tuple[int, ...]) -> CallPlace:
        place = self._places.get(modules)
        if place is None:
            walk = self.walk
            first, last = first_module(walk, modules), last_module(walk, modules)
            place = self._places[modules] = CallPlace(
                min(modules), Position.enter(walk, first), Position.leave(walk, last),
                output_needs_grad(self.trainable_from, walk.end[last]),
                input_needs_grad(self.trainable_from, walk.enter[first]))
        return place


# walk -> CallPlaces: a walk belongs to one tree (``step.walk`` keeps one per tree and order)
_PLACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def call_places(arr, walk: Walk) -> CallPlaces:
    """The walk's ``CallPlaces`` (``arr``: the arrays of the walk's tree), kept while the walk lives."""
    places = _PLACES.get(walk)
    if places is None:
        places = _PLACES[walk] = CallPlaces(arr, walk)
    return places


def call_hooks(arr, layout, walk: Walk, sh: ShardedParams) -> list[tuple]:
    """Per call of ``layout``, in plan order (``sh``: its sharded parameters), ``Call``'s hook fields
    (the first ``HOOK_FIELDS``) as a tuple: where its hooks run, which it gets, its state after forward."""
    root_of = roots(layout)
    places = call_places(arr, walk)
    trains = np.zeros(len(layout.units), dtype=bool)  # a call that manages trainable parameters
    trains[sh.unit[sh.trainable]] = True
    trains = trains.tolist()
    return [(ul.index, *places.of(ul.modules), root_of[ul.index], after_forward(ul.reshard_after_forward),
             trains[ul.index]) for ul in layout.units]


def build_calls(arr, layout, modules, walk: Walk, policies, sh: ShardedParams, whole: WholeParams, shard: int,
                with_activations: bool) -> list[Call]:
    """One ``Call`` per call of ``layout``, in plan order: its hooks (``call_hooks``) and, for a
    call with parameters, its buffers (a call with no parameters has no group, no buffers, no
    collectives: ``Call``'s defaults past its name)."""
    hooks = call_hooks(arr, layout, walk, sh)
    sums = _per_unit(sh, policies, shard, np.array([h[HOOK_FIELDS - 1] for h in hooks], dtype=bool))
    r = sums.reduction
    grads_at = gradient_positions(arr, layout, modules, walk, sh, whole, every_call=with_activations)
    whole_grads = whole.grads_per_unit.tolist()
    kept = [ul for ul in layout.units if sums.n_params[ul.index]]
    units = [ul.index for ul in kept]
    # Call's byte fields as columns over the calls with parameters, each row built positionally by
    # ``_make`` (a NamedTuple built by keyword costs ~1 us a call; a change of plan builds one per call)
    columns = {
        "name": [ul.unit.name for ul in kept], "managed": [True] * len(kept),
        "reshard_after_forward": [ul.reshard_after_forward for ul in kept],
        "offload": [policies[i].offload for i in units],
        "gather": [sums.gather[i] for i in units], "staged": [sums.staged[i] for i in units],
        "gather_dtype": [sums.gather_dtype[i] for i in units], "trainable": [r.trainable[i] for i in units],
        "reduce_dtype": [r.reduce_dtype[i] for i in units], "rs_input": [r.rs_input[i] for i in units],
        "rs_output": [r.rs_output[i] for i in units], "sharded_grads": [r.sharded_grads[i] for i in units],
        "cast": [r.cast[i] for i in units], "unsharded_grads": [sums.unsharded_grads[i] for i in units],
        "accumulated_grads": [r.accumulated_grads[i] for i in units],
        "converts_grads": [r.converts_grads[i] for i in units], "whole_grads": [whole_grads[i] for i in units],
        "modules": [ul.modules for ul in kept], "grads_at": [grads_at.get(i) for i in units],
    }
    tails = dict(zip(units, zip(*(columns[f] for f in BYTES_FIELDS))))
    defaults = Call._field_defaults
    # a call without parameters: its name, settings and modules, no buffers (the defaults)
    empty = tuple(defaults[f] for f in BYTES_FIELDS[3:-2])
    return [Call._make(h + (tails[ul.index] if ul.index in tails else
                            (ul.unit.name, False, ul.reshard_after_forward, *empty, ul.modules, None)) + _UNTIMED)
            for h, ul in zip(hooks, layout.units)]
