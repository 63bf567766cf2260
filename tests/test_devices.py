"""The device table, Mesh(device=...), efficiencies and the memory reserve."""

import dataclasses

import pytest

import shardviz as sv
from shardviz.run.devices import DEVICES, Device, Efficiency, GiB, MEMORY_RESERVE_BYTES, device_by_name, usable_memory

REQUIRED = ("A100-40GB", "A100-80GB", "H100", "H100-PCIe", "H200", "B200", "MI300X", "L40S", "A10G", "RTX-4090", "L4",
            "RTX-3090", "RTX-3090-NVLink")


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


def test_small_cards_issue_38():
    """The 24 GB cards QLoRA users train on: PCIe Gen4 x16 unless bridged; host RAM only where a source says."""
    small = [DEVICES[n] for n in ("RTX-3090", "RTX-4090", "L4", "A10G")]
    assert all(d.memory == 24 * GiB and d.intra_node_gbps == 32 for d in small)
    assert DEVICES["RTX-3090-NVLink"].intra_node_gbps > DEVICES["RTX-3090"].intra_node_gbps
    assert DEVICES["RTX-3090-NVLink"].gpus_per_node == 2  # one bridge pairs two cards
    assert DEVICES["RTX-4090"].bf16_tflops > DEVICES["RTX-3090"].bf16_tflops > DEVICES["A10G"].bf16_tflops
    assert DEVICES["L4"].hbm_gbps < DEVICES["A10G"].hbm_gbps  # GDDR6 on a 192-bit bus
    assert DEVICES["RTX-3090"].host_memory is None and DEVICES["L4"].host_memory == DEVICES["A10G"].host_memory
    assert device_by_name("NVIDIA GeForce RTX 3090") is DEVICES["RTX-3090"]
    assert device_by_name("NVIDIA L4") is DEVICES["L4"] and device_by_name("3090") is DEVICES["RTX-3090"]


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
    from shardviz.step.timing import efficiency_for

    a = sv.analyze(model, plan, sv.Mesh(shard=8, device="H100"))
    bus = efficiency_for(a.tree, a.mesh).collective_bus  # the stack's preset, as the step time uses
    # one call: its latency plus its bytes at the stack's share of the link
    assert comm.time_s.to_numpy() == pytest.approx((comm.latency_s + comm.sent_bytes / (450e9 * bus)).to_numpy())
    explicit = sv.analyze(model, plan, sv.Mesh(shard=8, intra_node_gbps=450, inter_node_gbps=50)).comm
    assert comm.time_s.tolist() == explicit.time_s.tolist()


def test_stack_presets_take_the_parts_figures_and_the_stacks():
    from shardviz.run.devices import DEFAULT_MATMUL, STACKS, default_efficiency, stack_of

    for stack, extra in STACKS.items():
        eff = Efficiency.for_stack(stack, "A100-80GB")
        assert eff.stack == stack and all(getattr(eff, k) == v for k, v in extra.items())
        assert eff.matmul == Efficiency.for_stack(stack, "A100-40GB").matmul  # one family
    assert Efficiency.for_stack("hf", "H200").matmul == Efficiency.for_stack("hf", "H100").matmul
    assert Efficiency.for_stack("hf", "B200").matmul == DEFAULT_MATMUL  # nothing published: the generic figure
    assert Efficiency.for_stack("torchtitan-compile").memory_traffic < 1  # inductor fuses the pointwise ops
    assert default_efficiency("H100") == Efficiency.for_stack("torchtitan-eager", "H100")
    with pytest.raises(ValueError, match="unknown stack 'hf_peft'.*closest: 'hf-peft'"):
        Efficiency.for_stack("hf_peft")
    assert stack_of("PeftModelForCausalLM", True) == "hf-peft"
    assert stack_of("LlamaForCausalLM", True) == "hf" and stack_of("MyNet", False) == "torchtitan-eager"


@pytest.mark.parametrize("field, bad", [("kernel_us", -1.0), ("memory_traffic", 1.5), ("attention", 0.0),
                                        ("host_adamw_gparams_per_s", 0)])
def test_efficiency_refuses_bad_stack_figures_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=f"Efficiency.{field} "):
        Efficiency(**{field: bad})


# ---------------------------------------------------------------------------
# The links (issue 27): rings across nodes spread over the node's NICs; NCCL's ring latency
# ---------------------------------------------------------------------------
def _bandwidth(mesh, group="shard", size=None):
    from shardviz.step.collectives import group_bandwidth

    return group_bandwidth(mesh, group, size or mesh.shard)


