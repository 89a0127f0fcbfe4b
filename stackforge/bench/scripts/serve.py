#!/usr/bin/env python3
"""Serving throughput of a stack: start SGLang's server with the stack's flags, drive SGLang's own
benchmark against it, report output tok/s, TTFT, TPOT and ITL (runs inside an image).

Standalone: stdlib + the shared probe helper ``_sfprobe.py`` (SGLang is started and driven as
subprocesses). Steps:

1. decide the flags the *installed* SGLang understands: ``--tp-size``, ``--disable-custom-all-reduce``,
   ``--mem-fraction-static``, speculative decoding, and the CUDA-graph batch-size flag, which is
   ``--cuda-graph-max-bs`` up to 0.5.18 and ``--cuda-graph-max-bs-decode`` from 0.5.14 (the old
   one is gone in 0.5.20+): read from ``launch_server --help``, the installed version as fallback;
2. start ``python -m sglang.launch_server`` on 127.0.0.1 in its own process group, its output in a
   log file, and wait for ``/health`` with a deadline (model loading takes minutes); a server that
   exits or never gets healthy is a ``fail`` with its exit status and log tail, not a crash;
3. run the benchmark module (``sglang.benchmark.serving`` in 0.5.23, ``sglang.bench_serving``
   before; found with ``importlib.util.find_spec``) with ``--output-file`` and read its JSONL row;
4. always stop the server's whole process group (SIGTERM, grace, SIGKILL), also when this script
   itself is terminated.

``--server-cmd`` / ``--bench-cmd`` replace the two commands (JSON lists with ``{host}``, ``{port}``,
``{model}``, ``{output_file}`` placeholders), so the harness can drive another server -- the tests
use it with a stdlib HTTP server. The last stdout line is ``STACKFORGE_RESULT {json}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import _sfbench as bench  # beside this script (sys.path[0]); it imports _sfprobe

sf = bench.sf

LOOPBACK = "127.0.0.1"
BENCH_MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")  # newest first
OLD_GRAPH_FLAG = "--cuda-graph-max-bs"
NEW_GRAPH_FLAG = "--cuda-graph-max-bs-decode"
# First release with --cuda-graph-max-bs-decode: the sglang 0.5.14 wheel's srt/server_args.py:1939
# declares cuda_graph_max_bs_decode; 0.5.13.post1 has no such field.
NEW_GRAPH_FLAG_SINCE = (0, 5, 14)
# Keys of SGLang's bench_serving JSONL row that we report (sglang 0.5.9 wheel: bench_serving.py:2671-2713).
LATENCY_KEYS = {
    "ttft_ms": ("mean", "median", "std", "p99"),
    "tpot_ms": ("mean", "median", "std", "p99"),
    "itl_ms": ("mean", "median", "std", "p95", "p99"),
    "e2e_latency_ms": ("mean", "median", "std", "p90", "p99"),
}
THROUGHPUT_KEYS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput",
                   "max_output_tokens_per_s")
RUN_KEYS = ("backend", "dataset_name", "request_rate", "max_concurrency", "random_input_len",
            "random_output_len", "random_range_ratio", "duration", "completed", "total_input_tokens",
            "total_output_tokens", "total_output_tokens_retokenized", "concurrency", "accept_length")
REQUIRED_KEYS = ("output_throughput", "completed")
_TAIL_CHARS = 4000


class Failed(Exception):
    """The stack could not serve or be benchmarked: a result (fail/skip/error), with its evidence."""

    def __init__(self, status: str, reason: str, evidence: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.evidence = status, reason, evidence


# ------------------------------------------------------------------------------------ version-aware flags


def parse_version(text: str) -> tuple[int, ...]:
    """``"0.5.20.post1"`` -> ``(0, 5, 20)``: the numeric release part only."""
    parts = []
    for piece in text.split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


def choose_cuda_graph_flag(help_text: str | None, version: str | None) -> tuple[str | None, str]:
    """The CUDA-graph max batch size flag this SGLang accepts, and how that was decided.

    ``--help`` is authoritative (it is the parser that will read the flag); the version is used only
    when the help text could not be obtained. On 0.5.20+ the old flag is not an alias any more and,
    as an argparse prefix of two flags, fails to parse -- so the new one wins whenever it exists.
    """
    if help_text:
        if NEW_GRAPH_FLAG in help_text:
            return NEW_GRAPH_FLAG, f"launch_server --help lists {NEW_GRAPH_FLAG}"
        if re.search(re.escape(OLD_GRAPH_FLAG) + r"(?![\w-])", help_text):
            return OLD_GRAPH_FLAG, f"launch_server --help lists {OLD_GRAPH_FLAG} only"
        return None, "launch_server --help lists no --cuda-graph-max-bs flag"
    if version:
        release = parse_version(version)
        flag = NEW_GRAPH_FLAG if release >= NEW_GRAPH_FLAG_SINCE else OLD_GRAPH_FLAG
        return flag, f"no --help text; sglang {version} (new flag since {'.'.join(map(str, NEW_GRAPH_FLAG_SINCE))})"
    return None, "neither --help text nor an installed sglang version"


def server_argv(python: str, args, port: int, graph_flag: str | None) -> list[str]:
    """``python -m sglang.launch_server`` with the stack's flags (``--tp-size``: ``--tp`` is only an
    argparse prefix abbreviation, not a declared alias)."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", args.model, "--host", LOOPBACK,
            "--port", str(port), "--tp-size", str(args.tp)]
    if args.custom_allreduce == "off":
        argv.append("--disable-custom-all-reduce")
    if args.cuda_graph_max_bs:
        argv += [graph_flag, str(args.cuda_graph_max_bs)]
    if args.mem_fraction is not None:
        argv += ["--mem-fraction-static", str(args.mem_fraction)]
    if args.speculative_algorithm:
        argv += ["--speculative-algorithm", args.speculative_algorithm]
        for flag, value in (("--speculative-draft-model-path", args.speculative_draft_model_path),
                            ("--speculative-num-steps", args.speculative_num_steps),
                            ("--speculative-eagle-topk", args.speculative_eagle_topk),
                            ("--speculative-num-draft-tokens", args.speculative_num_draft_tokens)):
            if value not in (None, ""):
                argv += [flag, str(value)]
    return argv + shlex.split(args.extra_server_args)


