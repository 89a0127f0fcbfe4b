"""Runtime probe ``torch-symm-mem``: torch symmetric memory on N GPUs of the target.

Each rank (own process, phase timeouts in the parent): init an NCCL process group, allocate a
buffer with ``torch.distributed._symmetric_memory.empty`` and ``rendezvous`` it, report whether
the handle has multicast (``handle.multicast_ptr != 0``), then run and check
``torch.ops.symm_mem.one_shot_all_reduce``, ``two_shot_all_reduce_`` and, with multicast,
``multimem_all_reduce_``. Each all-reduce variant is an independent check.

SGLang's ``TorchSymmMemCommunicator`` disables itself when the handle has no multicast, so by
default the feature passes only with multicast (``--no-require-multicast`` to judge torch alone).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf

OPS = ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_")


def worker(rank: int, world_size: int, options: dict[str, Any], reporter: sf.RankReporter) -> None:
    import torch
    import torch.distributed as dist

    with reporter.phase("init"):
        device = sf.init_nccl_rank(torch, dist, rank, world_size, options)
        group_name = dist.group.WORLD.group_name
    with reporter.phase("rendezvous") as data:
        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # required before torch 2.8, a deprecated no-op later
            enable(group_name)
        buffer = symm_mem.empty(options["numel"], dtype=torch.bfloat16, device=device)
        handle = symm_mem.rendezvous(buffer, group_name)
        multicast = bool(getattr(handle, "multicast_ptr", 0))
        data["multicast"] = multicast
    for op in OPS:
        if op == "multimem_all_reduce_" and not multicast:
            reporter.send(op, "skip", "no multicast on this device (handle.multicast_ptr == 0)")
            continue
        with reporter.attempt(op) as data:
            data["us"] = run_op(torch, dist, op, buffer, group_name, rank, world_size, options["iters"])
    with reporter.phase("destroy"):
        dist.destroy_process_group()


def run_op(torch: Any, dist: Any, op: str, buffer: Any, group_name: str, rank: int, world_size: int,
           iters: int) -> float:
    """Run one symm_mem all-reduce, check the sum, return its median latency (us)."""
    function = getattr(torch.ops.symm_mem, op)

    def call() -> Any:
        return function(buffer, "sum", group_name)

    buffer.fill_(float(rank + 1))
    dist.barrier()
    result = call()
    torch.cuda.synchronize()
    sf.check_allreduce_sum(result if op == "one_shot_all_reduce" else buffer, world_size, op)

    def reset_and_call() -> None:
        buffer.fill_(float(rank + 1))
        call()

    return sf.median_us(reset_and_call, torch.cuda.synchronize, iters)


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--phase-timeout", type=float, default=120.0)
    parser.add_argument("--numel", type=int, default=1 << 20, help="bf16 elements (a multiple of 8)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-require-multicast", dest="require_multicast", action="store_false")
    args = parser.parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight("nccl", args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    options = {"port": sf.free_tcp_port(), "numel": args.numel, "iters": args.iters,
               "collective_timeout_s": args.phase_timeout * 3}
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout)
    what = f"torch symmetric memory on {args.gpus} GPUs"
    failed = sf.ranks_verdict(outcome, what)
    metrics = summarize(outcome)
    if failed is not None:
        sf.emit_verdict(failed, facts, metrics)
    sf.emit_verdict(decide(what, metrics, outcome, args.require_multicast), facts, metrics)


def summarize(outcome: sf.RanksOutcome) -> dict[str, Any]:
    rendezvous = outcome.phase_events("rendezvous")
    metrics: dict[str, Any] = {"multicast": all(e.data.get("multicast") for e in rendezvous) if rendezvous
                               else None}
    for op in OPS:
        oks = outcome.phase_events(op)
        misses = outcome.phase_events(op, "check-fail")
        skips = outcome.phase_events(op, "skip")
        metrics[op] = ("fail" if misses else "skip" if skips else "ok" if oks else "not run")
        if oks and not misses:
            metrics[f"{op}_us_max_rank"] = max(e.data.get("us", 0.0) for e in oks)
    return metrics


def decide(what: str, metrics: dict[str, Any], outcome: sf.RanksOutcome, require_multicast: bool) -> sf.Verdict:
    log = outcome.log()
    working = [op for op in OPS if metrics[op] == "ok"]
    broken = [e for e in outcome.events if e.state == "check-fail"]
    summary = ", ".join(f"{op}={metrics[op]}" for op in OPS)
    if not working:
        first = broken[0] if broken else None
        detail = f"; rank {first.rank} {first.phase}: {first.detail}" if first else ""
        return sf.Verdict("fail", f"{what}: no all-reduce variant worked ({summary}){detail}", log)
    if require_multicast and not metrics["multicast"]:
        return sf.Verdict("fail", f"{what}: rendezvous ok and {', '.join(working)} correct, but the devices have no "
                          "multicast (handle.multicast_ptr == 0); SGLang's TorchSymmMemCommunicator disables "
                          "itself without it", log)
    return sf.Verdict("pass", f"{what}: {summary}; multicast={'yes' if metrics['multicast'] else 'no'}", log)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
