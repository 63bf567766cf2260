"""``sv.export_code``: the plan as a self-contained Python module that applies it with ``fully_shard``.

The exported module defines ``apply_fsdp(model, mesh=None)``. After it, an ordinary training loop
(``loss.backward(); optimizer.step(); optimizer.zero_grad()``) trains correctly on every rank:

- the calls are made bottom-up (the order ``Layout`` computed), each module addressed with
  ``model.get_submodule(<string literal>)``; every name is written with ``repr``, so no name
  is ever pasted into code;
- parameters FSDP does not shard (the plan's ignored ones and any under no call) are moved to
  the mesh's device (FSDP does not move ignored ones), the trainable ones are broadcast from
  the first data-parallel rank, and their gradients are averaged over every data-parallel
  rank (replicate x shard) in ONE flattened all-reduce per backward, queued on the autograd
  engine so it runs after the last gradient is ready (a parameter that got no gradient on
  some rank counts as zero there; one that got none on any rank keeps ``grad=None``);
- the import path, keyword arguments and technique follow the target release (the facts in
  ``fsdp.py``): ``torch.distributed._composable.fsdp`` before 2.6, ``ignored_params`` from
  2.7, and before 2.7 the ignored parameters are hidden from ``fully_shard`` during the calls
  (their slots in ``module._parameters`` set to ``None``, which ``named_parameters`` skips,
  then the same ``Parameter`` objects put back in the same slots). With ``torch_version=None``
  the module picks the path and the technique when it runs, so it works on 2.4 and later.
"""

from __future__ import annotations

import textwrap

from .analysis import Analysis
from .finding import PlanError
from .fsdp import (
    MIN_TORCH,
    Mesh,
    fully_shard_module_path,
    parse_version,
    supports_ignored_params,
)
from .plan import Unit, as_plan
from .tree import as_tree

_PUBLIC_DTENSOR = (2, 5)  # torch.distributed.tensor became public in 2.5 (2.4: torch.distributed._tensor)


