"""Runtime probes ``nccl-graph-tree`` / ``nccl-graph-ring`` / ``nccl-global-tree``: NCCL with a forced
algorithm, eagerly and captured in a CUDA graph, on N GPUs.

Each rank runs in its own process (spawned); the parent watches every phase with a timeout,
because a hang (not an error) is how NCCL usually fails on PCIe boxes.

Two variants, each its own verdict:

* ``--variant per-collective`` (``nccl-graph-tree`` / ``-ring``): the algorithm forced for the
  all-reduce only, with NCCL's per-collective syntax ``NCCL_ALGO=allreduce:<algo>`` (what SGLang's
  ``--enable-deterministic-inference`` sets). Phases per rank: init, eager (all_reduce, checked
  against the exact sum), graph_capture (warm-up on a side stream, then capture), graph_replay
  (replay, checked again), destroy.
* ``--variant global`` (``nccl-global-tree``): a global ``NCCL_ALGO=Tree``, as a launch script that
  exports it sets it, with the collectives a server captures: all_reduce, all_gather,
  reduce_scatter and broadcast, each an independent attempt (warm-up, capture, replay, checked).
  Only AllReduce has a Tree algorithm, so NCCL refuses the others with "no algorithm/protocol
  available for function AllGather ... NCCL_ALGO was set to Tree."; the verdict quotes NCCL's words
  per collective (:func:`nccl_refusal`).

An ``NCCL_ALGO`` the image sets is never overwritten (a server in that image would run with it):
when it is the variant's own value the ranks run with it and the record says so
(``NCCL_ALGO_source: image``); any other value makes the variant a skip that names it, since a
verdict would then be about the image's value, not the variant's feature.

``--backend gloo`` runs the same harness on CPU (rendezvous, eager collectives, correctness check,
result) and skips the CUDA-graph phases: it tests the probe, not NCCL, and says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import _sfprobe as sf

#: The collectives of the global variant, in the order a server's first captured step meets them.
GLOBAL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: NCCL's refusal when the forced algorithm has no implementation for a collective: the WARN of
#: topoGetAlgoInfo in NVIDIA/nccl src/enqueue.cc ("Error : no algorithm/protocol available for
#: function %s with datatype %s.%s%s", the tail " NCCL_ALGO was set to %s."); releases before 2.19
#: capitalise "No". torch repeats it after "Last error:" in the DistBackendError it raises.
NCCL_REFUSAL = re.compile(r"no algorithm/protocol available for function (?P<function>\w+) with datatype "
                          r"(?P<datatype>\w+)\.?(?: NCCL_ALGO was set to (?P<algo>[^.\s]+)\.)?", re.IGNORECASE)


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
    if options["variant"] == "global":
        for collective in GLOBAL_COLLECTIVES:
            if not nccl and collective == "reduce_scatter":
                reporter.send(collective, "skip", "gloo has no reduce_scatter")
                continue
            with reporter.attempt(collective) as data:
                data.update(run_collective(torch, dist, collective, device, rank, world_size, nccl, options))
        with reporter.phase("destroy"):
            dist.destroy_process_group()
        return
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


def run_collective(torch: Any, dist: Any, collective: str, device: Any, rank: int, world_size: int,
                   nccl: bool, options: dict[str, Any]) -> dict[str, Any]:
    """One collective of the global variant: eager warm-up (on a side stream, as before a capture),
    then capture and replay (NCCL only), the result checked after each; its latencies."""
    numel = options["numel"] - options["numel"] % world_size
    call = collective_call(torch, dist, collective, device, rank, world_size, numel)
    if not nccl:
        call.run_fresh()
        call.check("eager")
        return {"eager_us": sf.median_us(call.run_fresh, lambda: None, options["iters"]), "graph": "skipped (gloo)"}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # NCCL must have run on the capture stream before capture
            call.run_fresh()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    call.check("eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call.run()
    torch.cuda.synchronize()
    replay_and_check(torch, graph, call)
    return {"graph_us": sf.median_us(graph.replay, torch.cuda.synchronize, options["iters"])}


def replay_and_check(torch: Any, graph: Any, call: "CollectiveCall") -> None:
    """Replay the captured collective and check its result. The warm-up left the right answer in
    the outputs, so they are overwritten with a sentinel and the inputs restored first (outside the
    captured body): only a replay that really ran the collective makes the check pass."""
    call.reset()
    graph.replay()
    torch.cuda.synchronize()
    call.check("graph replay")


@dataclasses.dataclass(frozen=True)
class CollectiveCall:
    """One collective on known data: ``run`` (the collective alone, what is captured), ``reset``
    (inputs back to their values, outputs to a sentinel) and ``check(where)`` (raise AssertionError
    unless the outputs hold the exact answer)."""
    run: Callable[[], None]
    reset: Callable[[], None]
    check: Callable[[str], None]

    def run_fresh(self) -> None:
        """The collective on fresh inputs (eager runs; an in-place collective consumes its input)."""
        self.reset()
        self.run()


def collective_call(torch: Any, dist: Any, collective: str, device: Any, rank: int, world_size: int,
                    numel: int) -> CollectiveCall:
    """The :class:`CollectiveCall` for one collective on float32 data whose right answer is known
    exactly: rank r contributes r + 1 everywhere (broadcast: rank 0 sends 1). The sentinel is -1,
    never a right answer; in-place collectives (all_reduce, broadcast) reset to their input instead,
    which differs from the answer on every rank that receives anything."""
    def full(count: int, value: float) -> Any:
        return torch.full((count,), value, dtype=torch.float32, device=device)

    def expect(tensor: Any, expected: Any, where: str) -> None:
        error = float((tensor.double() - expected.double()).abs().max().item())
        if error > 1e-6:
            raise AssertionError(f"{collective} {where}: off by up to {error}")

    mine = full(numel, float(rank + 1))
    refill_mine = lambda: mine.fill_(float(rank + 1))  # noqa: E731
    if collective == "all_reduce":
        return CollectiveCall(lambda: dist.all_reduce(mine), refill_mine,
                              lambda where: sf.check_allreduce_sum(mine, world_size, f"{collective} {where}"))
    if collective == "all_gather":
        shard = full(numel // world_size, float(rank + 1))
        gathered = full(numel, 0.0)
        expected = torch.arange(1, world_size + 1, dtype=torch.float32, device=device).repeat_interleave(
            numel // world_size)
        return CollectiveCall(lambda: dist.all_gather_into_tensor(gathered, shard), lambda: gathered.fill_(-1.0),
                              lambda where: expect(gathered, expected, where))
    if collective == "reduce_scatter":
        shard = full(numel // world_size, 0.0)
        total = world_size * (world_size + 1) / 2
        return CollectiveCall(lambda: dist.reduce_scatter_tensor(shard, mine), lambda: shard.fill_(-1.0),
                              lambda where: expect(shard, full(numel // world_size, total), where))
    if collective == "broadcast":
        return CollectiveCall(lambda: dist.broadcast(mine, src=0), refill_mine,
                              lambda where: expect(mine, full(numel, 1.0), where))
    raise ValueError(f"unknown collective {collective!r}")


def nccl_refusal(text: str) -> dict[str, str] | None:
    """NCCL's own words when it had no algorithm for a collective under the forced NCCL_ALGO:
    ``{"words", "function", "datatype", "NCCL_ALGO"}``, or None when ``text`` has no such refusal."""
    found = NCCL_REFUSAL.search(text)
    if found is None:
        return None
    return {"words": found.group(0), "function": found.group("function"), "datatype": found.group("datatype"),
            "NCCL_ALGO": found.group("algo") or ""}


def nccl_algo_setting(variant: str, algo: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """(NCCL_ALGO the ranks run with, where it comes from): the image's own value when it sets one
    (never overwritten: a server in that image runs with it), else the variant's."""
    if environ.get("NCCL_ALGO"):
        return environ["NCCL_ALGO"], "image"
    return variant_algo(variant, algo), "probe"


