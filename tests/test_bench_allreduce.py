"""The all-reduce sweep, run for real: separate rank processes over gloo on the CPU.

The same harness (spawned ranks, per-phase timeout, correctness on every size, nccl-tests'
bandwidths) runs NCCL, SGLang's custom all-reduce and torch symmetric memory on GPUs; those paths
are tested on a GPU machine (``-m gpu``) and skip here with the reason.
"""

from __future__ import annotations

import pytest
from _bench_helpers import cuda_visible, load_script, python_without_torch, run_script, torch_python
from _skips import require_host_gpus, skip_gpu_only

from stackforge.bench.metrics import algbw_gbps, busbw_factor

SMALL = ("--min-bytes", "4", "--max-bytes", str(1 << 20), "--factor", "4")


@pytest.fixture(scope="module")
def python() -> str:
    return torch_python()


def rows_of(payload: dict) -> list[dict]:
    return payload["metrics"]["rows"]


def test_gloo_sweep_two_ranks_4b_to_1mib(python):
    payload, run = run_script(python, "allreduce_sweep", "--backend", "gloo", *SMALL, "--iters", "10",
                              "--repeats", "3", timeout=600)
    assert payload["status"] == "pass", payload["reason"]
    rows = rows_of(payload)
    sizes = sorted({r["size_bytes"] for r in rows})
    assert sizes == [4 ** i for i in range(1, 11)]                      # 4 B .. 1 MiB, factor 4
    assert {(r["mode"], r["placement"]) for r in rows} == {("eager", "out-of-place"), ("eager", "in-place")}
    assert all(r["wrong"] == 0 for r in rows)
    assert payload["metrics"]["world_size"] == 2
    # gloo has no CUDA graphs: said once, not silently dropped.
    assert payload["metrics"]["skipped"] == [{"mode": "graph",
                                              "reason": "CUDA graphs need a CUDA backend (gloo runs on the CPU)"}]
    assert "busbw(GB/s)" in payload["evidence"]                         # the table is the evidence
    assert payload["facts"]["versions"]["torch"].startswith("2.")
    print("\n" + "\n".join(f"{r['size_bytes']:>8} B {r['placement']:>12}  algbw {r['algbw_gbps']:.4f} GB/s  "
                           f"busbw {r['busbw_gbps']:.4f} GB/s" for r in rows))


def test_busbw_arithmetic_is_nccl_tests_with_three_ranks(python):
    # Three ranks make the all-reduce factor 2(n-1)/n = 4/3, so busbw != algbw is really checked.
    payload, _ = run_script(python, "allreduce_sweep", "--backend", "gloo", "--world-size", "3",
                            "--min-bytes", "4", "--max-bytes", "4096", "--factor", "8", "--iters", "5",
                            "--repeats", "3", timeout=600)
    assert payload["status"] == "pass", payload["reason"]
    assert payload["metrics"]["busbw_factor"] == pytest.approx(4 / 3)
    for row in rows_of(payload):
        seconds = row["time_us"] / 1e6
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / seconds / 1e9, rel=1e-9)
        assert row["algbw_gbps"] == pytest.approx(algbw_gbps(row["size_bytes"], seconds), rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (3 - 1) / 3, rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * busbw_factor("allreduce", 3), rel=1e-9)
        assert row["time_us_min"] <= row["time_us"] <= row["time_us_max"]
    summary = payload["metrics"]
    assert summary["peak_busbw_gbps"] == max(r["busbw_gbps"] for r in rows_of(payload))


def test_wrong_result_is_a_failure_not_a_number(python):
    payload, _ = run_script(python, "allreduce_sweep", "--backend", "gloo", "--min-bytes", "16",
                            "--max-bytes", "256", "--factor", "4", "--iters", "2", "--repeats", "1",
                            "--corrupt-rank", "1", timeout=300)
    assert payload["status"] == "fail"
    assert "wrong all-reduce result" in payload["reason"]
    rows = rows_of(payload)
    assert rows and all(r["wrong"] > 0 for r in rows)
    assert all("algbw_gbps" not in r and "busbw_gbps" not in r for r in rows)
    assert "expected 3.0" in payload["evidence"]   # ranks 0 and 1 contribute 1 and 2: the sum is 3