def _lit(value) -> str:
    """A Python literal for a str / bool / int / None: ``repr`` escapes quotes, backslashes, newlines."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    raise TypeError(f"cannot write {value!r} as a literal")


def _release(version) -> tuple[int, int] | None:
    if version is None:
        return None
    release = parse_version(version)
    if release < MIN_TORCH:
        raise ValueError(
            f"torch {version}: fully_shard (FSDP2) arrived in torch {MIN_TORCH[0]}.{MIN_TORCH[1]}; "
            "nothing to export for an older release"
        )
    return release


def _fmt(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}"


def _unit_kwargs(unit: Unit) -> list[str]:
    out = []
    if unit.reshard_after_forward is not None:
        out.append(f"reshard_after_forward={_lit(unit.reshard_after_forward)}")
    if unit.param_dtype or unit.reduce_dtype:
        parts = []
        if unit.param_dtype:
            parts.append(f"param_dtype=torch.{unit.param_dtype}")
        if unit.reduce_dtype:
            parts.append(f"reduce_dtype=torch.{unit.reduce_dtype}")
        out.append(f"mp_policy=MixedPrecisionPolicy({', '.join(parts)})")
    if unit.offload:
        out.append("offload_policy=CPUOffloadPolicy()")
    return out


def _module_expr(fqn: str) -> str:
    return "model" if fqn == "" else f"model.get_submodule({_lit(fqn)})"


def export_code(model, plan, mesh: Mesh | None = None, training=None, torch_version=None) -> str:
    """The ``fully_shard`` code for ``plan`` as a self-contained, black-formatted Python module.

    ``torch_version``: the release the code will run on (``"2.6"``, ``"2.13.0"``, ...); the import
    path, keyword arguments and technique are chosen for it. ``None``: detected when the code runs.
    Raises ``PlanError`` when torch would refuse the plan (the findings say why), ``ValueError``
    for a bad version or mesh.
    """
    from .checks import release_findings

    tree = as_tree(model)
    plan = as_plan(plan)
    mesh = mesh if mesh is not None else Mesh(shard=8)
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
    release = _release(torch_version)
    analysis = Analysis(tree, plan, mesh, training)
    layout = analysis.layout
    refusals = list(layout.errors) + [
        f for f in release_findings(layout, _fmt(release) if release else None) if f.severity == "error"
    ]
    if refusals:
        raise PlanError(refusals)

    units = [plan.units[u] for u in layout.order]
    if training is not None and hasattr(training, "unit_defaults"):
        units = [training.unit_defaults(u) for u in units]
    grouped = any(u.is_grouped for u in units)
    uses_mp = any(u.param_dtype or u.reduce_dtype for u in units)
    uses_offload = any(u.offload for u in units)
    ignored = list(plan.ignored)

    # What the code needs from torch, and the oldest release that has it.
    if release is None:
        need = max([MIN_TORCH] + ([(2, 5)] if grouped else []))
    else:
        need = max(
            [MIN_TORCH]
            + ([(2, 5)] if grouped else [])
            + ([_PUBLIC_DTENSOR] if release >= _PUBLIC_DTENSOR else [])
            + ([(2, 6)] if fully_shard_module_path(_fmt(release)) == "torch.distributed.fsdp" else [])
            + ([(2, 7)] if ignored and supports_ignored_params(_fmt(release)) else [])
        )
    fsdp_names = ["fully_shard"] + (["MixedPrecisionPolicy"] if uses_mp else []) + (
        ["CPUOffloadPolicy"] if uses_offload else []
    )

    if release is None:
        technique = "with ignored_params on torch >= 2.7, by hiding them from fully_shard during the calls before"
        target = f"torch >= {_fmt(need)}, release detected when it runs"
    else:
        if supports_ignored_params(_fmt(release)):
            technique = "with ignored_params"
        else:
            technique = f"by hiding them from fully_shard during the calls (torch {_fmt(release)} has no ignored_params)"
        target = f"torch {_fmt(release)}"

    L: list[str] = []
    add = L.append
    plan_label = plan.name or "unnamed plan"
    header = (
        f"shardviz export: plan {plan_label!r} on {tree.root_type}; mesh {mesh} "
        f"(init_device_mesh shape {mesh.shape}); target {target}. "
        f"{len(units)} fully_shard calls, bottom-up; "
        + (f"{len(ignored)} ignored parameters, kept out {technique}. " if ignored else "no ignored parameters. ")
        + "Parameters FSDP does not shard are moved to the mesh's device, broadcast from the first rank, "
        f"and have their gradients averaged over all {mesh.world} data-parallel ranks in one all-reduce "
        "per backward."
    )
    L.extend("# " + line for line in textwrap.wrap(header, 86, break_long_words=False, break_on_hyphens=False))
    add('"""Apply a shardviz plan with FSDP2 ``fully_shard``.')
    add("")
    add("Usage::")
    add("")
    add("    model = apply_fsdp(model)  # after torch.distributed is initialised, before building the optimizer")
    add("    optimizer = torch.optim.AdamW(optimizer_param_groups(model))")
    add("    loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()")
    add("")
    add("The gradients of trainable parameters FSDP leaves whole are averaged at the end of every")
    add("backward (like FSDP's own reduce-scatter); the average is linear, so gradient accumulation")
    add("over several backward passes stays correct. Generated code: self-contained, needs only torch.")
    add('"""')
    hides = bool(ignored) and (release is None or not supports_ignored_params(_fmt(release)))
    if hides:
        add("import contextlib")
    add("import re")
    add("")
    add("import torch")
    add("import torch.distributed as dist")
    add("from torch.distributed.device_mesh import init_device_mesh")
    add("")
    add('_RELEASE = tuple(int(x) for x in re.match(r"(\\d+)\\.(\\d+)", torch.__version__).groups())')
    add(f"if _RELEASE < {need!r}:")
    add("    raise ImportError(")
    add(f"        {('this fully_shard code (exported for ' + target + ') needs torch >= ' + _fmt(need) + '; installed: torch ')!r}")
    add("        + torch.__version__")
    add(f"        + {'; export it again for this release (shardviz export --torch X.Y, or torch_version=None)'!r}")
    add("    )")
    if release is None:
        add("if _RELEASE >= (2, 6):  # public path since 2.6")
        add(f"    from torch.distributed.fsdp import {', '.join(fsdp_names)}")
        add("else:  # torch 2.4 and 2.5")
        add(f"    from torch.distributed._composable.fsdp import {', '.join(fsdp_names)}")
        add("if _RELEASE >= (2, 5):")
        add("    from torch.distributed.tensor import DTensor")
        add("else:")
        add("    from torch.distributed._tensor import DTensor")
        if ignored:
            add("")
            add("")
            add("def _accepts_ignored_params():")
            add('    """``ignored_params`` arrived in torch 2.7; read the signature of the fully_shard we run against."""')
            add("    import inspect")
            add("")
            add("    try:")
            add('        return "ignored_params" in inspect.signature(fully_shard).parameters')
            add("    except (TypeError, ValueError):")
            add("        return _RELEASE >= (2, 7)")
    else:
        add(f"from {fully_shard_module_path(_fmt(release))} import {', '.join(fsdp_names)}")
        if release >= _PUBLIC_DTENSOR:
            add("from torch.distributed.tensor import DTensor")
        else:
            add("from torch.distributed._tensor import DTensor")
    add("")
    add(f"MESH_SHAPE = {mesh.shape!r}")
    add(f"MESH_DIM_NAMES = {('replicate', 'shard') if mesh.is_hsdp else ('shard',)!r}")
    if ignored:
        add("# The plan's ignored parameters: FSDP keeps them whole on every rank and never reduces their gradients.")
        add("IGNORED = (")
        for name in ignored:
            add(f"    {_lit(name)},")
        add(")")
    add("")
    add("")
    if hides:
        add(_HIDE_HELPER)
        add("")
        add("")
    add(_HELPERS)
    add("")
    add("")
    add("def apply_fsdp(model, mesh=None):")
    add('    """Apply the plan to ``model`` in place and return it.')
    add("")
    add(f"    ``mesh``: a DeviceMesh of shape {mesh.shape} ({'(replicate, shard): HSDP' if mesh.is_hsdp else 'shard'}); "
        "by default one is made over all ranks")
    add("    on the current accelerator, or the CPU (gloo) when there is none.")
    add('    """')
    add("    if mesh is None:")
    add('        device_type = "cuda" if torch.cuda.is_available() else "cpu"')
    add("        mesh = init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)")
    if ignored:
        add("    ignored = {model.get_parameter(name) for name in IGNORED}")
    call_kw = "mesh=mesh"
    if release is None and ignored:
        add("    keep_out = {}")
        add("    hide = contextlib.nullcontext()")
        add("    if _accepts_ignored_params():")
        add('        keep_out["ignored_params"] = ignored')
        add("    else:  # torch < 2.7 has no ignored_params: hide them from fully_shard during the calls")
        add("        hide = _hidden_from_fully_shard(model, ignored)")
        add("    with hide:")
        indent, call_kw = "        ", "mesh=mesh, **keep_out"
    elif ignored and supports_ignored_params(_fmt(release)):
        indent, call_kw = "    ", "mesh=mesh, ignored_params=ignored"
    elif ignored:
        add(f"    # torch {_fmt(release)} has no ignored_params: hide them from fully_shard during the calls.")
        add("    with _hidden_from_fully_shard(model, ignored):")
        indent = "        "
    else:
        indent = "    "
    for unit in units:
        if unit.is_grouped:
            target_expr = "[" + ", ".join(_module_expr(m) for m in unit.modules) + "]"
        else:
            target_expr = _module_expr(unit.modules[0])
        kwargs = ", ".join([call_kw] + _unit_kwargs(unit))
        add(f"{indent}fully_shard({target_expr}, {kwargs})")
    if not units:
        add(f"{indent}pass  # the plan has no fully_shard call")
    add("    _replicate_unsharded(model, mesh)")
    add("    return model")
    src = "\n".join(L) + "\n"
    return _black(src)


