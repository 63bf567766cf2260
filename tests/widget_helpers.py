"""Shared by the Inspector's tests (tests/test_widget_*.py): the names of the tiny Llama + LoRA's
modules, the mesh, and the check that every number shown equals ``sv.analyze`` run afresh.

The fixtures (``model``, ``st``, ``ins``) are in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path


import shardviz as sv
from shardviz.views import display
from shardviz.widget import Inspector
from shardviz.widget import bundle

L0 = "base_model.model.model.layers.0"
L1 = "base_model.model.model.layers.1"
LAYERS = "base_model.model.model.layers"
EMBED = "base_model.model.model.embed_tokens"
Q0 = L0 + ".self_attn.q_proj"
Q0_A = Q0 + ".lora_A.default.weight"
Q0_BASE = Q0 + ".base_layer.weight"
MESH = sv.Mesh(shard=4)


def fresh(model, st_or_ins):
    """``sv.analyze`` from scratch (a new tree) for the state's current plan, mesh and training."""
    return sv.analyze(model, st_or_ins.plan, st_or_ins.mesh, st_or_ins.training, strict=False)


def assert_numbers_match(model, st):
    """Every number the widget shows equals a fresh ``sv.analyze`` of the same plan."""
    a = fresh(model, st)
    mem = st.memory
    assert mem["available"]
    table = a.memory
    assert mem["max_peak"] == int(table["peak"].max())
    assert mem["n_ranks"] == len(table) == st.mesh.world
    for bar in mem["bars"]:
        for rank in range(bar["first"], bar["last"] + 1):
            row = table[table["rank"] == rank].iloc[0]
            assert bar["peak"] == int(row["peak"])
            assert sum(bar["parts"].values()) == int(row["peak"])  # the stack sums to the peak
            assert bar["parts"] == display.peak_breakdown(a, rank)  # the one breakdown, not a split of its own
            assert list(bar["parts"]) == list(display.PEAK_PARTS)
            assert bar["parts"]["optimizer states"] == int(row["optimizer"])
            assert bar["parts"]["sharded params"] + bar["parts"]["whole params"] == int(row["params"])
    covered = sorted(r for b in mem["bars"] for r in range(b["first"], b["last"] + 1))
    assert covered == list(range(st.mesh.world))
    comm = a.comm
    tr = st.traffic
    for c in tr["by_collective"]:
        sub = comm[comm["collective"] == c["collective"]]
        assert c["sent"] == int(sub["sent_bytes"].sum())
        assert c["bytes"] == int(sub["bytes"].sum())
        assert c["count"] == int(sub["count"].sum())
    assert tr["total_sent"] == int(comm["sent_bytes"].sum())
    for u in tr["by_unit"]:
        if u.get("other"):
            continue
        sub = comm[comm["unit"] == u["unit"]] if u["unit"] != "(outside FSDP)" else comm[comm["unit"].isna()]
        assert u["total"] == int(sub["sent_bytes"].sum())
    assert [(f["code"], f["severity"], f["message"]) for f in st.findings] == [
        (f.code, f.severity, f.message) for f in a.findings
    ]
    # the tree's per-rank bytes of the root: every parameter's padded shard (or whole tensor)
    params = a.params
    assert st.stats.rank_bytes[0] == int(params["shard_bytes"].sum())


def rows_by_fqn(st):
    order, rows = st.rows()
    return {r["fqn"]: r for r in (rows[i] for i in order) if r["kind"] != "group"}, order, rows


def open_path(st, fqn):
    st.reveal(fqn)
    return rows_by_fqn(st)[0]


def open_and_get(st):
    st.expand("base_model")
    st.expand("base_model.model")
    st.expand("base_model.model.model")
    st.expand(LAYERS)
    return st


def torch_shard(model, plan, mesh, rank, fqn):
    """(padded shard shape, local shape) of parameter ``fqn`` on ``rank``, from torch's own fully_shard."""
    from torch.distributed.fsdp import fully_shard

    from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

    copy_ = meta_copy(model)
    with fake_process_group(rank, mesh.world):
        apply_plan(copy_, plan, device_mesh(mesh))
        target = copy_.get_parameter(fqn)
        for unit in plan.units:
            group = fully_shard.state(copy_.get_submodule(unit.modules[0]))._fsdp_param_group
            for fp in group.fsdp_params if group is not None else ():
                if fp.sharded_param is target:
                    return tuple(fp.padded_sharded_param_size), tuple(fp.sharded_size)
    raise AssertionError(f"torch did not shard {fqn}")


def saved(path) -> sv.Plan:
    return sv.Plan.from_json(Path(path).read_text())


class Wire:
    """Records what the widget sends: custom messages and trait changes, in order."""

    def __init__(self, ins: Inspector):
        self.log: list[tuple[str, object]] = []
        ins.send = lambda msg, buffers=None: self.log.append(("msg", msg))
        ins.observe(lambda c: self.log.append(("trait", c["name"])),
                         names=["memory", "traffic", "findings", "summary", "code", "messages", "verify_result"])

    def msgs(self, kind):
        return [m for t, m in self.log if t == "msg" and m["type"] == kind]

    def clear(self):
        self.log.clear()


def group_id(st):
    order, _ = st.rows()
    return next(i for i in order if i.startswith("g"))


def front_end_source() -> str:
    """The front end's ES module as the widget ships it (widget/bundle.py: front/*.js and charts.js)."""
    return bundle.bundle()