def test_a_hung_rank_fails_at_the_phase_timeout(python):
    payload, run = run_script(python, "allreduce_sweep", "--backend", "gloo", "--min-bytes", "16",
                              "--max-bytes", "16", "--stall-rank", "1", "--phase-timeout", "20", timeout=180)
    assert payload["status"] == "fail"
    assert payload["reason"].startswith("hang:") and "16 B eager" in payload["reason"]
    assert run.duration_s < 120  # the phase timeout, not the stalled rank's 24 h sleep


def test_a_dead_rank_is_named_not_its_peers_symptoms(python):
    payload, _ = run_script(python, "allreduce_sweep", "--backend", "gloo", "--min-bytes", "16",
                            "--max-bytes", "16", "--kill-rank", "0", "--phase-timeout", "30", timeout=120)
    assert payload["status"] == "fail"
    assert "rank 0 died (SIGKILL)" in payload["reason"]


def test_without_torch_it_skips_with_the_reason():
    payload, _ = run_script(python_without_torch(), "allreduce_sweep", "--backend", "gloo", timeout=120)
    assert payload["status"] == "skip"
    assert "torch is not installed" in payload["reason"]


@pytest.mark.parametrize("backend", ["nccl", "custom", "symm-mem"])
def test_gpu_backends_skip_on_a_cpu_torch(python, backend):
    # Decided before the run: a result that is not a skip (an error too) must fail on a CPU machine.
    if cuda_visible(python):
        skip_gpu_only("a GPU is visible: the no-GPU path is not reachable here")
    payload, _ = run_script(python, "allreduce_sweep", "--backend", backend, timeout=120)
    assert payload["status"] == "skip", payload
    assert "no CUDA device visible" in payload["reason"]


def test_sizes_plan_and_nccl_environment():
    script = load_script("allreduce_sweep")
    assert script.message_sizes(8, 64, 2) == [8, 16, 32, 64]
    assert script.message_sizes(4, 1 << 20, 4)[-1] == 1 << 20
    with pytest.raises(ValueError):
        script.message_sizes(0, 8, 2)
    with pytest.raises(ValueError):
        script.message_sizes(8, 64, 1)
    config = {"backend": "nccl", "dtype": "bfloat16", "min_bytes": 1, "max_bytes": 4, "factor": 2,
              "modes": ["eager"], "placements": ["in-place"], "requested_graph": False}
    steps, skipped = script.plan_steps(config)
    assert [s["size_bytes"] for s in steps] == [2, 4]          # 1 B is smaller than one bf16 element
    assert skipped == [{"size_bytes": 1, "reason": "smaller than one bfloat16 element"}]
    args = script.parse_args(["--nccl-algo", "tree", "--nccl-proto", "simple"])
    # Per-collective syntax: a global NCCL_ALGO=Tree would break all-gather and broadcast.
    assert script.nccl_environment(args) == {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "simple"}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_nccl_sweep_on_gpus(mode):
    require_host_gpus(1)
    payload, _ = run_script(torch_python(), "allreduce_sweep", "--backend", "nccl", "--mode", mode,
                            "--min-bytes", "1024", "--max-bytes", str(1 << 22), "--factor", "16", timeout=900)
    if payload["status"] == "skip":
        pytest.skip(payload["reason"])
    assert payload["status"] == "pass", payload["reason"] + payload["evidence"][-2000:]
    assert {r["mode"] for r in rows_of(payload)} == {mode}


# ------------------------------------------------------------------------------------------- nccl-tests parity