def _black(src: str) -> str:
    import black

    return black.format_str(src, mode=black.Mode())


# The runtime helpers every export carries (plain torch; tested through the exported modules).
_HIDE_HELPER = '''
@contextlib.contextmanager
def _hidden_from_fully_shard(model, params):
    """Keep ``params`` out of ``fully_shard`` on a release without ``ignored_params``.

    ``fully_shard`` collects what it shards with ``module.named_parameters(recurse=False)``
    on each module it manages, which skips slots holding ``None``. Each slot holding one of
    these parameters is set to ``None`` for the duration of the calls, then the same
    ``Parameter`` object goes back into the same slot (order, identity and ties kept).
    """
    ids = {id(p) for p in params}
    slots = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and id(param) in ids:
                slots.append((module, name, param))
    for module, name, _ in slots:
        module._parameters[name] = None
    try:
        yield
    finally:
        for module, name, param in slots:
            module._parameters[name] = param
'''.strip("\n")


_HELPERS = '''
def _mesh_device(mesh):
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, getattr(torch, mesh.device_type).current_device())


def _dp_groups(mesh):
    """Groups whose successive sums cover every data-parallel rank of ``mesh`` (None: the world)."""
    if mesh.ndim == 1:
        return [mesh.get_group()]
    if mesh.size() == dist.get_world_size():
        return [None]
    return [mesh.get_group(dim) for dim in range(mesh.ndim)]


def _common_dtype(tensors):
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@torch.no_grad()
def _broadcast(params, mesh, groups):
    """Make ``params`` equal on every rank: one flattened broadcast from the mesh's first rank per group."""
    flat = torch.cat([p.detach().reshape(-1).to(_common_dtype(params)) for p in params])
    for group in groups:
        src = int(mesh.mesh.flatten()[0]) if group is None else dist.get_global_rank(group, 0)
        dist.broadcast(flat, src=src, group=group)
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


class _GradAverager:
    """Averages the gradients of trainable parameters FSDP does not reduce, once per backward.

    Every such parameter's post-accumulate-grad hook, and a hook on the root's outputs, queue one
    callback on the autograd engine; it runs when the backward pass ends and does ONE flattened
    all-reduce (sum, then divide by the number of data-parallel ranks). A trailing count of the ranks
    that had each gradient travels in the same buffer: a parameter with no gradient on any rank keeps
    ``grad=None``; one missing on some ranks counts as zero there.
    """

    def __init__(self, params, groups, world):
        self.params, self.groups, self.world = params, groups, world
        self.queued = False

    def on_forward(self, module, args, output):
        self.queued = False
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(self.queue)
                    break

    def queue(self, *_):
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.average)

    @torch.no_grad()
    def average(self):
        self.queued = False
        params = self.params
        dtype = _common_dtype(params)
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(dtype)
            for p in params
        ]
        has = torch.tensor([p.grad is not None for p in params], dtype=dtype, device=params[0].device)
        flat = torch.cat(parts + [has])
        for group in self.groups:
            dist.all_reduce(flat, group=group)
        offset, n = 0, flat.numel() - len(params)
        for i, p in enumerate(params):
            if flat[n + i] > 0:
                mean = (flat[offset : offset + p.numel()] / self.world).view_as(p)
                if p.grad is None:
                    p.grad = mean.to(p.dtype)
                else:
                    p.grad.copy_(mean)
            offset += p.numel()


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def optimizer_param_groups(model):
    """The trainable parameters as optimizer param groups: sharded ones (DTensor) apart from whole
    ones (plain tensors). One group holding both fails in torch's foreach kernels (the default on GPU)
    with "got mixed torch.Tensor and DTensor"."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    sharded = [p for p in trainable if isinstance(p, DTensor)]
    whole = [p for p in trainable if not isinstance(p, DTensor)]
    return [{"params": group} for group in (sharded, whole) if group]


def _replicate_unsharded(model, mesh):
    """Parameters FSDP left whole: move them to the mesh's device (FSDP does not move ignored ones),
    make the trainable ones equal on every rank and average their gradients every backward."""
    device = _mesh_device(mesh)
    whole = [p for p in model.parameters() if not isinstance(p, DTensor)]
    for p in whole:
        if p.device != device and p.device.type != "meta":
            with torch.no_grad():
                p.data = p.data.to(device)
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != device and buf.device.type != "meta":
                module._buffers[name] = buf.to(device)
    trainable = [p for p in whole if p.requires_grad]
    if not trainable:
        return
    groups = _dp_groups(mesh)
    # Parameters still on the meta device (deferred init) cannot be broadcast: initialise them
    # identically on every rank (same seed) after to_empty(); their gradients are averaged anyway.
    materialised = [p for p in trainable if p.device.type != "meta"]
    if materialised:
        _broadcast(materialised, mesh, groups)
    averager = _GradAverager(trainable, groups, mesh.size())
    for p in trainable:
        p.register_post_accumulate_grad_hook(averager.queue)
    model.register_forward_hook(averager.on_forward)
'''.strip("\n")
