"""One test per overlap rule of shardviz.step.schedule against hand-built schedules.

Every expected time below is worked out by hand from the rule named in the test (docs/step-time.md),
on three units A, B, C in forward order with round seconds, not read back from the code.
Base case: forward 2 s, backward 4 s, all-gather 1 s (forward and backward), reduce-scatter 1.5 s.
"""


import pytest

from shardviz.run.devices import DEVICES, Efficiency
from shardviz.step.collectives import collective_seconds
from shardviz.step.schedule import StepExtras, optimizer_seconds, schedule_step, timed


def unit(name, **kw):
    base = dict(forward_s=2.0, backward_s=4.0, all_gather_forward_s=1.0, all_gather_backward_s=1.0, reduce_scatter_s=1.5)
    base.update(kw)
    return timed(name, **base)


def three(**per_unit):
    return [unit(n, **per_unit.get(n, {})) for n in "ABC"]


def bar(schedule, unit_name, kind, phase=None):
    found = [e for e in schedule.events if e.unit == unit_name and e.kind == kind and (phase is None or e.phase == phase)]
    assert len(found) == 1, (unit_name, kind, phase, found)
    return found[0]


def span(event):
    return (event.start_s, event.end_s)


def test_first_all_gather_is_exposed_and_the_next_overlaps_the_previous_compute():
    s = schedule_step(three())
    # A's all-gather [0, 1] has nothing to hide behind; A computes [1, 3]
    assert span(bar(s, "A", "all_gather", "forward")) == (0, 1) and bar(s, "A", "all_gather", "forward").exposed_s == 1
    assert span(bar(s, "A", "forward")) == (1, 3)
    # B's pre-forward runs while A computes: its all-gather [1, 2] is hidden by A's [1, 3]
    assert span(bar(s, "B", "all_gather", "forward")) == (1, 2) and not bar(s, "B", "all_gather", "forward").exposed
    assert span(bar(s, "B", "forward")) == (3, 5)
    assert span(bar(s, "C", "all_gather", "forward")) == (3, 4) and span(bar(s, "C", "forward")) == (5, 7)


def test_a_forward_all_gather_longer_than_the_previous_compute_shows_the_difference():
    s = schedule_step(three(B={"all_gather_forward_s": 3.0}))
    # B's all-gather [1, 4] outlasts A's compute [1, 3]: B starts at 4, 1 s exposed on B
    assert span(bar(s, "B", "all_gather", "forward")) == (1, 4)
    assert bar(s, "B", "all_gather", "forward").exposed_s == 1
    assert span(bar(s, "B", "forward")) == (4, 6)
    # C's all-gather queues behind B's on the one all-gather stream: [4, 5], hidden by B's compute
    assert span(bar(s, "C", "all_gather", "forward")) == (4, 5) and span(bar(s, "C", "forward")) == (6, 8)


# The rules with the reduce-scatters on a communicator of their own (``set_separate_reduce_scatter_group``);
# torch's default, one communicator for both, is tested below ("shared communicator").
SEPARATE = {"separate_reduce_scatter_group": True}


def test_backward_all_gathers_are_prefetched_one_ahead_in_reverse_order():
    s = schedule_step(three(), **SEPARATE)
    # backward starts at 7 with C: its own all-gather [7, 8] is exposed, B's is prefetched right behind it
    assert span(bar(s, "C", "all_gather", "backward")) == (7, 8) and bar(s, "C", "all_gather", "backward").exposed_s == 1
    assert span(bar(s, "B", "all_gather", "backward")) == (8, 9)
    assert span(bar(s, "C", "backward")) == (8, 12)
    # B's pre-backward (at 12) prefetches A: [12, 13], hidden by B's backward [12, 16]
    assert span(bar(s, "A", "all_gather", "backward")) == (12, 13) and span(bar(s, "B", "backward")) == (12, 16)
    assert [k for k in s.issue_order if k[0] in ("all_gather", "backward")][3:] == [
        ("all_gather", "C"), ("all_gather", "B"), ("backward", "C"), ("all_gather", "A"), ("backward", "B"),
        ("backward", "A")]


