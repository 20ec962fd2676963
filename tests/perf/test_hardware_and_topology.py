"""Hardware as data (every field, a source, lookups, user files) and the two-level collective cost model."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.comm.cost import Link
from trainmath.comm.twolevel import (
    TWO_LEVEL_OPS,
    Group,
    Topology,
    time_s,
    tree_all_reduce_s,
    two_tree_broadcast_s,
    two_tree_steps_s,
)
from trainmath.errors import TrainmathError
from trainmath.hardware import all_gpus, gpu, presets, read_hardware_file

ISSUE_GPUS = {"A100-SXM-40GB", "A100-SXM-80GB", "H100-SXM-80GB", "H100-PCIe-80GB", "H200-SXM-141GB",
              "H800-SXM-80GB", "B200-180GB", "GB200", "MI300X", "L40S", "RTX-4090"}


def test_every_issue_gpu_with_topology_and_sources():
    assert ISSUE_GPUS <= {g.name for g in all_gpus()}
    for g in all_gpus():
        assert g.source.strip() and g.topology_source.strip()
        assert g.gpus_per_node >= 1 and g.nics_per_gpu > 0 and g.nic_gbps > 0
        assert presets().efficiency(g).how.strip()


def test_pinned_datasheet_figures():
    h = gpu("H100-SXM")
    assert h.bf16_flops_per_s == 989_400_000_000_000 and h.interconnect_bytes_per_s == 450e9
    assert h.nvlink_generation == 4 and h.nvlink_sharp and h.inter_node_bytes_per_s == 50e9  # 400 Gb/s
    assert gpu("a100").nvlink_sharp is False and gpu("a100").inter_node_bytes_per_s == 25e9  # HDR 200 Gb/s
    assert gpu("GB200").gpus_per_node == 72 and gpu("h800").interconnect_bytes_per_s == 200e9
    assert gpu("h100-pcie").bf16_flops_per_s == 756e12


@pytest.mark.parametrize("name", ["h100", "H100-SXM", "h100-80gb", "H100_SXM_80GB", " h100-sxm5 "])
def test_spellings(name):
    assert gpu(name).name == "H100-SXM-80GB"


def test_unknown_gpu_lists_close_names():
    with pytest.raises(TrainmathError, match=r"unknown GPU 'h10'; did you mean H100-SXM-80GB"):
        gpu("h10")


def _entry(**over):
    g = gpu("h100").to_dict()
    g.update(name="MyGPU", aliases=["mine"], bf16_flops_per_s=10**15, **over)
    return g


def test_user_file_extends_and_replaces(tmp_path):
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"gpus": [_entry()]}))
    hw = read_hardware_file(str(p))
    assert hw.gpu("MINE").bf16_flops_per_s == 10**15 and hw.gpu("h100").name == "H100-SXM-80GB"
    assert len(hw.gpus) == len(all_gpus()) + 1


def test_user_file_missing_fields_is_one_line(tmp_path):
    g = _entry()
    del g["nic_gbps"], g["gpus_per_node"]
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"gpus": [g]}))
    with pytest.raises(TrainmathError, match=r"GPU 'MyGPU': missing gpus_per_node, nic_gbps"):
        read_hardware_file(str(p))
    with pytest.raises(TrainmathError, match="cannot read hardware file"):
        read_hardware_file(str(tmp_path / "nope.json"))


def test_user_file_generation_must_exist(tmp_path):
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"gpus": [_entry(generation="rubin")]}))
    with pytest.raises(TrainmathError, match="generation 'rubin' has no efficiency curve"):
        read_hardware_file(str(p))


# ---- two-level collectives -------------------------------------------------------------------------------

H100 = Topology.of_gpu(gpu("h100"))


def test_pinned_ring_inside_a_node():
    # 8 ranks on NVLink 4 (450 GB/s per direction, α 2 µs): 2·7·α + 2·7/8·S/B.
    s = 2**30
    t = time_s("all_reduce", s, Group(size=8, local=8), H100, "ring")
    assert t == pytest.approx(14 * 2e-6 + 2 * 7 / 8 * s / 450e9)
    # NVLink SHARP sends each byte once: α + S/B, (2·7/8)× less bandwidth time
    assert time_s("all_reduce", s, Group(size=8, local=8), H100, "sharp") == pytest.approx(2e-6 + s / 450e9)


def test_pinned_hierarchical():
    # 16 ranks, 8 per node: intra RS(S) + inter ring AR(S/8) over 2 nodes + intra AG(S).
    s = 2**30
    intra = 7 * 2e-6 + 7 / 8 * s / 450e9
    inter = 2 * 6e-6 + 2 * 1 / 2 * (s / 8) / 50e9
    assert time_s("all_reduce", s, Group(size=16, local=8), H100, "hierarchical") == pytest.approx(2 * intra + inter)
    # a flat ring waits for the network on every step
    assert time_s("all_reduce", s, Group(size=16, local=8), H100, "ring") == pytest.approx(
        30 * 6e-6 + 2 * 15 / 16 * s / 50e9)


groups = st.sampled_from([(2, 2), (8, 8), (16, 8), (64, 8), (32, 4), (8, 1), (128, 2)])
links = st.tuples(st.floats(1e-7, 1e-4), st.floats(1e9, 1e12))


def _topo(intra, inter, sharp=True):
    return Topology(intra=Link(alpha_s=intra[0], bandwidth_bytes_per_s=intra[1]),
                    inter=Link(alpha_s=inter[0], bandwidth_bytes_per_s=inter[1]), gpus_per_node=8,
                    in_switch_reduction=sharp)


@settings(max_examples=60, deadline=None)
@given(g=groups, size=st.integers(0, 2**34), intra=links, inter=links, algo=st.sampled_from(["ring", "hierarchical"]))
def test_ring_all_reduce_is_reduce_scatter_plus_all_gather(g, size, intra, inter, algo):
    group, topo = Group(size=g[0], local=g[1]), _topo(intra, inter)
    if algo == "hierarchical" and (group.nodes == 1 or group.local == 1):
        algo = "ring"
    ar = time_s("all_reduce", size, group, topo, algo)
    assert ar == pytest.approx(time_s("reduce_scatter", size, group, topo, algo)
                               + time_s("all_gather", size, group, topo, algo), rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(g=groups, size=st.integers(0, 2**34), intra=links, inter=links, op=st.sampled_from(TWO_LEVEL_OPS),
       slower=st.floats(1.0, 10.0), level=st.sampled_from(["intra", "inter"]), what=st.sampled_from(["a", "b"]))
def test_time_never_falls_when_a_link_gets_slower(g, size, intra, inter, op, slower, level, what):
    group = Group(size=g[0], local=g[1])
    before = time_s(op, size, group, _topo(intra, inter))
    worse = {"intra": intra, "inter": inter}
    a, b = worse[level]
    worse[level] = (a * slower, b) if what == "a" else (a, b / slower)
    after = time_s(op, size, group, _topo(worse["intra"], worse["inter"]))
    assert after >= before * (1 - 1e-12)


def test_bad_group_is_one_line():
    with pytest.raises(TrainmathError, match="a group of 12 ranks cannot have 8 per node"):
        Group(size=12, local=8)


def test_pinned_tree_and_all_to_all():
    s = 2**28
    # double binary tree across 4 nodes (one rank each): 2⌈log2 4⌉α + 2·S·β on the network
    assert time_s("all_reduce", s, Group(size=4, local=1), H100, "tree") == pytest.approx(4 * 6e-6 + 2 * s / 50e9)
    # all-to-all over 16 ranks, 8 per node: 8 messages of S/16 leave on the NIC while 7 cross NVLink
    off = 8 * (6e-6 + s / 16 / 50e9)
    on = 7 * (2e-6 + s / 16 / 450e9)
    assert time_s("all_to_all", s, Group(size=16, local=8), H100, "hierarchical") == pytest.approx(max(off, on))
    # auto picks the fastest: never slower than any single algorithm
    g = Group(size=64, local=8)
    assert time_s("all_reduce", s, g, H100) == min(time_s("all_reduce", s, g, H100, a)
                                                   for a in ("ring", "tree", "hierarchical"))


def test_no_sharp_across_nodes_and_unknown_names():
    with pytest.raises(TrainmathError, match="no 'sharp' algorithm for all_reduce on 16 ranks"):
        time_s("all_reduce", 1, Group(size=16, local=8), H100, "sharp")
    with pytest.raises(TrainmathError, match="unknown collective 'allreduce'"):
        time_s("allreduce", 1, Group(size=2, local=2), H100)


def test_tree_all_reduce_is_nccls_tuning_model():
    """NCCL's own arithmetic (src/graph/tuning.cc, ncclTopoTuneModel + ncclTopoGetAlgoTime) with its own table
    figures for Tree/Simple — NVLink hop 28 µs, network hop 50 µs, base latency 0 — on 16 nodes of 8 GPUs, two
    channels at 12 GB/s; 1 GiB is past its size-correction table (log2i(S >> 6) >= 22)."""
    intra_lat_us, inter_lat_us, base_lat_us = 28.0, 50.0, 0.0
    n_nodes, ppn, n_channels, speed_inter = 16, 8, 2, 12.0
    bus_bw = min(n_channels * speed_inter * 0.9, 80.0)  # GB/s: `busBw = std::min(busBw*.9, maxTreeBw)`
    algo_bw = bus_bw * 0.5  # `ratio = .5` for trees
    lat = base_lat_us + 2 * ((ppn - 1) * intra_lat_us + math.log2(n_nodes) * inter_lat_us)
    size = 2**30
    nccl_s = (lat + size / (1000 * algo_bw)) * 1e-6  # `*time = lat + nBytes / (1000 * bw)`, µs
    topo = Topology(intra=Link(alpha_s=intra_lat_us * 1e-6, bandwidth_bytes_per_s=300e9),
                    inter=Link(alpha_s=inter_lat_us * 1e-6, bandwidth_bytes_per_s=bus_bw * 1e9), gpus_per_node=ppn)
    ours = time_s("all_reduce", size, Group(size=n_nodes * ppn, local=ppn), topo, "tree")
    assert ours == pytest.approx(nccl_s, rel=1e-12)
    assert ours == pytest.approx(tree_all_reduce_s(size, Group(size=128, local=8), topo), rel=1e-15)
    # inside one node it is a chain (log2 1 = 0): never faster than the ring there, as NCCL only trees across nodes
    one = Group(size=8, local=8)
    for s in (0, 2**10, 2**20, 2**30):
        assert time_s("all_reduce", s, one, topo, "tree") >= time_s("all_reduce", s, one, topo, "ring")


@pytest.mark.parametrize("n, size", [(2, 2**10), (16, 2**20), (1000, 2**26), (4096, 2**30)])
def test_two_tree_broadcast_is_the_best_block_count_of_sanders_schedule(n, size):
    """Sanders, Speck & Träff 2009: (2h + 2k)(α + βS/2k) for k blocks per tree; the closed form is its minimum
    over k >= 1 (the continuous one, so every integer k is no faster, and the best is within rounding of it); at
    2 ranks and 1 KiB the message is not worth cutting and the answer is the one-block schedule itself."""
    link = Link(alpha_s=5e-6, bandwidth_bytes_per_s=25e9)
    closed = two_tree_broadcast_s(size, n, link)
    steps = [two_tree_steps_s(size, n, link, k) for k in range(1, 20001)]
    assert min(steps) >= closed * (1 - 1e-12)
    assert min(steps) <= closed * 1.01
    if (n, size) == (2, 2**10):
        assert closed == steps[0]
    topo = Topology(intra=link, inter=link, gpus_per_node=8)
    assert time_s("broadcast", size, Group(size=n, local=1), topo, "tree") == pytest.approx(closed, rel=1e-15)


def test_two_trees_have_twice_one_trees_bandwidth():
    """The paper's title claim: for large messages the two-tree broadcast approaches S·β, where one pipelined
    binary tree, whose inner nodes send every block to two children, needs 2·S·β."""
    link = Link(alpha_s=5e-6, bandwidth_bytes_per_s=25e9)
    size = 2**40
    one_tree = 2 * size * link.beta_s_per_byte
    assert one_tree / two_tree_broadcast_s(size, 64, link) == pytest.approx(2, rel=5e-3)
