"""The serving harness, against a real HTTP server process (tests/fake_sglang_server.py) and a fake
benchmark that writes SGLang's real JSONL keys (tests/fake_sglang_bench.py). Loopback only.

What SGLang itself would do (its flags, its benchmark module) is tested on the pure functions; a run
with a real SGLang server needs a GPU image and a model (``-m gpu``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from _bench_helpers import SCRIPTS, TESTS, load_script, pid_alive, run_script
from test_probe_scripts import fi063_python  # noqa: F401  (SGLang 0.5.9 venv)
from test_sglang_custom_ar_dispatch import sglang0523_python  # noqa: F401  (SGLang 0.5.23 venv)

from stackforge.edges import runner
from stackforge.inimage._sfshared import parse_result_line

serve = load_script("serve")

# SGLang's bench_serving JSONL keys (python/sglang/bench_serving.py of sglang v0.5.9, github.com/sgl-project/sglang).
SGLANG_ROW_KEYS = (
    "backend dataset_name request_rate max_concurrency sharegpt_output_len random_input_len random_output_len "
    "random_range_ratio duration completed total_input_tokens total_input_text_tokens total_input_vision_tokens "
    "total_output_tokens total_output_tokens_retokenized request_throughput input_throughput output_throughput "
    "total_throughput max_output_tokens_per_s max_concurrent_requests "
    "mean_e2e_latency_ms median_e2e_latency_ms std_e2e_latency_ms p90_e2e_latency_ms p99_e2e_latency_ms "
    "mean_ttft_ms median_ttft_ms std_ttft_ms p99_ttft_ms mean_tpot_ms median_tpot_ms std_tpot_ms p99_tpot_ms "
    "mean_itl_ms median_itl_ms std_itl_ms p95_itl_ms p99_itl_ms concurrency accept_length tag server_info"
).split()


def server_cmd(tmp_path: Path, *extra: str) -> str:
    return json.dumps([sys.executable, str(TESTS / "fake_sglang_server.py"), "--port", "{port}",
                       "--pid-file", str(tmp_path / "pids"), *extra])


def bench_cmd(*extra: str) -> str:
    return json.dumps([sys.executable, str(TESTS / "fake_sglang_bench.py"), "--host", "{host}", "--port", "{port}",
                       "--output-file", "{output_file}", *extra])


def serve_run(tmp_path: Path, server_extra=(), bench_extra=(), *args: str, timeout: float = 120) -> dict:
    payload, _ = run_script(sys.executable, "serve", "--server-cmd", server_cmd(tmp_path, *server_extra),
                            "--bench-cmd", bench_cmd(*bench_extra), "--health-interval", "0.1",
                            "--stop-grace", "2", *args, timeout=timeout)
    return payload


def server_pids(tmp_path: Path) -> list[int]:
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def assert_nothing_left(pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if pid_alive(p)], "server processes left behind"


def test_healthy_server_is_benchmarked_and_stopped(tmp_path):
    payload = serve_run(tmp_path, ("--health-delay", "1", "--spawn-child"), ("--num-prompts", "6"))
    assert payload["status"] == "pass", payload
    m = payload["metrics"]
    assert m["completed"] == 6
    assert m["output_tok_s"] == m["output_throughput"] > 0
    assert set(m["ttft_ms"]) == {"mean", "median", "std", "p99"}
    assert set(m["itl_ms"]) == {"mean", "median", "std", "p95", "p99"}
    assert m["startup_s"] >= 1.0                                   # it really waited for /health
    assert m["request_rate"] == "inf"                              # SGLang's Infinity, as strict JSON
    assert payload["facts"]["model_info"].startswith('{"model_path"')
    assert "Serving Benchmark Result" in payload["evidence"]
    pids = server_pids(tmp_path)
    assert len(pids) == 2                                          # the server and its child
    assert_nothing_left(pids)


def test_health_deadline_expiry_fails_with_the_log_tail(tmp_path):
    payload = serve_run(tmp_path, ("--health-delay", "60", "--spawn-child"), (), "--startup-timeout", "2")
    assert payload["status"] == "fail"
    assert payload["reason"].startswith("server not healthy within 2 s (last /health: HTTP 503 loading)")
    assert "fake sglang server: loading" in payload["evidence"]
    assert_nothing_left(server_pids(tmp_path))


def test_server_that_exits_early_fails_with_its_exit_code_and_log(tmp_path):
    payload = serve_run(tmp_path, ("--health-delay", "30", "--exit-after", "0.5", "--exit-code", "3"))
    assert payload["status"] == "fail"
    assert "server exited with status 3 before it became healthy" in payload["reason"]
    assert "fatal error, exiting with 3" in payload["evidence"]
    assert_nothing_left(server_pids(tmp_path))


def test_server_ignoring_sigterm_is_killed(tmp_path):
    payload = serve_run(tmp_path, ("--ignore-sigterm", "--spawn-child"))
    assert payload["status"] == "pass"
    assert_nothing_left(server_pids(tmp_path))


def test_failing_benchmark_fails_with_its_output(tmp_path):
    payload = serve_run(tmp_path, (), ("--exit-code", "2"))
    assert payload["status"] == "fail"
    assert payload["reason"] == "benchmark exited with status 2"
    assert "Warmup failed" in payload["evidence"]
    assert_nothing_left(server_pids(tmp_path))


def test_benchmark_without_a_row_fails(tmp_path):
    payload = serve_run(tmp_path, (), ("--no-row",))
    assert payload["status"] == "fail"
    assert "wrote no output file" in payload["reason"]


def test_terminated_harness_still_stops_the_server(tmp_path):
    # The runner stops serve.py at its timeout (SIGTERM to serve.py's group); the server lives in its own
    # group, and serve.py must take it down before it goes.
    result = runner.run([sys.executable, str(SCRIPTS / "serve.py"), "--server-cmd",
                         server_cmd(tmp_path, "--health-delay", "600", "--spawn-child"), "--bench-cmd", bench_cmd(),
                         "--startup-timeout", "600", "--health-interval", "0.1"], timeout=4, tail_chars=20000)
    assert result.timed_out
    payload = parse_result_line(result.output_tail)
    assert payload is not None and payload["status"] == "error" and "SIGTERM" in payload["reason"]
    assert_nothing_left(server_pids(tmp_path))


def test_missing_sglang_is_a_skip(tmp_path):
    payload, _ = run_script(sys.executable, "serve", "--model", str(tmp_path), "--python", sys.executable,
                            timeout=60)
    if serve.installed_version("sglang"):
        pytest.skip("sglang is installed here")
    assert payload["status"] == "skip" and payload["reason"] == "sglang is not installed in this image"


def test_missing_model_directory_is_an_error(tmp_path):
    payload, _ = run_script(sys.executable, "serve", "--model", str(tmp_path / "nope"), timeout=60)
    assert payload["status"] == "error" and "does not exist in this container" in payload["reason"]


# ------------------------------------------------------------------------------------ pure parts


def sglang_row(**overrides) -> dict:
    row = {key: 1.5 for key in SGLANG_ROW_KEYS}
    row.update(backend="sglang", dataset_name="random-ids", request_rate=float("inf"), completed=200,
               output_throughput=4321.5, median_ttft_ms=35.0, median_tpot_ms=7.0, median_itl_ms=6.5,
               p99_itl_ms=20.0, server_info={"version": "0.5.9"}, tag=None)
    row.update(overrides)
    return row


def test_bench_metrics_reads_sglangs_real_keys():
    metrics = serve.bench_metrics(sglang_row())
    assert metrics["output_tok_s"] == 4321.5
    assert metrics["completed"] == 200
    assert metrics["ttft_ms"] == {"mean": 1.5, "median": 35.0, "std": 1.5, "p99": 1.5}
    assert metrics["tpot_ms"]["median"] == 7.0
    assert metrics["itl_ms"] == {"mean": 1.5, "median": 6.5, "std": 1.5, "p95": 1.5, "p99": 20.0}
    assert metrics["e2e_latency_ms"]["p90"] == 1.5
    for key in ("request_throughput", "input_throughput", "total_throughput", "duration", "accept_length"):
        assert key in metrics
    assert "server_info" not in metrics                      # bulky, and not a measurement


def test_bench_metrics_refuses_a_row_it_does_not_understand():
    with pytest.raises(serve.Failed) as failed:
        serve.bench_metrics({"throughput": 1.0})
    assert failed.value.status == "error" and "output_throughput" in failed.value.reason


def test_read_bench_row_takes_the_last_row(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(sglang_row(completed=1)) + "\n" + json.dumps(sglang_row(completed=2)) + "\n\n")
    assert serve.read_bench_row(str(path))["completed"] == 2
    path.write_text("{not json\n")
    with pytest.raises(serve.Failed, match="not JSON"):
        serve.read_bench_row(str(path))


@pytest.mark.parametrize(("help_text", "version", "flag"), [
    ("  --cuda-graph-max-bs CUDA_GRAPH_MAX_BS\n", "0.5.9", "--cuda-graph-max-bs"),
    ("  --cuda-graph-max-bs-decode N\n  --cuda-graph-max-bs-prefill N\n", "0.5.23", "--cuda-graph-max-bs-decode"),
    # 0.5.14 - 0.5.18 have both (the old one a deprecated alias): take the new one.
    ("  --cuda-graph-max-bs N\n  --cuda-graph-max-bs-decode N\n", "0.5.15.post1", "--cuda-graph-max-bs-decode"),
    (None, "0.5.20", "--cuda-graph-max-bs-decode"),
    (None, "0.5.14", "--cuda-graph-max-bs-decode"),
    (None, "0.5.13.post1", "--cuda-graph-max-bs"),
    ("  --tp-size N\n", "0.5.23", None),
])
def test_cuda_graph_flag_follows_the_installed_sglang(help_text, version, flag):
    chosen, why = serve.choose_cuda_graph_flag(help_text, version)
    assert chosen == flag
    assert why


def test_server_argv_carries_the_stacks_flags():
    args = serve.parse_args(["--model", "/stackforge/model", "--tp", "2", "--custom-allreduce", "off",
                             "--cuda-graph-max-bs", "160", "--mem-fraction", "0.85", "--speculative-algorithm",
                             "EAGLE3", "--speculative-draft-model-path", "/d", "--speculative-num-steps", "3",
                             "--extra-server-args", "--attention-backend flashinfer"])
    argv = serve.server_argv("python3", args, 30000, "--cuda-graph-max-bs-decode")
    text = " ".join(argv)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--host 127.0.0.1 --port 30000 --tp-size 2" in text
    assert "--disable-custom-all-reduce" in argv
    assert "--cuda-graph-max-bs-decode 160" in text and "--mem-fraction-static 0.85" in text
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path /d --speculative-num-steps 3" in text
    assert argv[-2:] == ["--attention-backend", "flashinfer"]
    default = serve.server_argv("python3", serve.parse_args(["--model", "/m"]), 1, None)
    assert "--disable-custom-all-reduce" not in default and "--cuda-graph-max-bs" not in " ".join(default)


def test_bench_argv_uses_sglangs_module_offline_dataset_and_loopback():
    args = serve.parse_args(["--model", "/m", "--num-prompts", "50", "--max-concurrency", "8"])
    argv = serve.bench_argv("python3", "sglang.benchmark.serving", args, 30000, "/tmp/o.jsonl")
    text = " ".join(argv)
    assert argv[:3] == ["python3", "-m", "sglang.benchmark.serving"]
    assert "--host 127.0.0.1 --port 30000" in text and "--output-file /tmp/o.jsonl" in text
    assert "--dataset-name random-ids" in text        # `random` downloads ShareGPT: impossible offline
    assert "--num-prompts 50" in text and "--max-concurrency 8" in text


def test_bench_module_prefers_the_0_5_23_path(monkeypatch):
    present = {"sglang.benchmark.serving", "sglang.bench_serving"}
    monkeypatch.setattr(serve.importlib.util, "find_spec", lambda name: object() if name in present else None)
    assert serve.find_bench_module() == "sglang.benchmark.serving"
    present.discard("sglang.benchmark.serving")
    assert serve.find_bench_module() == "sglang.bench_serving"
    present.clear()
    assert serve.find_bench_module() is None


def test_parse_version():
    assert serve.parse_version("0.5.20.post1") == (0, 5, 20)
    assert serve.parse_version("0.5.3rc1") == (0, 5, 3)
    assert serve.parse_version("1.0") == (1, 0)


def test_a_server_child_in_its_own_session_is_gone_after_the_run(tmp_path):
    payload = serve_run(tmp_path, ("--spawn-child", "--spawn-detached"))
    assert payload["status"] == "pass", payload
    pids = server_pids(tmp_path)
    assert len(pids) == 3                                          # server, its child, the detached one
    assert_nothing_left(pids)


def test_terminated_harness_also_ends_a_detached_server_child(tmp_path):
    result = runner.run([sys.executable, str(SCRIPTS / "serve.py"), "--server-cmd",
                         server_cmd(tmp_path, "--health-delay", "600", "--spawn-detached"), "--bench-cmd", bench_cmd(),
                         "--startup-timeout", "600", "--health-interval", "0.1"], timeout=4, tail_chars=20000)
    assert result.timed_out
    assert_nothing_left(server_pids(tmp_path))


def sglang_disable_warnings(python: Path) -> list[str]:
    """Every "... is disabled ..." warning of SGLang's custom all-reduce files in a venv, rendered as
    the server logs it (f-string fields filled: the class name, a world size)."""
    import ast
    fields = {"cls_name": "CustomAllreduce", "world_size": "3", "supported_world_size": "[2, 4, 6, 8]"}
    found = []
    for path in sorted(python.parent.parent.glob(
            "lib/python*/site-packages/sglang/srt/distributed/device_communicators/custom_all_reduce*.py")):
        tree = ast.parse(path.read_text())
        parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if id(node) in parts:
                continue  # a piece of an f-string, read with it
            if isinstance(node, ast.JoinedStr):
                text = "".join(part.value if isinstance(part, ast.Constant) else
                               fields.get(getattr(part.value, "id", ""), "?") for part in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if " is disabled " in text and text.rstrip().endswith("explicitly."):
                found.append(text.replace("%d", "3").replace("%s", "[2, 4, 6, 8]"))
    return found


@pytest.mark.parametrize("fixture, count", [("fi063_python", 3), ("sglang0523_python", 3)])
def test_custom_allreduce_fallback_is_read_in_sglangs_own_words(request, fixture, count):
    """SGLang 0.5.9 and 0.5.23 turn their custom all-reduce off with a warning and serve on NCCL;
    each of their warnings, in a server log line, makes the record say so."""
    warnings = sglang_disable_warnings(request.getfixturevalue(fixture))
    assert len(warnings) == count, warnings
    for warning in warnings:
        log = f"[2026-12-01 04:30:00 TP0] Init torch distributed begin.\n[2026-12-01 04:30:01 TP2] {warning}\n"
        state = serve.custom_allreduce_state("on", 4, log)
        head = warning.split(" To silence")[0]
        assert state == f"fell back to NCCL: {head}", (state, warning)
    assert serve.custom_allreduce_state("on", 4, "[TP0] Capture cuda graph end.\n") == "on"
    assert serve.custom_allreduce_state("on", 4, f"$ python -m sglang.launch_server --say '{warnings[0]}'\n") == "on"
    assert serve.custom_allreduce_state("off", 4, warnings[0]) == "off (requested)"
    assert serve.custom_allreduce_state("on", 1, "") == "not used (tp 1)"


def test_a_custom_allreduce_that_failed_to_set_up_is_a_fallback_to_nccl():
    """SGLang 0.5.23's GroupCoordinator catches any error of the class while it sets it up and serves on NCCL
    (parallel_state.py:514-517): that is no custom all-reduce 'on'."""
    log = ("[2026-12-01 04:30:01 TP0] Setup Custom allreduce failed with RuntimeError: CUDA error: peer access is "
           "not supported between these two devices. To silence this warning, specify --disable-custom-all-reduce "
           "explicitly.\n")
    assert serve.custom_allreduce_state("on", 8, log) == (
        "fell back to NCCL: Setup Custom allreduce failed with RuntimeError: CUDA error: peer access is not supported "
        "between these two devices.")


def test_serving_record_says_the_server_fell_back_to_nccl(tmp_path):
    said = ("[2026-12-01 04:30:01 TP0] Custom allreduce is disabled because it's not supported on more than two "
            "PCIe-only GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.")
    payload = serve_run(tmp_path, ("--say", said), (), "--tp", "4")
    assert payload["status"] == "pass", payload
    assert payload["metrics"]["custom_allreduce"] == ("fell back to NCCL: Custom allreduce is disabled because it's "
                                                      "not supported on more than two PCIe-only GPUs.")
    assert "custom all-reduce was asked for but SGLang fell back to NCCL" in payload["reason"]
