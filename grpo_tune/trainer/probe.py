"""``python -m torch.distributed.run --nproc-per-node N -m grpo_tune.trainer.probe --out FILE``: measure this machine.

Run by ``grpo-tune probe-hardware``. Every rank measures at the same time, because that is how a
training run loads the machine (on CPU the ranks share cores and memory bandwidth):

- GEMM FLOP/s at several shapes (bf16 on GPU, fp32 on CPU), per rank, ``2*m*n*k / t``;
- memory bandwidth, per rank: a large tensor copy, ``2 * bytes / t`` (read + write);
- collective bus bandwidth at several message sizes over the real backend (NCCL on GPU, gloo on
  CPU): all-reduce, all-gather, reduce-scatter, all-to-all and point-to-point, with nccl-tests'
  bus factors (PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all
  (n-1)/n, send/recv 1). A collective the backend lacks is replaced by its closest real
  equivalent, and the output says so;
- on GPU, pinned host-to-device copy bandwidth; on CPU host and "device" memory are the same RAM.

Rank 0 writes a hardware profile TOML that ``core.specs.load_hardware`` reads. Figures one
machine cannot measure (inter-node bandwidth, price) come from a base profile, and ``source``
says which are measured, when, and how.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

MiB = 1 << 20


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timeit(
    fn, dev: torch.device, *, min_s: float, min_reps: int = 3, max_reps: int = 200, collective: bool = False
) -> float:
    """Median seconds of ``fn`` after one warm-up, over enough repeats for ``min_s`` of work.

    For a collective every rank must make the same number of calls, so the repeat count is agreed
    on (from the slowest rank's first call) before timing, and each call starts at a barrier.
    """
    fn()
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    first = time.perf_counter() - t0
    if collective:
        first = _agree(first)
    reps = int(min(max_reps, max(min_reps, math.ceil(min_s / max(first, 1e-9)))))
    times: list[float] = []
    for _ in range(reps):
        if collective:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _agree(x: float, op=dist.ReduceOp.MAX) -> float:
    """The slowest rank's time: a collective finishes when its last rank does."""
    t = torch.tensor([x], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op)
    return float(t.item())


def _mean(x: float) -> float:
    return _agree(x, dist.ReduceOp.SUM) / dist.get_world_size()


def _active_mean(x: float, active: int) -> float:
    """Mean of ``x`` over the ranks that measured (ranks < active)."""
    return _agree(x if dist.get_rank() < active else 0.0, dist.ReduceOp.SUM) / active


def gemm(dev: torch.device, dtype: torch.dtype, shapes, min_s: float, active: int) -> list[dict]:
    """FLOP/s per rank while ``active`` ranks multiply at once (the others wait)."""
    out = []
    for m, n, k in shapes:
        t = 1.0
        dist.barrier()
        if dist.get_rank() < active:
            a = torch.randn(m, k, device=dev, dtype=dtype)
            b = torch.randn(k, n, device=dev, dtype=dtype)
            c = torch.empty(m, n, device=dev, dtype=dtype)
            t = _timeit(lambda: torch.matmul(a, b, out=c), dev, min_s=min_s)
            del a, b, c
        out.append({"m": m, "n": n, "k": k, "flops_per_s": _active_mean(2.0 * m * n * k / t, active)})
    return out


def mem_bandwidth(dev: torch.device, nbytes: int, min_s: float, active: int) -> float:
    t = 1.0
    dist.barrier()
    if dist.get_rank() < active:
        x = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
        y = torch.empty_like(x)
        t = _timeit(lambda: y.copy_(x), dev, min_s=min_s)
    return _active_mean(2.0 * nbytes / t, active)  # one read + one write per byte


def fit_gemm_curve(rows: list[dict]) -> tuple[float, float] | None:
    """(asymptotic FLOP/s A, I_half) of ``A * I / (I + I_half)``, costmodel.timing.gemm_efficiency's curve."""
    import numpy as np
    from scipy.optimize import least_squares

    if len(rows) < 2:
        return None
    inten = np.array([1.0 / (1.0 / r["m"] + 1.0 / r["k"] + 1.0 / r["n"]) for r in rows])
    y = np.log([r["flops_per_s"] for r in rows])

    def res(x):  # log residuals; x = (log A, log I_half)
        return x[0] + np.log(inten / (inten + np.exp(x[1]))) - y

    sol = least_squares(
        res,
        [float(y.max()), math.log(float(np.median(inten)) / 4)],
        bounds=([y.max() - 5, math.log(1e-3)], [y.max() + 5, math.log(1e6)]),
    )
    return (float(math.exp(sol.x[0])), float(math.exp(sol.x[1]))) if sol.success else None


def fit_alpha_beta(rows: list[dict], factor: float) -> tuple[float, float] | None:
    """(latency_s, bus bytes/s) of ``t = alpha + factor * S / B`` by non-negative least squares."""
    import numpy as np
    from scipy.optimize import nnls

    if len(rows) < 2:
        return None
    a = np.array([[1.0, factor * r["bytes"]] for r in rows])
    t = np.array([r["time_s"] for r in rows])
    w = 1.0 / t  # relative error: small messages count as much as large ones
    (alpha, inv_b), _ = nnls(a * w[:, None], t * w)
    if inv_b <= 0:
        return None
    return float(alpha), float(1.0 / inv_b)


def h2d_bandwidth(dev: torch.device, nbytes: int, min_s: float) -> float:
    x = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    y = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dist.barrier()
    t = _timeit(lambda: y.copy_(x, non_blocking=True), dev, min_s=min_s)
    return _mean(nbytes / t)


def _supports(fn) -> bool:
    try:
        fn()
        return True
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def collectives(dev: torch.device, sizes: list[int], min_s: float) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Bus bandwidth per collective and message size; ``notes`` names any substitution made."""
    n = dist.get_world_size()
    rank = dist.get_rank()
    notes: dict[str, str] = {}
    probe = torch.ones(n * 4, device=dev)
    has_rs = _supports(lambda: dist.reduce_scatter_tensor(torch.empty(4, device=dev), probe))
    has_a2a = _supports(lambda: dist.all_to_all_single(torch.empty_like(probe), probe))
    has_agt = _supports(lambda: dist.all_gather_into_tensor(torch.empty(n * n * 4, device=dev), probe))
    if not has_rs:
        notes["reduce_scatter"] = (
            "backend lacks reduce_scatter: measured as all_reduce + local slice (moves ~2x the bytes)"
        )
    if not has_a2a:
        notes["all_to_all"] = "backend lacks all_to_all: measured as pairwise isend/irecv of every chunk"
    if not has_agt:
        notes["all_gather"] = "backend lacks all_gather_into_tensor: measured with list all_gather"
    res: dict[str, list[dict]] = {k: [] for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")}
    for size in sizes:
        elems = max(n, size // 4 // n * n)  # fp32, divisible by n
        nbytes = elems * 4
        x = torch.ones(elems, device=dev)
        chunk = torch.empty(elems // n, device=dev)
        big = torch.empty(elems * n, device=dev)
        y = torch.empty_like(x)

        def ar():
            dist.all_reduce(x)

        def ag():
            if has_agt:
                dist.all_gather_into_tensor(big, x)
            else:
                dist.all_gather(list(big.chunk(n)), x)

        def rs():
            if has_rs:
                dist.reduce_scatter_tensor(chunk, x)
            else:
                dist.all_reduce(x)
                chunk.copy_(x[rank * (elems // n) : (rank + 1) * (elems // n)])

        def a2a():
            if has_a2a:
                dist.all_to_all_single(y, x)
            else:
                ins, outs = list(x.chunk(n)), list(y.chunk(n))
                reqs = []
                for p in range(n):
                    if p == rank:
                        outs[p].copy_(ins[p])
                        continue
                    reqs.append(dist.isend(ins[p], p))
                    reqs.append(dist.irecv(outs[p], p))
                for r in reqs:
                    r.wait()

        # nccl-tests PERFORMANCE.md: algbw = S / t; busbw = algbw * factor.
        for name, fn, s_bytes, factor in (
            ("all_reduce", ar, nbytes, 2.0 * (n - 1) / n),
            ("all_gather", ag, nbytes * n, (n - 1) / n),
            ("reduce_scatter", rs, nbytes, (n - 1) / n),
            ("all_to_all", a2a, nbytes, (n - 1) / n),
        ):
            t = _agree(_timeit(fn, dev, min_s=min_s, collective=True))
            res[name].append({"bytes": s_bytes, "time_s": t, "busbw_bytes_per_s": s_bytes / t * factor})
        if n >= 2:
            # ping-pong between ranks 0 and 1; one direction takes half the round trip
            def pp():
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(y, 1)
                elif rank == 1:
                    dist.recv(y, 0)
                    dist.send(x, 0)

            t = _agree(_timeit(pp, dev, min_s=min_s, collective=True)) / 2
            res["p2p"].append({"bytes": nbytes, "time_s": t, "busbw_bytes_per_s": nbytes / t})
        x = y = chunk = big = None  # free this size's buffers (not `del`: the closures above name them)
    return res, notes


def _proc_kib_field(path: str, key: str) -> int | None:
    """Bytes of a ``Key:  N kB`` line in a /proc file (Linux), or None when absent."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss_bytes() -> int:
    return _proc_kib_field("/proc/self/status", "VmRSS") or 0


def _mem_total_bytes() -> int:
    total = _proc_kib_field("/proc/meminfo", "MemTotal")
    if total is not None:
        return total
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _fmt_bw(b: float) -> str:
    return f"{b / 1e9:.3g} GB/s"


def write_profile(
    path: Path, *, name: str, base: dict, fields: dict, efficiency: dict, source: str, comments: list[str]
) -> None:
    """The profile as TOML, through a writer that escapes every string (a name can never add a key)."""
    from grpo_tune.core import tomlwrite

    data: dict = {"name": name, "source": source, **fields}
    if base.get("price_per_gpu_hour_usd") is not None:
        data["price_per_gpu_hour_usd"] = base["price_per_gpu_hour_usd"]  # from the base profile
    eff = {**(base.get("efficiency") or {}), **efficiency}
    if eff:
        data["efficiency"] = eff
    text = tomlwrite.dumps(
        data, comments=[f"Written by `grpo-tune probe-hardware` ({source.split(';')[0]}).", *comments]
    )
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text)
    os.replace(tmp, path)


