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
  the module picks the path and the technique when it runs, so it works on 2.4 and later;
- the plan's ``checkpoint`` modules are wrapped in torch's ``checkpoint_wrapper`` before any
  ``fully_shard`` call; every module is resolved before wrapping (wrapping renames what lies
  below a block), and ``fully_shard`` is applied to the wrapper, as torchtitan does.

The helpers the exported module needs at run time live in ``export_runtime.py``, a real module the
tests import; their source is copied into every export, which therefore needs only torch.
"""

from __future__ import annotations

import ast
import textwrap
from functools import lru_cache
from pathlib import Path

from .analysis import Analysis
from .finding import PlanError
from .fsdp import (
    MIN_TORCH,
    Mesh,
    fully_shard_module_path,
    parse_version,
    supports_ignored_params,
)
from . import export_runtime
from .plan import Plan, Unit, as_plan, refuse_selective
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


def _module_expr(fqn: str, resolved: bool = False) -> str:
    """How the exported code names module ``fqn``: by path, or (with checkpointing) from the
    ``modules`` dict resolved before any wrapping."""
    if fqn == "":
        return "model"
    return f"modules[{_lit(fqn)}]" if resolved else f"model.get_submodule({_lit(fqn)})"


# Definitions of export_runtime.py every export carries, and those only some need.
RUNTIME_ALWAYS = ("_mesh_device", "_dp_groups", "_common_dtype", "_broadcast", "_GradAverager", "_tensors",
                  "optimizer_param_groups", "_replicate_unsharded")
RUNTIME_HIDE = "_hidden_from_fully_shard"
RUNTIME_CHECKPOINT = "_apply_checkpointing"


@lru_cache(maxsize=None)
def _runtime_definitions() -> dict[str, str]:
    """Top-level definition name -> its exact source (decorators included) in export_runtime.py."""
    source = Path(export_runtime.__file__).read_text(encoding="utf-8")
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[first - 1 : node.end_lineno])
    return out


def runtime_source(names) -> str:
    """The source of the named export_runtime definitions, in file order, ready to paste into an export."""
    definitions = _runtime_definitions()
    missing = set(names) - set(definitions)
    if missing:
        raise KeyError(f"export_runtime.py defines no {sorted(missing)}")
    return "\n\n\n".join(src for name, src in definitions.items() if name in set(names))


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
    if plan.checkpoint:
        Plan(checkpoint=plan.checkpoint).validate(tree)  # names, root, nesting: a ValueError naming the module
        refuse_selective(plan, "export_code")  # TODO(issue 18): write the selective policy
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
    checkpoint = list(plan.checkpoint)

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
        + (f"{len(checkpoint)} modules wrapped in checkpoint_wrapper first (full activation checkpointing). "
           if checkpoint else "")
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

    def names_tuple(comment: str, variable: str, names) -> None:
        add(f"# {comment}")
        add(f"{variable} = (")
        for name in names:
            add(f"    {_lit(name)},")
        add(")")

    if ignored:
        names_tuple("The plan's ignored parameters: FSDP keeps them whole on every rank and never reduces their "
                    "gradients.", "IGNORED", ignored)
    if checkpoint:
        names_tuple("Wrapped in checkpoint_wrapper before any fully_shard call; fully_shard then takes the wrapper.",
                    "CHECKPOINT", checkpoint)
        names_tuple("Every module a fully_shard call takes, resolved by name before wrapping renames them.",
                    "MODULES", dict.fromkeys(m for u in units for m in u.modules if m))
    add("")
    add("")
    add(runtime_source(RUNTIME_ALWAYS + ((RUNTIME_HIDE,) if hides else ()) + ((RUNTIME_CHECKPOINT,) if checkpoint else ())))
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
    if checkpoint:
        add("    modules = {name: model.get_submodule(name) for name in MODULES}")
        add("    modules.update(_apply_checkpointing(model, CHECKPOINT))")
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
            target_expr = "[" + ", ".join(_module_expr(m, bool(checkpoint)) for m in unit.modules) + "]"
        else:
            target_expr = _module_expr(unit.modules[0], bool(checkpoint))
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