def variant_algo(variant: str, algo: str) -> str:
    """The NCCL_ALGO the variant is about: a global ``Tree`` or the per-collective ``allreduce:tree``."""
    return algo.capitalize() if variant == "global" else f"allreduce:{algo}"


def variant_feature(variant: str, algo: str) -> str:
    """The feature the variant's verdict is filed under (the probe catalog's names)."""
    return f"nccl-global-{algo}" if variant == "global" else f"nccl-graph-{algo}"


def image_forces_other_algo(variant: str, algo: str, environ: Mapping[str, str]) -> str | None:
    """The image's NCCL_ALGO when it is set and is not the variant's own value (NCCL reads the
    names case-insensitively), else None: ranks run with the image's value, so a verdict then
    would be about that value, not about the variant's feature."""
    forced = environ.get("NCCL_ALGO", "")
    if forced and forced.strip().lower() != variant_algo(variant, algo).lower():
        return forced
    return None


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("tree", "ring"), default="tree")
    parser.add_argument("--variant", choices=("per-collective", "global"), default="per-collective",
                        help="NCCL_ALGO=allreduce:<algo> with all_reduce, or a global NCCL_ALGO=<Algo> with "
                             "all_reduce, all_gather, reduce_scatter and broadcast")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--phase-timeout", type=float, default=120.0, help="seconds a phase may make no progress")
    parser.add_argument("--numel", type=int, default=1 << 20, help="float32 elements per all-reduce")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight(args.backend, args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    forced = image_forces_other_algo(args.variant, args.algo, os.environ)
    if forced is not None:
        sf.emit("skip", f"the image forces NCCL_ALGO={forced}; {variant_feature(args.variant, args.algo)} cannot "
                "be decided here", evidence=f"NCCL_ALGO={forced}", facts=facts)
    algo_env, algo_source = nccl_algo_setting(args.variant, args.algo, os.environ)
    options = {"backend": args.backend, "port": sf.free_tcp_port(), "numel": args.numel, "iters": args.iters,
               "variant": args.variant,
               # torch's own collective timeout sits above ours so that the parent names the hung phase
               "collective_timeout_s": args.phase_timeout * 3}
    env = {"NCCL_ALGO": algo_env}
    if "NCCL_DEBUG" not in os.environ:  # NCCL's warnings belong in the log; a caller may ask for more
        env["NCCL_DEBUG"] = "WARN"
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout, env=env)
    collectives = "all_reduce" if args.variant == "per-collective" else ", ".join(GLOBAL_COLLECTIVES)
    what = (f"{args.backend} {collectives}, {args.gpus} ranks, NCCL_ALGO={algo_env}"
            + (" (set by the image)" if algo_source == "image" else ""))
    metrics = summarize(outcome, args.backend, algo_env, args.gpus)
    metrics["NCCL_ALGO_source"] = algo_source
    failed = sf.ranks_result(outcome, what)
    if failed is not None:
        sf.emit_result(failed, facts, metrics)
    if args.variant == "global":
        sf.emit_result(global_result(args.backend, what, metrics, outcome), facts, metrics)
    sf.emit_result(passed(args.backend, what, metrics, outcome.log()), facts, metrics)


