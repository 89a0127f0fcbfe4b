"""Runtime probe ``torch-symm-mem``: torch symmetric memory on N GPUs, judged by the op SGLang uses.

Each rank (own process, phase timeouts in the parent): init an NCCL process group, allocate a
bf16 buffer with ``torch.distributed._symmetric_memory.empty`` and ``rendezvous`` it, report
whether the handle has multicast (``handle.multicast_ptr != 0``) and its compute capability, then
run and check ``one_shot_all_reduce``, ``two_shot_all_reduce_`` and ``multimem_all_reduce_``
eagerly, each an independent check, and finally capture the op SGLang would run into a CUDA graph
and replay it (SGLang's decode steps replay it from graphs), checked again.

The verdict is decided by the op SGLang's ``TorchSymmMemCommunicator.all_reduce`` picks:
``multimem_all_reduce_`` when the world size is in ``_WORLD_SIZES_MULTIMEM[capability major]``
(read from the installed SGLang's file; 0.5.23: 9 and 10 -> 4, 6, 8), else
``two_shot_all_reduce_``; the other ops are metrics. Cases torch has no kernel for
(``_sfprobe.symm_mem_unsupported``) are reported ``unsupported``, not run. SGLang's communicator
disables itself when the handle has no multicast, so by default the feature passes only with
multicast (``--no-require-multicast`` to judge torch alone).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import _sfprobe as sf

OPS = ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_")
DTYPE = "bfloat16"  # SGLang's TorchSymmMemCommunicator is bf16 only
GRAPH_PHASE = "graph_replay"
#: SGLang's ``TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM`` when the installed SGLang's file
#: cannot be read: 0.5.23's literal (0.5.9 had ``10: [6, 8]``).
SGLANG_MULTIMEM_FALLBACK: Mapping[int, tuple[int, ...]] = {9: (4, 6, 8), 10: (4, 6, 8)}
SGLANG_SYMM_FILE = os.path.join("srt", "distributed", "device_communicators", "torch_symm_mem.py")


def sglang_multimem_table() -> tuple[dict[int, tuple[int, ...]], str]:
    """SGLang's capability -> world sizes that use ``multimem_all_reduce_``, and where it was read;
    from the installed SGLang's file without importing SGLang, else :data:`SGLANG_MULTIMEM_FALLBACK`."""
    spec = importlib.util.find_spec("sglang")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, SGLANG_SYMM_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                table = multimem_literal(ast.parse(handle.read()))
            if table is not None:
                return table, path
    return dict(SGLANG_MULTIMEM_FALLBACK), "stackforge's copy of SGLang 0.5.23's table (no readable SGLang here)"


