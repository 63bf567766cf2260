"""The tensor-parallel part of an exported plan, as torchtitan writes it: ``apply_tp`` (torch's
``parallelize_module`` for torch's styles, transformers' own ``apply_tensor_parallelism`` for its
names) on ``mesh["tp"]``, then ``apply_fsdp``'s ``fully_shard`` calls on ``mesh["dp_shard"]``
(HSDP: ``mesh["dp_replicate", "dp_shard"]``)."""

from __future__ import annotations

from ..tp import LAYOUT_FIELDS, MESH_DIM_NAMES


def uses_tensor_parallel(mesh, plan) -> bool:
    return mesh.tensor > 1 and bool(plan.tensor_parallel)


def _layout_expr(text: str) -> str:
    return "Replicate()" if text.startswith("Replicate") else f"Shard({text[6:-1]})"


def style_expr(style) -> str:
    """A torch style as the constructor call that makes it: ``RowwiseParallel(output_layouts=Shard(1))``."""
    args = [f"{key}={_layout_expr(value) if key in LAYOUT_FIELDS else value}"
            for key, value in style.torch_kwargs().items()]
    return f"{style.style}({', '.join(args)})"


def mesh_dim_names(mesh) -> tuple[str, ...]:
    return MESH_DIM_NAMES if mesh.tensor > 1 else (("replicate", "shard") if mesh.is_hsdp else ("shard",))


def apply_tp_source(plan) -> list[str]:
    """``def apply_tp(model, tp_mesh)``: the plan's tensor-parallel entries, applied in place."""
    entries = plan.tensor_parallel.items()
    torch_entries = [(k, s) for k, s in entries if s.is_torch]
    hf_entries = [(k, s) for k, s in entries if not s.is_torch]
    lines = ["def apply_tp(model, tp_mesh):",
             '    """Tensor parallelism on the mesh\'s "tp" dim, before any fully_shard call (torchtitan\'s apply_tp)."""']
    if torch_entries:
        names = sorted({s.style for _, s in torch_entries})
        layouts = [n for n in ("Replicate", "Shard") if any(n + "(" in style_expr(s) for _, s in torch_entries)]
        if layouts:
            lines.append(f"    from torch.distributed.tensor import {', '.join(layouts)}")
        lines += [f"    from torch.distributed.tensor.parallel import {', '.join(names)}, parallelize_module", "",
                  "    parallelize_module(model, tp_mesh, {"]
        lines += [f"        {k!r}: {style_expr(s)}," for k, s in torch_entries] + ["    })"]
    if hf_entries:
        lines += ["    # transformers' own styles, applied as from_pretrained(tp_plan=...) applies them",
                  "    from transformers.distributed.tensor_parallel import apply_tensor_parallelism", "",
                  "    hf_plan = {"] + [f"        {k!r}: {s.style!r}," for k, s in hf_entries] + [
                  "    }", "    apply_tensor_parallelism(model, tp_mesh, model._expand_parallel_plan(hf_plan))"]
    return lines + ["    return model", "", ""]


def apply_fsdp_mesh_lines(mesh, plan) -> list[str]:
    """In ``apply_fsdp``, once the mesh exists: TP on its "tp" dim, then the data-parallel mesh
    (nothing on a mesh without a tensor dim)."""
    if mesh.tensor == 1:
        return []
    dp = '["dp_shard"]' if not mesh.is_hsdp else '["dp_replicate", "dp_shard"]'
    return (['    apply_tp(model, mesh["tp"])'] if plan.tensor_parallel else []) + [
        "    # fully_shard over the data-parallel dims (torchtitan's apply_fsdp)", f"    mesh = mesh{dp}"]
