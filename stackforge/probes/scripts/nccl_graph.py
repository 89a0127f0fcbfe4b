"""Runtime probe ``nccl-graph-tree`` / ``nccl-graph-ring``: NCCL all-reduce with a forced
algorithm, eagerly and captured in a CUDA graph, on N GPUs.

Each rank runs in its own process (spawned); the parent watches every phase with a timeout,
because a hang (not an error) is how NCCL usually fails on PCIe boxes. The algorithm is forced
with NCCL's per-collective syntax ``NCCL_ALGO=allreduce:<algo>`` (a global ``NCCL_ALGO=Tree``
breaks AllGather/Broadcast, which only have Ring). Phases per rank: init (process group), eager
(all_reduce, checked against the exact sum), graph_capture (warm-up on a side stream, then
capture), graph_replay (replay, checked again), destroy.

``--backend gloo`` runs the same harness on CPU (rendezvous, eager all-reduce, correctness check,
result) and skips the CUDA-graph phases: it tests the probe, not NCCL, and says so.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf


def worker(rank: int, world_size: int, options: dict[str, Any], reporter: sf.RankReporter) -> None:
    """One rank: init, eager all-reduce, CUDA-graph capture and replay (NCCL only), destroy."""
    import torch
    import torch.distributed as dist

    nccl = options["backend"] == "nccl"
    with reporter.phase("init") as data:
        device = torch.device("cuda", rank) if nccl else torch.device("cpu")
        if nccl:
            torch.cuda.set_device(device)
        dist.init_process_group(options["backend"], init_method=f"tcp://127.0.0.1:{options['port']}",
                                rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=options["collective_timeout_s"]))
        if nccl:
            data["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            data["gpu"] = torch.cuda.get_device_name(device)
    sync = torch.cuda.synchronize if nccl else (lambda: None)
    tensor = torch.full((options["numel"],), float(rank + 1), dtype=torch.float32, device=device)
    with reporter.phase("eager") as data:
        dist.all_reduce(tensor)
        sync()
        sf.check_allreduce_sum(tensor, world_size, "eager")
        data["eager_us"] = sf.median_us(lambda: dist.all_reduce(tensor), sync, options["iters"])
    if nccl:
        run_graph_phases(torch, dist, tensor, rank, world_size, options, reporter)
    else:
        reporter.send("graph_capture", "skip", "gloo has no CUDA graphs")
    with reporter.phase("destroy"):
        dist.destroy_process_group()


def run_graph_phases(torch: Any, dist: Any, tensor: Any, rank: int, world_size: int,
                     options: dict[str, Any], reporter: sf.RankReporter) -> None:
    with reporter.phase("graph_capture"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # NCCL must have run on the capture stream before capture
                dist.all_reduce(tensor)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
    with reporter.phase("graph_replay") as data:
        tensor.fill_(float(rank + 1))
        graph.replay()
        torch.cuda.synchronize()
        sf.check_allreduce_sum(tensor, world_size, "graph replay")
        data["graph_us"] = sf.median_us(graph.replay, torch.cuda.synchronize, options["iters"])


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("tree", "ring"), default="tree")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--phase-timeout", type=float, default=120.0, help="seconds a phase may make no progress")
    parser.add_argument("--numel", type=int, default=1 << 20, help="float32 elements per all-reduce")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight(args.backend, args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    algo_env = f"allreduce:{args.algo}"
    options = {"backend": args.backend, "port": sf.free_tcp_port(), "numel": args.numel, "iters": args.iters,
               # torch's own collective timeout sits above ours so that the parent names the hung phase
               "collective_timeout_s": args.phase_timeout * 3}
    env = {"NCCL_ALGO": algo_env}
    if "NCCL_DEBUG" not in os.environ:  # NCCL's warnings belong in the log; a caller may ask for more
        env["NCCL_DEBUG"] = "WARN"
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout, env=env)
    what = f"{args.backend} all_reduce, {args.gpus} ranks, NCCL_ALGO={algo_env}"
    metrics = summarize(outcome, args.backend, algo_env, args.gpus)
    failed = sf.ranks_verdict(outcome, what)
    if failed is not None:
        sf.emit_verdict(failed, facts, metrics)
    sf.emit_verdict(passed(args.backend, what, metrics, outcome.log()), facts, metrics)


def summarize(outcome: sf.RanksOutcome, backend: str, algo_env: str, gpus: int) -> dict[str, Any]:
    metrics: dict[str, Any] = {"backend": backend, "NCCL_ALGO": algo_env, "ranks": gpus}
    for key, phase in (("eager_us", "eager"), ("graph_us", "graph_replay")):
        values = [e.data[key] for e in outcome.phase_events(phase) if key in e.data]
        if values:
            metrics[f"{key}_max_rank"] = max(values)
    metrics.update(outcome.nccl_facts())
    return metrics


def passed(backend: str, what: str, metrics: dict[str, Any], log: str) -> sf.Verdict:
    if backend == "gloo":
        return sf.Verdict("pass", f"gloo harness: {metrics['ranks']} ranks rendezvoused and the eager all_reduce "
                          "was exact; CUDA-graph phases skipped (gloo has no CUDA graphs), so this says "
                          "nothing about NCCL", log)
    return sf.Verdict("pass", f"{what}: exact eagerly ({metrics.get('eager_us_max_rank')} us) and replayed "
                      f"from a CUDA graph ({metrics.get('graph_us_max_rank')} us), NCCL {metrics.get('nccl')}", log)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