def test_each_reduce_scatter_overlaps_the_next_backward_and_the_last_is_exposed():
    s = schedule_step(three())
    assert span(bar(s, "C", "reduce_scatter")) == (12, 13.5)  # under B's backward [12, 16]
    assert span(bar(s, "B", "reduce_scatter")) == (16, 17.5)  # under A's backward [16, 20]
    assert not bar(s, "C", "reduce_scatter").exposed and not bar(s, "B", "reduce_scatter").exposed
    assert span(bar(s, "A", "reduce_scatter")) == (20, 21.5) and bar(s, "A", "reduce_scatter").exposed_s == 1.5
    # exposed: A's first all-gather 1 + C's backward all-gather 1 + A's reduce-scatter 1.5
    assert s.step_time_s == 21.5 and s.exposed_comm_s == 3.5 and s.compute_s == 18


def test_a_reduce_scatter_longer_than_the_next_backward_holds_the_compute_stream():
    s = schedule_step(three(A={"reduce_scatter_s": 5.0}, B={"reduce_scatter_s": 5.0}, C={"reduce_scatter_s": 5.0}),
                      **SEPARATE)
    # C's [12, 17] outlasts B's backward [12, 16]: B's post-backward waits until 17 (1 s on C)
    assert span(bar(s, "C", "reduce_scatter")) == (12, 17) and bar(s, "C", "reduce_scatter").exposed_s == 1
    assert span(bar(s, "B", "reduce_scatter")) == (17, 22)
    assert span(bar(s, "A", "backward")) == (17, 21)
    assert bar(s, "B", "reduce_scatter").exposed_s == 1  # A's post-backward waits 21 -> 22
    assert span(bar(s, "A", "reduce_scatter")) == (22, 27) and bar(s, "A", "reduce_scatter").exposed_s == 5
    assert s.step_time_s == 27


def test_shared_communicator_a_prefetched_all_gather_queues_behind_the_reduce_scatter_issued_before_it():
    """torch's default: all-gathers and reduce-scatters go through one communicator, one at a time in
    issue order (``FSDPModule.set_separate_reduce_scatter_group``'s docstring)."""
    s = schedule_step(three())
    # C's reduce-scatter [12, 13.5] is issued before B's pre-backward prefetches A: A's all-gather waits for it
    assert span(bar(s, "C", "reduce_scatter")) == (12, 13.5)
    assert span(bar(s, "A", "all_gather", "backward")) == (13.5, 14.5)  # still under B's backward [12, 16]
    assert span(bar(s, "B", "reduce_scatter")) == (16, 17.5) and span(bar(s, "A", "reduce_scatter")) == (20, 21.5)
    assert s.step_time_s == 21.5 and s.exposed_comm_s == 3.5


def test_shared_communicator_long_reduce_scatters_delay_the_next_all_gather_and_each_other():
    s = schedule_step(three(A={"reduce_scatter_s": 5.0}, B={"reduce_scatter_s": 5.0}, C={"reduce_scatter_s": 5.0}))
    # C's [12, 17]; A's all-gather, issued at 12, runs after it [17, 18]; B's post-backward waits for C's until 17
    assert span(bar(s, "C", "reduce_scatter")) == (12, 17) and bar(s, "C", "reduce_scatter").exposed_s == 1
    assert span(bar(s, "A", "all_gather", "backward")) == (17, 18) and bar(s, "A", "all_gather", "backward").exposed_s == 1
    # B's reduce-scatter, issued at 17, waits for A's all-gather on the communicator: [18, 23]
    assert span(bar(s, "B", "reduce_scatter")) == (18, 23) and span(bar(s, "A", "backward")) == (18, 22)
    assert bar(s, "B", "reduce_scatter").exposed_s == 1  # A's post-backward waits 22 -> 23
    assert span(bar(s, "A", "reduce_scatter")) == (23, 28) and s.step_time_s == 28


def test_a_backward_all_gather_over_the_post_forward_group_does_not_queue_behind_reduce_scatters():
    s = schedule_step(three(A={"reduce_scatter_s": 5.0, "backward_gather_own_group": True},
                            B={"reduce_scatter_s": 5.0}, C={"reduce_scatter_s": 5.0}))
    assert span(bar(s, "A", "all_gather", "backward")) == (12, 13)  # its own communicator
    assert span(bar(s, "B", "reduce_scatter")) == (17, 22) and s.step_time_s == 27


