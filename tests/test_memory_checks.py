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


def test_first_findings_say_the_same_verdict_with_the_what_ifs_pending():
    """``a.first_findings`` (the Inspector shows them while the what-ifs run): no other step is priced,
    SV201 carries the full finding's message and severity with its fixes marked ``pending``, every
    finding that needs no what-if is the full one as it is; once ``a.findings`` is computed, it is that."""
    a = analysed()
    priced = []
    real_price = type(a).price
    type_price = lambda self, *args, **kw: priced.append(kw) or real_price(self, *args, **kw)  # noqa: E731
    try:
        type(a).price = type_price
        first = a.first_findings
    finally:
        type(a).price = real_price
    assert priced == []  # not one what-if ran
    full = a.findings
    by_code = {f.code: f for f in full}
    sv201 = next(f for f in first if f.code == "SV201")
    assert sv201.pending and sv201.message == by_code["SV201"].message and sv201.severity == by_code["SV201"].severity
    assert sv201.fix != by_code["SV201"].fix and not by_code["SV201"].pending
    assert [f for f in first if not f.pending] == [f for f in full if f.code not in {g.code for g in first if g.pending}]
    assert a.first_findings is full
