"""Memory per rank and communication per step, from the layout, mirroring torch 2.13's FSDP2 buffers.

Every quantity names the torch code it mirrors (``torch/distributed/fsdp/_fully_shard``); the
formulas and their sources are written out in ``docs/cost-model.md``. Nothing here touches the
model: per-parameter numbers come from the ``ModelTree`` once (cached per tree, as numpy arrays),
then everything is summed per ``fully_shard`` call, so a widget toggle costs O(calls), not
O(parameters). Ranks differ only by their shard coordinate (later coordinates may hold fewer rows
of an unevenly sharded parameter, but the padded buffers are allocated everywhere); the per-rank
columns are computed for the ``shard`` coordinates at once and tiled over the replicas.

Vocabulary used in the tables:
- *sharded* parameters: managed by a ``fully_shard`` call (a padded shard on every rank);
- *whole* parameters: ignored (``ignored_params``) or unmanaged (under no call): every rank holds
  the full tensor, FSDP never all-gathers nor reduces them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .finding import Finding
from .plan import DTYPE_NAMES, Unit

# ---------------------------------------------------------------------------
# Training: optimizer and the policies fully_shard is called with
# ---------------------------------------------------------------------------
OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class Training:
    """How the model is trained; feeds the cost model and the policies passed to ``fully_shard``.

    optimizer: ``"adamw"`` / ``"adam"`` (2 states per trainable parameter: ``exp_avg``,
        ``exp_avg_sq``, plus a 0-dim float32 ``step`` tensor that torch keeps on the CPU),
        ``"sgd"`` (no state), ``"sgd_momentum"`` (1 state: ``momentum_buffer``), or an int:
        that many states per trainable parameter.
    optimizer_dtype: dtype of the states; None means each parameter's own dtype (torch's
        ``zeros_like(param)``). With FSDP the sharded parameters keep their original dtype under
        mixed precision, so the states do too.
    param_dtype, reduce_dtype: ``MixedPrecisionPolicy`` defaults for every call (a ``sv.Unit``
        option overrides them per call).
    offload: ``CPUOffloadPolicy`` for every call (a ``sv.Unit(offload=True)`` turns it on per call).
    sync_outside_fsdp: after backward, average the gradients of trainable parameters that FSDP
        leaves alone (ignored or unmanaged) over all ranks, one all-reduce per parameter. FSDP
        does not; without it every rank trains its own copy. The exported code does it.
    foreach: the optimizer's multi-tensor path (one temporary the size of all its states at
        once in ``step()``); None means torch's default: foreach for device tensors, the
        per-parameter loop for CPU tensors (offload).
    """

    optimizer: str | int = "adamw"
    optimizer_dtype: str | None = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    offload: bool = False
    sync_outside_fsdp: bool = True
    foreach: bool | None = None

    def __post_init__(self):
        opt = self.optimizer
        if isinstance(opt, bool) or not isinstance(opt, (str, int)):
            raise ValueError(f"Training.optimizer must be a name or an int, got {opt!r}")
        if isinstance(opt, str):
            key = opt.lower().replace("-", "_").replace(" ", "_")
            if key not in OPTIMIZERS:
                raise ValueError(f"Training.optimizer={opt!r}: expected one of {sorted(OPTIMIZERS)} or an int")
            object.__setattr__(self, "optimizer", key)
        elif opt < 0:
            raise ValueError(f"Training.optimizer={opt}: the number of states per parameter must be >= 0")
        for key in ("optimizer_dtype", "param_dtype", "reduce_dtype"):
            value = getattr(self, key)
            if value is not None:
                value = str(value).replace("torch.", "")
                if value not in DTYPE_NAMES:
                    raise ValueError(f"Training.{key}={getattr(self, key)!r}: expected one of {DTYPE_NAMES}")
                object.__setattr__(self, key, value)
        object.__setattr__(self, "offload", bool(self.offload))
        object.__setattr__(self, "sync_outside_fsdp", bool(self.sync_outside_fsdp))

    @property
    def n_states(self) -> int:
        """Optimizer state tensors per trainable parameter (Adam's ``step`` scalar not counted)."""
        return OPTIMIZERS[self.optimizer] if isinstance(self.optimizer, str) else int(self.optimizer)

    @property
    def step_scalars(self) -> bool:
        """Adam/AdamW keep a 0-dim float32 ``step`` per parameter on the CPU (not fused, not capturable)."""
        return self.optimizer in ("adam", "adamw")

    def unit_defaults(self, unit: Unit) -> Unit:
        """The unit with this training's default policies filled in where the unit sets none."""
        changes = {}
        if unit.param_dtype is None and self.param_dtype is not None:
            changes["param_dtype"] = self.param_dtype
        if unit.reduce_dtype is None and self.reduce_dtype is not None:
            changes["reduce_dtype"] = self.reduce_dtype
        if self.offload and not unit.offload:
            changes["offload"] = True
        if not changes:
            return unit
        return Unit(unit.modules, unit.reshard_after_forward,
                      changes.get("param_dtype", unit.param_dtype),
                      changes.get("reduce_dtype", unit.reduce_dtype),
                      changes.get("offload", unit.offload))


# ---------------------------------------------------------------------------
# Per-tree arrays (computed once per ModelTree, reused by every analysis of it)
# ---------------------------------------------------------------------------
_DTYPE_CODES: dict = {}


def _dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        _DTYPE_CODES[name] = len(_DTYPE_CODES)
    return _DTYPE_CODES[name]


def _code_name(code: int) -> str:
    for name, c in _DTYPE_CODES.items():
        if c == code:
            return name
    raise KeyError(code)


@dataclass
class _TreeArrays:
    numel: np.ndarray
    dim0: np.ndarray
    itemsize: np.ndarray
    dtype: np.ndarray  # dtype codes
    is_float: np.ndarray
    trainable: np.ndarray
    owner: np.ndarray  # preorder index of the first module that registers it
    buffer_bytes: int
    first_trainable: int  # preorder index of the first module holding a trainable parameter


_TREE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tree_arrays(tree) -> _TreeArrays:
    cached = _TREE_CACHE.get(tree)
    if cached is not None:
        return cached
    params = tree.params
    numel = np.array([p.numel for p in params], dtype=np.int64)
    dim0 = np.array([p.shape[0] if p.shape else 1 for p in params], dtype=np.int64)
    itemsize = np.array([p.itemsize for p in params], dtype=np.int64)
    dtype = np.array([_dtype_code(p.dtype) for p in params], dtype=np.int64)
    is_float = np.array([p.dtype.is_floating_point for p in params], dtype=bool)
    trainable = np.array([p.requires_grad for p in params], dtype=bool)
    owner = np.array([p.owners[0] if p.owners else 0 for p in params], dtype=np.int64)
    seen, buffers = set(), 0
    for m in tree.modules:
        if m.index not in seen:
            seen.add(m.index)
            buffers += m.buffer_bytes
    first = int(owner[trainable].min()) if trainable.any() else tree.n_modules
    arrays = _TreeArrays(numel, dim0, itemsize, dtype, is_float, trainable, owner, buffers, first)
    _TREE_CACHE[tree] = arrays
    return arrays


def _local_rows(dim0: np.ndarray, shard: int) -> np.ndarray:
    """rows[i, c]: rows of parameter i that ``torch.chunk`` gives shard coordinate c."""
    rows = -(-dim0 // shard)
    coords = np.arange(shard, dtype=np.int64)
    return np.clip(dim0[:, None] - coords[None, :] * rows[:, None], 0, rows[:, None])


def _per_coord_sum(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """sum_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c (grouped by dim0)."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    uniq, inverse = np.unique(dim0, return_inverse=True)
    weights = np.bincount(inverse, weights=row_bytes, minlength=uniq.size)
    return np.rint(weights @ _local_rows(uniq, shard)).astype(np.int64)


def _per_coord_max(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """max_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    pairs = np.unique(np.stack([dim0, row_bytes.astype(np.int64)], axis=1), axis=0)
    return (_local_rows(pairs[:, 0], shard) * pairs[:, 1:2]).max(axis=0)


# ---------------------------------------------------------------------------
# The cost model of one analysis
# ---------------------------------------------------------------------------
@dataclass
class _Group:
    """One fully_shard call with parameters: its FSDPParamGroup's buffers, in bytes."""

    unit: int
    name: str
    rar: bool | int
    offload: bool
    is_root: bool
    shard_bytes: int  # padded shards, original dtype (sharded params resident per rank)
    gather_bytes: int  # all-gather output = unsharded parameters (padded), param dtype
    gather_dtype: str
    copy_in_bytes: int  # all-gather input staged in param dtype (mixed precision) or copied to device (offload)
    trainable: bool
    reduce_dtype: str
    rs_bytes: int  # reduce-scatter input (padded, reduce dtype)
    ro_bytes: int  # reduce-scatter output (one padded shard, reduce dtype)
    grad_bytes: int  # sharded gradients (padded shard, original dtype)
    grad_cast: bool  # the reduce output is cast to the original dtype (a second buffer)
    ug_bytes: int  # unsharded gradients autograd computes (unpadded, param dtype)
    whole_grad_bytes: int = 0  # gradients of trainable ignored parameters inside this call
    whole_sync: list = field(default_factory=list)  # (count, bytes, dtype) of their all-reduces
    pre: tuple = ()
    post: tuple = ()
    first_module: int = 0
    out_grad: bool = True
    in_grad: bool = True


class CostModel:
    """Everything ``memory_table`` and ``comm_table`` need, computed once per analysis."""

    def __init__(self, analysis):
        self.analysis = analysis
        tree, lay, mesh, training = analysis.tree, analysis.layout, analysis.mesh, analysis.training
        self.training = training
        S, R = mesh.shard, mesh.replicate
        self.S, self.R = S, R
        arr = _tree_arrays(tree)
        n_units = len(lay.units)
        policies = [training.unit_defaults(ul.unit) for ul in lay.units]

        status_sharded = np.fromiter((s == "sharded" for s in lay.param_status), dtype=bool, count=arr.numel.size)
        punit = np.asarray(lay.param_unit, dtype=np.int64)
        sharded = status_sharded & (punit >= 0)
        whole = ~sharded

        # -- per-unit policy arrays ------------------------------------------------
        pd_code = np.array([_dtype_code(p.param_dtype) if p.param_dtype else -1 for p in policies] + [-1], dtype=np.int64)
        pd_size = np.array([_ITEMSIZE[p.param_dtype] if p.param_dtype else 0 for p in policies] + [0], dtype=np.int64)
        offload_u = np.array([p.offload for p in policies] + [False], dtype=bool)

        # -- sharded parameters: padded shard (FSDPParam._init_sharded_param) -------
        idx = np.nonzero(sharded)[0]
        u = punit[idx]
        numel, dim0, isz = arr.numel[idx], arr.dim0[idx], arr.itemsize[idx]
        rowsize = np.where(dim0 > 0, numel // np.maximum(dim0, 1), 0)
        padded = -(-dim0 // S) * rowsize
        # param dtype: MixedPrecisionPolicy.param_dtype unless it equals the original dtype or the
        # parameter is not floating point (FSDPParam.init_dtype_attrs)
        cast = (pd_code[u] >= 0) & arr.is_float[idx] & (pd_code[u] != arr.dtype[idx])
        pd_isz = np.where(cast, pd_size[u], isz)
        pd_dtype = np.where(cast, pd_code[u], arr.dtype[idx])
        train = arr.trainable[idx]
        mp_copy = (pd_code[u] >= 0) & ~offload_u[u]  # _get_param_all_gather_inputs: foreach copy when param_dtype is set

        def per_unit(weights, mask=None):
            w = weights if mask is None else np.where(mask, weights, 0)
            return np.bincount(u, weights=w, minlength=n_units)

        shard_bytes = per_unit(padded * isz)
        gather_bytes = per_unit(padded * pd_isz) * S
        copy_in = per_unit(padded * pd_isz, mp_copy) + per_unit(padded * (isz + np.where(cast, pd_isz, 0)), offload_u[u])
        trainable_count = per_unit(train.astype(np.float64))
        pad_train = per_unit(padded, train)
        ug = per_unit(numel * pd_isz, train)
        n_params = np.bincount(u, minlength=n_units)
        # dtypes of the all-gather inputs in each call: one dtype, or uint8 bytes (foreach_all_gather)
        ag_dtypes: dict[int, set] = {}
        # dtype of the trainable parameters (original) and their param dtype
        train_dtype: dict[int, tuple[int, int]] = {}
        if idx.size:
            pairs = np.unique(np.stack([u, pd_dtype], axis=1), axis=0)
            for uu, code in pairs:
                ag_dtypes.setdefault(int(uu), set()).add(int(code))
            tpairs = np.unique(np.stack([u[train], arr.dtype[idx][train], pd_dtype[train]], axis=1), axis=0) if train.any() else []
            for uu, orig, pdc in tpairs:
                train_dtype.setdefault(int(uu), (int(orig), int(pdc)))

        # -- whole parameters (ignored / unmanaged): every rank holds them -----------
        widx = np.nonzero(whole)[0]
        would = np.asarray(lay.would_be_unit, dtype=np.int64)[widx]
        w_bytes = arr.numel[widx] * arr.itemsize[widx]
        w_train = arr.trainable[widx]
        self.params_whole = int(w_bytes.sum())
        self.grads_whole = int(w_bytes[w_train].sum())
        self.buffers = arr.buffer_bytes

        # -- groups, in forward order --------------------------------------------------
        modules = tree.modules
        groups: list[_Group] = []
        whole_by_unit_bytes = np.bincount(np.where(would >= 0, would, n_units)[w_train], weights=w_bytes[w_train],
                                          minlength=n_units + 1) if widx.size else np.zeros(n_units + 1)
        for ul in lay.units:
            i = ul.index
            if n_params[i] == 0:
                continue
            pol = policies[i]
            codes = ag_dtypes.get(i, set())
            gdtype = _code_name(next(iter(codes))) if len(codes) == 1 else "uint8"
            has_train = trainable_count[i] > 0
            if has_train:
                orig_c, pd_c = train_dtype[i]
                # FSDPParam.init_dtype_attrs: reduce_dtype is dropped when it equals param_dtype;
                # foreach_reduce: reduce in reduce_dtype, else in the gradient's dtype (param dtype)
                rd = pol.reduce_dtype if (pol.reduce_dtype and pol.reduce_dtype != pol.param_dtype) else _code_name(pd_c)
                rd_size = _ITEMSIZE.get(rd, 4)
                orig_name = _code_name(orig_c)
                orig_size = _ITEMSIZE.get(orig_name, 4)
            else:
                rd, rd_size, orig_name, orig_size = "", 0, "", 0
            ro = int(round(pad_train[i])) * rd_size
            mods = [modules[m] for m in ul.modules]
            first = min(mods, key=lambda m: m.index)
            last = max(mods, key=lambda m: (m.subtree_end, -m.depth))
            groups.append(_Group(
                unit=i, name=ul.unit.name, rar=ul.reshard_after_forward, offload=pol.offload, is_root=ul.is_root,
                shard_bytes=int(round(shard_bytes[i])), gather_bytes=int(round(gather_bytes[i])), gather_dtype=gdtype,
                copy_in_bytes=int(round(copy_in[i])), trainable=bool(has_train), reduce_dtype=rd,
                rs_bytes=ro * S, ro_bytes=ro, grad_bytes=int(round(pad_train[i])) * orig_size,
                grad_cast=bool(has_train and rd != orig_name), ug_bytes=int(round(ug[i])),
                whole_grad_bytes=int(round(whole_by_unit_bytes[i])),
                pre=(first.index, 1, 0), post=(last.subtree_end, 0, -last.depth), first_module=first.index,
                # autograd: a call's output needs a gradient when a trainable parameter ran before it ends;
                # its input when one ran before it starts (FSDPState._register_pre_backward_hook,
                # FSDPParamGroup._register_post_backward_hook)
                out_grad=arr.first_trainable < last.subtree_end,
                in_grad=arr.first_trainable < first.index,
            ))
        self.groups = groups
        self.whole_unmanaged_grad_bytes = int(round(whole_by_unit_bytes[n_units])) if widx.size else 0

        # -- resident state per shard coordinate -----------------------------------------
        off = offload_u[u]
        dev = ~off
        self.params_sharded = int((padded * isz)[dev].sum())
        self.cpu_params = int((padded * isz)[off].sum())
        self.grads_sharded = int(sum(g.grad_bytes for g in groups if not g.offload))
        n_states, opt_dtype = training.n_states, training.optimizer_dtype
        s_isz = (np.full(idx.size, _ITEMSIZE[opt_dtype]) if opt_dtype else isz)
        row_state = rowsize * s_isz  # bytes of one state row
        t_dev = train & dev
        t_off = train & off
        # optimizer states: zeros_like(DTensor) -> the local (unpadded) rows of this coordinate
        self.opt_dev = n_states * _per_coord_sum(dim0[t_dev], row_state[t_dev], S)
        self.opt_cpu = n_states * _per_coord_sum(dim0[t_off], row_state[t_off], S)
        w_state = arr.numel[widx] * (_ITEMSIZE[opt_dtype] if opt_dtype else arr.itemsize[widx])
        self.opt_whole = n_states * int(w_state[w_train].sum())
        n_trainable = int(train.sum() + w_train.sum())
        self.step_bytes = 4 * n_trainable if training.step_scalars else 0
        # offloaded gradients are copied to the CPU without padding (foreach_reduce: .to("cpu"))
        g_off = t_off
        self.cpu_grads = _per_coord_sum(dim0[g_off], (rowsize * isz)[g_off], S)
        # optimizer.step() temporaries: Adam's sqrt(exp_avg_sq), all at once with foreach
        if training.step_scalars:
            fe_dev = True if training.foreach is None else training.foreach
            fe_cpu = False if training.foreach is None else training.foreach
            tmp_w = w_state[w_train]
            if fe_dev:
                self.opt_tmp_dev = _per_coord_sum(dim0[t_dev], row_state[t_dev], S) + int(tmp_w.sum())
            else:
                self.opt_tmp_dev = np.maximum(_per_coord_max(dim0[t_dev], row_state[t_dev], S), int(tmp_w.max(initial=0)))
            self.opt_tmp_cpu = (_per_coord_sum if fe_cpu else _per_coord_max)(dim0[t_off], row_state[t_off], S)
        else:
            self.opt_tmp_dev = np.zeros(S, dtype=np.int64)
            self.opt_tmp_cpu = np.zeros(S, dtype=np.int64)
        self.whole_counts = (would, w_train, arr.numel[widx] * arr.itemsize[widx], arr.dtype[widx])
        self._simulate()

    # -- one training step, event by event (the order torch runs hooks in) ---------------
    def _simulate(self) -> None:
        S = self.S
        groups = self.groups
        base = self.params_sharded + self.params_whole + self.buffers  # + optimizer states, added per rank
        comm: list[tuple] = []
        best = {"x": -1}

        def record(x, phase, g, parts):
            if x > best["x"]:
                best.update(x=x, phase=phase, unit=g.name if g is not None else None, parts=dict(parts))

        def ag_row(g, phase, size, group_name):
            comm.append((g.name, "all_gather", phase, group_name, size, 1, g.gather_dtype, g.gather_bytes))

        # ---------------- forward: FSDPParamGroup.pre_forward / post_forward --------------
        events = sorted([(g.pre, 1, k) for k, g in enumerate(groups)] + [(g.post, 0, k) for k, g in enumerate(groups)])
        held = 0  # unsharded parameters (and post-forward shards) alive
        ag_state = 0  # the previous all-gather output, freed after the next copy-out (implicit prefetch)
        state = ["sharded"] * len(groups)
        gathered = S > 1
        for _, kind, k in events:
            g = groups[k]
            if kind == 1:  # pre-forward: unshard + wait_for_unshard
                ag = g.gather_bytes if gathered else 0
                parts = {"all-gather buffers": ag_state + ag + g.copy_in_bytes, "unsharded params": held}
                record(base + held + ag_state + ag + g.copy_in_bytes, "forward", g, parts)
                record(base + held + ag + g.gather_bytes, "forward", g,
                       {"all-gather buffers": ag, "unsharded params": held + g.gather_bytes})
                if gathered:
                    ag_row(g, "forward", S, "shard")
                held += g.gather_bytes
                ag_state = ag
                state[k] = "unsharded"
            else:  # post-forward: reshard (to the post-forward mesh for an int)
                rar = g.rar
                if rar is True:
                    held -= g.gather_bytes
                    state[k] = "sharded"
                elif rar is not False:
                    pf = g.gather_bytes // rar
                    record(base + held + ag_state + pf, "forward", g,
                           {"all-gather buffers": ag_state, "unsharded params": held + pf})
                    held += pf - g.gather_bytes
                    state[k] = "post_forward"
        ag_state = 0  # the root's post-forward frees the last all-gather output
        self.forward_held = held

        # ---------------- backward: pre_backward (+ prefetch), post_backward ---------------
        order = sorted(range(len(groups)), key=lambda k: groups[k].post)  # comm_ctx.post_forward_order
        pos = {k: i for i, k in enumerate(order)}
        pending: dict[int, int] = {}  # prefetched all-gathers not yet copied out
        rs_hold = 0  # reduce_scatter_states keeps one reduce-scatter input (max_input_buffers=1)
        grads = 0  # sharded gradients on the device so far
        ug_held = 0  # unsharded gradients waiting for a deferred post_backward
        deferred: list[int] = []
        back = []

        def cur(extra=0):
            return base + held + grads + rs_hold + sum(pending.values()) + ug_held + extra

        def parts(**kw):
            out = {"unsharded params": held, "gradients": grads, "reduce-scatter buffers": rs_hold,
                   "all-gather buffers": sum(pending.values()), "unsharded grads": ug_held}
            for key, v in kw.items():
                out[key.replace("_", " ")] = out.get(key.replace("_", " "), 0) + v
            return out

        def unshard(k, g):
            nonlocal held
            if state[k] == "unsharded" or k in pending:
                return
            size = S if state[k] == "sharded" else g.rar
            if size > 1:
                pending[k] = g.gather_bytes
                record(cur(g.copy_in_bytes), "backward", g, parts(all_gather_buffers=g.copy_in_bytes))
                ag_row(g, "backward", size, "shard" if state[k] == "sharded" else "post_forward")
            else:
                pending[k] = 0

        def wait(k, g):
            nonlocal held
            if k not in pending:
                return
            pf = g.gather_bytes // g.rar if state[k] == "post_forward" else 0
            record(cur(g.gather_bytes), "backward", g, parts(unsharded_params=g.gather_bytes))
            del pending[k]
            held += g.gather_bytes - pf
            state[k] = "unsharded"

        def post_backward(k, g, ug):
            nonlocal held, rs_hold, grads
            if state[k] == "unsharded":
                held -= g.gather_bytes
            elif state[k] == "post_forward":
                held -= g.gather_bytes // g.rar
            state[k] = "sharded"
            rs_hold = 0
            if not g.trainable:
                return
            record(cur(ug + g.rs_bytes), "backward", g, parts(unsharded_grads=ug, reduce_scatter_buffers=g.rs_bytes))
            dev_grad = 0 if g.offload else g.grad_bytes
            cast = g.grad_bytes if (g.grad_cast and not g.offload) else 0
            record(cur(g.rs_bytes + g.ro_bytes + cast), "backward", g,
                   parts(reduce_scatter_buffers=g.rs_bytes + g.ro_bytes, gradients=cast))
            if S > 1:
                back.append((g.name, "reduce_scatter", "backward", "shard", S, 1, g.reduce_dtype, g.rs_bytes))
            if self.R > 1:
                back.append((g.name, "all_reduce", "backward", "replicate", self.R, 1, g.reduce_dtype, g.ro_bytes))
            grads += dev_grad
            rs_hold = g.rs_bytes

        for k in reversed(order):
            g = groups[k]
            if not g.out_grad:
                continue  # no pre-backward hook: its output needs no gradient
            unshard(k, g)
            wait(k, g)
            i = pos[k]
            if i > 0:  # FSDPParamGroup._backward_prefetch: the previous call in post-forward order
                t = order[i - 1]
                unshard(t, groups[t])
            comm.extend(back)
            back.clear()
            # autograd computes this call's gradients
            record(cur(g.ug_bytes + g.whole_grad_bytes), "backward", g,
                   parts(unsharded_grads=g.ug_bytes, gradients=g.whole_grad_bytes))
            grads += g.whole_grad_bytes
            if g.in_grad:
                post_backward(k, g, g.ug_bytes)
                comm.extend(back)
                back.clear()
            else:
                ug_held += g.ug_bytes
                deferred.append(k)
        grads += self.whole_unmanaged_grad_bytes
        # FSDPState._root_post_backward_final_callback: post_backward for every state not yet
        # done, in the root's named_modules order
        done = {k for k in range(len(groups)) if groups[k].out_grad and groups[k].in_grad}
        for k in sorted(set(range(len(groups))) - done, key=lambda k: groups[k].first_module):
            g = groups[k]
            ug = g.ug_bytes if k in deferred else 0
            ug_held -= ug
            post_backward(k, g, ug)
            comm.extend(back)
            back.clear()
        pending.clear()
        rs_hold = 0
        self.backward_grads = grads
        self.fb_peak = best["x"]
        self.fb_best = dict(best)

        # ---------------- gradients of whole parameters: all-reduce over all ranks ----------
        world = self.S * self.R
        if self.training.sync_outside_fsdp and world > 1:
            would, w_train, w_bytes, w_dtype = self.whole_counts
            labels = {ul.index: ul.unit.name for ul in self.analysis.layout.units}
            rows: dict = {}
            for wu, tr, b, dt in zip(would.tolist(), w_train.tolist(), w_bytes.tolist(), w_dtype.tolist()):
                if not tr:
                    continue
                key = (labels.get(wu) if wu >= 0 else None, _code_name(dt))
                c, total = rows.get(key, (0, 0))
                rows[key] = (c + 1, total + b)
            for (label, dt), (c, total) in rows.items():
                comm.append((label, "all_reduce", "optimizer", "world", world, c, dt, total))
        self.comm_rows = comm
        # grads on the device after backward (the optimizer step sees them all)
        self.grads_dev = self.grads_sharded + self.grads_whole

    # -- per-rank tables ----------------------------------------------------------------
    def memory(self) -> pd.DataFrame:
        S, R = self.S, self.R
        coords = np.arange(S)
        opt_dev = self.opt_dev + self.opt_whole
        fb = self.fb_peak + opt_dev
        state = self.params_sharded + self.params_whole + self.buffers + self.grads_dev
        step = state + opt_dev + self.opt_tmp_dev
        peak = np.maximum(fb, step)
        in_step = step > fb
        fb_part = self.fb_best["x"] - (self.params_sharded + self.params_whole + self.buffers)
        transient = np.where(in_step, self.opt_tmp_dev, fb_part - self.fb_best["parts"].get("gradients", 0))
        cpu_opt = self.opt_cpu + self.step_bytes
        data = {
            "rank": np.arange(S * R),
            "replica": np.repeat(np.arange(R), S),
            "shard": np.tile(coords, R),
            "params": np.full(S * R, self.params_sharded + self.params_whole),
            "params_sharded": np.full(S * R, self.params_sharded),
            "params_whole": np.full(S * R, self.params_whole),
            "buffers": np.full(S * R, self.buffers),
            "grads": np.full(S * R, self.grads_dev),
            "grads_sharded": np.full(S * R, self.grads_sharded),
            "grads_whole": np.full(S * R, self.grads_whole),
            "optimizer": np.tile(opt_dev, R),
            "state": np.tile(state + opt_dev, R),
            "peak": np.tile(peak, R),
            "peak_phase": np.tile(np.where(in_step, "optimizer", self.fb_best.get("phase", "forward")), R),
            "peak_unit": np.tile(np.where(in_step, None, self.fb_best.get("unit")), R),
            "peak_transient": np.tile(transient, R),
            "cpu_params": np.full(S * R, self.cpu_params),
            "cpu_grads": np.tile(self.cpu_grads, R),
            "cpu_optimizer": np.tile(cpu_opt, R),
            "cpu_peak": np.tile(self.cpu_params + self.cpu_grads + cpu_opt + self.opt_tmp_cpu, R),
        }
        return pd.DataFrame(data)

    def peak_breakdown(self, rank: int = 0) -> dict[str, int]:
        """What is alive at ``rank``'s peak, by kind (bytes)."""
        _, coord = self.analysis.mesh.coords(rank)
        opt = int(self.opt_dev[coord] + self.opt_whole)
        base = {"sharded params": self.params_sharded, "ignored/unmanaged params": self.params_whole,
                "buffers": self.buffers, "optimizer states": opt}
        fb = self.fb_peak + opt
        step = self.params_sharded + self.params_whole + self.buffers + self.grads_dev + opt + int(self.opt_tmp_dev[coord])
        if step > fb:
            out = {**base, "gradients": self.grads_dev, "optimizer step temporaries": int(self.opt_tmp_dev[coord])}
        else:
            out = {**base, **{k: int(v) for k, v in self.fb_best["parts"].items()}}
        return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}

    def comm(self) -> pd.DataFrame:
        mesh = self.analysis.mesh
        cols = ["unit", "collective", "phase", "group", "group_size", "count", "dtype", "bytes"]
        df = pd.DataFrame(self.comm_rows, columns=cols)
        n = df["group_size"].to_numpy(dtype=np.int64)
        b = df["bytes"].to_numpy(dtype=np.int64)
        factor = np.where(df["collective"].to_numpy() == "all_reduce", 2.0, 1.0)
        sent = np.rint(factor * b * (n - 1) / np.maximum(n, 1)).astype(np.int64)
        df["sent_bytes"] = sent
        bw = np.array([_group_bandwidth(mesh, grp, size) for grp, size in zip(df["group"], n)], dtype=float)
        df["time_s"] = sent / (bw * 1e9)
        df.attrs["time_per_step_s"] = float(df["time_s"].sum()) if len(df) else 0.0
        return df


def _group_bandwidth(mesh, group: str, size: int) -> float:
    """GB/s of the slowest link a ring over this process group crosses (NaN when unknown)."""
    rpn = mesh.ranks_per_node
    if group == "shard":
        intra = mesh.shard <= rpn and rpn % mesh.shard == 0
    elif group == "post_forward":
        intra = size <= rpn and rpn % size == 0
    elif group == "replicate":
        intra = mesh.world <= rpn
    else:  # world
        intra = mesh.world <= rpn
    bw = mesh.intra_node_gbps if intra else mesh.inter_node_gbps
    return float("nan") if bw is None else float(bw)


_MODEL_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def cost_model(analysis) -> CostModel:
    model = _MODEL_CACHE.get(analysis)
    if model is None:
        model = CostModel(analysis)
        _MODEL_CACHE[analysis] = model
    return model


def memory_table(analysis) -> pd.DataFrame:
    """One row per rank, bytes: see ``docs/cost-model.md`` for every column."""
    return cost_model(analysis).memory()


def comm_table(analysis) -> pd.DataFrame:
    """One row per collective per call per step: see ``docs/cost-model.md``."""
    return cost_model(analysis).comm()


def peak_breakdown(analysis, rank: int = 0) -> dict[str, int]:
    return cost_model(analysis).peak_breakdown(rank)


def format_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def memory_findings(analysis) -> list[Finding]:
    """SV201: the predicted peak of some rank does not fit ``Mesh.device_memory``."""
    limit = analysis.mesh.device_memory
    if limit is None:
        return []
    mem = analysis.memory
    worst = int(mem["peak"].idxmax())
    peak = int(mem.at[worst, "peak"])
    if peak <= limit:
        return []
    rank = int(mem.at[worst, "rank"])
    parts = peak_breakdown(analysis, rank)
    top = ", ".join(f"{k} {format_bytes(v)}" for k, v in list(parts.items())[:4])
    units = sorted(analysis.units.itertuples(index=False), key=lambda r: -r.padded_unsharded_bytes)[:3]
    big = ", ".join(f"{r.unit} ({format_bytes(r.padded_unsharded_bytes)} unsharded)" for r in units)
    phase = mem.at[worst, "peak_phase"]
    where = f" in {phase}" + (f" at {mem.at[worst, 'peak_unit']}" if mem.at[worst, "peak_unit"] else "")
    fixes = []
    if parts.get("optimizer states", 0) or parts.get("sharded params", 0):
        fixes.append("shard over more ranks")
    if not analysis.training.offload:
        fixes.append("offload to CPU (Training(offload=True))")
    fixes.append("set reshard_after_forward=True on calls that keep parameters unsharded")
    if not analysis.training.param_dtype:
        fixes.append("use param_dtype='bfloat16'")
    return [Finding(
        "SV201", "error",
        f"peak memory {format_bytes(peak)} on rank {rank}{where} exceeds device_memory "
        f"{format_bytes(limit)} by {format_bytes(peak - limit)} (activations not counted); "
        f"largest contributors: {top}; largest calls: {big}",
        tuple(m for r in units for m in r.modules),
        "; ".join(fixes),
    )]
