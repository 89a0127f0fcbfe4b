"""Drives stackforge's multi-rank harness (_sfprobe.run_ranks) with ranks that misbehave on
purpose, so the harness's hang / crash / failure detection is tested for real (spawned processes,
real timeouts) without a GPU. Usage: ranks.py --mode hang|crash|fail|ok|orphan|orphan-hang [--phase-timeout S]
[--pidfile F]. The orphan modes: rank 1 starts a stubborn grandchild (``sleep 600`` in its own session,
SIGTERM ignored) and writes its pid to F; then the rank finishes (orphan) or hangs (orphan-hang)."""

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "stackforge",
                                "probes", "scripts"))

import _sfprobe as sf


def worker(rank, world_size, options, reporter):
    with reporter.phase("init"):
        pass
    if options["mode"].startswith("slow-jit"):
        # A first compile longer than the phase timeout: inside its own budget it is no hang.
        budget = 30.0 if options["mode"] == "slow-jit" else None
        with reporter.phase("jit", budget_s=budget):
            time.sleep(options["phase_timeout"] * 2)
    with reporter.phase("work"):
        if rank == 1 and options["mode"].startswith("orphan"):
            stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 600"], start_new_session=True)
            with open(options["pidfile"], "w") as handle:
                handle.write(str(stubborn.pid))
            if options["mode"] == "orphan-hang":
                time.sleep(3600)
        if rank == 1 and options["mode"] == "hang":
            time.sleep(3600)
        if rank == 1 and options["mode"] == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if rank == 1 and options["mode"] == "fail":
            raise AssertionError("rank 1 computed the wrong sum")
        if rank == 0 and options["mode"] in ("crash", "fail"):
            time.sleep(3600)  # a peer of a broken rank typically blocks in the next collective


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("hang", "crash", "fail", "ok", "orphan", "orphan-hang", "slow-jit",
                                           "slow-jit-unbudgeted"), required=True)
    parser.add_argument("--pidfile", default="")
    parser.add_argument("--phase-timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcome = sf.run_ranks(worker, 2, {"mode": args.mode, "pidfile": args.pidfile, "phase_timeout": args.phase_timeout},
                           phase_timeout_s=args.phase_timeout)
    result = sf.ranks_result(outcome, f"harness test ({args.mode})") or sf.ScriptResult("pass", "all ranks finished")
    sf.emit_result(result, extra_metrics={"seconds": round(time.monotonic() - started, 1),
                                           "exitcodes": list(outcome.exitcodes)})


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