def test_reshard_after_forward_false_saves_the_backward_all_gather():
    s = schedule_step(three(C={"reshard_after_forward": False}))
    assert not [e for e in s.events if e.unit == "C" and e.kind == "all_gather" and e.phase == "backward"]
    # C's backward starts at 7 with nothing to wait for; B's prefetch [7, 8] hides under it
    assert span(bar(s, "C", "backward")) == (7, 11)
    assert span(bar(s, "B", "all_gather", "backward")) == (7, 8)
    assert s.step_time_s == 20.5  # one exposed second less than the base case (21.5)
    rows = s.table().set_index("unit")
    assert rows.loc["C", "all_gather_backward_s"] == 0 and rows.loc["B", "all_gather_backward_s"] == 1


def test_hsdp_all_reduce_follows_each_reduce_scatter_and_the_last_is_exposed():
    s = schedule_step(three(A={"all_reduce_s": 2.0}, B={"all_reduce_s": 2.0}, C={"all_reduce_s": 2.0}))
    assert span(bar(s, "C", "all_reduce")) == (13.5, 15.5)  # after C's reduce-scatter [12, 13.5]
    assert span(bar(s, "B", "all_reduce")) == (17.5, 19.5)
    assert span(bar(s, "A", "all_reduce")) == (21.5, 23.5)
    # the compute stream waits for every reduction at the end of backward: A's 1.5 + 2 exposed
    assert s.step_time_s == 23.5
    assert bar(s, "A", "reduce_scatter").exposed_s == 1.5 and bar(s, "A", "all_reduce").exposed_s == 2
    assert not bar(s, "B", "all_reduce").exposed


def test_the_ignored_parameters_all_reduce_and_the_optimizer_come_after_backward_exposed():
    s = schedule_step(three(), extras=StepExtras(ignored_all_reduce_s=0.5, optimizer_s=2.0))
    ar = bar(s, None, "ignored_all_reduce")
    assert span(ar) == (21.5, 22.0) and ar.exposed_s == 0.5
    assert span(bar(s, None, "optimizer")) == (22.0, 24.0)
    assert s.step_time_s == 24.0 and s.exposed_comm_s == 4.0


def test_recomputation_runs_before_the_backward_of_a_checkpointed_unit():
    s = schedule_step(three(B={"recompute_s": 2.0}))
    # B: recompute [12, 14], then backward [14, 18]; A's backward follows at 18
    assert span(bar(s, "B", "recompute")) == (12, 14) and span(bar(s, "B", "backward")) == (14, 18)
    assert span(bar(s, "A", "backward")) == (18, 22)
    assert s.issue_order.index(("recompute", "B")) == s.issue_order.index(("backward", "B")) + 1


def test_explicit_forward_prefetch_issues_the_targets_from_the_owner_hook():
    s = schedule_step(three(A={"all_gather_forward_s": 1.0}), forward_prefetch={"A": ["B", "C"]})
    # A's hook at 0 issues A, B, C back to back on the all-gather stream
    assert [span(bar(s, n, "all_gather", "forward")) for n in "ABC"] == [(0, 1), (1, 2), (2, 3)]
    # torch issues explicit targets after the group's own pre-forward has returned
    assert s.issue_order[:4] == (("all_gather", "A"), ("forward", "A"), ("all_gather", "B"), ("all_gather", "C"))


def test_explicit_backward_prefetch_replaces_the_default():
    s = schedule_step(three(), backward_prefetch={"C": ["B", "A"]})
    # C's hook at 7: C [7, 8], then B [8, 9] and A [9, 10]; B's own hook then prefetches nothing new
    assert [span(bar(s, n, "all_gather", "backward")) for n in "CBA"] == [(7, 8), (8, 9), (9, 10)]
    with pytest.raises(ValueError, match="'Z', which is not a unit"):
        schedule_step(three(), backward_prefetch={"C": ["Z"]})


