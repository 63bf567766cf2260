"""SV201 (``memory_checks.check_memory``): the one verdict's words, and the calls it names."""

from __future__ import annotations

import shardviz as sv
from shardviz import zoo
from shardviz.format import format_bytes

TRAINING = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=2, seq_len=64)


def analysed():
    model = zoo.tiny_llama_lora()
    return sv.analyze(model, sv.Plan.auto(model), sv.Mesh(8, device_memory="1MiB", memory_reserve=0), TRAINING)


def test_sv201_says_the_one_verdict_and_the_calls_at_the_bytes_they_gather():
    """The message opens with ``a.fit.headline`` (the CLI's and the report's words); a call's size is
    what its forward all-gather holds in bf16 (``a.comm``), not its fp32 storage (``a.units``)."""
    a = analysed()
    found = [f for f in a.findings if f.code == "SV201"]
    assert found and found[0].message.startswith(a.fit.headline)
    comm = a.comm
    ag = comm[(comm.collective == "all_gather") & (comm.phase == "forward")]
    layer = "base_model.model.model.layers.0"
    gathered = int(ag.loc[ag.unit == layer, "bytes"].iloc[0])
    stored = int(a.units.set_index("unit").at[layer, "padded_unsharded_bytes"])
    assert gathered * 2 == stored  # the premise: fp32 storage gathered in bf16
    assert f"{layer} ({format_bytes(gathered)} unsharded)" in found[0].message
