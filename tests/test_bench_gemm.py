"""GEMM bench: skip without a GPU, the tiny CPU harness mode, shapes, and the GPU run (``-m gpu``)."""

from __future__ import annotations

import pytest
from _bench_helpers import cuda_visible, load_script, python_without_torch, run_script, torch_python
from _skips import require_host_gpus, skip_gpu_only

from stackforge.bench.metrics import tflops


@pytest.fixture(scope="module")
def python() -> str:
    return torch_python()


def test_without_a_gpu_it_skips_with_the_reason(python):
    if cuda_visible(python):
        skip_gpu_only("a GPU is visible: the no-GPU path is not reachable here")
    payload, _ = run_script(python, "gemm", timeout=120)
    assert payload["status"] == "skip"
    assert "no CUDA device visible" in payload["reason"]


def test_without_torch_it_skips():
    payload, _ = run_script(python_without_torch(), "gemm", timeout=120)
    assert payload["status"] == "skip" and "torch is not installed" in payload["reason"]


def test_cpu_harness_mode_measures_and_checks(python):
    if cuda_visible(python):
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
        # median over median, against the reference of the row's own dtype
        assert row["fraction_of_matmul_best"] == pytest.approx(
            row["tflops"] / metrics["matmul_best"][row["dtype"]]["tflops_median"])
        assert row["weight_copies"] == 1          # no L2 size on the CPU: nothing to rotate past
    assert metrics["matmul_best"]["bf16"]["kernel"] == "torch.matmul" and metrics["l2_cache_bytes"] is None


def test_serving_shapes_and_tensor_parallel_split():
    script = load_script("gemm")
    plans = script.plan_shapes([1, 4096], ["70b.qkv", "70b.down"], tp=8, cpu=False)
    assert {(p["shape"], p["m"], p["n"], p["k"]) for p in plans} == {
        ("70b.qkv", 1, 1280, 8192), ("70b.qkv", 4096, 1280, 8192),      # column-parallel: N / 8
        ("70b.down", 1, 8192, 3584), ("70b.down", 4096, 8192, 3584)}    # row-parallel: K / 8
    assert len(script.plan_shapes(list(script.DEFAULT_M), [], tp=1, cpu=False)) == 5 * len(script.SHAPES)
    with pytest.raises(ValueError, match="unknown shape"):
        script.plan_shapes([1], ["405b.qkv"], tp=1, cpu=False)


MIB = 1 << 20


@pytest.mark.parametrize("weight_bytes, l2, budget, copies", [
    (4096 * 4096 * 2, 50 * MIB, 4096 * MIB, 5),     # 8b.o bf16 (32 MiB) on a 50 MiB L2: 4 others = 128 MiB >= 100
    (4096 * 4096 * 1, 50 * MIB, 4096 * MIB, 8),     # the same layer in fp8 (16 MiB): 7 others = 112 MiB
    (4096 * 4096 * 2, 128 * MIB, 4096 * MIB, 9),    # a 128 MiB L2 needs 256 MiB of others: 8 x 32 MiB
    (57344 * 8192 * 2, 50 * MIB, 4096 * MIB, 2),    # 70b.gate_up (896 MiB) dwarfs L2: one other copy
    (57344 * 8192 * 2, 50 * MIB, 1024 * MIB, 1),    # ... unless two do not fit the budget
    (1024, None, 4096 * MIB, 1),                    # CPU mode: no L2 size, no rotation
])
def test_l2_rotation_arithmetic(weight_bytes, l2, budget, copies):
    script = load_script("gemm")
    got = script.rotation_copies(weight_bytes, l2, budget)
    assert got == copies
    if l2 and (copies - 1) * weight_bytes and copies * weight_bytes <= budget and copies > 1:
        assert (copies - 1) * weight_bytes >= 2 * l2 > (copies - 2) * weight_bytes  # the fewest that flush L2


def test_rotation_cycles_through_every_copy():
    script = load_script("gemm")
    seen = []
    run = script.rotating([lambda i=i: seen.append(i) or i for i in range(3)])
    assert [run() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_fraction_is_median_over_the_median_of_its_own_dtype():
    script = load_script("gemm")
    references = {"bf16": {"tflops": 800.0, "tflops_median": 700.0}, "fp8": {"tflops": 1600.0, "tflops_median": 1400.0}}
    assert script.fraction_of_best({"dtype": "bf16", "tflops": 350.0}, references) == pytest.approx(0.5)
    assert script.fraction_of_best({"dtype": "fp8", "tflops": 350.0}, references) == pytest.approx(0.25)
    assert script.fraction_of_best({"dtype": "fp8", "skipped": "x"}, references) is None
    assert script.fraction_of_best({"dtype": "fp8", "tflops": 1.0}, {"bf16": references["bf16"]}) is None


@pytest.mark.gpu
def test_gpu_gemm_bf16_and_fp8():
    require_host_gpus(1)
    python = torch_python()
    if not cuda_visible(python):   # GPUs here, but this torch does not see them: a setup problem
        pytest.skip(f"the torch at {python} sees no CUDA GPU (STACKFORGE_TEST_TORCH_PYTHON: a CUDA torch)")
    payload, _ = run_script(python, "gemm", "--m", "1,128,4096", "--shapes", "8b.qkv,70b.down", "--repeats", "3",
                            timeout=900)
    assert payload["status"] == "pass", payload["reason"] + payload["evidence"][-2000:]
    assert payload["metrics"]["best_tflops"]["bf16"] > 1.0


def test_a_reference_that_raises_skips_its_dtype_and_keeps_the_others(monkeypatch):
    """``torch._scaled_mm`` refusing the fp8 square reference must not abort the bf16 rows: fp8 is
    dropped from the references and the kernels, and skipped with the error text."""
    script = load_script("gemm")

    def matmul_best(torch, clock, device, size, args, dtype="bf16"):
        if dtype == "fp8":
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling\n cublasLtMatmul")
        return {"size": size, "dtype": dtype, "tflops": 1.0, "tflops_median": 1.0}

    monkeypatch.setattr(script, "matmul_best", matmul_best)
    bf16, fp8 = (type(name, (), {"dtype": name})() for name in ("bf16", "fp8"))
    references, kept, skipped = script.dtype_references(None, None, "cuda:0", 8192, None, [bf16, fp8])
    assert list(references) == ["bf16"] and kept == [bf16]
    assert skipped == [{"dtype": "fp8", "reason": "its 8192x8192 reference product failed: RuntimeError: "
                                                  "CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"}]
    assert script.dtype_references(None, None, "cuda:0", 0, None, [bf16, fp8]) == ({}, [bf16, fp8], [])