def test_cpu_offload_copies_parameters_in_before_each_all_gather_and_gradients_out_after():
    s = schedule_step(three(A={"h2d_s": 0.5, "d2h_s": 0.25}))
    assert span(bar(s, "A", "h2d", "forward")) == (0, 0.5)
    assert span(bar(s, "A", "all_gather", "forward")) == (0.5, 1.5)
    assert span(bar(s, "A", "reduce_scatter")) == (20.5, 22.0)
    assert span(bar(s, "A", "d2h")) == (22.0, 22.25)
    assert s.step_time_s == 22.25  # the compute stream waits for the copy-out too


def test_a_unit_without_gradients_has_no_reduce_scatter_but_still_waits_for_the_previous_one():
    s = schedule_step(three(B={"reduce_scatter_s": None}))
    assert not [e for e in s.events if e.unit == "B" and e.kind == "reduce_scatter"]
    assert span(bar(s, "A", "reduce_scatter")) == (20, 21.5)


def test_the_root_gathers_first_computes_its_head_last_and_reduces_last():
    root = timed("", forward_s=1.0, backward_s=2.0, all_gather_forward_s=1.0, reduce_scatter_s=0.5,
                 reshard_after_forward=False)
    s = schedule_step(three(), root=root)
    # root all-gather [0, 1] exposed; A's all-gather queues [1, 2] and is exposed too (root's head has no compute)
    assert span(bar(s, "", "all_gather", "forward")) == (0, 1)
    assert span(bar(s, "A", "all_gather", "forward")) == (1, 2) and bar(s, "A", "all_gather", "forward").exposed_s == 1
    assert span(bar(s, "", "forward")) == (8, 9)  # after C's forward [6, 8]
    # backward: root first (no all-gather, reshard False), prefetching C [9, 10] under it
    assert span(bar(s, "", "backward")) == (9, 11) and span(bar(s, "C", "all_gather", "backward")) == (9, 10)
    # C [11, 15], B [15, 19], A [19, 23]; A's reduce-scatter [23, 24.5]; the root's post-backward comes
    # last: it waits for A's reduce-scatter (1.5 s exposed), then its own [24.5, 25] (exposed)
    assert span(bar(s, "A", "reduce_scatter")) == (23, 24.5) and bar(s, "A", "reduce_scatter").exposed_s == 1.5
    assert span(bar(s, "", "reduce_scatter")) == (24.5, 25.0) and bar(s, "", "reduce_scatter").exposed_s == 0.5
    assert s.step_time_s == 25.0
    assert s.issue_order[-1] == ("reduce_scatter", "")
    assert list(s.table().unit) == ["", "A", "B", "C"]


def test_rows_and_timeline_payload():
    s = schedule_step(three())
    t = s.table()
    assert list(t.unit) == ["A", "B", "C"]
    assert set(t.columns) >= {"forward_s", "backward_s", "recompute_s", "all_gather_forward_s", "all_gather_backward_s",
                              "reduce_scatter_s", "all_reduce_s", "exposed_comm_s"}
    assert t.exposed_comm_s.sum() == s.exposed_comm_s
    line = s.timeline()
    assert [e["start_s"] for e in line] == sorted(e["start_s"] for e in line)
    assert set(line[0]) == {"stream", "unit", "kind", "phase", "start_s", "end_s", "exposed", "exposed_s"}


@pytest.mark.parametrize("field,value", [("forward_s", -1.0), ("all_gather_backward_s", float("nan")),
                                         ("reduce_scatter_s", -0.1), ("backward_s", "1s")])
def test_bad_seconds_name_the_field_and_unit(field, value):
    with pytest.raises(ValueError, match=rf"timed\('A'\)\.{field} "):
        timed("A", **{field: value})


def test_duplicate_units_are_refused():
    with pytest.raises(ValueError, match=r"\['A'\]"):
        schedule_step([unit("A"), unit("A")])


def test_seconds_from_bytes_and_bandwidth():
    h100 = DEVICES["H100"]
    eff = Efficiency(matmul=0.5, collective_bus=0.8, hbm=0.8)
    assert collective_seconds(360e9, 450, efficiency=eff) == pytest.approx(1.0)
    assert optimizer_seconds(3350e9 * 0.8, h100, eff) == pytest.approx(1.0)


