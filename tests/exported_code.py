"""Reading and running the code ``sv.export_code`` writes: the helpers of the ``test_codegen*`` tests.

``load_exported`` imports exported code as a fresh module, ``apply_under_fake_pg`` runs its
``apply_fsdp`` as one rank under the fake process group, ``layout_mismatches`` compares the
applied placements and local shapes with the prediction, ``fully_shard_targets`` and ``imports_of``
read the code's ``fully_shard`` calls and imports, ``tiny_plans`` are the plans most cases export.
"""

from __future__ import annotations

import ast
import types

from torch import nn

import shardviz as sv
from shardviz.export.oracle import device_mesh, fake_process_group


def load_exported(code: str, name: str = "exported_fsdp") -> types.ModuleType:
    """Import exported code as a fresh module (no file needed)."""
    module = types.ModuleType(name)
    exec(compile(code, f"<{name}>", "exec"), module.__dict__)
    return module


def layout_mismatches(model: nn.Module, analysis, rank: int) -> list:
    """Every parameter name whose placement or local shape differs from the prediction."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    want_placements = (Replicate(), Shard(0)) if analysis.mesh.is_hsdp else (Shard(0),)
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        idx = analysis.tree.param_index[name]
        if analysis.layout.param_status[idx] == "sharded":
            want = ("sharded", analysis.local_shape(name, rank), want_placements)
        else:
            want = ("whole", analysis.tree.params[idx].shape, ())
        if isinstance(p, DTensor):
            got = ("sharded", tuple(p.to_local().shape), tuple(p.placements))
        else:
            got = ("whole", tuple(p.shape), ())
        if got != want:
            out.append((name, want, got))
    return out


def apply_under_fake_pg(code: str, model: nn.Module, mesh: sv.Mesh, rank: int, check=None):
    """Run the exported ``apply_fsdp`` on ``model`` as ``rank``; ``check(model, module)`` runs inside."""
    module = load_exported(code)
    with fake_process_group(rank, mesh.world):
        result = module.apply_fsdp(model, device_mesh(mesh))
        assert result is model
        return check(model, module) if check else None


def fully_shard_targets(code: str) -> list[tuple[str, ...]]:
    """The modules of every fully_shard call in the order the code makes them, loops unrolled."""
    out = []

    def name_of(node):
        if isinstance(node, ast.Name):  # ``model``: the root
            return ""
        if isinstance(node, ast.Subscript):  # ``modules["x"]``
            return node.slice.value
        return node.args[0].value  # ``model.get_submodule("x")``

    def visit(statements, loop_names=None):
        for node in statements:
            if isinstance(node, ast.For):
                visit(node.body, [e.value for e in node.iter.elts])
            elif isinstance(node, ast.With):
                visit(node.body, loop_names)
            elif isinstance(node, ast.Expr) and getattr(getattr(node.value, "func", None), "id", "") == "fully_shard":
                target = node.value.args[0]
                uses_loop = isinstance(target, (ast.Call, ast.Subscript)) and any(
                    isinstance(n, ast.Name) and n.id == "name" for n in ast.walk(target))
                if uses_loop:
                    out.extend((n,) for n in loop_names)
                else:
                    items = target.elts if isinstance(target, ast.List) else [target]
                    out.append(tuple(name_of(i) for i in items))

    (apply_fsdp,) = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name == "apply_fsdp"]
    visit(apply_fsdp.body)
    return out


def tiny_plans(model):
    """LoRA ignored / sharded, and a plan with no grouped call (torch 2.4 cannot group)."""
    ignored = sv.Plan.auto(model, lora="ignored")
    flat_units = []
    for unit in ignored.units:
        flat_units.extend(unit.modules)
    return {
        "ignored": ignored,
        "sharded": sv.Plan.auto(model, lora="sharded"),
        "ignored-ungrouped": sv.Plan(flat_units, ignored.ignored, name="LoRA ignored, no groups"),
    }


def imports_of(code: str) -> list[str]:
    tree = ast.parse(code)
    return [f"{n.module}:{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
