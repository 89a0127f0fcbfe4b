"""nccl-tests' bandwidth formulas, GEMM FLOPs, summary statistics, json_safe and the result line:
one implementation (``stackforge/inimage/_sfshared.py``), used by the host and, from the
mounted in-image package, in images."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from _bench_helpers import REPO, load_script

from stackforge.bench import metrics, stats
from stackforge.inimage import _sfshared

SHARED_FOLDER = REPO / "stackforge" / "inimage"

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


def test_busbw_is_algbw_times_the_factor():
    # 1 GiB all-reduced over 8 ranks in 10 ms: algbw 107.374 GB/s, busbw 1.75 times that.
    assert metrics.busbw_gbps(1 << 30, 0.01, "allreduce", 8) == pytest.approx(107.3741824 * 1.75)
    assert metrics.busbw_gbps(1 << 30, 0.01, "broadcast", 8) == metrics.algbw_gbps(1 << 30, 0.01)
    with pytest.raises(ValueError, match="unknown collective"):
        metrics.busbw_gbps(8, 1.0, "allscatter", 2)


def test_summary_statistics_known_values():
    spread = _sfshared.summarize([3.0, 1.0, 2.0, 10.0])
    assert list(spread) == ["n", "median", "minimum", "maximum", "mean", "stdev", "cv"]
    assert (spread["n"], spread["median"], spread["minimum"], spread["maximum"], spread["mean"]) == (
        4, 2.5, 1.0, 10.0, 4.0)
    assert spread["stdev"] == pytest.approx(statistics.stdev([3.0, 1.0, 2.0, 10.0]))
    assert spread["cv"] == pytest.approx(spread["stdev"] / 4.0)
    assert _sfshared.summarize([0.0, 0.0])["cv"] == 0.0   # zero mean: no division by zero
    assert _sfshared.summarize([7.5])["stdev"] == 0.0     # one sample: no spread
    for bad in ([], [math.nan], [1.0, -math.inf]):
        with pytest.raises(ValueError):
            _sfshared.summarize(bad)


def test_host_summary_is_the_shared_statistics_with_a_type():
    samples = [5e-6, 7e-6, 5.5e-6, 6e-6]
    assert stats.summarize(samples).to_json() == _sfshared.summarize(samples)


def test_json_safe_gives_strict_json():
    value = {"rate": math.inf, "nan": math.nan, 3: (1, 2.5, [-math.inf]), "ok": None, "flag": True,
             "path": Path("/x")}
    safe = _sfshared.json_safe(value)
    assert safe == {"rate": "inf", "nan": "nan", "3": [1, 2.5, ["-inf"]], "ok": None, "flag": True,
                    "path": "/x"}
    json.dumps(safe, allow_nan=False)  # raises on any non-finite float left behind


def test_result_line_round_trip_and_last_line_wins():
    first = _sfshared.RESULT_MARKER + json.dumps({"status": "fail"})
    last = _sfshared.RESULT_MARKER + json.dumps({"status": "pass", "reason": "ok"})
    assert _sfshared.parse_result_line(f"log\n{first}\nmore log\n{last}\n") == {"status": "pass", "reason": "ok"}
    assert _sfshared.parse_result_line("no marker here") is None
    assert _sfshared.parse_result_line(_sfshared.RESULT_MARKER + "{broken") is None
    assert _sfshared.parse_result_line(_sfshared.RESULT_MARKER + "[1, 2]") is None   # not an object


def test_scripts_and_host_compute_with_the_same_file():
    # In images the scripts import _sfshared from the mounted in-image package; the host imports it as a package
    # module. Both are the one file in stackforge/inimage.
    shared_file = SHARED_FOLDER / "_sfshared.py"
    assert Path(_sfshared.__file__).resolve() == shared_file
    for name in ("allreduce_sweep", "gemm", "serve"):
        assert Path(load_script(name).bench.shared.__file__).resolve() == shared_file, name
    probe_helper = load_script("_sfbench").sf
    assert probe_helper.RESULT_PREFIX == _sfshared.RESULT_MARKER
    assert Path(probe_helper._sfshared.__file__).resolve() == shared_file