def global_result(backend: str, what: str, metrics: dict[str, Any], outcome: sf.RanksOutcome) -> sf.ScriptResult:
    """The global variant: one entry per collective, NCCL's own words where it refused one."""
    results = collective_results(outcome)
    metrics["collectives"] = {name: text for name, (_, text) in results.items()}
    summary = "; ".join(f"{name}: {text}" for name, (_, text) in results.items())
    statuses = {status for status, _ in results.values()}
    broken = [name for name, (status, _) in results.items() if status not in ("pass", "skip")]
    if broken:
        status = "fail" if statuses & {"fail", "not reached"} else "error"
        return sf.ScriptResult(status, f"{what}: {len(broken)} of {len(results)} collectives failed: {summary}",
                               outcome.log())
    tail = ("CUDA-graph phases skipped (gloo has no CUDA graphs), so this says nothing about NCCL"
            if backend == "gloo" else "each exact eagerly and replayed from a CUDA graph")
    return sf.ScriptResult("pass", f"{what}: {tail}; {summary}", outcome.log())


def collective_results(outcome: sf.RanksOutcome) -> dict[str, tuple[str, str]]:
    """(status, text) per collective of the global variant: ``pass`` with its latency, ``skip``,
    or the first failure; a refusal by NCCL is reduced to NCCL's own words."""
    results = {}
    for name in GLOBAL_COLLECTIVES:
        broken = outcome.phase_events(name, "check-fail")
        done = outcome.phase_events(name)
        skipped = outcome.phase_events(name, "skip")
        if broken:
            refusal = nccl_refusal(broken[0].detail)
            results[name] = (("fail", f"NCCL: {refusal['words']}") if refusal else
                             (sf.failure_status(broken[0].detail), f"rank {broken[0].rank}: {broken[0].detail}"))
        elif skipped:
            results[name] = ("skip", f"skipped: {skipped[0].detail}")
        elif done:
            key = "graph_us" if "graph_us" in done[0].data else "eager_us"
            results[name] = ("pass", f"pass ({key} {max(e.data.get(key, 0.0) for e in done)})")
        else:
            results[name] = ("not reached", "not reached")
    return results


def summarize(outcome: sf.RanksOutcome, backend: str, algo_env: str, gpus: int) -> dict[str, Any]:
    # devices: the GPUs (CUDA indices) the ranks ran on, rank r on GPU r; the report blames a failure on the
    # host's P2P only when P2P failed between two of them.
    metrics: dict[str, Any] = {"backend": backend, "NCCL_ALGO": algo_env, "ranks": gpus,
                               "devices": list(range(gpus)) if backend == "nccl" else []}
    for key, phase in (("eager_us", "eager"), ("graph_us", "graph_replay")):
        values = [e.data[key] for e in outcome.phase_events(phase) if key in e.data]
        if values:
            metrics[f"{key}_max_rank"] = max(values)
    metrics.update(outcome.nccl_facts())
    return metrics


def passed(backend: str, what: str, metrics: dict[str, Any], log: str) -> sf.ScriptResult:
    if backend == "gloo":
        return sf.ScriptResult("pass", f"gloo harness: {metrics['ranks']} ranks rendezvoused and the eager all_reduce "
                               "was exact; CUDA-graph phases skipped (gloo has no CUDA graphs), so this says "
                               "nothing about NCCL", log)
    return sf.ScriptResult("pass", f"{what}: exact eagerly ({metrics.get('eager_us_max_rank')} us) and replayed "
                           f"from a CUDA graph ({metrics.get('graph_us_max_rank')} us), NCCL {metrics.get('nccl')}", log)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
