"""GEMM bench: skip without a GPU, the tiny CPU harness mode, shapes, and the GPU run (``-m gpu``)."""

from __future__ import annotations

import pytest
from _bench_helpers import load_script, python_without_torch, run_script, torch_python
from _skips import require_host_gpus, skip_gpu_only

from stackforge.bench.metrics import tflops


@pytest.fixture(scope="module")
def python() -> str:
    return torch_python()


def _cuda_visible(python: str) -> bool:
    import subprocess
    done = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                          text=True, timeout=120)
    return done.stdout.strip() == "True"


def test_without_a_gpu_it_skips_with_the_reason(python):
    if _cuda_visible(python):
        skip_gpu_only("a GPU is visible: the no-GPU path is not reachable here")
    payload, _ = run_script(python, "gemm", timeout=120)
    assert payload["status"] == "skip"
    assert "no CUDA device visible" in payload["reason"]


def test_without_torch_it_skips():
    payload, _ = run_script(python_without_torch(), "gemm", timeout=120)
    assert payload["status"] == "skip" and "torch is not installed" in payload["reason"]


def test_cpu_harness_mode_measures_and_checks(python):
    if _cuda_visible(python):
        skip_gpu_only("a GPU is visible: gemm.py measures the GPU, not the CPU mode")
    payload, _ = run_script(python, "gemm", "--allow-cpu", "--m", "1,16", "--iters", "3", "--repeats", "3",
                            "--warmup", "1", timeout=300)
    assert payload["status"] == "pass", payload["reason"]
    assert "CPU harness mode" in payload["reason"]      # never mistaken for a GPU number
    metrics = payload["metrics"]
    assert metrics["device"] == "cpu"
    assert {s["dtype"] for s in metrics["skipped"]} == {"fp8"}
    rows = metrics["rows"]
    assert {(r["shape"], r["m"]) for r in rows} == {(s, m) for s in ("cpu.tiny", "cpu.wide") for m in (1, 16)}
    for row in rows:
        assert row["correct"] is True
        assert row["tflops"] == pytest.approx(tflops(row["m"], row["n"], row["k"], row["time_us"] / 1e6), rel=1e-9)
        assert row["tflops_best"] >= row["tflops"]
        assert row["fraction_of_matmul_best"] == pytest.approx(row["tflops"] / metrics["matmul_best"]["tflops"])


def test_serving_shapes_and_tensor_parallel_split():
    script = load_script("gemm")
    plans = script.plan_shapes([1, 4096], ["70b.qkv", "70b.down"], tp=8, cpu=False)
    assert {(p["shape"], p["m"], p["n"], p["k"]) for p in plans} == {
        ("70b.qkv", 1, 1280, 8192), ("70b.qkv", 4096, 1280, 8192),      # column-parallel: N / 8
        ("70b.down", 1, 8192, 3584), ("70b.down", 4096, 8192, 3584)}    # row-parallel: K / 8
    assert len(script.plan_shapes(list(script.DEFAULT_M), [], tp=1, cpu=False)) == 5 * len(script.SHAPES)
    with pytest.raises(ValueError, match="unknown shape"):
        script.plan_shapes([1], ["405b.qkv"], tp=1, cpu=False)


@pytest.mark.gpu
def test_gpu_gemm_bf16_and_fp8():
    require_host_gpus(1)
    python = torch_python()
    if not _cuda_visible(python):   # GPUs here, but this torch does not see them: a setup problem
        pytest.skip(f"the torch at {python} sees no CUDA GPU (STACKFORGE_TEST_TORCH_PYTHON: a CUDA torch)")
    payload, _ = run_script(python, "gemm", "--m", "1,128,4096", "--shapes", "8b.qkv,70b.down", "--repeats", "3",
                            timeout=900)
    assert payload["status"] == "pass", payload["reason"] + payload["evidence"][-2000:]
    assert payload["metrics"]["best_tflops"]["bf16"] > 1.0