def bench_argv(python: str, module: str, args, port: int, output_file: str) -> list[str]:
    """SGLang's own serving benchmark against our server, one JSONL row into ``output_file``.

    The default dataset is ``random-ids``: ``random`` samples ShareGPT prompts and downloads them,
    which an offline image cannot do.
    """
    return [python, "-m", module, "--backend", "sglang", "--host", LOOPBACK, "--port", str(port),
            "--model", args.model, "--dataset-name", args.dataset, "--num-prompts", str(args.num_prompts),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1.0", "--max-concurrency", str(args.max_concurrency),
            "--request-rate", str(args.request_rate), "--seed", str(args.seed), "--output-file", output_file]


def fill_placeholders(template: list[str], **values: str) -> list[str]:
    """Substitute ``{host}``/``{port}``/``{model}``/``{output_file}`` in a command template."""
    return [part.format(**values) for part in template]


def find_bench_module() -> str | None:
    """The first benchmark module this SGLang has (``find_spec`` imports the parent packages)."""
    for name in BENCH_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except Exception:  # a missing parent package, or sglang failing at import
            continue
    return None


def installed_version(package: str) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(package)
    except PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------ server process


def free_port() -> int:
    """A free TCP port on the loopback interface (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def tail_of(path: str, chars: int = _TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars * 2))
            return handle.read().decode("utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


class ProcessGroup:
    """A command in its own process group, its output in a log file; ``stop()`` ends the whole group.

    SGLang's server spawns scheduler and detokenizer processes; they stay in the server's group, so
    stopping the group stops them too.
    """

    def __init__(self, argv: list[str], log_path: str, env: dict | None = None) -> None:
        self.argv, self.log_path = argv, log_path
        with open(log_path, "ab") as log:
            log.write(("$ " + shlex.join(argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, grace: float) -> None:
        """SIGTERM the group, wait ``grace`` seconds for it to empty, then SIGKILL what is left."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader so that it stops counting as a member
            if not self.group_alive():
                return
            time.sleep(0.05)
        self._signal(signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + grace
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """(HTTP status, body) of a GET; (0, error text) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read(65536).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode("utf-8", errors="replace") if exc.fp else ""
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def wait_healthy(server: ProcessGroup, base_url: str, *, health_path: str, deadline_s: float,
                 interval_s: float) -> float:
    """Poll ``health_path`` until it answers 200; return the seconds it took.

    Raises:
        Failed: the server exited first, or the deadline passed (its log tail is the evidence).
    """
    started = time.monotonic()
    last = "no answer yet"
    while True:
        code = server.exit_code()
        if code is not None:
            raise Failed("fail", f"server {describe_exit(code)} before it became healthy "
                                 f"({time.monotonic() - started:.1f} s after start)", tail_of(server.log_path))
        status, body = http_get(base_url + health_path, timeout=min(10.0, max(1.0, interval_s * 2)))
        if status == 200:
            return time.monotonic() - started
        last = f"HTTP {status} {body[:200]}" if status else body[:200]
        if time.monotonic() - started > deadline_s:
            raise Failed("fail", f"server not healthy within {deadline_s:.0f} s (last {health_path}: {last})",
                         tail_of(server.log_path))
        time.sleep(interval_s)


def run_bench(argv: list[str], log_path: str, timeout: float) -> tuple[int | None, float]:
    """Run the benchmark command to completion or timeout; (exit status or None on timeout, seconds)."""
    started = time.monotonic()
    bench = ProcessGroup(argv, log_path)
    try:
        code = bench.wait(timeout)
    finally:
        bench.stop(grace=5.0)
    return code, time.monotonic() - started


# ------------------------------------------------------------------------------------ results


def read_bench_row(path: str) -> dict:
    """The last JSON row of the benchmark's JSONL output file (it appends one row per run).

    Raises:
        Failed: no file, no row, or a row that is not a JSON object.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
    except OSError as exc:
        raise Failed("fail", f"the benchmark wrote no output file ({exc.strerror})") from None
    if not lines:
        raise Failed("fail", "the benchmark output file is empty")
    try:
        row = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise Failed("error", f"the benchmark's last JSONL line is not JSON: {exc}", lines[-1][:2000]) from None
    if not isinstance(row, dict):
        raise Failed("error", "the benchmark's last JSONL line is not an object", lines[-1][:2000])
    return row


def bench_metrics(row: dict) -> dict:
    """Our metrics from SGLang's JSONL row: throughputs, latency percentiles, run parameters.

    Raises:
        Failed: the row lacks the keys a result cannot do without (a format we do not understand).
    """
    missing = [key for key in REQUIRED_KEYS if key not in row]
    if missing:
        raise Failed("error", f"benchmark JSONL row lacks {missing}; keys present: {sorted(row)[:40]}",
                     json.dumps(row)[:2000])
    metrics = {"output_tok_s": row["output_throughput"]}
    metrics.update({key: row[key] for key in THROUGHPUT_KEYS + RUN_KEYS if key in row})
    for name, stats in LATENCY_KEYS.items():
        found = {stat: row[f"{stat}_{name}"] for stat in stats if f"{stat}_{name}" in row}
        if found:
            metrics[name] = found
    return metrics


def summary_line(metrics: dict) -> str:
    parts = [f"output {metrics['output_tok_s']:.1f} tok/s"]
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        median = metrics.get(name, {}).get("median")
        if median is not None:
            parts.append(f"median {label} {median:.1f} ms")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------ orchestration


def resolve_commands(args, port: int, output_file: str, facts: dict) -> tuple[list[str], list[str]]:
    """The server and benchmark commands: the overrides when given, else SGLang's, version-aware."""
    values = {"host": LOOPBACK, "port": str(port), "model": args.model or "", "output_file": output_file}
    server = fill_placeholders(json.loads(args.server_cmd), **values) if args.server_cmd else None
    bench = fill_placeholders(json.loads(args.bench_cmd), **values) if args.bench_cmd else None
    if server is None or bench is None:
        version = installed_version("sglang")
        if version is None:
            raise Failed("skip", "sglang is not installed in this image")
        facts["sglang"] = version
    if server is None:
        server = server_argv(args.python, args, port, sglang_graph_flag(args, facts))
    if bench is None:
        module = find_bench_module()
        if module is None:
            raise Failed("fail", f"sglang {facts['sglang']} has none of the benchmark modules {list(BENCH_MODULES)}")
        facts["bench_module"] = module
        bench = bench_argv(args.python, module, args, port, output_file)
    return server, bench


def sglang_graph_flag(args, facts: dict) -> str | None:
    """Ask the installed launch_server for its flags when a CUDA-graph batch size is requested."""
    if not args.cuda_graph_max_bs:
        return None
    help_text = None
    try:
        done = subprocess.run([args.python, "-m", "sglang.launch_server", "--help"], capture_output=True,
                              text=True, timeout=args.help_timeout, stdin=subprocess.DEVNULL)
        help_text = done.stdout if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    flag, why = choose_cuda_graph_flag(help_text, facts.get("sglang"))
    facts["cuda_graph_flag"], facts["cuda_graph_flag_source"] = flag, why
    if flag is None:
        raise Failed("fail", f"cannot set the CUDA-graph batch size: {why}")
    return flag


def check_model(args) -> None:
    if args.server_cmd:
        return  # a custom server brings its own model (or none)
    if not args.model:
        raise Failed("error", "no --model directory given")
    if not os.path.isdir(args.model):
        raise Failed("error", f"model directory {args.model} does not exist in this container "
                              f"(is it mounted?)")


# SGLang's own words when its custom all-reduce turns itself off and the server falls back to NCCL
# (0.5.9 "Custom allreduce is disabled because ...", 0.5.23 "CustomAllreduce is disabled because ..."
# / "CustomAllReduceV2 is disabled ...", custom_all_reduce.py / custom_all_reduce_utils.py), the line
# up to SGLang's "To silence this warning" advice. Also the GroupCoordinator's own catch-all when the class
# raised while it was set up (0.5.23 parallel_state.py:514-517 "Setup Custom allreduce failed with <error>.
# To silence this warning, ..."): the server goes on without it, on NCCL.
CUSTOM_AR_DISABLED = re.compile(r"(?:(?:Custom allreduce|CustomAllreduce|CustomAllReduceV2) is disabled"
                                r"|Setup Custom allreduce failed)[^\n]*?"
                                r"(?=\s*To silence|\s*$)", re.IGNORECASE | re.MULTILINE)


def custom_allreduce_state(requested: str, tp: int, server_log: str) -> str:
    """What the server really ran for its all-reduce: ``off (requested)``, ``on``, ``not used
    (tp 1)``, or ``fell back to NCCL: <SGLang's words>`` when SGLang disabled it by itself (more
    than two PCIe GPUs, no P2P, an unsupported world size) although it was asked for."""
    if requested == "off":
        return "off (requested)"
    if tp < 2:
        return "not used (tp 1)"
    logged = "\n".join(line for line in server_log.splitlines() if not line.startswith("$ "))  # not our echo
    said = CUSTOM_AR_DISABLED.search(logged)
    return f"fell back to NCCL: {said.group(0).strip()}" if said else "on"


def serve_and_bench(args, workdir: str, stop_request: list, facts: dict) -> tuple[str, str, str, dict]:
    """Start the server, wait for health, benchmark, always stop the server.

    Returns (status, reason, evidence, metrics); ``facts`` fills up as things are learned, so that a
    failure still reports the version and the exact server command.

    Raises:
        Failed: the server or the benchmark failed (a result, with its log tail).
    """
    check_model(args)
    port = args.port or free_port()
    output_file = os.path.join(workdir, "bench.jsonl")
    server_cmd, bench_cmd = resolve_commands(args, port, output_file, facts)
    facts["server_argv"] = server_cmd
    server_log, bench_log = (os.path.join(workdir, name) for name in ("server.log", "bench.log"))
    print(f"serve: starting {shlex.join(server_cmd)}", flush=True)
    server = ProcessGroup(server_cmd, server_log)
    stop_request.append(server)
    try:
        base_url = f"http://{LOOPBACK}:{port}"
        startup_s = wait_healthy(server, base_url, health_path=args.health_path,
                                 deadline_s=args.startup_timeout, interval_s=args.health_interval)
        print(f"serve: healthy after {startup_s:.1f} s; running {shlex.join(bench_cmd)}", flush=True)
        status, body = http_get(base_url + "/get_model_info", timeout=10.0)
        if status == 200:
            facts["model_info"] = body[:2000]
        code, bench_s = run_bench(bench_cmd, bench_log, args.bench_timeout)
        if code is None:
            raise Failed("fail", f"benchmark did not finish within {args.bench_timeout:.0f} s", tail_of(bench_log))
        if code != 0:
            raise Failed("fail", f"benchmark {describe_exit(code)}",
                         tail_of(bench_log) + "\n--- server log ---\n" + tail_of(server_log, 2000))
        if server.exit_code() is not None:
            raise Failed("fail", f"server {describe_exit(server.exit_code())} during the benchmark",
                         tail_of(server_log))
        metrics = bench_metrics(read_bench_row(output_file))
        metrics.update(startup_s=round(startup_s, 2), bench_s=round(bench_s, 2),
                       custom_allreduce=custom_allreduce_state(args.custom_allreduce, args.tp,
                                                               read_text(server_log)))
    finally:
        server.stop(grace=args.stop_grace)
        stop_request.remove(server)
    if not metrics.get("completed"):
        return "fail", "the benchmark completed no request", tail_of(bench_log), metrics
    reason = summary_line(metrics)
    if metrics["custom_allreduce"].startswith("fell back"):
        reason += f"; custom all-reduce was asked for but SGLang {metrics['custom_allreduce']}"
    return "pass", reason, tail_of(bench_log, 3000), metrics


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server = parser.add_argument_group("server (the stack's flags)")
    server.add_argument("--model", default="", help="model directory (mounted from the host)")
    server.add_argument("--tp", type=int, default=1)
    server.add_argument("--custom-allreduce", choices=("on", "off"), default="on")
    server.add_argument("--cuda-graph-max-bs", type=int, default=0, help="0: SGLang's default")
    server.add_argument("--mem-fraction", type=float, default=None)
    server.add_argument("--speculative-algorithm", default="")
    server.add_argument("--speculative-draft-model-path", default="")
    server.add_argument("--speculative-num-steps", type=int, default=None)
    server.add_argument("--speculative-eagle-topk", type=int, default=None)
    server.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    server.add_argument("--extra-server-args", default="", help="more launch_server flags (shell words)")
    server.add_argument("--port", type=int, default=0, help="0: a free port")
    server.add_argument("--startup-timeout", type=float, default=1200.0, help="seconds to become healthy")
    server.add_argument("--health-path", default="/health")
    server.add_argument("--health-interval", type=float, default=2.0)
    server.add_argument("--stop-grace", type=float, default=10.0)
    server.add_argument("--help-timeout", type=float, default=180.0)
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--dataset", default="random-ids")
    bench.add_argument("--input-len", type=int, default=1024)
    bench.add_argument("--output-len", type=int, default=256)
    bench.add_argument("--num-prompts", type=int, default=200)
    bench.add_argument("--max-concurrency", type=int, default=32)
    bench.add_argument("--request-rate", default="inf")
    bench.add_argument("--seed", type=int, default=1)
    bench.add_argument("--bench-timeout", type=float, default=1800.0)
    harness = parser.add_argument_group("harness")
    harness.add_argument("--python", default=sys.executable)
    harness.add_argument("--server-cmd", default="", help="JSON list replacing the server command")
    harness.add_argument("--bench-cmd", default="", help="JSON list replacing the benchmark command")
    harness.add_argument("--log-dir", default="", help="keep server/bench logs here (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv) -> None:
    """Serve, benchmark, clean up -- then emit (``_sfprobe.emit`` ends the process, so it comes last)."""
    args = parse_args(argv)
    running: list[ProcessGroup] = []

    def on_terminate(signum, frame):
        # The runner stops us with SIGTERM and SIGKILLs after a short grace; the server lives in its
        # own process group, which the runner does not see: stop it now, quickly. A second SIGTERM
        # while stopping must not cut the stop short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for group in list(running):
            group.stop(grace=2.0)
        sf.end_descendants(settle_s=1.0)
        raise SystemExit(128 + signum)

    # Whatever the server starts outside its process group (a process in its own session) is
    # re-parented here when its parent dies, and ended with the rest below.
    sf.adopt_orphans()
    signal.signal(signal.SIGTERM, on_terminate)
    workdir = args.log_dir or tempfile.mkdtemp(prefix="sf-serve-")
    os.makedirs(workdir, exist_ok=True)
    facts: dict = {}
    try:
        status, reason, evidence, metrics = serve_and_bench(args, workdir, running, facts)
    except Failed as failed:
        status, reason, evidence, metrics = failed.status, failed.reason, failed.evidence, {}
    except SystemExit:
        status, reason, evidence, metrics = "error", "serve.py was terminated (SIGTERM); the server was stopped", "", {}
    finally:
        for group in list(running):
            group.stop(grace=2.0)
        sf.end_descendants()
        if not args.log_dir:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    # strict JSON: SGLang writes ``request_rate: Infinity``
    sf.emit(status, reason, evidence, bench.shared.json_safe(metrics),
            {**sf.collect_facts(import_torch=False), **facts})


if __name__ == "__main__":
    sf.run_main(main)
