"""``Training(grad_accum=k)``: what gradient accumulation adds to the peak and to the collectives.

The bytes themselves are checked against torch in ``test_cost_truth.py`` (the ``grad-accum-*``
cases: a real accumulated step under the fake process group); these are the rules around them.
"""

from __future__ import annotations

import pytest

import shardviz as sv

FSDP8 = sv.Mesh(shard=8)


def _analyze(model, lora="sharded", **training):
    return sv.analyze(model, sv.Plan.auto(model, lora=lora), FSDP8, sv.Training(**training))


@pytest.mark.parametrize("field, value", [("grad_accum", 0), ("grad_accum", 2.0), ("grad_accum", True),
                                          ("grad_accum", "4"), ("sync_every_microbatch", "yes")])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"Training.{field}"):
        sv.Training(**{field: value})


def test_one_micro_batch_is_the_plain_step(model):
    plain, one = _analyze(model), _analyze(model, grad_accum=1)
    assert plain.memory.equals(one.memory) and plain.comm.equals(one.comm)


def test_kept_unsharded_gradients_are_in_the_peak(model):
    plain, accumulated = _analyze(model), _analyze(model, grad_accum=4)
    kept = sum(u.accumulated_grads for u in accumulated.costs.units)
    assert kept > 0
    # the largest moment of a later micro-batch's forward holds every call's unsharded gradients
    assert accumulated.memory.peak.max() == plain.memory.peak.max() + kept
    assert accumulated.peak_breakdown()["gradients"] == kept
    # what stays after the step does not change: the sharded gradients of the last micro-batch
    assert (accumulated.memory.grads == plain.memory.grads).all()


def test_bf16_gradients_are_kept_in_the_reduce_dtype(model):
    bf16 = dict(param_dtype="bfloat16", reduce_dtype="float32")
    blocks = [u for u in _analyze(model, grad_accum=2, **bf16).costs.units if u.trainable]
    assert all(u.converts_grads and u.accumulated_grads == 2 * u.unsharded_grads for u in blocks)
    # reduce_dtype None: reduced in param_dtype, the gradients' own (no conversion kept)
    same = [u for u in _analyze(model, grad_accum=2, param_dtype="bfloat16", reduce_dtype=None).costs.units if u.trainable]
    assert all(not u.converts_grads and u.accumulated_grads == u.unsharded_grads for u in same)


def test_collectives_count_per_micro_batch(model):
    plain = _analyze(model).comm
    for sync_every, reduce_count in ((False, 1), (True, 3)):
        comm = _analyze(model, grad_accum=3, sync_every_microbatch=sync_every).comm
        assert comm.drop(columns="count").equals(plain.drop(columns="count"))
        gathers = comm.collective == "all_gather"
        assert set(comm[gathers]["count"]) == {3} and set(comm[~gathers]["count"]) == {reduce_count}


def test_sync_every_micro_batch_keeps_sharded_gradients_instead(model):
    no_sync = _analyze(model, grad_accum=3)
    every = _analyze(model, grad_accum=3, sync_every_microbatch=True)
    assert every.memory.peak.max() < no_sync.memory.peak.max()
    assert every.peak_breakdown()["gradients"] >= every.memory.grads_sharded.max()


def test_whole_gradients_are_averaged_every_micro_batch(model):
    comm = _analyze(model, lora="ignored", grad_accum=2).comm
    average = comm[comm.unit.isna()]
    assert len(average) == 1 and average.iloc[0]["count"] == 2


def _sv201_at_batch_9(model, capsys):
    """SV201 at a micro-batch of 9 on a device between the peak of 9 sequences and that of 3 (the
    allocated peak judged, no reserve: the tiny model's reserved peak is the allocator's segments)."""
    from dataclasses import replace

    from shardviz.views.display import DEFAULT_TRAINING

    def peak(batch, k):
        training = replace(DEFAULT_TRAINING, batch_size=batch, seq_len=256, grad_accum=k)
        return int(sv.analyze(model, sv.Plan.auto(model), FSDP8, training).memory.peak.max())

    device_memory = (peak(9, 1) + peak(3, 3)) // 2
    flags = ["--world-size", "8", "--device", "H100", "--device-memory", f"{device_memory}B", "--memory-reserve", "0",
             "--judge", "allocated", "--seq-len", "256"]
    return device_memory, flags


def test_sv201_splits_the_micro_batch_into_the_same_sequences_with_flags_that_reproduce_it(model, capsys):
    """At batch 9 the fix is 3 x 3 (never 4 x 2: 8 sequences), said as CLI flags; those flags in the
    CLI give the peak and the step time the fix states (accumulation as the exported train_step does it)."""
    from dataclasses import replace

    from shardviz.cli import main
    from shardviz.views.display import DEFAULT_TRAINING
    from shardviz.format import format_duration
    from shardviz.checks.memory_checks import _micro_batches, memory_fixes

    assert _micro_batches(9) == [3, 1] and _micro_batches(8) == [4, 2, 1] and _micro_batches(7) == [1]
    device_memory, flags = _sv201_at_batch_9(model, capsys)
    mesh = sv.Mesh(8, device="H100", device_memory=device_memory, memory_reserve=0, judge="allocated")
    a = sv.analyze(model, sv.Plan.auto(model), mesh, replace(DEFAULT_TRAINING, batch_size=9, seq_len=256))
    fixes = [f for f in memory_fixes(a) if "--grad-accum" in f.flags]
    assert [f.flags for f in fixes] == ["--batch-size 3 --grad-accum 3"]
    assert "the same 9 sequences per step" in fixes[0].text and "last micro-batch only" in fixes[0].text
    sv201 = next(f for f in a.findings if f.code == "SV201")
    assert "--batch-size 3 --grad-accum 3 (peak " in sv201.fix_for("cli")
    fix = fixes[0]
    assert main(["report", "zoo:tiny_llama_lora", *flags, "--batch-size", "3", "--grad-accum", "3", "-o", "-"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"verdict: {mesh.fit(fix.peak, fix.reserved).headline} on rank 0" in err
    assert f"step {format_duration(fix.step_time_s)} " in err
    assert main(["report", "zoo:tiny_llama_lora", *flags, "--batch-size", "9", "-o", "-"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--batch-size 3 --grad-accum 3 (peak " in err and "--batch-size 4" not in err


def test_the_cli_grad_accum_flag_is_training_grad_accum(model, capsys):
    from shardviz.cli import main

    assert main(["export", "zoo:tiny_llama_lora", "--world-size", "8", "--batch-size", "3", "--grad-accum", "3",
                 "--seq-len", "256", "-q"]) == 0
    code = capsys.readouterr().out
    assert "GRAD_ACCUM = 3" in code and "def train_step(" in code
