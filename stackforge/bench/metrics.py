"""Bandwidth and throughput formulas, defined exactly as nccl-tests and GEMM benchmarks define them.

nccl-tests (``doc/PERFORMANCE.md``) reports two bandwidths for a collective over ``n`` ranks that
moved ``S`` bytes in ``t`` seconds:

* ``algbw = S / t`` -- the "algorithm bandwidth" the user sees, in GB/s with GB = 1e9 bytes;
* ``busbw = algbw * factor(n)`` -- the bandwidth each link really carried, which is what can be
  compared against the hardware's link speed, independently of the rank count.

``S`` is the size nccl-tests prints in its ``size`` column: the full buffer (for all-gather the
gathered output, for reduce-scatter the full input). The factors per collective are those of
nccl-tests' ``*GetBw`` functions. busbw is *not* comparable across algorithms (NVLS reduces inside
the switch and can exceed the link speed), so the algorithm is always recorded beside it.

The in-image bench scripts carry a copy of these formulas (they run where stackforge is not
installed); ``tests/test_bench_metrics.py`` checks that the copies equal this module.
"""

from __future__ import annotations

#: Collectives whose bus-bandwidth factor nccl-tests defines.
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv")

#: Bytes in the GB nccl-tests uses for GB/s (decimal, not GiB).
GB = 1e9
#: FLOPs in a TFLOP.
TFLOP = 1e12


def busbw_factor(collective: str, n_ranks: int) -> float:
    """The factor nccl-tests multiplies algbw by to get busbw.

    all-reduce ``2(n-1)/n`` (a reduce-scatter then an all-gather, each moving ``(n-1)/n`` of the
    data over every link); all-gather, reduce-scatter and all-to-all ``(n-1)/n``; broadcast,
    reduce and send/recv ``1`` (every byte crosses a link once).

    Raises:
        ValueError: an unknown collective or fewer than one rank.
    """
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    name = collective.replace("_", "").replace("-", "").lower()
    if name == "allreduce":
        return 2.0 * (n_ranks - 1) / n_ranks
    if name in ("allgather", "reducescatter", "alltoall"):
        return (n_ranks - 1) / n_ranks
    if name in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes): ``size / time``.

    Raises:
        ValueError: a non-positive time or a negative size.
    """
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r}")
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0, got {size_bytes!r}")
    return size_bytes / seconds / GB


def gemm_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an ``[m,k] x [k,n]`` matrix product: one multiply and one add
    per (row, column, inner) triple, ``2*m*n*k``."""
    if min(m, n, k) < 1:
        raise ValueError(f"GEMM dimensions must be >= 1, got m={m} n={n} k={k}")
    return 2 * m * n * k


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """Achieved TFLOP/s of one ``[m,k] x [k,n]`` product that took ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r}")
    return gemm_flops(m, n, k) / seconds / TFLOP