def _base_profile(name: str | None, on_gpu: bool) -> dict:
    from grpo_tune.core.specs import list_hardware, load_hardware

    if name is None:
        if on_gpu:
            dev = torch.cuda.get_device_name(0).lower()
            name = next((h for h in list_hardware() if h.split("-")[0] in dev), "h100-sxm-80gb")
        else:
            name = "cpu"
    return load_hardware(name).to_dict()


@dataclass
class Measured:
    """What every rank measured together (rank 0 writes it)."""

    on_gpu: bool
    ranks: int
    active: int
    """Ranks that measured compute and memory at once (on CPU: at most one per core)."""
    dtype: torch.dtype
    gemm: list[dict]
    mem_bytes: int
    bandwidth: float
    h2d: float
    collectives: dict[str, list[dict]]
    notes: dict[str, str]
    rss: float
    used_bytes: float | None
    elapsed_s: float


def _workload(on_gpu: bool, quick: bool) -> tuple[torch.dtype, list[tuple[int, int, int]], list[int], int]:
    """(dtype, GEMM shapes, collective message sizes, memory-copy bytes) for this kind of machine."""
    if on_gpu:
        shapes = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 1024), (4096, 14336, 4096)]
        dtype, sizes, mem_bytes = torch.bfloat16, [64 * 1024, MiB, 16 * MiB, 256 * MiB], 1024 * MiB
    else:
        shapes = [
            (128, 128, 128),
            (512, 512, 512),
            (1024, 1024, 1024),
            (256, 1024, 1024),
            (4096, 64, 256),
            (2048, 64, 192),
            (8192, 64, 64),
        ]
        dtype, sizes, mem_bytes = torch.float32, [4 * 1024, 256 * 1024, 4 * MiB, 16 * MiB], 64 * MiB
    if quick:
        shapes, sizes = shapes[:2] + shapes[-2:], sizes[:1] + sizes[-2:-1]
        mem_bytes //= 4
    return dtype, shapes, sizes, mem_bytes