def test_a_ring_across_nodes_spreads_over_the_nodes_nics():
    a100 = sv.Mesh(64, device="A100-80GB")  # DGX A100: 8 HDR NICs of 25 GB/s, NVLink 300 GB/s
    assert (a100.nics_per_node, a100.nic_gbps, a100.node_network_gbps) == (8, 25, 200)
    assert _bandwidth(a100) == 200  # the node's 8 NICs, below NVLink
    assert _bandwidth(sv.Mesh(8, device="A100-80GB")) == 300  # one node: NVLink
    h100 = sv.Mesh(64, device="H100")
    assert _bandwidth(h100) == 400
    hsdp = sv.Mesh(8, replicate=8, device="H100")  # the replicate group has one rank per node: its own NIC
    assert _bandwidth(hsdp, "replicate", 8) == 50
    four = sv.Mesh(64, device="H100", nics_per_node=4)  # the same network over 4 NICs
    assert four.node_network_gbps == 400 and four.nic_gbps == 100
    slow = sv.Mesh(64, device="H100", nics_per_node=1, nic_gbps=50)  # one 400 Gb/s NIC for 8 GPUs
    assert _bandwidth(slow) == 50 and _bandwidth(replace_mesh(slow, nic_gbps=1000)) == 450  # capped by NVLink
    with pytest.raises(ValueError, match="Mesh.nics_per_node"):
        sv.Mesh(64, device="H100", nics_per_node=0)


def replace_mesh(mesh, **kw):
    return dataclasses.replace(mesh, **kw)


# nccl-tests bus bandwidth across nodes, large messages, as NVIDIA's engineers state it for each system:
# (nics per node, GB/s per NIC, published busbw GB/s, source)
PUBLISHED_BUSBW = [
    (4, 12.5, 48.0, "NVIDIA/nccl-tests#29: DGX-1, 4 x 100 Gb/s EDR: 48 GB/s"),
    (8, 25.0, 8 * 24.0, "NVIDIA/nccl#412: 24 GB/s per 200 Gb/s HDR NIC inter-node, more NICs add up"),
    (8, 50.0, 8 * 47.0, "NVIDIA/nccl-tests#290: 46-48 GB/s per 400 Gb/s NDR NIC; #309: peak 400 GB/s for 8"),
]


@pytest.mark.parametrize("nics, gbps, published, source", PUBLISHED_BUSBW)
def test_the_ring_bandwidth_across_nodes_is_nccl_tests_busbw(nics, gbps, published, source):
    """The bus bandwidth the model charges a multi-node all-gather / reduce-scatter (the ring's link
    x collective_bus) against nccl-tests' published figure: within 20 % (collective_bus 0.8 is
    below the two-node figures, above NVIDIA/nccl#1218's 200 GB/s all-gather on 32 nodes of 8 x 400 Gb/s)."""
    mesh = sv.Mesh(16, device="H100", nics_per_node=nics, nic_gbps=gbps)
    modelled = _bandwidth(mesh) * Efficiency().collective_bus
    assert abs(modelled / published - 1) <= 0.20, (source, modelled)


def test_each_collective_pays_nccls_ring_latency():
    from shardviz import zoo
    from shardviz.step.collectives import RING_BASE_US, RING_NET_STEP_US, RING_NVLINK_STEP_US, ring_latency_s

    assert ring_latency_s("all_gather", 1, 1) == 0
    assert ring_latency_s("all_gather", 8, 1) == pytest.approx((RING_BASE_US + 7 * RING_NVLINK_STEP_US) * 1e-6)
    # 64 ranks on 8 nodes: 7 of the 63 steps cross the network; an all-reduce twice that
    assert ring_latency_s("reduce_scatter", 64, 8) == pytest.approx(
        (RING_BASE_US + 56 * RING_NVLINK_STEP_US + 7 * RING_NET_STEP_US) * 1e-6)
    assert ring_latency_s("all_reduce", 64, 8) == pytest.approx(
        (RING_BASE_US + 112 * RING_NVLINK_STEP_US + 14 * RING_NET_STEP_US) * 1e-6)
    model = zoo.tiny_llama_lora()
    comm = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(shard=64, device="H100")).comm
    assert (comm.latency_s == ring_latency_s("all_gather", 64, 8)).all()  # a tiny model: latency-bound calls
    assert (comm.latency_s > comm.time_s - comm.latency_s).all()  # time_s: the call, its latency included


def test_the_public_names():
    assert sv.Device is Device and sv.Efficiency is Efficiency
    assert {"Device", "Efficiency"} <= set(sv.__all__)
