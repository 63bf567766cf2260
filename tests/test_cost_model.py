"""``sv.Training``, the shape of ``a.memory`` / ``a.comm``, link times, SV201, offload (speed: benchmarks/bench_analyze.py).

The numbers themselves are checked against torch in ``test_cost_truth.py`` and
``test_cost_gloo.py``; here: the API, internal consistency, per-rank differences (against the
local shapes torch's own ``fully_shard`` gives), and that the tables are fast enough for a widget.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import shardviz as sv
from shardviz.checks import check_memory as memory_findings
from shardviz.run.training import Training
from shardviz.step.model import STR_DTYPE
from torch_truth import tiny_lora

MEMORY_COLUMNS = {"rank", "params", "grads", "optimizer", "peak", "params_sharded", "params_whole", "buffers",
                  "grads_sharded", "grads_whole", "state", "peak_phase", "peak_unit", "peak_transient",
                  "cpu_params", "cpu_grads", "cpu_optimizer", "cpu_peak"}
COMM_COLUMNS = ["unit", "collective", "phase", "group", "group_size", "count", "dtype", "bytes", "sent_bytes", "time_s",
                "latency_s"]


@pytest.fixture(scope="module")
def uneven():
    return tiny_lora(r=6, vocab=100)


# -- Training -----------------------------------------------------------------------------------
def test_training_defaults_and_names():
    t = sv.Training()
    assert t.optimizer == "adamw" and t.n_states == 2 and t.step_scalars
    assert Training(optimizer="AdamW").optimizer == "adamw"
    assert Training(optimizer="sgd").n_states == 0
    assert Training(optimizer="sgd-momentum").n_states == 1
    assert Training(optimizer=3, optimizer_dtype="float32").n_states == 3
    assert not Training(optimizer=2).step_scalars
    assert Training(param_dtype="torch.bfloat16").param_dtype == "bfloat16"


@pytest.mark.parametrize("kwargs", [{"optimizer": "lion"}, {"optimizer": -1}, {"optimizer": True},
                                    {"param_dtype": "int8"}, {"reduce_dtype": "fp8"}, {"optimizer_dtype": "x"}])
def test_training_rejects(kwargs):
    with pytest.raises(ValueError):
        Training(**kwargs)


def test_unit_defaults_fill_only_what_the_unit_leaves_open():
    t = Training(param_dtype="bfloat16", reduce_dtype="float32", offload=True)
    u = t.unit_defaults(sv.Unit("a"))
    assert (u.param_dtype, u.reduce_dtype, u.offload) == ("bfloat16", "float32", True)
    own = t.unit_defaults(sv.Unit("a", param_dtype="float32", reshard_after_forward=2))
    assert (own.param_dtype, own.reduce_dtype, own.reshard_after_forward) == ("float32", "float32", 2)
    assert Training(param_dtype=None, reduce_dtype=None).unit_defaults(sv.Unit("a")) == sv.Unit("a")
    assert Training().unit_defaults(sv.Unit("a")) == sv.Unit("a", param_dtype="bfloat16", reduce_dtype="float32")


def test_unit_defaults_kept_per_training_are_no_part_of_it():
    """Each unit a training filled in is kept (every change of plan asks again for every call):
    equal units get the same answer, another option its own, and the training still equals,
    hashes, lists its fields and copies as those fields say, ``Training(**t.__dict__)`` too."""
    t = Training(param_dtype="bfloat16")
    first = t.unit_defaults(sv.Unit("a"))
    assert t.unit_defaults(sv.Unit("a")) is first and first == sv.Unit("a", param_dtype="bfloat16", reduce_dtype="float32")
    assert t.unit_defaults(sv.Unit("a", reduce_dtype="bfloat16")).reduce_dtype == "bfloat16"
    same = Training(param_dtype="bfloat16")
    assert t == same and hash(t) == hash(same) and repr(t) == repr(same)
    assert [f.name for f in dataclasses.fields(t)] == [f.name for f in dataclasses.fields(Training)]
    assert dataclasses.replace(t, param_dtype="float16").unit_defaults(sv.Unit("a")).param_dtype == "float16"
    assert Training(**t.__dict__) == t


def test_a_change_of_plan_reuses_the_places_of_the_calls_it_keeps(model):
    """Where each call's hooks run is kept per walk (``step.calls.call_places``): the calls of an
    edited plan equal those a fresh tree of the same model computes."""
    tree, mesh = sv.ModelTree(model), sv.Mesh(4)
    plan = sv.Plan.auto(tree, lora="sharded")
    sv.analyze(tree, plan, mesh).memory  # noqa: B018 - the places of every call of the plan
    edited = plan.without_unit(plan.units[1].modules[0])
    assert sv.analyze(tree, edited, mesh).costs.calls == sv.analyze(sv.ModelTree(model), edited, mesh).costs.calls



def test_a_change_of_plan_with_activations_reads_what_a_fresh_tree_reads(model):
    """With activations, the levels of one step are kept per tree (``step.levels.activation_levels``)
    and each call's gradient parts per walk (``step.calls.CallPlaces.gradients``): an edited plan analysed
    after the plan it edits has the tables and step of the same plan on a fresh tree."""
    tree, mesh, step = sv.ModelTree(model), sv.Mesh(4), Training(batch_size=2, seq_len=64)
    plan = sv.Plan.auto(tree, lora="sharded")
    a = sv.analyze(tree, plan, mesh, step)
    edited = plan.without_unit(plan.units[1].modules[0])
    b = sv.analyze(tree, edited, mesh, step)
    assert b.activation_levels() is a.activation_levels()
    fresh = sv.analyze(sv.ModelTree(model), edited, mesh, step)
    assert fresh.activation_levels() is not b.activation_levels()
    pd.testing.assert_frame_equal(b.memory, fresh.memory)
    pd.testing.assert_frame_equal(b.comm, fresh.comm)
    assert b.costs.step == fresh.costs.step

# -- memory table ---------------------------------------------------------------------------------
def test_memory_one_row_per_rank_and_consistent(model):
    a = sv.analyze(model, sv.Plan.auto(model, lora="ignored"), sv.Mesh(shard=4, replicate=2))
    mem = a.memory
    assert MEMORY_COLUMNS <= set(mem.columns)
    assert list(mem["rank"]) == list(range(8))
    assert (mem.params == mem.params_sharded + mem.params_whole).all()
    assert (mem.grads == mem.grads_sharded + mem.grads_whole).all()
    assert (mem.state == mem.params + mem.buffers + mem.grads + mem.optimizer).all()
    assert (mem.peak >= mem.state).all()
    numeric = mem.drop(columns=["rank", "replica", "peak_phase", "peak_unit"])
    assert (numeric.iloc[:4].to_numpy() == numeric.iloc[4:].to_numpy()).all()  # replicas hold the same
    assert (mem.params_whole > 0).all()  # LoRA ignored: whole adapters on every rank


def test_optimizer_per_rank_follows_torchs_local_shapes(uneven):
    """Later ranks hold fewer rows (or none) of an unevenly sharded parameter: optimizer states shrink,
    padded buffers do not. Expected values come from torch's own fully_shard (local shapes)."""
    from shardviz.export.oracle import torch_layout

    plan, mesh = sv.Plan.auto(uneven, lora="sharded"), sv.Mesh(8)
    a = sv.analyze(uneven, plan, mesh)
    trainable = {n: p for n, p in uneven.named_parameters() if p.requires_grad}
    for rank in (0, 6, 7):
        torch_rows = torch_layout(uneven, plan, mesh, rank)
        local = sum(math.prod(r.local_shape) * trainable[r.fqn].element_size()
                    for r in torch_rows.itertuples() if r.fqn in trainable)
        assert a.memory.at[rank, "optimizer"] == 2 * local
    assert a.memory.at[7, "optimizer"] < a.memory.at[0, "optimizer"]
    assert a.memory.params.nunique() == 1 and a.memory.grads.nunique() == 1


