"""Multi-GPU on paper: what DeepSpeed ZeRO-1/2/3 sends per optimizer step on 8 GPUs and on 2 nodes,
how long that takes, and the per-GPU micro-batch at which the step's compute covers it (issue 55).

Arithmetic only, no GPU and no torch: the device this project is lent has one GPU. Inputs:
- the model's parameter count Psi and the bytes of one communicated element (bf16: 2);
- the step measured on one H100 (BENCHMARKS.md, "GPU: the text pipeline's training step"): two
  points (batch, ms per step, forward+backward GFLOP per sample), through which a straight line
  gives a fixed cost per step and a rate on the work itself;
- the links: NVLink per GPU and direction, NICs per node, and one efficiency for what NCCL gets
  of a link's line rate.

Volumes, per GPU and optimizer step, in elements of Psi before the ring's (N-1)/N:
- the ZeRO paper (Rajbhandari et al. 2020, section 7): ZeRO-1 and ZeRO-2 a gradient
  reduce-scatter + a parameter all-gather = 2 Psi, as data parallelism's all-reduce; ZeRO-3 adds
  a second parameter all-gather (forward and backward) = 3 Psi;
- DeepSpeed 0.19.8 as our job configures it (no zero_optimization overrides), read from its source:
  ZeRO-1/2 all-reduce the gradient bucket (`use_multi_rank_bucket_allreduce: true`) = 2 Psi, plus
  the all-gather = 3 Psi; ZeRO-3 keeps a 100M model's gathered parameters from forward to backward
  (`stage3_max_reuse_distance` 1e9 > Psi) = 2 Psi. docs/multi_gpu.md cites the functions.

`python benchmarks/zero_comm.py` prints the Markdown section; `--output FILE` also writes it.
Every input is an option, so a session with GPUs can re-run it with fresh step figures.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all-reduce", "reduce-scatter", "all-gather"
FORWARD, BACKWARD, AFTER_STEP = "forward", "backward", "after the optimizer step"
# Share of forward+backward FLOPs in each pass: backward costs twice forward (2 FLOPs per
# parameter and token forward, 4 backward: the C = 6N count of Kaplan et al. 2020).
PASS_SHARE = {FORWARD: 1 / 3, BACKWARD: 2 / 3}

DEFAULT_POINTS = ["256:93.7:40.13", "1024:191.7:43.51"]  # ZeRO-1 bf16, one H100, StepRunner
DEFAULT_MFU_TARGETS = [0.35, 0.45]  # the targets at batch 256 and 1024
DEFAULT_GLOBAL_BATCHES = [256, 1024]


@dataclass(frozen=True)
class Collective:
    what: str
    kind: str  # ALL_REDUCE, REDUCE_SCATTER or ALL_GATHER
    phase: str  # the pass it can hide behind (FORWARD, BACKWARD), or AFTER_STEP: nothing


GRAD_RS = Collective("gradient reduce-scatter", REDUCE_SCATTER, BACKWARD)
GRAD_AR = Collective("gradient all-reduce", ALL_REDUCE, BACKWARD)
PARAM_AG_STEP = Collective("parameter all-gather", ALL_GATHER, AFTER_STEP)
PARAM_AG_FWD = Collective("parameter all-gather (forward)", ALL_GATHER, FORWARD)
PARAM_AG_BWD = Collective("parameter all-gather (backward)", ALL_GATHER, BACKWARD)

# ZeRO-1 and ZeRO-2 send the same per optimizer step (without gradient accumulation): one row.
TABLE_ROWS = (("ZeRO-1, ZeRO-2", "ZeRO-1"), ("ZeRO-3", "ZeRO-3"))
PAPER = {
    "ZeRO-1": (GRAD_RS, PARAM_AG_STEP),
    "ZeRO-2": (GRAD_RS, PARAM_AG_STEP),
    "ZeRO-3": (PARAM_AG_FWD, PARAM_AG_BWD, GRAD_RS),
}
DEEPSPEED_0_19_8 = {
    "ZeRO-1": (GRAD_AR, PARAM_AG_STEP),
    "ZeRO-2": (GRAD_AR, PARAM_AG_STEP),
    "ZeRO-3": (PARAM_AG_FWD, GRAD_RS),
}


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Links:
    nvlink_gbps: float  # per GPU and direction (H100 SXM: 450 of the 900 GB/s bidirectional)
    nic_gbps: float  # per NIC and direction (400 Gb/s = 50 GB/s)
    nics_per_node: int
    efficiency: float  # the share of line rate NCCL's bus bandwidth reaches


def ring_fraction(kind: str, gpus: int) -> float:
    """Share of its buffer each GPU sends in a ring collective: (N-1)/N, twice for an all-reduce."""
    fraction = (gpus - 1) / gpus
    return 2 * fraction if kind == ALL_REDUCE else fraction


def elements_moved(collectives: tuple[Collective, ...]) -> int:
    """In units of Psi, before the ring fraction: the paper's 2 Psi, 3 Psi."""
    return sum(2 if c.kind == ALL_REDUCE else 1 for c in collectives)


