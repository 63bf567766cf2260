"""The device table, Mesh(device=...), efficiencies and the memory reserve."""

import dataclasses

import pytest

import shardviz as sv
from shardviz.devices import (DEVICES, Device, Efficiency, GiB, MEMORY_RESERVE_BYTES, device_by_name,
                              usable_memory)

REQUIRED = ("A100-40GB", "A100-80GB", "H100", "H100-PCIe", "H200", "B200", "MI300X", "L40S", "A10G", "RTX-4090")


def test_the_table_has_every_device_the_issue_names_each_with_a_source():
    for name in REQUIRED:
        row = DEVICES[name]
        assert row.source.startswith("https://"), name


@pytest.mark.parametrize("name", REQUIRED)
def test_rows_are_physically_sane(name):
    d = DEVICES[name]
    assert 16 * GiB <= d.memory <= 256 * GiB
    assert d.fp32_tflops < d.bf16_tflops <= 5000  # dense tensor-core bf16 beats fp32
    assert d.bf16_tflops == d.fp16_tflops  # every listed part runs both at one rate
    assert d.inter_node_gbps <= d.intra_node_gbps < d.hbm_gbps
    assert d.gpus_per_node >= 1


def test_known_relations_between_rows():
    assert DEVICES["A100-80GB"].hbm_gbps > DEVICES["A100-40GB"].hbm_gbps
    assert DEVICES["H200"].bf16_tflops == DEVICES["H100"].bf16_tflops  # same GH100 die, more memory
    assert DEVICES["H200"].memory > DEVICES["H100"].memory
    assert DEVICES["B200"].bf16_tflops > DEVICES["H100"].bf16_tflops
    assert DEVICES["H100"].intra_node_gbps > DEVICES["H100-PCIe"].intra_node_gbps  # NVLink vs PCIe


def test_lookup_ignores_case_and_separators_and_knows_aliases():
    assert device_by_name("h100") is DEVICES["H100"]
    assert device_by_name("a100_80gb") is DEVICES["A100-80GB"]
    assert device_by_name("H100-SXM") is DEVICES["H100"]


def test_unknown_name_lists_the_known_and_the_closest():
    with pytest.raises(ValueError) as err:
        device_by_name("H10O")
    text = str(err.value)
    assert "'H10O'" in text and "closest: 'H100'" in text
    for name in REQUIRED:
        assert name in text


@pytest.mark.parametrize("field", ["memory", "bf16_tflops", "fp16_tflops", "fp32_tflops", "hbm_gbps",
                                   "intra_node_gbps", "inter_node_gbps", "gpus_per_node"])
@pytest.mark.parametrize("bad", [0, -1])
def test_zero_or_negative_figure_names_the_field(field, bad):
    with pytest.raises(ValueError, match=f"Device.{field} "):
        dataclasses.replace(DEVICES["H100"], **{field: bad})


def test_custom_device_takes_a_size_string():
    d = Device(name="my-gpu", memory="96GiB", bf16_tflops=500, fp16_tflops=500, fp32_tflops=50, hbm_gbps=3000,
               intra_node_gbps=300, inter_node_gbps=25, gpus_per_node=4)
    assert d.memory == 96 * GiB
    assert d.peak_flops("bfloat16") == 500e12 and d.peak_flops("float32") == 50e12
    with pytest.raises(ValueError, match="dtype"):
        d.peak_flops("int8")


@pytest.mark.parametrize("field", ["matmul", "collective_bus", "hbm"])
@pytest.mark.parametrize("bad", [0, -0.5, 1.5, float("nan")])
def test_efficiency_is_a_fraction_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=f"Efficiency.{field} "):
        Efficiency(**{field: bad})


def test_memory_reserve():
    assert MEMORY_RESERVE_BYTES == GiB
    assert usable_memory(80 * GiB) == 79 * GiB
    assert usable_memory(80 * GiB, reserve=0) == 80 * GiB
    with pytest.raises(ValueError, match="device_memory"):
        usable_memory(0)


def test_mesh_with_a_device_fills_memory_bandwidths_and_ranks_per_node():
    mesh = sv.Mesh(shard=64, device="H100")
    h100 = DEVICES["H100"]
    assert mesh.device is h100
    assert (mesh.device_memory, mesh.intra_node_gbps, mesh.inter_node_gbps, mesh.ranks_per_node) == (
        h100.memory, 450, 50, 8)


def test_explicit_mesh_fields_win_over_the_device_row():
    mesh = sv.Mesh(shard=16, device="H100", device_memory="94GiB", inter_node_gbps=25, ranks_per_node=4)
    assert mesh.device_memory == 94 * GiB
    assert mesh.inter_node_gbps == 25 and mesh.intra_node_gbps == 450 and mesh.ranks_per_node == 4


def test_mesh_without_a_device_is_unchanged():
    mesh = sv.Mesh(8)
    assert mesh.device is None and mesh.device_memory is None and mesh.ranks_per_node == 8
    assert mesh.intra_node_gbps is None and mesh.inter_node_gbps is None
    assert sv.Mesh(8) == sv.Mesh(8, ranks_per_node=8)


def test_mesh_takes_a_custom_device_and_rejects_an_unknown_name():
    custom = dataclasses.replace(DEVICES["H100"], name="H100-NVL-ish", memory=94 * GiB)
    assert sv.Mesh(8, device=custom).device_memory == 94 * GiB
    with pytest.raises(ValueError, match="unknown device 'H1OO'"):
        sv.Mesh(8, device="H1OO")


def test_comm_table_uses_the_device_bandwidths():
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model, lora="sharded")
    comm = sv.analyze(model, plan, sv.Mesh(shard=8, device="H100")).comm
    assert (comm.time_s == comm.sent_bytes / 450e9).all()
    explicit = sv.analyze(model, plan, sv.Mesh(shard=8, intra_node_gbps=450, inter_node_gbps=50)).comm
    assert comm.time_s.tolist() == explicit.time_s.tolist()


def test_default_efficiency_uses_a_measured_matmul_fraction_where_one_is_published():
    from shardviz.devices import DEFAULT_EFFICIENCY, MEASURED_MATMUL_EFFICIENCY, default_efficiency

    assert default_efficiency("A100-80GB").matmul == 0.72
    assert default_efficiency(DEVICES["H100"]).matmul == 0.48
    assert default_efficiency("B200") == DEFAULT_EFFICIENCY  # nothing published: the generic default
    assert set(MEASURED_MATMUL_EFFICIENCY) <= set(DEVICES)
    custom = dataclasses.replace(DEVICES["H100"], name="mine")
    assert default_efficiency(custom) == DEFAULT_EFFICIENCY


def test_the_public_names():
    assert sv.Device is Device and sv.Efficiency is Efficiency
    assert {"Device", "Efficiency"} <= set(sv.__all__)