def test_optimizer_options_scale_states(model):
    plan, mesh = sv.Plan.auto(model, lora="ignored"), sv.Mesh(8)
    adamw = sv.analyze(model, plan, mesh, Training()).memory.iloc[0]
    two = sv.analyze(model, plan, mesh, Training(optimizer=2)).memory.iloc[0]
    bf16 = sv.analyze(model, plan, mesh, Training(optimizer=2, optimizer_dtype="bfloat16")).memory.iloc[0]
    sgd = sv.analyze(model, plan, mesh, Training(optimizer="sgd")).memory.iloc[0]
    assert two.optimizer == adamw.optimizer and two.cpu_optimizer == 0 < adamw.cpu_optimizer
    assert bf16.optimizer * 2 == two.optimizer  # fp32 LoRA weights, bf16 states
    assert sgd.optimizer == 0 and sgd.peak < adamw.peak


def test_mixed_precision_shrinks_gathers_not_shards(model):
    plan, mesh = sv.Plan.auto(model, lora="sharded"), sv.Mesh(8)
    fp32 = sv.analyze(model, plan, mesh, Training(param_dtype=None, reduce_dtype=None))
    bf16 = sv.analyze(model, plan, mesh, Training(param_dtype="bfloat16"))
    assert (bf16.memory.params == fp32.memory.params).all()  # shards keep the original dtype
    f, b = fp32.comm, bf16.comm
    gathers = lambda c: c[c.collective == "all_gather"].bytes.sum()  # noqa: E731
    assert gathers(b) * 2 == gathers(f)
    assert set(b[b.collective == "all_gather"].dtype) == {"bfloat16"}
    assert bf16.memory.peak.max() < fp32.memory.peak.max()