def bytes_per_gpu(collectives: tuple[Collective, ...], params: float, gpus: int, element_bytes: int) -> float:
    """Bytes each GPU sends per optimizer step (each collective's buffer is the whole model)."""
    return sum(params * element_bytes * ring_fraction(c.kind, gpus) for c in collectives)


def bus_gbps(topology: Topology, links: Links) -> float:
    """NCCL bus bandwidth: time = bytes each GPU sends / this (nccl-tests' busbw definition).

    In a node, NVLink. Across nodes, a ring (one channel per NIC) carries out of each node what one
    GPU sends, so the node's NICs together and each GPU's NVLink bound it, whichever is lower."""
    line = links.nvlink_gbps
    if topology.nodes > 1:
        line = min(line, links.nics_per_node * links.nic_gbps)
    return line * links.efficiency


def comm_seconds(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * 1e9)


def straight_line(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(fixed seconds per step, FLOP/s on the work) through two (batch, ms, GFLOP/sample) points."""
    (b1, ms1, g1), (b2, ms2, g2) = points[0], points[-1]
    work1, work2 = b1 * g1 * 1e9, b2 * g2 * 1e9
    rate = (work2 - work1) / ((ms2 - ms1) / 1e3)
    return ms1 / 1e3 - work1 / rate, rate


def compute_bound_batch(comm_s: float, sample_s: float) -> int:
    """No overlap: the smallest micro-batch whose compute lasts at least as long as the
    communication (the step then spends at least half its time computing)."""
    return max(1, math.ceil(round(comm_s / sample_s, 9)))


def seconds_by_phase(
    collectives: tuple[Collective, ...], params: float, gpus: int, element_bytes: int, gbps: float
) -> dict[str, float]:
    phases: dict[str, float] = {FORWARD: 0.0, BACKWARD: 0.0, AFTER_STEP: 0.0}
    for c in collectives:
        phases[c.phase] += comm_seconds(bytes_per_gpu((c,), params, gpus, element_bytes), gbps)
    return phases


def overlapped_batch(phases: dict[str, float], sample_s: float) -> tuple[int, float]:
    """With overlap: (the smallest micro-batch whose forward and backward each last as long as the
    communication that runs beside them, the seconds nothing hides)."""
    batch = 1
    for phase, share in PASS_SHARE.items():
        batch = max(batch, compute_bound_batch(phases[phase], sample_s * share))
    return batch, phases[AFTER_STEP]


@dataclass(frozen=True)
class Inputs:
    params: float
    element_bytes: int
    points: list[tuple[int, float, float]]
    gflop_per_sample: float
    peak_tflops: float
    mfu_targets: list[float]
    topologies: list[Topology]
    links: Links
    global_batches: list[int]

    def rates(self) -> list[tuple[str, float]]:
        """(label, FLOP/s): the measured line's rate on the work, then each MFU target's."""
        _, measured = straight_line(self.points)
        return [("measured", measured)] + [
            (f"MFU {t:.0%}", t * self.peak_tflops * 1e12) for t in self.mfu_targets
        ]

    def sample_seconds(self, rate: float) -> float:
        return self.gflop_per_sample * 1e9 / rate


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def volume_table(inputs: Inputs) -> list[str]:
    lines = [
        "| ZeRO | GPUs | collectives per step (paper) | elements sent per GPU | bytes sent per GPU "
        "| bus GB/s | comm ms | DeepSpeed 0.19.8 as configured: elements | bytes | comm ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, stage in TABLE_ROWS:
        for topo in inputs.topologies:
            gbps = bus_gbps(topo, inputs.links)
            row = [label, f"{topo.gpus} ({topo.name})", " + ".join(c.what for c in PAPER[stage])]
            for scheme in (PAPER, DEEPSPEED_0_19_8):
                nbytes = bytes_per_gpu(scheme[stage], inputs.params, topo.gpus, inputs.element_bytes)
                frac = f"{topo.gpus - 1}/{topo.gpus}"
                row += [f"{elements_moved(scheme[stage])} Psi x {frac}", _mb(nbytes)]
                row += ([f"{gbps:.0f}"] if scheme is PAPER else []) + [_ms(comm_seconds(nbytes, gbps))]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def _batch_cells(inputs: Inputs, collectives: tuple[Collective, ...], topo: Topology) -> list[str]:
    gbps = bus_gbps(topo, inputs.links)
    phases = seconds_by_phase(collectives, inputs.params, topo.gpus, inputs.element_bytes, gbps)
    cells = []
    for _, rate in inputs.rates():
        sample_s = inputs.sample_seconds(rate)
        batch, _ = overlapped_batch(phases, sample_s)
        cells.append(f"{compute_bound_batch(sum(phases.values()), sample_s)} / {batch}")
    return [*cells, _ms(phases[AFTER_STEP])]


def batch_table(inputs: Inputs) -> list[str]:
    labels = [label for label, _ in inputs.rates()]
    head = " | ".join(f"{label}: no overlap / overlap" for label in labels)
    lines = [
        f"| volumes | ZeRO | GPUs | {head} | ms left exposed with overlap |",
        "|---|---|---|" + "---|" * (len(labels) + 1),
    ]
    for scheme_name, scheme in (("paper", PAPER), ("DeepSpeed 0.19.8", DEEPSPEED_0_19_8)):
        for label, stage in TABLE_ROWS:
            for topo in inputs.topologies:
                cells = [scheme_name, label, str(topo.gpus), *_batch_cells(inputs, scheme[stage], topo)]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def job_batch_table(inputs: Inputs) -> list[str]:
    """ZeRO-1 as our job would run it (DeepSpeed 0.19.8, no overlap) at the measured global batches,
    assuming each rank pays the measured fixed cost per step."""
    fixed, rate = straight_line(inputs.points)
    sample_s = inputs.sample_seconds(rate)
    lines = [
        "| GPUs | global batch | micro-batch per GPU | step ms (fixed + work + comm) | comm share "
        "| one GPU on the line, same global batch, ms | samples/s vs one GPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for topo in inputs.topologies:
        gbps = bus_gbps(topo, inputs.links)
        comm = comm_seconds(
            bytes_per_gpu(DEEPSPEED_0_19_8["ZeRO-1"], inputs.params, topo.gpus, inputs.element_bytes), gbps
        )
        for global_batch in inputs.global_batches:
            micro = global_batch / topo.gpus
            step = fixed + micro * sample_s + comm
            alone = fixed + global_batch * sample_s
            cells = [str(topo.gpus), str(global_batch), f"{micro:g}", _ms(step), f"{comm / step:.1%}"]
            lines.append("| " + " | ".join([*cells, _ms(alone), f"{alone / step:.2f}x"]) + " |")
    return lines


def assumptions(inputs: Inputs) -> list[str]:
    fixed, rate = straight_line(inputs.points)
    links = inputs.links
    points = ", ".join(f"batch {b}: {ms} ms, {g} GFLOP/sample" for b, ms, g in inputs.points)
    buses = ", ".join(f"{t.name} {bus_gbps(t, links):.0f} GB/s" for t in inputs.topologies)
    return [
        f"- Model: Psi = {inputs.params / 1e6:.1f}M parameters, {inputs.element_bytes} bytes per "
        "communicated element (bf16 gradients and parameters: DeepSpeed's `communication_data_type` "
        "defaults to the bf16 compute dtype).",
        f"- Step measured on one H100 (ZeRO-1, bf16): {points}. Straight line: {fixed * 1e3:.1f} ms "
        f"fixed per step + {rate / 1e12:.0f} TFLOP/s on the work. Compute per sample: "
        f"{inputs.gflop_per_sample} GFLOP (batch 256's count, the lower: less compute to hide behind).",
        f"- Compute that hides communication: the work term only ({inputs.sample_seconds(rate) * 1e3:.4f}"
        " ms a sample at the measured rate), not the fixed cost, which is host time (kernel launches, "
        "per-tensor checks). MFU targets: the whole step at "
        + ", ".join(f"{t:.0%}" for t in inputs.mfu_targets)
        + f" of {inputs.peak_tflops:.0f} TFLOP/s, assumed to hold at the smaller batches.",
        f"- Links: NVLink {links.nvlink_gbps:.0f} GB/s per GPU and direction; {links.nics_per_node} "
        f"NICs of {links.nic_gbps:.0f} GB/s per node; NCCL at {links.efficiency:.0%} of line rate. "
        f"Bus bandwidth: {buses}.",
        "- Overlap: `overlap_comm: true` with `reduce_bucket_size` below Psi (our job sets neither: "
        "its ZeRO-1/2 get the no-overlap column). Forward-time collectives hide behind forward "
        "(1/3 of the work), backward-time ones behind backward (2/3); ZeRO-1/2's parameter "
        "all-gather after the optimizer step hides behind nothing.",
    ]


def section(inputs: Inputs) -> str:
    lines = [
        "## Multi-GPU on paper: ZeRO communication per optimizer step (issue 55)",
        "",
        "_Arithmetic, not a measurement: `python benchmarks/zero_comm.py` (docs/multi_gpu.md explains "
        "the formulas and their sources)._",
        "",
        *assumptions(inputs),
        "",
        "Bytes each GPU sends per optimizer step (gradient accumulation 1), and the time at the bus "
        "bandwidth (1 MB = 1e6 bytes):",
        "",
        *volume_table(inputs),
        "",
        "Compute-bound micro-batch per GPU at each compute rate. No overlap: the smallest micro-batch "
        "whose compute lasts as long as the whole communication (which then takes at most half the "
        "step). Overlap: the smallest whose forward and backward each last as long as the "
        "collectives running beside them; what runs after the optimizer step stays exposed:",
        "",
        *batch_table(inputs),
        "",
        "ZeRO-1 as our job would run it today (DeepSpeed 0.19.8 volumes, no overlap) at the measured "
        "global batches, each rank paying the measured fixed cost per step:",
        "",
        *job_batch_table(inputs),
    ]
    return "\n".join(lines) + "\n"


def _point(text: str) -> tuple[int, float, float]:
    batch, ms, gflop = text.split(":")
    return int(batch), float(ms), float(gflop)


def parse_args(argv: list[str] | None = None) -> tuple[Inputs, Path | None]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=100.5e6, help="parameters (default 100.5e6)")
    p.add_argument("--bytes-per-element", type=int, default=2, help="2 for bf16, 4 for fp32")
    p.add_argument("--point", action="append", help="BATCH:MS:GFLOP_PER_SAMPLE, twice (default: ours)")
    p.add_argument("--gflop-per-sample", type=float, default=40.13)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM)")
    p.add_argument("--mfu-target", type=float, action="append", help="default 0.35 and 0.45")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes", type=int, default=2, help="the multi-node topology's node count")
    p.add_argument("--nvlink-gbps", type=float, default=450.0, help="per GPU and direction")
    p.add_argument("--nic-gbps", type=float, default=50.0, help="per NIC and direction")
    p.add_argument("--nics-per-node", type=int, default=8)
    p.add_argument("--efficiency", type=float, default=0.8, help="NCCL's share of line rate")
    p.add_argument("--global-batch", type=int, action="append", help="default 256 and 1024")
    p.add_argument("--output", type=Path, help="also write the section to this file")
    args = p.parse_args(argv)
    if args.point is not None and len(args.point) != 2:
        p.error("--point: give two steps (a line needs two points)")
    return _inputs(args), args.output


def _inputs(args: argparse.Namespace) -> Inputs:
    return Inputs(
        params=args.params,
        element_bytes=args.bytes_per_element,
        points=[_point(t) for t in (args.point or DEFAULT_POINTS)],
        gflop_per_sample=args.gflop_per_sample,
        peak_tflops=args.peak_tflops,
        mfu_targets=args.mfu_target or DEFAULT_MFU_TARGETS,
        topologies=[
            Topology("1 node, NVLink", 1, args.gpus_per_node),
            Topology(f"{args.nodes} nodes, NVLink + InfiniBand", args.nodes, args.gpus_per_node),
        ],
        links=Links(args.nvlink_gbps, args.nic_gbps, args.nics_per_node, args.efficiency),
        global_batches=args.global_batch or DEFAULT_GLOBAL_BATCHES,
    )


def main(argv: list[str] | None = None) -> None:
    inputs, output = parse_args(argv)
    text = section(inputs)
    print(text, end="")
    if output:
        output.write_text(text)


if __name__ == "__main__":
    main()
