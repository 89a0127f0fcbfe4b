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

The formulas themselves live in ``stackforge/inimage/_sfshared.py``, the one stdlib-only
module that the in-image bench scripts import too (from the mounted in-image package); this module is their
name on the host.
"""

from __future__ import annotations

from stackforge.inimage._sfshared import (
                                                 COLLECTIVES,
                                                 GB,
                                                 TFLOP,
                                                 algbw_gbps,
                                                 busbw_factor,
                                                 busbw_gbps,
                                                 gemm_flops,
                                                 tflops,
)

__all__ = ["COLLECTIVES", "GB", "TFLOP", "algbw_gbps", "busbw_factor", "busbw_gbps", "gemm_flops", "tflops"]
