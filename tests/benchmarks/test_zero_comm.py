"""benchmarks/zero_comm.py's arithmetic: ZeRO volumes against the paper's 2 Psi and 3 Psi, the ring's
(N-1)/N, the bus bandwidth across nodes, the measured line, and the compute-bound micro-batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import zero_comm as zc

PSI, BF16 = 100.5e6, 2
ONE_NODE = zc.Topology("1 node", 1, 8)
TWO_NODES = zc.Topology("2 nodes", 2, 8)
DGX = zc.Links(nvlink_gbps=450, nic_gbps=50, nics_per_node=8, efficiency=0.8)


@pytest.mark.parametrize(
    ("kind", "gpus", "fraction"),
    [
        (zc.ALL_GATHER, 8, 7 / 8),
        (zc.REDUCE_SCATTER, 16, 15 / 16),
        (zc.ALL_REDUCE, 8, 2 * 7 / 8),
        (zc.ALL_GATHER, 1, 0.0),  # one GPU sends nothing
    ],
)
def test_each_gpu_sends_n_minus_1_over_n_of_the_buffer_twice_for_an_all_reduce(kind, gpus, fraction):
    assert zc.ring_fraction(kind, gpus) == pytest.approx(fraction)


@pytest.mark.parametrize("gpus", [2, 8, 16])
def test_paper_zero_1_and_2_send_what_a_data_parallel_all_reduce_sends_and_zero_3_half_again(gpus):
    all_reduce = zc.bytes_per_gpu((zc.GRAD_AR,), PSI, gpus, BF16)
    assert all_reduce == pytest.approx(2 * PSI * BF16 * (gpus - 1) / gpus)
    for stage in ("ZeRO-1", "ZeRO-2"):
        assert zc.elements_moved(zc.PAPER[stage]) == 2
        assert zc.bytes_per_gpu(zc.PAPER[stage], PSI, gpus, BF16) == pytest.approx(all_reduce)
    assert zc.elements_moved(zc.PAPER["ZeRO-3"]) == 3
    assert zc.bytes_per_gpu(zc.PAPER["ZeRO-3"], PSI, gpus, BF16) == pytest.approx(1.5 * all_reduce)


def test_deepspeed_0_19_8_sends_1_5x_the_paper_at_zero_1_and_2_and_2_psi_at_zero_3():
    paper = zc.bytes_per_gpu(zc.PAPER["ZeRO-1"], PSI, 8, BF16)
    for stage in ("ZeRO-1", "ZeRO-2"):  # the gradient bucket all-reduced, then the all-gather
        assert zc.bytes_per_gpu(zc.DEEPSPEED_0_19_8[stage], PSI, 8, BF16) == pytest.approx(1.5 * paper)
    # parameters kept gathered from forward to backward: no second all-gather
    assert zc.bytes_per_gpu(zc.DEEPSPEED_0_19_8["ZeRO-3"], PSI, 8, BF16) == pytest.approx(paper)
    assert zc.bytes_per_gpu(zc.PAPER["ZeRO-1"], PSI, 8, 4) == pytest.approx(2 * paper)  # fp32


def test_bus_bandwidth_is_nvlink_in_a_node_and_the_lower_of_nvlink_and_the_nodes_nics_across():
    assert zc.bus_gbps(ONE_NODE, DGX) == pytest.approx(360)
    assert zc.bus_gbps(TWO_NODES, DGX) == pytest.approx(320)  # 8 x 50 GB/s < 450
    one_nic = zc.Links(450, 50, 1, 0.8)
    assert zc.bus_gbps(ONE_NODE, one_nic) == pytest.approx(360)  # NICs unused in a node
    assert zc.bus_gbps(TWO_NODES, one_nic) == pytest.approx(40)
    assert zc.bus_gbps(TWO_NODES, zc.Links(450, 100, 8, 1.0)) == pytest.approx(450)  # NVLink bound


def test_the_line_through_two_steps_gives_back_its_fixed_cost_and_rate():
    fixed, rate = 0.050, 400e12
    points = [(b, (fixed + b * g * 1e9 / rate) * 1e3, g) for b, g in ((256, 40.0), (1024, 44.0))]
    assert zc.straight_line(points) == pytest.approx((fixed, rate))
    # the measured ZeRO-1 steps (BENCHMARKS.md): ~64 ms fixed, ~350 TFLOP/s on the work
    measured = [zc._point(p) for p in zc.DEFAULT_POINTS]
    fixed_s, rate_flops = zc.straight_line(measured)
    assert fixed_s == pytest.approx(0.0643, abs=5e-4)
    assert rate_flops == pytest.approx(350e12, rel=0.01)


def test_compute_bound_batch_is_the_smallest_whose_compute_covers_the_communication():
    assert zc.compute_bound_batch(1.0e-3, 0.25e-3) == 4  # an exact ratio is not rounded up
    assert zc.compute_bound_batch(1.01e-3, 0.25e-3) == 5
    assert zc.compute_bound_batch(0.0, 0.25e-3) == 1


def _batch(links: zc.Links, rate: float, topology: zc.Topology = TWO_NODES) -> int:
    nbytes = zc.bytes_per_gpu(zc.PAPER["ZeRO-1"], PSI, topology.gpus, BF16)
    comm = zc.comm_seconds(nbytes, zc.bus_gbps(topology, links))
    return zc.compute_bound_batch(comm, 40.13e9 / rate)


def test_the_compute_bound_batch_falls_with_bandwidth_and_rises_with_faster_compute():
    slow, fast = zc.Links(450, 50, 1, 0.8), DGX
    assert _batch(fast, 350e12) < _batch(slow, 350e12)
    assert _batch(fast, 0.45 * 989e12) > _batch(fast, 0.35 * 989e12)
    assert _batch(fast, 350e12, ONE_NODE) < _batch(fast, 350e12, TWO_NODES)


def test_overlap_hides_the_passes_collectives_but_not_zero_1s_all_gather_after_the_step():
    sample_s = 40.13e9 / 350e12
    phases = zc.seconds_by_phase(zc.PAPER["ZeRO-1"], PSI, 8, BF16, 360)
    batch, exposed = zc.overlapped_batch(phases, sample_s)
    all_gather = zc.comm_seconds(zc.bytes_per_gpu((zc.PARAM_AG_STEP,), PSI, 8, BF16), 360)
    assert exposed == pytest.approx(all_gather)
    assert batch == zc.compute_bound_batch(phases[zc.BACKWARD], sample_s * 2 / 3)
    assert batch <= zc.compute_bound_batch(sum(phases.values()), sample_s)
    zero_3 = zc.seconds_by_phase(zc.PAPER["ZeRO-3"], PSI, 8, BF16, 360)
    assert zc.overlapped_batch(zero_3, sample_s)[1] == 0.0


def test_the_script_prints_the_section_and_writes_it_with_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "zero.md"
    zc.main(["--output", str(out), "--nics-per-node", "1"])
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert printed.startswith("## Multi-GPU on paper")
    assert "| ZeRO-1, ZeRO-2 | 8 (1 node, NVLink) | gradient reduce-scatter + parameter all-gather" in printed
    assert "376.9 MB | 40 | 9.42 |" in printed  # 2 nodes on one NIC each: 2 Psi x 15/16 at 40 GB/s


def test_docs_multi_gpu_holds_the_section_the_script_prints_with_its_defaults() -> None:
    # Stale after a change to the script or its defaults: paste `python benchmarks/zero_comm.py`'s
    # output into docs/multi_gpu.md.
    inputs, _ = zc.parse_args([])
    assert zc.section(inputs) in (REPO_ROOT / "docs" / "multi_gpu.md").read_text()
