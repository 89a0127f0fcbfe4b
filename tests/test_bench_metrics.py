"""nccl-tests' bandwidth formulas, GEMM FLOPs, and the in-image scripts' copies of them."""

from __future__ import annotations

import math

import pytest
from _bench_helpers import load_script

from stackforge.bench import metrics, stats

RANKS = range(1, 17)
SIZES = (1, 8, 1000, 1 << 20, 3 * (1 << 29), 1 << 30)
TIMES = (1e-6, 3.3e-5, 0.5, 2.0)


def nccl_tests_factor(collective: str, n: int) -> float:
    """Written out from nccl-tests doc/PERFORMANCE.md, independently of the code under test."""
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reducescatter": (n - 1) / n,
            "alltoall": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}[collective]


@pytest.mark.parametrize("collective", metrics.COLLECTIVES)
def test_busbw_factor_is_nccl_tests(collective):
    for n in RANKS:
        assert metrics.busbw_factor(collective, n) == pytest.approx(nccl_tests_factor(collective, n))


def test_busbw_factor_known_values():
    assert metrics.busbw_factor("allreduce", 8) == 1.75
    assert metrics.busbw_factor("allreduce", 2) == 1.0
    assert metrics.busbw_factor("allreduce", 1) == 0.0      # one rank moves nothing over a bus
    assert metrics.busbw_factor("all_gather", 4) == 0.75   # spelling variants accepted
    assert metrics.busbw_factor("reduce-scatter", 8) == 0.875
    assert metrics.busbw_factor("broadcast", 8) == 1.0


def test_busbw_factor_rejects_nonsense():
    with pytest.raises(ValueError, match="unknown collective"):
        metrics.busbw_factor("allscatter", 2)
    with pytest.raises(ValueError, match="n_ranks"):
        metrics.busbw_factor("allreduce", 0)


def test_algbw_in_decimal_gb_per_s():
    # 1 GiB in 10 ms: algbw = 107.374 GB/s (GB = 1e9 bytes, not GiB).
    assert metrics.algbw_gbps(1 << 30, 0.01) == pytest.approx(107.3741824)
    with pytest.raises(ValueError):
        metrics.algbw_gbps(8, 0.0)
    with pytest.raises(ValueError):
        metrics.algbw_gbps(-1, 1.0)


def test_gemm_flops_and_tflops():
    assert metrics.gemm_flops(1, 1, 1) == 2
    assert metrics.gemm_flops(4096, 4096, 4096) == 2 * 4096 ** 3
    assert metrics.tflops(8192, 8192, 8192, 1.0) == pytest.approx(2 * 8192 ** 3 / 1e12)
    with pytest.raises(ValueError):
        metrics.gemm_flops(0, 1, 1)
    with pytest.raises(ValueError):
        metrics.tflops(1, 1, 1, 0)


def test_allreduce_script_copy_equals_metrics_module():
    script = load_script("allreduce_sweep")
    for collective in metrics.COLLECTIVES:
        for n in RANKS:
            assert script._local_busbw_factor(collective, n) == metrics.busbw_factor(collective, n)
    for size in SIZES:
        for seconds in TIMES:
            assert script._local_algbw_gbps(size, seconds) == metrics.algbw_gbps(size, seconds)
    for bad in (lambda: script._local_busbw_factor("allreduce", 0), lambda: script._local_algbw_gbps(8, 0)):
        with pytest.raises(ValueError):
            bad()


def test_gemm_script_copy_equals_metrics_module():
    script = load_script("gemm")
    for m in (1, 16, 128, 1024, 4096):
        for n, k in ((6144, 4096), (57344, 8192), (4096, 14336)):
            for seconds in TIMES:
                assert script._local_tflops(m, n, k, seconds) == metrics.tflops(m, n, k, seconds)


@pytest.mark.parametrize("name", ["allreduce_sweep", "gemm"])
def test_script_summary_copy_equals_stats_module(name):
    # The scripts' statistics copy lives in the shared _sfbench.py beside them (script.bench).
    script = load_script(name)
    samples_grid = ([1.0], [3.0, 1.0, 2.0], [5e-6, 7e-6, 5.5e-6, 6e-6], [2.0, 2.0, 2.0, 2.0, 9.0], [0.0, 0.0])
    for samples in samples_grid:
        assert script.bench.summarize_copy(samples) == stats.summarize(samples).to_json()
    for bad in ([], [math.nan]):
        with pytest.raises(ValueError):
            script.bench.summarize_copy(bad)


def test_sfbench_summary_copy_equals_stats_module_on_a_grid():
    bench = load_script("_sfbench")
    values = (-3.5, -1.0, 0.0, 1e-9, 2.5e-6, 0.1, 1.0, 7.0, 123.456, 1e6)
    grid = [[a] for a in values] + [[a, b] for a in values for b in values]
    grid += [[a, b, c] for a in values[::3] for b in values[1::3] for c in values[2::3]]
    for samples in grid:
        assert bench.summarize_copy(samples) == stats.summarize(samples).to_json(), samples
    for bad in ([math.inf], [1.0, -math.inf], [1.0, math.nan]):
        with pytest.raises(ValueError):
            bench.summarize_copy(bad)


def test_scripts_use_the_package_formulas_when_stackforge_is_importable():
    # In the test interpreter stackforge is importable, so the scripts bind the package's functions.
    script = load_script("allreduce_sweep")
    assert script.FORMULAS_FROM == "stackforge.bench"
    assert script.busbw_factor is metrics.busbw_factor
    assert script.algbw_gbps is metrics.algbw_gbps
    assert load_script("gemm").tflops is metrics.tflops