def test_the_host_optimizer_step_runs_at_the_host_adamw_rate():
    from shardviz.step.schedule import host_optimizer_seconds

    assert host_optimizer_seconds(2e9, Efficiency(host_adamw_gparams_per_s=0.5)) == pytest.approx(4.0)
    assert host_optimizer_seconds(1e9, Efficiency()) == pytest.approx(1.39)  # ZeRO-Offload's PyTorch CPU Adam


def test_a_unit_kept_unsharded_after_forward_needs_no_backward_all_gather():
    # A: forward 2 s, backward 4 s; B: forward 2 s, recompute 2 s, backward 4 s, kept unsharded after
    # forward (no backward all-gather) and no gradient (no reduce-scatter); every all-gather 1 s
    a = timed("A", forward_s=2.0, backward_s=4.0, all_gather_forward_s=1.0, all_gather_backward_s=1.0,
              reduce_scatter_s=1.0)
    b = timed("B", forward_s=2.0, backward_s=4.0, recompute_s=2.0, all_gather_forward_s=1.0,
              all_gather_backward_s=1.0, reshard_after_forward=False)
    s = schedule_step([a, b])
    # forward: A's all-gather [0, 1] exposed, A [1, 3], B's all-gather [1, 2], B [3, 5]; backward: B (no
    # all-gather) recompute + backward [5, 11] with A's prefetch [5, 6]; A [11, 15], its reduce-scatter [15, 16]
    assert s.step_time_s == pytest.approx(16.0) and s.exposed_comm_s == pytest.approx(2.0)
    assert not [e for e in s.events if e.unit == "B" and e.kind == "all_gather" and e.phase == "backward"]


@pytest.mark.parametrize("seed", range(20))
def test_invariants_on_random_steps(seed):
    """Whatever the seconds: one thing at a time per stream, compute never starts before the
    all-gather it needs, a reduction never before its backward, and idle compute = exposed."""
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 6)
    units = [timed(f"u{i}", forward_s=rng.uniform(0, 3), backward_s=rng.uniform(0, 6),
                   recompute_s=rng.choice([0.0, rng.uniform(0, 3)]), all_gather_forward_s=rng.uniform(0, 4),
                   all_gather_backward_s=rng.uniform(0, 4), reduce_scatter_s=rng.choice([None, rng.uniform(0, 5)]),
                   all_reduce_s=rng.choice([None, rng.uniform(0, 3)]), reshard_after_forward=rng.random() < 0.7,
                   h2d_s=rng.choice([0.0, rng.uniform(0, 1)]))
             for i in range(n)]
    root = timed("root", forward_s=1, backward_s=2, all_gather_forward_s=rng.uniform(0, 2),
                 reshard_after_forward=False) if rng.random() < 0.5 else None
    s = schedule_step(units, root=root, extras=StepExtras(ignored_all_reduce_s=rng.choice([None, 0.3]), optimizer_s=0.5))
    assert s.step_time_s == pytest.approx(s.compute_s + s.exposed_comm_s)
    for stream in ("compute", "all_gather", "reduce_scatter", "all_reduce"):
        bars = sorted((e for e in s.events if e.stream == stream), key=lambda e: e.start_s)
        for a, b in zip(bars, bars[1:]):
            assert b.start_s >= a.end_s - 1e-12, (stream, a, b)
    collectives = sorted((e for e in s.events if e.kind in ("all_gather", "reduce_scatter")), key=lambda e: e.start_s)
    for a, b in zip(collectives, collectives[1:]):  # one communicator: one collective at a time
        assert b.start_s >= a.end_s - 1e-12, (a, b)
    for e in s.events:
        if e.kind in ("forward", "backward", "recompute") and e.unit is not None:
            gathers = [g for g in s.events if g.unit == e.unit and g.kind == "all_gather" and g.phase == e.phase]
            assert all(g.end_s <= e.start_s + 1e-12 for g in gathers), e
        if e.kind == "reduce_scatter":
            done = max(c.end_s for c in s.events if c.unit == e.unit and c.kind == "backward" or
                       (c.unit == e.unit and c.kind == "recompute"))
            assert e.start_s >= done - 1e-12
    assert all(e.end_s <= s.step_time_s + 1e-12 for e in s.events)
