"""Runtime probe ``custom-allreduce``: SGLang's custom all-reduce against NCCL on N GPUs.

Each rank (own process, phase timeouts in the parent): init NCCL plus a gloo group (SGLang
attaches ``CustomAllreduce`` to a CPU group), record its row of the P2P access matrix
(``torch.cuda.can_device_access_peer``), construct the class SGLang's own dispatcher picks
(``dispatch_custom_allreduce``: ``CustomAllReduceV2`` on full-NVLink CUDA groups in 0.5.23, else
``CustomAllreduce``; see ``_sfprobe.sglang_custom_allreduce_class``) with its own gates (world size,
NVLink via NVML; its P2P test is skipped as a server skips it without ``--enable-p2p-check``, see
``_sfprobe.skip_sglang_p2p_check``) and, when it stays enabled, compare
``custom_all_reduce`` with NCCL's ``all_reduce`` for several sizes, then once more captured in a
CUDA graph inside ``communicator.capture()`` and replayed (how SGLang's decode steps run it):
results (bf16 tolerance) and median latency of each. Every rank's difference is gathered before
any rank decides, so a mismatch on one rank is reported by rank on all of them instead of leaving
the others waiting in the next collective; likewise an exception in one rank's custom all-reduce,
capture or replay (``agree_on_step``).
"""

from __future__ import annotations

import builtins
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import _sfprobe as sf

SIZES = (2048, 131072, 1048576)  # bf16 elements: 4 KiB, 256 KiB, 2 MiB
GRAPH_PHASE = "graph_replay"
GRAPH_NUMEL = 131072  # 256 KiB, a decode-step all-reduce
TEXT_BYTES = 1024  # of a rank's error text shared with its peers (see agree_on_step)


def worker(rank: int, world_size: int, options: dict[str, Any], reporter: sf.RankReporter) -> None:
    import torch
    import torch.distributed as dist

    with reporter.phase("init"):
        device = sf.init_nccl_rank(torch, dist, rank, world_size, options)
        cpu_group = dist.new_group(backend="gloo")
    with reporter.phase("p2p") as data:
        data["row"] = [True if peer == rank else bool(torch.cuda.can_device_access_peer(rank, peer))
                       for peer in range(world_size)]
    said = LogCollector()
    logging.getLogger("sglang").addHandler(said)
    # The class SGLang picks, and what it JIT-compiles on first use built here, with its own budget and time:
    # a slow first compile inside a collective's phase would read as a hang.
    with reporter.phase("jit", budget_s=options["jit_budget_s"]) as data:
        p2p_check = sf.skip_sglang_p2p_check()
        chosen, name = sf.sglang_custom_allreduce_class(cpu_group, device)
        data.update(sf.warm_sglang_custom_allreduce_jit(chosen, world_size, torch))
    with reporter.phase("construct") as data:
        data["p2p_check"], data["class"] = p2p_check, name
        communicator = chosen(group=cpu_group, device=device)
        data["disabled"] = bool(communicator.disabled)
        data["sglang_said"] = " | ".join(said.messages)
    if not communicator.disabled:
        for numel in options["sizes"]:
            with reporter.attempt(f"allreduce_{numel}") as data:
                data.update(compare(torch, dist, cpu_group, communicator, numel, rank, options["iters"]))
        with reporter.attempt(GRAPH_PHASE) as data:
            data.update(compare_graph(torch, dist, cpu_group, communicator, GRAPH_NUMEL, rank, options["iters"]))
        communicator.close()
    with reporter.phase("destroy"):
        dist.destroy_process_group()