def measure(dev: torch.device, on_gpu: bool, quick: bool) -> Measured:
    """Every rank runs this at once (a collective)."""
    n = dist.get_world_size()
    try:
        import megatron.core  # noqa: F401  (the trainer imports it: count it in the per-process overhead)
    except ImportError:
        pass
    rss = _agree(float(_rss_bytes()))
    t_start = time.time()
    min_s = 0.05 if quick else 0.2
    dtype, shapes, sizes, mem_bytes = _workload(on_gpu, quick)
    # On CPU, ranks beyond the core count would only time-share cores; the time model scales for
    # that itself (efficiency.max_parallel_ranks), so compute and memory are measured per core.
    active = n if on_gpu else min(n, os.cpu_count() or 1)
    g = gemm(dev, dtype, shapes, min_s, active)
    bw = mem_bandwidth(dev, mem_bytes, min_s, active)
    h2d = h2d_bandwidth(dev, 256 * MiB if not quick else 32 * MiB, min_s) if on_gpu else bw
    coll, notes = collectives(dev, sizes, min_s) if n > 1 else ({}, {"all": "one process: no collectives measured"})
    used = None
    if on_gpu:
        free, total = torch.cuda.mem_get_info(dev)
        used = _agree(float(total - free - torch.cuda.memory_allocated(dev)))
    return Measured(
        on_gpu, n, active, dtype, g, mem_bytes, bw, h2d, coll, notes, rss, used, elapsed_s=time.time() - t_start
    )


