#!/usr/bin/env python3
"""A stand-in for ``python -m sglang.bench_serving`` in the serving-harness tests (stdlib only).

It checks that the server answers ``/health``, sends ``--num-prompts`` real GET requests to it, and
appends one JSONL row to ``--output-file`` with the key names of SGLang's real benchmark row
(``python/sglang/bench_serving.py`` of https://github.com/sgl-project/sglang at v0.5.9, shipped in the
sglang 0.5.9 wheel). The values are derived from the requests it really made, so a harness that reads
the wrong key gets a wrong number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--output-file", required=True)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--no-row", action="store_true")
    args, _ = parser.parse_known_args()
    if args.exit_code:
        print("fake bench: Warmup failed - Please make sure benchmark arguments are correctly specified.")
        sys.exit(args.exit_code)
    started = time.perf_counter()
    latencies = []
    for _ in range(args.num_prompts):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://{args.host}:{args.port}/health", timeout=5) as response:
            assert response.status == 200
        latencies.append((time.perf_counter() - t0) * 1000)
    duration = time.perf_counter() - started
    out_tokens = args.num_prompts * args.output_len
    ms = statistics.median(latencies)
    row = {"backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
           "max_concurrency": 1, "random_input_len": 16, "random_output_len": args.output_len,
           "random_range_ratio": 1.0, "duration": duration, "completed": args.num_prompts,
           "total_input_tokens": args.num_prompts * 16, "total_output_tokens": out_tokens,
           "total_output_tokens_retokenized": out_tokens, "request_throughput": args.num_prompts / duration,
           "input_throughput": args.num_prompts * 16 / duration, "output_throughput": out_tokens / duration,
           "total_throughput": (out_tokens + args.num_prompts * 16) / duration, "max_output_tokens_per_s": 1.0,
           "max_concurrent_requests": 1, "concurrency": 1.0, "accept_length": None, "tag": None}
    for stat in ("mean", "median", "std", "p90", "p99"):
        row[f"{stat}_e2e_latency_ms"] = ms
    for stat in ("mean", "median", "std", "p99"):
        row[f"{stat}_ttft_ms"] = ms / 2
        row[f"{stat}_tpot_ms"] = ms / 4
    for stat in ("mean", "median", "std", "p95", "p99"):
        row[f"{stat}_itl_ms"] = ms / 4
    print("============ Serving Benchmark Result ============")
    print(f"Output token throughput (tok/s):         {row['output_throughput']:.2f}")
    if not args.no_row:
        with open(args.output_file, "a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
