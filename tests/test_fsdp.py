"""The engine agrees with torch's own fully_shard on hand-built models, parameter by parameter."""

import pytest
import torch
from torch.distributed.fsdp import fully_shard

import shardviz as sv
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy, torch_layout
from handmade import MixedFrozen, Odd, Tied, WeirdKeys, handmade_cases

MESHES = [sv.Mesh(1), sv.Mesh(2), sv.Mesh(3), sv.Mesh(8), sv.Mesh(64), sv.Mesh(4, replicate=2)]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("name,factory,units", handmade_cases(), ids=[c[0] for c in handmade_cases()])
def test_verify_handmade(name, factory, units, mesh):
    model = factory()
    plan = sv.Plan(units)
    diff = sv.verify(model, plan, mesh=mesh)
    assert diff.empty, diff.to_string()


@pytest.mark.parametrize("mesh", [sv.Mesh(4), sv.Mesh(8, replicate=2)], ids=str)
def test_verify_every_rank_on_uneven_shapes(mesh):
    """Every rank, not just first/middle/last: later ranks hold fewer or zero rows."""
    plan = sv.Plan(["a", "b", "c", ""])
    diff = sv.verify(Odd(), plan, mesh=mesh, ranks=range(mesh.world))
    assert diff.empty, diff.to_string()


def test_ignored_and_unmanaged_agree_with_torch():
    model = Odd()
    plan = sv.Plan(["a", "b"], ignored=["b.bias", "scale"])
    a = sv.analyze(model, plan, sv.Mesh(4))
    status = dict(zip(a.params.fqn, a.params.status))
    assert status["b.bias"] == "ignored" and status["scale"] == "ignored"
    assert status["c.weight"] == "unmanaged" and status["a.weight"] == "sharded"
    assert sv.verify(model, plan, mesh=sv.Mesh(4)).empty


def test_tied_parameter_is_one_row_with_every_name():
    plan = sv.Plan(["body", ["embed", "norm", "head"], ""])
    a = sv.analyze(Tied(), plan, sv.Mesh(4))
    row = a.params[a.params.fqn == "embed.weight"].iloc[0]
    assert row.aliases == ("head.weight",)
    torch_rows = torch_layout(Tied(), plan, sv.Mesh(4), 3).set_index("fqn")  # every name, aliases too
    for name in ("head.weight", "embed.weight"):
        assert a.local_shape(name, 3) == torch_rows.at[name, "local_shape"], name
    assert len(a.params) == len({id(p) for p in Tied().parameters()})


def test_grouped_unit_table():
    plan = sv.Plan(["body", ["embed", "norm", "head"], ""])
    a = sv.analyze(Tied(), plan, sv.Mesh(4))
    units = a.units.set_index("unit")
    group = units.loc["[embed, norm, head]"]
    # torch's own count: the FSDPParams of the grouped call (the tied weight once)
    copy_ = meta_copy(Tied())
    with fake_process_group(0, 4):
        apply_plan(copy_, plan, device_mesh(sv.Mesh(4)))
        n_torch = len(fully_shard.state(copy_.embed)._fsdp_param_group.fsdp_params)
    assert group.n_params == n_torch
    assert list(a.units.unit) == ["body", "[embed, norm, head]", "<root>"]  # bottom-up


def test_split_tie_is_an_error_that_torch_confirms():
    """A tied weight split across two calls: torch makes two DTensors; we report SV001."""
    model, plan = Tied(), sv.Plan(["embed", "head", ""])
    with pytest.raises(sv.PlanError, match="SV001"):
        sv.analyze(model, plan, sv.Mesh(4))
    a = sv.analyze(model, plan, sv.Mesh(4), strict=False)
    assert [f.code for f in a.findings if f.severity == "error"] == ["SV001"]
    assert sv.verify(model, plan, mesh=sv.Mesh(4)).empty  # per-name prediction still matches torch


def test_tie_left_outside_every_call_is_reported():
    model, plan = Tied(), sv.Plan(["embed"])
    a = sv.analyze(model, plan, sv.Mesh(4), strict=False)
    assert "SV006" in [f.code for f in a.findings]
    assert sv.verify(model, plan, mesh=sv.Mesh(4)).empty


def test_scalar_parameter_refused_like_torch():
    model = Odd()
    model.temp = torch.nn.Parameter(torch.tensor(1.0))
    with pytest.raises(sv.PlanError, match="temp"):
        sv.analyze(model, sv.Plan([""]), sv.Mesh(2))
    from shardviz.export.oracle import fake_process_group, device_mesh, apply_plan, meta_copy

    with fake_process_group(0, 2), pytest.raises(ValueError, match="scalar"):
        apply_plan(meta_copy(model), sv.Plan([""]), device_mesh(sv.Mesh(2)))
    # Ignoring it is the way out, and torch agrees.
    assert sv.verify(model, sv.Plan([""], ignored=["temp"]), mesh=sv.Mesh(2)).empty


def test_mixed_trainable_dtypes_in_one_call_is_an_error():
    model = MixedFrozen()
    model.frozen16.requires_grad_(True)
    with pytest.raises(sv.PlanError, match="SV003"):
        sv.analyze(model, sv.Plan([""]), sv.Mesh(2))
    # Frozen parameters of several dtypes in one call are fine.
    assert not sv.analyze(MixedFrozen(), sv.Plan([""]), sv.Mesh(2)).errors