def profile_figures(m: Measured, base: dict, dev: torch.device) -> tuple[dict, dict]:
    """The profile's measured fields and its ``[efficiency]`` table; the rest comes from ``base``."""
    n = m.ranks
    peak = max(r["flops_per_s"] for r in m.gemm)
    fields: dict = {"bf16_dense_flops_per_s": peak}
    if m.on_gpu:
        fields["hbm_bytes"] = int(torch.cuda.get_device_properties(dev).total_memory)
        fields["hbm_bandwidth_bytes_per_s"] = m.bandwidth
        fields["gpus_per_node"] = torch.cuda.device_count()
        # CUDA context + NCCL buffers measured, plus 1 GiB for allocator fragmentation
        reserved = int(m.used_bytes or 0) + 1024 * MiB
    else:
        fields["hbm_bytes"] = _mem_total_bytes()
        fields["hbm_bandwidth_bytes_per_s"] = m.bandwidth
        # every process runs on this one machine: one "node" of (at least) 8 ranks, as profiles/hardware/cpu.toml
        fields["gpus_per_node"] = max(8, n)
        fields["memory_is_host"] = True  # the ranks share this machine's RAM
        reserved = int(m.rss)
    ar = m.collectives.get("all_reduce") or []
    ab = fit_alpha_beta(ar, 2.0 * (n - 1) / n)
    fields["intra_node_bandwidth_bytes_per_s"] = (
        ab[1] if ab else (ar[-1]["busbw_bytes_per_s"] if ar else base["intra_node_bandwidth_bytes_per_s"])
    )
    fields["inter_node_bandwidth_bytes_per_s"] = base["inter_node_bandwidth_bytes_per_s"]
    fields["host_memory_bytes"] = _mem_total_bytes()
    fields["host_to_device_bandwidth_bytes_per_s"] = m.h2d
    fields["reserved_memory_bytes"] = reserved
    # What the base says about the kernels (a CPU probe keeps the CPU trainer's; its memory_is_host, set above, makes
    # the trainer's own sampler its plans' default engine: the engine is the plan's, not the profile's).
    for k in (
        "attention_kernel",
        "activation_layout",
        "host_flops_per_s",
        "host_memory_bandwidth_bytes_per_s",
    ):
        if k in base:
            fields[k] = base[k]
    # Measured figures are achieved ones: bandwidth efficiencies are 1 (the base's are for datasheet peaks).
    efficiency = {"hbm_efficiency": 1.0}
    if ar:
        efficiency["comm_efficiency"] = 1.0
        efficiency["intra_node_latency_s"] = ab[0] if ab else ar[0]["time_s"]
    curve = fit_gemm_curve(m.gemm)
    if curve:
        a_flops, i_half = curve
        efficiency["gemm_efficiency_max"] = min(1.0, a_flops / peak)
        efficiency["gemm_intensity_half"] = i_half
    if not m.on_gpu:
        efficiency["max_parallel_ranks"] = os.cpu_count() or 1
    return fields, efficiency