def multimem_literal(tree: ast.Module) -> dict[int, tuple[int, ...]] | None:
    """``_WORLD_SIZES_MULTIMEM = {9: [4, 6, 8], ...}`` from a class body, as a dict of tuples."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WORLD_SIZES_MULTIMEM"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return {int(k): tuple(v) for k, v in value.items()}
    return None


def sglang_op(table: Mapping[int, Sequence[int]], capability_major: int, world_size: int) -> str:
    """The op ``TorchSymmMemCommunicator.all_reduce`` runs for this capability and world size."""
    return "multimem_all_reduce_" if world_size in table.get(capability_major, ()) else "two_shot_all_reduce_"


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
        buffer = symm_mem.empty(options["numel"], dtype=getattr(torch, DTYPE), device=device)
        handle = symm_mem.rendezvous(buffer, group_name)
        multicast = bool(getattr(handle, "multicast_ptr", 0))
        capability = torch.cuda.get_device_capability(device)[0]
        chosen = sglang_op(options["multimem_table"], capability, world_size)
        data.update(multicast=multicast, capability=capability, sglang_op=chosen)
    for op in OPS:
        reason = sf.symm_mem_unsupported(op, world_size, DTYPE, multicast, torch_git=torch.version.git_version)
        if reason:
            reporter.send(op, "skip", f"unsupported: {reason}")
            continue
        with reporter.attempt(op) as data:
            data["us"] = run_op(torch, dist, op, buffer, group_name, rank, world_size, options["iters"])
    if sf.symm_mem_unsupported(chosen, world_size, DTYPE, multicast) is None:
        with reporter.attempt(GRAPH_PHASE) as data:
            data["us"] = replay_op(torch, dist, chosen, buffer, group_name, rank, world_size, options["iters"])
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


def replay_op(torch: Any, dist: Any, op: str, buffer: Any, group_name: str, rank: int, world_size: int,
              iters: int) -> float:
    """Capture ``op`` (with the refill of its input) into a CUDA graph, replay it, check the sum;
    the median replay latency (us)."""
    function = getattr(torch.ops.symm_mem, op)

    def step() -> None:
        buffer.fill_(float(rank + 1))
        function(buffer, "sum", group_name)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream's side, as torch.cuda.graph expects
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    buffer.zero_()
    dist.barrier()
    graph.replay()
    torch.cuda.synchronize()
    sf.check_allreduce_sum(buffer, world_size, f"{op} replayed from a CUDA graph")
    return sf.median_us(graph.replay, torch.cuda.synchronize, iters)


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
    table, table_source = sglang_multimem_table()
    options = {"port": sf.free_tcp_port(), "numel": args.numel, "iters": args.iters, "multimem_table": table,
               "collective_timeout_s": args.phase_timeout * 3}
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout)
    what = f"torch symmetric memory on {args.gpus} GPUs"
    failed = sf.ranks_result(outcome, what)
    metrics = summarize(outcome)
    metrics["sglang_multimem_table"] = {str(k): list(v) for k, v in table.items()}
    metrics["sglang_multimem_table_source"] = table_source
    if failed is not None:
        sf.emit_result(failed, facts, metrics)
    sf.emit_result(decide(what, metrics, outcome, args.require_multicast), facts, metrics)


def summarize(outcome: sf.RanksOutcome) -> dict[str, Any]:
    rendezvous = outcome.phase_events("rendezvous")
    metrics: dict[str, Any] = {
        "multicast": all(e.data.get("multicast") for e in rendezvous) if rendezvous else None,
        "capability": rendezvous[0].data.get("capability") if rendezvous else None,
        "sglang_op": rendezvous[0].data.get("sglang_op") if rendezvous else None}
    for op in (*OPS, GRAPH_PHASE):
        metrics[op] = op_state(outcome, op)
        oks = outcome.phase_events(op)
        if metrics[op] == "ok":
            metrics[f"{op}_us_max_rank"] = max(e.data.get("us", 0.0) for e in oks)
    return metrics


def op_state(outcome: sf.RanksOutcome, phase: str) -> str:
    """``ok`` | ``fail`` | ``unsupported`` | ``skip`` | ``not run`` for one op across the ranks."""
    if outcome.phase_events(phase, "check-fail"):
        return "fail"
    skips = outcome.phase_events(phase, "skip")
    if skips:
        return "unsupported" if skips[0].detail.startswith("unsupported:") else "skip"
    return "ok" if outcome.phase_events(phase) else "not run"


def decide(what: str, metrics: dict[str, Any], outcome: sf.RanksOutcome, require_multicast: bool) -> sf.ScriptResult:
    log = outcome.log()
    chosen = metrics["sglang_op"]
    summary = ", ".join(f"{op}={metrics[op]}" for op in (*OPS, GRAPH_PHASE))
    judged = (f"{what}, capability {metrics['capability']}: SGLang runs {chosen} here" if chosen
              else what)
    if require_multicast and not metrics["multicast"]:
        return sf.ScriptResult("fail", f"{judged}, but the devices have no multicast (handle.multicast_ptr == 0); "
                               f"SGLang's TorchSymmMemCommunicator disables itself without it ({summary})", log)
    if chosen is None or metrics[chosen] == "not run":
        return sf.ScriptResult("error", f"{what}: the ranks never reached the op SGLang uses ({summary})", log)
    if metrics[chosen] == "unsupported":
        first = outcome.phase_events(chosen, "skip")[0]
        return sf.ScriptResult("fail", f"{judged}, which torch cannot run: {first.detail[len('unsupported: '):]}", log)
    broken = [e for e in outcome.events if e.state == "check-fail" and e.phase in (chosen, GRAPH_PHASE)]
    if broken:
        first = broken[0]
        return sf.ScriptResult(sf.failure_status(first.detail), f"{judged}; rank {first.rank} {first.phase}: "
                               f"{first.detail} ({summary})", log)
    return sf.ScriptResult("pass", f"{judged}: exact eagerly ({metrics[f'{chosen}_us_max_rank']} us) and replayed from a "
                           f"CUDA graph ({metrics[f'{GRAPH_PHASE}_us_max_rank']} us); {summary}; "
                           f"multicast={'yes' if metrics['multicast'] else 'no'}", log)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
