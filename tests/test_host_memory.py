"""Host memory is part of the one fits verdict when anything is offloaded (issue 38): a node's host RAM
(the worst rank's ``a.memory.cpu_peak`` x the ranks of a node) against ``Mesh.host_memory``."""

import pytest

import shardviz as sv
from shardviz.cli import main
from shardviz.run.devices import DEVICES, Device, memory_fit
from shardviz.format import format_bytes

WORLD, PER_NODE = 4, 2


def _analyze(model, offload=True, **mesh):
    mesh = sv.Mesh(shard=WORLD, ranks_per_node=PER_NODE, device_memory="24GiB", **mesh)
    return sv.analyze(model, sv.Plan.auto(model), mesh, sv.Training(offload=offload))


def test_host_figure_is_the_worst_rank_times_the_ranks_of_a_node(model):
    a = _analyze(model)
    fit = a.fit
    assert fit.host == int(a.memory.cpu_peak.max()) * PER_NODE > 0
    assert fit.host_ranks == PER_NODE and fit.host_memory is None
    # no host limit: the need is said, never a silent pass; the device decides the verdict
    assert "host RAM" in fit.headline and "no host limit given" in fit.headline
    assert format_bytes(fit.host) in fit.headline and fit.verdict == "fits"


def test_host_below_the_need_is_over_and_named(model):
    need = _analyze(model).fit.host
    over = _analyze(model, host_memory=need - 1)
    assert over.fit.verdict == "over" and not over.fit.fits and over.fit.host_over
    assert over.fit.margin > 0  # the device itself holds the step
    assert over.fit.headline.startswith("does not fit: host RAM") and format_bytes(need - 1) in over.fit.headline
    sv201 = [f for f in over.findings if f.code == "SV201"]
    assert len(sv201) == 1 and sv201[0].severity == "error" and "host RAM" in sv201[0].message
    assert "host_memory" in sv201[0].fix
    enough = _analyze(model, host_memory=need).fit
    assert enough.verdict == "fits" and not enough.host_over
    assert f"of {format_bytes(need)}" in enough.headline and "host RAM" in enough.headline


def test_without_offload_the_headline_is_unchanged(model):
    a = _analyze(model, offload=False, host_memory=1)  # a host limit no offload could meet: not judged
    mem, mesh = a.memory, a.mesh
    plain = memory_fit(int(mem.peak.max()), int(mem.reserved_peak.max()), mesh.device_memory, mesh.memory_reserve,
                       mesh.safety_margin, mesh.judge, a.fit.assumed.split(", ")[1])
    assert a.fit.host == 0 and "host" not in a.fit.headline
    assert a.fit.headline == plain.headline and a.fit.verdict == plain.verdict == "fits"


def test_host_ranks_are_the_world_when_it_is_smaller_than_a_node():
    assert sv.Mesh(shard=2).host_ranks == 2 and sv.Mesh(shard=16).host_ranks == 8
    assert sv.Mesh(shard=8, replicate=2, ranks_per_node=4).host_ranks == 4


def test_host_memory_defaults_from_the_device_table():
    assert sv.Mesh(shard=8, device="H100").host_memory == DEVICES["H100"].host_memory > 0
    assert sv.Mesh(shard=8, device="A100-40GB").host_memory == DEVICES["A100-40GB"].host_memory
    assert sv.Mesh(shard=8, device="H100", host_memory="512GiB").host_memory == 512 * 1024**3  # given wins
    assert sv.Mesh(shard=8, device="RTX-4090").host_memory is None  # no source states it
    assert sv.Mesh(shard=8).host_memory is None


@pytest.mark.parametrize("bad", [0, -5, "lots", True, float("nan")])
def test_bad_host_memory_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"Mesh\.host_memory"):
        sv.Mesh(shard=2, host_memory=bad)
    with pytest.raises(ValueError, match=r"Device\.host_memory"):
        Device("X", "24GiB", 1, 1, 1, 1, 1, 1, host_memory=bad)


def test_cli_offload_with_host_memory_prints_the_host_verdict(model, tmp_path, capsys):
    flags = ["report", "zoo:tiny_llama_lora", "--world-size", str(WORLD), "--device-memory", "24GiB",
             "--offload", "--no-compare"]
    fit = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(shard=WORLD, device_memory="24GiB"),
                     sv.Training(offload=True)).fit
    low = fit.host // 2
    rc = main([*flags, "--host-memory", f"{low}B", "-o", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    assert rc == 0 and "host RAM" in out  # report writes its file whatever the verdict and format_bytes(fit.host) in out and format_bytes(low) in out
    assert "SV201" in out and "exceeds" in out
    rc = main([*flags, "--host-memory", f"{fit.host}B", "-o", str(tmp_path / "r2.html")])
    out = capsys.readouterr().out
    assert rc == 0 and f"of {format_bytes(fit.host)}" in out and "SV201" not in out
    assert main([*flags, "--host-memory", "0", "-o", str(tmp_path / "r3.html")]) == 2
    assert "host_memory" in capsys.readouterr().err


def test_the_inspector_and_the_chart_payload_read_the_one_verdict(model):
    from shardviz.views import display
    from shardviz.widget.panels import host_ram_text

    need = _analyze(model).fit.host
    a = _analyze(model, host_memory=need - 1)
    use = display.limit_use(a.fit)
    assert use["over"] and use["host_over"] and use["host"] == need and use["text"] == a.fit.headline
    text = host_ram_text(a)
    assert text.startswith(f"host RAM {format_bytes(int(a.memory.cpu_peak.max()))} per rank")
    assert f"{format_bytes(need)} per node of {PER_NODE} ranks exceeds {format_bytes(need - 1)}" in text
    assert not display.limit_use(_analyze(model, offload=False).fit)["host"]


def test_the_verdict_line_names_the_device_rank_apart_from_the_host(model):
    from shardviz.views.display import verdict_text
    from shardviz.run.mesh import worst_rank

    a, plain = _analyze(model), _analyze(model, offload=False)
    assert verdict_text(a) == f"{a.fit.headline}; device peak on rank {worst_rank(a.memory)}"
    assert verdict_text(plain) == f"{plain.fit.headline} on rank {worst_rank(plain.memory)}"