def nccl_tests_allreduce_bw(count: int, typesize: int, sec: float, nranks: int) -> tuple[float, float]:
    """NVIDIA/nccl-tests src/all_reduce.cu:59-65 (AllReduceGetBw, a0b82b2 = NCCL_TESTS_VERSION 2.19.6):
    baseBw = count * typesize / 1.0E9 / sec; algBw = baseBw; busBw = baseBw * 2 * (nranks - 1) / nranks."""
    base = (count * typesize) / 1.0e9 / sec
    return base, base * (2 * (nranks - 1)) / nranks


@pytest.mark.parametrize("mode, placement", [("eager", "in-place"), ("eager", "out-of-place"),
                                             ("graph", "in-place"), ("graph", "out-of-place")])
def test_rows_carry_nccl_tests_bandwidths(mode, placement):
    """A row from eight ranks' repeats: each repeat averaged over the ranks, the median kept, and
    algbw / busbw exactly nccl-tests' for that time, whatever the mode and placement."""
    script = load_script("allreduce_sweep")
    count, world = 1 << 20, 8
    step = {"index": 0, "size_bytes": count * 4, "count": count, "mode": mode, "placement": placement}
    per_rank = {r: {"times": [100e-6 + r * 1e-6, 80e-6 + r * 1e-6, 120e-6 + r * 1e-6], "wrong": 0, "example": "",
                    "impl": "x"} for r in range(world)}
    row = script.merge_step(step, per_rank, world, "float32")
    assert row["time_us"] == pytest.approx(103.5)   # median of the rank-averaged repeats 103.5, 83.5, 123.5 us
    algbw, busbw = nccl_tests_allreduce_bw(count, 4, 103.5e-6, world)
    assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
    assert row["busbw_gbps"] == pytest.approx(busbw, rel=1e-12)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.75, rel=1e-12)
    assert (row["mode"], row["placement"]) == (mode, placement)


def test_avg_busbw_is_per_mode_as_one_nccl_tests_run():
    """nccl-tests averages busbw over the out-of-place and in-place rows of one run
    (src/common.cu:895-896 per BenchTime, 939-940 both placements, 1831 the mean); a run is either
    eager or -G, so eager and graph rows are never averaged together."""
    script = load_script("allreduce_sweep")
    rows = [{"size_bytes": 1 << s, "mode": mode, "placement": placement, "busbw_gbps": value, "time_us": 10.0}
            for s, (mode, placement, value) in enumerate([("eager", "in-place", 10.0), ("eager", "out-of-place", 20.0),
                                                          ("graph", "in-place", 100.0), ("graph", "out-of-place", 300.0)])]
    summary = script.summary_metrics(rows)
    assert summary["avg_busbw_gbps"] == pytest.approx(15.0)
    assert summary["avg_busbw_graph_gbps"] == pytest.approx(200.0)
    assert summary["peak_busbw_gbps"] == 300.0 and summary["peak_busbw_mode"] == "graph"
    eager_only = script.summary_metrics(rows[:2])
    assert "avg_busbw_graph_gbps" not in eager_only and eager_only["avg_busbw_gbps"] == pytest.approx(15.0)


def test_default_dtype_is_nccl_tests_float():
    script = load_script("allreduce_sweep")
    for backend in ("nccl", "custom", "symm-mem", "gloo"):
        args = script.parse_args(["--backend", backend])
        assert script.build_config(args, 2, "tcp://127.0.0.1:1")["dtype"] == "float32"   # src/common.cu:102


def test_nccl_out_of_place_is_not_measured_as_copy_plus_in_place():
    script = load_script("allreduce_sweep")
    backend = object.__new__(script.TorchDistBackend)
    backend.on_gpu, backend.config = True, {"backend": "nccl"}
    out_of_place = {"mode": "eager", "placement": "out-of-place"}
    assert backend.unsupported(out_of_place) == script.NCCL_OUT_OF_PLACE
    assert "no out-of-place NCCL all-reduce" in script.NCCL_OUT_OF_PLACE
    assert backend.unsupported({"mode": "graph", "placement": "in-place"}) is None
    backend.on_gpu, backend.config = False, {"backend": "gloo"}   # the CPU harness keeps both placements
    assert backend.unsupported(out_of_place) is None