def test_grouped_root_is_an_error():
    with pytest.raises(sv.PlanError, match="SV004"):
        sv.analyze(Odd(), sv.Plan([["a", "b"]]), sv.Mesh(2))


def test_int_reshard_after_forward_like_torch():
    """torch takes a divisor of the shard size (1 means False, the shard size True) and refuses the rest."""
    from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

    mesh = sv.Mesh(8)
    with pytest.raises(sv.PlanError, match="SV005"):
        sv.analyze(Odd(), sv.Plan([sv.Unit("a", reshard_after_forward=3), ""]), mesh)
    with fake_process_group(0, 8), pytest.raises(ValueError, match="factor of 8"):
        apply_plan(meta_copy(Odd()), sv.Plan([sv.Unit("a", reshard_after_forward=3), ""]), device_mesh(mesh))
    for value, effective in ((4, 4), (8, True), (1, False)):
        plan = sv.Plan([sv.Unit("a", reshard_after_forward=value), ""])
        a = sv.analyze(Odd(), plan, mesh)
        assert a.units.set_index("unit").at["a", "reshard_after_forward"] == effective
        assert sv.verify(Odd(), plan, mesh=mesh, ranks=[0]).empty  # torch accepts it


def test_local_shape_matches_torch_chunk():
    """The arithmetic itself, checked against torch.chunk on every rank for many shapes."""
    from shardviz.fsdp import local_rows

    for dim0 in range(0, 20):
        for world in (1, 2, 3, 4, 5, 8, 16):
            chunks = torch.chunk(torch.empty(dim0, 1), world, dim=0) if dim0 else ()
            for rank in range(world):
                want = chunks[rank].shape[0] if rank < len(chunks) else 0
                assert local_rows(dim0, world, rank) == want, (dim0, world, rank)


def test_unknown_parameter_in_local_shape():
    a = sv.analyze(Odd(), sv.Plan([""]), sv.Mesh(2))
    with pytest.raises(ValueError, match="a.wieght.*a.weight"):
        a.local_shape("a.wieght", 0)
    with pytest.raises(ValueError, match="rank 2"):
        a.local_shape("a.weight", 2)


def test_weird_keys_are_addressed_exactly():
    model = WeirdKeys()
    a = sv.analyze(model, sv.Plan(["blocks.quote'\"", "blocks.back\\slash"]), sv.Mesh(2))
    status = dict(zip(a.params.fqn, a.params.unit))
    assert status["blocks.quote'\".weight"] == "blocks.quote'\""
    assert status["blocks.ünï.weight"] is None


def _params_by_rows(a):
    """``a.params`` as pandas builds it from one dict per parameter, read off the layout one parameter
    at a time (how it was built before it was built from the tree's arrays)."""
    import pandas as pd

    lay, rows = a.layout, []
    for p in a.tree.params:
        status = lay.param_status[p.index]
        sharded = status == "sharded"
        rows.append({
            "fqn": p.fqn, "aliases": p.fqns[1:], "shape": p.shape, "dtype": str(p.dtype).replace("torch.", ""),
            "numel": p.numel, "bytes": p.nbytes, "requires_grad": p.requires_grad, "role": p.role, "status": status,
            "unit": a.unit_label(lay.param_unit[p.index]),
            "shard_shape": lay.shard_shape(p.index) if sharded else p.shape,
            "shard_bytes": (lay.padded_shard_numel(p.index) if sharded else p.numel) * p.itemsize,
            "padding_numel": lay.padded_shard_numel(p.index) * a.mesh.shard - p.numel if sharded else 0,
        })
    table = pd.DataFrame(rows)
    if a.tp_placements:
        table.insert(3, "full_shape", [p.shape for p in a.full_tree.params])
        table.insert(4, "tp_placement", [a.tp_placements.get(p.index) for p in a.tree.params])
    table["unit"] = pd.Series([r["unit"] for r in rows], dtype=object)
    return table


@pytest.mark.parametrize("name,factory,units", handmade_cases(), ids=[c[0] for c in handmade_cases()])
def test_the_params_table_is_the_frame_of_its_rows(name, factory, units):
    """``a.params`` is built a column at a time; it is the frame pandas builds from its rows, dtypes,
    None for no call and the padding of uneven shards included."""
    import pandas as pd
    from shardviz import zoo

    cases = [(factory(), sv.Plan(units), sv.Mesh(3))]
    if name == handmade_cases()[0][0]:  # once: a peft model, LoRA ignored and sharded, and a 2-D mesh
        lora = zoo.tiny_llama_lora()
        cases += [(lora, sv.Plan.auto(lora, lora=how), sv.Mesh(4)) for how in ("ignored", "sharded")]
        cases.append((lora, sv.Plan.auto(lora, tensor_parallel="torchtitan"), sv.Mesh(shard=2, tensor=2)))
    for model, plan, mesh in cases:
        a = sv.analyze(model, plan, mesh, strict=False)
        pd.testing.assert_frame_equal(a.params, _params_by_rows(a))