class LogCollector(logging.Handler):
    """Keeps what SGLang logs at WARNING and above (why it disabled itself)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def compare(torch: Any, dist: Any, cpu_group: Any, communicator: Any, numel: int, rank: int,
            iters: int) -> dict[str, Any]:
    """Custom all-reduce vs NCCL on the same bf16 input, eagerly: every rank's difference, then
    latencies. Every rank takes the same path (see :func:`agree_on_differences`)."""
    data, reference = input_and_nccl_reference(torch, dist, numel, seed=1234 + rank)
    if not communicator.should_custom_ar(data):
        return {"used": False}

    def reduce() -> Any:
        result = communicator.custom_all_reduce(data)
        torch.cuda.synchronize()
        return result

    result = agree_on_step(dist, cpu_group, reduce, "eager")
    differences = agree_on_differences(dist, cpu_group, *difference_and_scale(result, reference), "eager")
    return {"used": True, "max_abs_diff": max(d for d, _ in differences),
            "custom_us": sf.median_us(lambda: communicator.custom_all_reduce(data), torch.cuda.synchronize, iters),
            "nccl_us": sf.median_us(lambda: dist.all_reduce(reference), torch.cuda.synchronize, iters)}


def compare_graph(torch: Any, dist: Any, cpu_group: Any, communicator: Any, numel: int, rank: int,
                  iters: int) -> dict[str, Any]:
    """Custom all-reduce captured in a CUDA graph the way SGLang's graph runner does it (inside
    ``communicator.capture()``, which registers the graph's buffers on exit), replayed, and compared
    with NCCL on every rank; the replay latency."""
    data, reference = input_and_nccl_reference(torch, dist, numel, seed=4321 + rank)
    if not communicator.should_custom_ar(data):
        return {"used": False}
    graph = torch.cuda.CUDAGraph()

    def capture() -> Any:
        with communicator.capture():
            with torch.cuda.graph(graph):
                result = communicator.custom_all_reduce(data)
        torch.cuda.synchronize()
        return result

    def replay() -> None:
        graph.replay()
        torch.cuda.synchronize()

    # the gather after the capture is also the barrier before any replay: every rank's graph
    # buffers are registered by then
    result = agree_on_step(dist, cpu_group, capture, "graph capture")
    agree_on_step(dist, cpu_group, replay, "graph replay")
    differences = agree_on_differences(dist, cpu_group, *difference_and_scale(result, reference), "graph replay")
    return {"used": True, "max_abs_diff": max(d for d, _ in differences),
            "graph_us": sf.median_us(graph.replay, torch.cuda.synchronize, iters)}


def input_and_nccl_reference(torch: Any, dist: Any, numel: int, *, seed: int) -> tuple[Any, Any]:
    """A seeded bf16 input on this rank and NCCL's all-reduce of it (the reference to compare with)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    data = torch.randn(numel, dtype=torch.bfloat16, device="cuda", generator=generator)
    reference = data.clone()
    dist.all_reduce(reference)
    return data, reference


def difference_and_scale(result: Any, reference: Any) -> tuple[float, float]:
    difference = float((result.float() - reference.float()).abs().max().item())
    return difference, float(reference.float().abs().max().item()) or 1.0


def agree_on_step(dist: Any, group: Any, step: Callable[[], Any], where: str) -> Any:
    """``step()`` on this rank, then every rank's outcome gathered on the CPU group: a rank whose
    step raised and left alone would leave its peers waiting in the next collective (a false
    "hang"), so it takes part in the gather with its error text and all ranks raise together,
    naming the ranks that failed and the first one's error; else ``step``'s result."""
    try:
        result, error, cause = step(), "", None
    except Exception as exc:  # any failure: it is named to every rank below, then raised
        result, error, cause = None, sf.describe_exception(exc), exc
    errors = gather_texts(dist, group, error)
    failed = [rank for rank, text in enumerate(errors) if text]
    if failed:
        first = errors[failed[0]]
        # Every rank raises the first failing rank's exception type where it names a probe bug
        # (sf.PROBE_BUG_EXCEPTIONS: graded error, not a measured fail); anything else is a RuntimeError.
        name = first.split(":", 1)[0].strip()
        kind = getattr(builtins, name, RuntimeError) if name in sf.PROBE_BUG_EXCEPTIONS else RuntimeError
        raise kind(f"{where}: custom all-reduce raised on rank(s) {', '.join(map(str, failed))}: "
                   f"rank {failed[0]}: {first}") from cause
    return result


