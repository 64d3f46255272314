"""Collective communication times and which link a process group uses.

Ring algorithms, alpha-beta model: ``t = latency + bus_factor * bytes / bus_bandwidth``. The bus
factors are those of nccl-tests' PERFORMANCE.md ("busbw"): all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n (``bytes`` is the full, gathered buffer), all-to-all (n-1)/n.
Plain float math: the search calls these thousands of times.
"""

from __future__ import annotations

from collections.abc import Mapping

from grpo_tune.core.specs import Efficiency, HardwareSpec


def all_reduce_s(nbytes: float, n: int, bw: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` per rank (nccl-tests PERFORMANCE.md: busbw = algbw * 2(n-1)/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return latency_s + 2.0 * (n - 1) / n * nbytes / bw


def all_gather_s(nbytes: float, n: int, bw: float, latency_s: float = 0.0) -> float:
    """All-gather producing ``nbytes`` per rank (nccl-tests PERFORMANCE.md: busbw = algbw * (n-1)/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return latency_s + (n - 1) / n * nbytes / bw


def reduce_scatter_s(nbytes: float, n: int, bw: float, latency_s: float = 0.0) -> float:
    """Reduce-scatter of an ``nbytes`` input per rank (nccl-tests PERFORMANCE.md: (n-1)/n)."""
    return all_gather_s(nbytes, n, bw, latency_s)


def all_to_all_s(nbytes: float, n: int, bw: float, latency_s: float = 0.0) -> float:
    """All-to-all of ``nbytes`` per rank: a fraction (n-1)/n leaves the rank (nccl-tests alltoall busbw)."""
    return all_gather_s(nbytes, n, bw, latency_s)


def p2p_s(nbytes: float, bw: float, latency_s: float = 0.0) -> float:
    """One send/recv between neighbouring pipeline stages."""
    if nbytes <= 0:
        return 0.0
    return latency_s + nbytes / bw


def spans_nodes(span: int, gpus_per_node: int) -> bool:
    """Does a group whose ranks lie within ``span`` consecutive ranks cross a node boundary?

    Megatron's rank order is tp -> cp -> ep/dp -> pp (fastest varying first), so a TP group spans
    ``tp`` consecutive ranks, a CP group ``tp*cp``, a DP group ``tp*cp*dp`` and a PP group all of them.
    """
    return span > gpus_per_node


def nvlink_domain(hw: HardwareSpec, gpus_per_node: int) -> int:
    """GPUs one NVLink domain joins: the node (``gpus_per_node``), or more where the profile says so
    (GB200 NVL72: 72 GPUs across 18 hosts of 4)."""
    return hw.nvlink_domain_gpus if hw.nvlink_domain_gpus > gpus_per_node else gpus_per_node


def hierarchical_all_reduce_s(
    nbytes: float, n: int, domain: int, intra: tuple[float, float], inter: tuple[float, float]
) -> float:
    """All-reduce of ``nbytes`` over ``n`` ranks that span NVLink domains of ``domain`` ranks, as NCCL
    runs it across nodes: reduce-scatter inside the domain over NVLink, an all-reduce of each rank's
    1/domain share across the n/domain domains (every GPU on its own NIC, so all NICs at once), then an
    all-gather inside the domain. ``intra``/``inter``: (bandwidth, latency) of the two links."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g = min(domain, n)
    nodes = max(1, n // g)
    bw_i, lat_i = intra
    bw_x, lat_x = inter
    return (
        reduce_scatter_s(nbytes, g, bw_i, lat_i)
        + all_reduce_s(nbytes / g, nodes, bw_x, lat_x)
        + all_gather_s(nbytes, g, bw_i, lat_i)
    )


def ring_link(
    hw: HardwareSpec, span: int, per_node: int, gpus_per_node: int, cal: Mapping[str, float]
) -> tuple[float, float]:
    """``(bandwidth, latency_s)`` per rank of an NCCL ring collective (broadcast, all-gather) over a group of
    ``span`` ranks with ``per_node`` of them on each node. Inside an NVLink domain: NVLink. Across nodes NCCL's
    channels are rail-aligned: each enters and leaves a node on its own NIC, so the group's ring crosses a node
    at the NICs of its ``per_node`` GPUs together (``per_node`` x the per-GPU NIC bandwidth), bounded by the
    NVLink rate each GPU forwards at (NVIDIA/nccl issue #412); a group with one rank per node (a pipeline group
    across nodes) runs at one NIC. Both scaled by ``comm_efficiency`` and the calibration."""
    scale = cal["comm_efficiency_scale"]
    ce = hw.efficiency.comm_efficiency * scale
    if not spans_nodes(span, nvlink_domain(hw, gpus_per_node)):
        return hw.intra_node_bandwidth_bytes_per_s * ce, hw.efficiency.intra_node_latency_s / scale
    g = max(1, min(per_node, gpus_per_node))
    bw = min(g * hw.inter_node_bandwidth_bytes_per_s, hw.intra_node_bandwidth_bytes_per_s)
    return bw * ce, hw.efficiency.inter_node_latency_s / scale


def link(
    hw: HardwareSpec, span: int, gpus_per_node: int, cal: Mapping[str, float], e: Efficiency | None = None
) -> tuple[float, float]:
    """``(bandwidth, latency_s)`` of the link a group of ``span`` ranks runs its collectives over, both scaled
    by the calibration's collective speed (``comm_efficiency_scale``); ``e``: the efficiencies (the profile's)."""
    scale = cal["comm_efficiency_scale"]
    ce = (e or hw.efficiency).comm_efficiency * scale
    if spans_nodes(
        span, nvlink_domain(hw, gpus_per_node)
    ):  # NVLink inside a node, the NIC across nodes (per GPU, one direction)
        return hw.inter_node_bandwidth_bytes_per_s * ce, hw.efficiency.inter_node_latency_s / scale
    return hw.intra_node_bandwidth_bytes_per_s * ce, hw.efficiency.intra_node_latency_s / scale
