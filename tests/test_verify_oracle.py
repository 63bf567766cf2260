"""``verify`` checks what torch does on its own: torch's statuses and the oracle's own call order."""

import pytest

import shardviz as sv
from handmade import Nested, Odd, handmade_cases
from shardviz.export import oracle


def test_ignored_and_unmanaged_come_from_torch(monkeypatch):
    """A wrong ignored/unmanaged prediction is caught: the oracle reads torch, not the plan."""
    model, plan, mesh = Odd(), sv.Plan(["a", "b"], ignored=["b.bias"]), sv.Mesh(4)
    assert sv.verify(model, plan, mesh=mesh).empty
    rows = oracle.torch_layout(model, plan, mesh, rank=0).set_index("fqn")
    assert rows.at["b.bias", "status"] == "ignored"  # plain tensor under an FSDP module
    assert rows.at["c.weight", "status"] == "unmanaged"  # plain tensor under no FSDP module
    real = oracle.analyze

    def lying(*args, **kwargs):
        a = real(*args, **kwargs)
        lay = a.layout
        lay.param_status[a.tree.param_index["b.bias"]] = "unmanaged"
        lay.param_status[a.tree.param_index["c.weight"]] = "ignored"
        lay.would_be_unit[a.tree.param_index["c.weight"]] = 0
        return a

    monkeypatch.setattr(oracle, "analyze", lying)
    diff = sv.verify(model, plan, mesh=mesh, ranks=[0])
    assert set(diff[diff.field == "status"].fqn) == {"b.bias", "c.weight"}


def test_ignored_parameter_no_call_reaches_is_unmanaged_to_torch():
    model, plan = Odd(), sv.Plan(["a"], ignored=["scale", "c.weight"])
    rows = oracle.torch_layout(model, plan, sv.Mesh(2), rank=0).set_index("fqn")
    assert rows.at["scale", "status"] == "unmanaged" and rows.at["c.weight", "status"] == "unmanaged"
    assert sv.verify(model, plan, mesh=sv.Mesh(2)).empty


@pytest.mark.parametrize("name,factory,units", handmade_cases(), ids=[c[0] for c in handmade_cases()])
def test_oracle_order_is_its_own(name, factory, units, monkeypatch):
    """The oracle orders the calls from the module objects; verify still agrees when the engine's own
    order is scrambled (so verify does not lean on it)."""
    model, plan = factory(), sv.Plan(units)
    order = oracle.bottom_up_order(model, plan)
    position = {u: i for i, u in enumerate(order)}
    for u, unit in enumerate(plan.units):
        inside = [model.get_submodule(m) for m in unit.modules]
        for v, other in enumerate(plan.units):
            if v != u and any(model.get_submodule(o) in set(x.modules()) - {x} for o in other.modules for x in inside):
                assert position[v] < position[u], (plan.units[v].name, unit.name)
    from shardviz.fsdp import Layout

    original = Layout._order_units

    def scrambled(self, own, owner):
        original(self, own, owner)
        self.order = list(reversed(self.order))

    monkeypatch.setattr(Layout, "_order_units", scrambled)
    assert sv.verify(model, plan, mesh=sv.Mesh(4), ranks=[3]).empty


def test_no_bottom_up_order_is_refused():
    """A group with one module inside another call and one around it: no order works."""
    plan = sv.Plan([["outer.1.0", "outer"], "outer.1", ""])
    with pytest.raises(ValueError, match="bottom-up"):
        oracle.bottom_up_order(Nested(), plan)


# -- issue 24: every plan shardviz produces ------------------------------------------------------------
def _archs():
    from torch_truth import tiny_gpt2, tiny_lora, tiny_mixtral

    return {"llama-lora": tiny_lora, "gpt2": tiny_gpt2, "mixtral": tiny_mixtral}


def _offloaded(plan):
    return plan.with_units([sv.Unit(u.modules, u.reshard_after_forward, u.param_dtype, u.reduce_dtype, True)
                            for u in plan.units])


def _nested(model, plan):
    """A call on the first checkpointed block's first child with parameters, inside the block's call."""
    block = next(iter(plan.checkpoint))
    child = next(n for n, m in model.get_submodule(block).named_children() if any(True for _ in m.parameters()))
    return plan.with_unit(f"{block}.{child}")


PLANS = {
    "checkpointed": lambda m: sv.Plan.auto(m, checkpoint="blocks"),
    "selective": lambda m: sv.Plan.auto(m, checkpoint="selective"),
    "offloaded": lambda m: _offloaded(sv.Plan.auto(m, checkpoint="blocks")),
    "nested": lambda m: _nested(m, sv.Plan.auto(m, checkpoint="every 2")),
}


@pytest.mark.parametrize("kind", PLANS)
@pytest.mark.parametrize("arch", ["llama-lora", "gpt2", "mixtral"])
def test_verify_agrees_on_every_kind_of_plan(arch, kind):
    """Before issue 24 every checkpointed plan raised KeyError ('..._checkpoint_wrapped_module...'):
    torch's names have checkpoint_wrapper's inner module in them."""
    model = _archs()[arch]()
    plan = PLANS[kind](model)
    assert plan.checkpoint
    for mesh in (sv.Mesh(4), sv.Mesh(shard=2, replicate=2)):
        diff = sv.verify(model, plan, mesh=mesh, ranks=[0, mesh.world - 1])
        assert diff.empty, diff.head().to_string()


def test_verify_with_the_training_offload():
    from torch_truth import tiny_lora

    model = tiny_lora()
    plan = sv.Plan.auto(model, checkpoint="blocks")
    training = sv.Training(offload=True, param_dtype="bfloat16", batch_size=2, seq_len=16)
    assert sv.verify(model, plan, mesh=sv.Mesh(4), training=training).empty


def test_verify_leaves_no_traceback_prefix():
    """torch's init_process_group wraps sys.excepthook to prefix tracebacks with '[rank<r>]: ' and
    never unwraps it: after three verifies every later traceback read '[rank7]: [rank4]: [rank0]: '."""
    import sys

    from torch_truth import tiny_lora

    hook = sys.excepthook
    model = tiny_lora()
    sv.verify(model, sv.Plan.auto(model), mesh=sv.Mesh(8))
    assert sys.excepthook is hook
    import torch.distributed as dist

    assert not dist.is_initialized()


@pytest.mark.parametrize("kind", ["checkpointed", "selective", "offloaded"])
def test_the_inspector_verifies_what_python_verifies(kind):
    """The Inspector's "verify with torch" is sv.verify with its plan, mesh and training (before
    issue 24: the KeyError on every checkpointed plan, shown as if torch had refused)."""
    from torch_truth import tiny_lora

    from shardviz.widget.controller import InspectorState

    model = tiny_lora()
    training = sv.Training(offload=kind == "offloaded")
    st = InspectorState(model, plan=PLANS[kind](model), mesh=sv.Mesh(shard=2, replicate=2), training=training)
    result = st.verify()
    assert result["ok"] and result["n"] == 0 and result["error"] is None, result