def gather_texts(dist: Any, group: Any, text: str) -> list[str]:
    """Every rank's ``text`` (cut to TEXT_BYTES of UTF-8), gathered as fixed-size byte tensors:
    tensors, not all_gather_object, so no numpy is needed."""
    import torch

    encoded = text.encode()[:TEXT_BYTES]
    mine = torch.zeros(TEXT_BYTES, dtype=torch.uint8)
    if encoded:
        mine[:len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
    slots = [torch.zeros(TEXT_BYTES, dtype=torch.uint8) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(slots, mine, group=group)
    return [bytes(slot.tolist()).rstrip(b"\0").decode(errors="replace") for slot in slots]


def agree_on_differences(dist: Any, group: Any, difference: float, scale: float,
                         where: str) -> list[tuple[float, float]]:
    """Every rank's (difference, scale), gathered on the CPU group before anyone decides: a rank
    that alone raised would leave its peers waiting in the next collective (a false "hang"); so all
    ranks raise together, naming the ranks that differ, or all go on."""
    import torch

    mine = torch.tensor([difference, scale], dtype=torch.float64)
    slots = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(slots, mine, group=group)  # tensors, not all_gather_object: no numpy needed
    gathered = [(float(slot[0]), float(slot[1])) for slot in slots]
    mismatched = mismatched_ranks(gathered)
    if mismatched:
        raise AssertionError(f"{where}: custom all-reduce differs from NCCL on rank(s) "
                             + ", ".join(f"{r} (by {gathered[r][0]:.4g}, max |NCCL| {gathered[r][1]:.4g})"
                                         for r in mismatched))
    return gathered


def mismatched_ranks(differences: Sequence[tuple[float, float]]) -> list[int]:
    """Ranks whose difference exceeds what bf16 rounding explains (5 % of the largest |value|)."""
    return [rank for rank, (difference, scale) in enumerate(differences) if difference > 0.05 * scale]


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--phase-timeout", type=float, default=180.0)
    parser.add_argument("--jit-budget", type=float, default=600.0,
                        help="seconds SGLang's first JIT compile of its custom all-reduce may take (its own phase)")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight("nccl", args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    version = sf.installed_version("sglang")
    if version is None:
        sf.emit("skip", "SGLang is not installed in this image", facts=facts)
    options = {"port": sf.free_tcp_port(), "iters": args.iters, "sizes": SIZES, "jit_budget_s": args.jit_budget,
               "collective_timeout_s": max(args.phase_timeout, args.jit_budget) * 3}
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout)
    metrics = summarize(outcome)
    metrics["devices"] = list(range(args.gpus))   # rank r on GPU r: the pairs a host P2P fault is judged by
    what = (f"SGLang {version} custom all-reduce ({metrics['sglang_class'] or 'class not reached'}) "
            f"on {args.gpus} GPUs ({args.interconnect})")
    facts = {**facts, "p2p_matrix": metrics.pop("p2p_matrix", None)}
    failed = sf.ranks_result(outcome, what)
    if failed is not None:
        sf.emit_result(failed, facts, metrics)
    sf.emit_result(decide(what, metrics, outcome), facts, metrics)


def summarize(outcome: sf.RanksOutcome) -> dict[str, Any]:
    rows = {e.rank: e.data.get("row") for e in outcome.phase_events("p2p")}
    constructed = outcome.phase_events("construct")
    compiled = outcome.phase_events("jit")
    metrics: dict[str, Any] = {"p2p_matrix": [rows[r] for r in sorted(rows)],
                               "jit": compiled[0].data.get("jit") if compiled else None,
                               "jit_s_max_rank": max((e.data.get("jit_s", 0.0) for e in compiled), default=None),
                               "disabled": any(e.data.get("disabled") for e in constructed) if constructed else None,
                               "sglang_class": constructed[0].data.get("class") if constructed else None,
                               "sglang_p2p_check": constructed[0].data.get("p2p_check") if constructed else None,
                               "sglang_said": next((e.data["sglang_said"] for e in constructed
                                                    if e.data.get("sglang_said")), "")}
    for numel in SIZES:
        events = outcome.phase_events(f"allreduce_{numel}")
        if events and all(e.data.get("used") for e in events):
            metrics[f"custom_us_{numel}"] = max(e.data["custom_us"] for e in events)
            metrics[f"nccl_us_{numel}"] = max(e.data["nccl_us"] for e in events)
            metrics[f"max_abs_diff_{numel}"] = max(e.data["max_abs_diff"] for e in events)
    replayed = outcome.phase_events(GRAPH_PHASE)
    if replayed and all(e.data.get("used") for e in replayed):
        metrics["graph_us"] = max(e.data["graph_us"] for e in replayed)
        metrics["graph_max_abs_diff"] = max(e.data["max_abs_diff"] for e in replayed)
    return metrics


def decide(what: str, metrics: dict[str, Any], outcome: sf.RanksOutcome) -> sf.ScriptResult:
    log = outcome.log()
    if metrics["disabled"]:
        return sf.ScriptResult("fail", f"{what}: SGLang disabled it: {metrics['sglang_said'] or 'no reason logged'}",
                               log)
    broken = [e for e in outcome.events if e.state == "check-fail"]
    if broken:
        first = broken[0]
        return sf.ScriptResult(sf.failure_status(first.detail), f"{what}: rank {first.rank} {first.phase}: "
                               f"{first.detail}", log)
    used = [n for n in SIZES if f"custom_us_{n}" in metrics]
    if not used:
        return sf.ScriptResult("fail", f"{what}: enabled, but should_custom_ar declined every size tried", log)
    timing = "; ".join(f"{n * 2 // 1024} KiB: custom {metrics[f'custom_us_{n}']} us vs NCCL {metrics[f'nccl_us_{n}']} us"
                       for n in used)
    if "graph_us" not in metrics:
        return sf.ScriptResult("fail", f"{what}: matches NCCL eagerly ({timing}), but should_custom_ar declined the "
                               f"{GRAPH_NUMEL * 2 // 1024} KiB all-reduce to capture in a CUDA graph", log)
    return sf.ScriptResult("pass", f"{what}: matches NCCL eagerly and replayed from a CUDA graph "
                           f"({metrics['graph_us']} us); {timing}", log)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