def test_offload_moves_state_to_the_cpu(model):
    plan, mesh = sv.Plan.auto(model, lora="sharded"), sv.Mesh(8)
    on = sv.analyze(model, plan, mesh, Training(offload=True)).memory.iloc[0]
    off = sv.analyze(model, plan, mesh).memory.iloc[0]
    assert on.params_sharded == 0 and on.cpu_params == off.params_sharded
    assert on.grads_sharded == 0 and 0 < on.cpu_grads <= off.grads_sharded  # copied to the CPU unpadded
    assert on.optimizer == 0 and on.cpu_optimizer == off.optimizer + off.cpu_optimizer
    assert on.peak < off.peak
    # a unit's own offload moves only that call's shards
    head = next(u for u in plan.units if u.is_grouped)
    one = sv.analyze(model, plan.with_unit_options(head.modules[0], offload=True), mesh).memory.iloc[0]
    assert 0 < one.cpu_params < off.params_sharded


# -- comm table -----------------------------------------------------------------------------------
def test_comm_rows_and_ring_bytes(model):
    # no mixed precision: an all-gather's output is the call's padded unsharded bytes in their own dtype
    a = sv.analyze(model, sv.Plan.auto(model, lora="sharded"), sv.Mesh(shard=4, replicate=2),
                   Training(param_dtype=None, reduce_dtype=None))
    comm = a.comm
    assert list(comm.columns) == COMM_COLUMNS
    assert set(comm.collective) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert set(comm.phase) <= {"forward", "backward", "optimizer"}
    n = comm.group_size
    factor = np.where(comm.collective == "all_reduce", 2, 1)
    assert (comm.sent_bytes == factor * comm.bytes * (n - 1) // n).all()
    # one forward all-gather per call with parameters, its full output: world x padded shards
    forward = comm[(comm.collective == "all_gather") & (comm.phase == "forward")]
    units = a.units[a.units.n_params > 0]
    assert sorted(forward.unit) == sorted(units.unit)
    assert dict(zip(forward.unit, forward.bytes)) == dict(zip(units.unit, units.padded_unsharded_bytes))
    # HSDP: every reduce-scatter is followed by an all-reduce of its output over the replicas
    rs, ar = comm[comm.collective == "reduce_scatter"], comm[comm.collective == "all_reduce"]
    assert list(rs.unit) == list(ar.unit) and (ar.bytes * 4 == rs.bytes.to_numpy()).all()
    assert set(ar.group) == {"replicate"} and set(ar.group_size) == {2}


def test_time_per_step_from_link_bandwidths(model):
    plan = sv.Plan.auto(model, lora="sharded")
    no_bw = sv.analyze(model, plan, sv.Mesh(shard=4, replicate=2)).comm
    assert no_bw.time_s.isna().all() and math.isnan(no_bw.attrs["time_per_step_s"])
    mesh = sv.Mesh(shard=4, replicate=2, ranks_per_node=4, intra_node_gbps=100, inter_node_gbps=10)
    a = sv.analyze(model, plan, mesh)
    comm = a.comm
    bw = np.where(comm.group == "shard", 100e9, 10e9)  # shard groups inside a node, replicas across
    from shardviz.step.timing import efficiency_for

    bus = efficiency_for(a.tree, mesh).collective_bus  # one call's duration: latency + bytes at the bus share
    assert np.allclose(comm.time_s, comm.latency_s + comm.sent_bytes / (bw * bus), rtol=1e-12, atol=0)
    assert comm.attrs["time_per_step_s"] == pytest.approx((comm.time_s * comm["count"]).sum())


def _rebuilt(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` built again by pandas' constructor from its values: the unit columns as object
    Series (their None kept), numbers as arrays, every other column as a list pandas infers."""
    def column(name: str, values: pd.Series):
        if name in ("unit", "peak_unit", "peak_module"):
            return pd.Series(values.tolist(), dtype=object)
        return values.to_numpy() if pd.api.types.is_numeric_dtype(values.dtype) else values.tolist()
    return pd.DataFrame({name: column(name, table[name]) for name in table.columns})


@pytest.mark.parametrize("mesh", [sv.Mesh(1), sv.Mesh(shard=4, replicate=2)], ids=["one-rank", "hsdp"])
def test_tables_are_the_frames_pandas_builds(model, mesh):
    """The comm table's str columns are built without the constructor's inference
    (``step.model._str_column``): each table is the frame the constructor builds from its values,
    dtypes and labels included (str columns as pandas infers them, object ones with None kept, one
    rank's empty comm table)."""
    a = sv.analyze(model, sv.Plan.auto(model, lora="sharded"), mesh)
    for table in (a.memory, a.comm):
        pd.testing.assert_frame_equal(table, _rebuilt(table), check_dtype=True, check_column_type=True,
                                      check_index_type=True, check_exact=True)
    assert a.memory.peak_unit.dtype == object and a.memory.peak_phase.dtype == STR_DTYPE
    assert a.comm.empty or a.comm.collective.dtype == STR_DTYPE
    assert (len(a.comm) == 0) == (mesh.world == 1)


# -- SV201 --------------------------------------------------------------------------------------------
def test_device_memory_finding(model):
    plan = sv.Plan.auto(model, lora="sharded")
    fits = sv.analyze(model, plan, sv.Mesh(8, device_memory="80GiB"))
    assert memory_findings(fits) == [] and not [f for f in fits.findings if f.code == "SV201"]
    tight = sv.analyze(model, plan, sv.Mesh(8, device_memory="100KiB"))
    found = memory_findings(tight)
    assert [f.code for f in found] == ["SV201"] and found[0].severity == "error"
    message = found[0].message
    parts = tight.peak_breakdown(0)
    top = max(parts, key=parts.get)
    assert message.startswith(tight.fit.headline) and top in message and "layers" in message
    assert any(f.code == "SV201" for f in tight.findings)
    assert found[0].fix


def test_execution_walk_follows_the_order_it_is_given(model):
    """The walk is cached per tree and order (the last order by identity): alternating two orders,
    or passing an equal order that is another object, gives each order's own walk."""
    from shardviz.step.walk import execution_walk

    tree = sv.ModelTree(model)
    names = [m.fqn for m in tree.modules]
    forward, backward = tuple(names), tuple(reversed(names))
    walks = [execution_walk(tree, order) for order in (forward, backward, forward, tuple(list(backward)), None)]
    assert walks[0] == walks[2] and walks[1] == walks[3] and walks[0] != walks[1]
    assert walks[4] == execution_walk(tree, None) and walks[4].enter == tuple(range(len(names)))
