"""``verify`` checks what torch does on its own: torch's statuses and the oracle's own call order."""

import pytest

import shardviz as sv
from handmade import Nested, Odd, handmade_cases
from shardviz import oracle


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