def provenance(m: Measured, base: dict, backend: str) -> tuple[str, list[str]]:
    """The profile's ``source`` (what was measured, when, how) and the comment lines (the raw figures)."""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    kind = torch.cuda.get_device_name(0) if m.on_gpu else (platform.processor() or platform.machine())
    n_ar = len(m.collectives.get("all_reduce") or [])
    source = (
        f"measured by grpo-tune probe-hardware on {socket.gethostname()} ({kind}, {os.cpu_count()} CPUs) "
        f"at {when}; torchrun --nproc-per-node {m.ranks}, backend {backend}, torch {torch.__version__}, "
        f"all ranks at once; GEMM {str(m.dtype).replace('torch.', '')} peak over {len(m.gemm)} shapes; "
        f"{'' if m.on_gpu else f'{m.active} ranks (one per core) for compute and memory, '}"
        f"GEMM efficiency curve fitted over the shapes; memory copy {m.mem_bytes // MiB} MiB; intra-node "
        f"bandwidth and latency = alpha-beta fit of all-reduce times over {n_ar} sizes "
        f"(nccl-tests busbw factors); inter-node bandwidth"
        f"{'' if base.get('price_per_gpu_hour_usd') is None else ', price'} from base profile "
        f"{base['name']!r} (not measurable on one machine)"
    )
    if m.notes:
        source += "; " + "; ".join(f"{k}: {v}" for k, v in m.notes.items())
    comments = [f"probe took {m.elapsed_s:.1f} s; per-process resident memory after imports {m.rss / MiB:.0f} MiB"]
    comments.append("GEMM (m x n x k -> FLOP/s per rank):")
    comments += [f"  {r['m']}x{r['n']}x{r['k']}: {r['flops_per_s'] / 1e9:.2f} GFLOP/s" for r in m.gemm]
    comments.append(f"memory copy bandwidth per rank: {_fmt_bw(m.bandwidth)}")
    for cname, rows in m.collectives.items():
        if rows:
            comments.append(
                f"{cname} busbw: "
                + ", ".join(f"{r['bytes'] // 1024} KiB {_fmt_bw(r['busbw_bytes_per_s'])}" for r in rows)
                + (f"  ({m.notes[cname]})" if cname in m.notes else "")
            )
    return source, comments


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grpo_tune.trainer.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="hardware profile TOML to write")
    ap.add_argument("--name", default=None, help="profile name (default: the file's stem)")
    ap.add_argument(
        "--base",
        default=None,
        help="profile for figures one machine cannot measure (default: cpu, or the GPU's preset)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer shapes and sizes (tests)")
    args = ap.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    backend = "nccl" if on_gpu else "gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    if on_gpu:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    dist.init_process_group(backend)
    m = measure(dev, on_gpu, args.quick)
    if dist.get_rank() == 0:
        base = _base_profile(args.base, on_gpu)
        out = Path(args.out)
        fields, efficiency = profile_figures(m, base, dev)
        source, comments = provenance(m, base, backend)
        name = args.name or out.stem
        write_profile(out, name=name, base=base, fields=fields, efficiency=efficiency, source=source, comments=comments)
        print("\n".join(comments), flush=True)
        print(f"wrote {out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
