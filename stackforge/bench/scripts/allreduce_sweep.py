#!/usr/bin/env python3
"""All-reduce latency / bandwidth sweep with nccl-tests semantics (runs inside an image).

Standalone: stdlib + torch (+ sglang for ``--backend custom``) + the shared probe helper
``_sfprobe.py`` mounted beside the bench scripts. It imports with the stdlib alone and answers
``skip`` with a reason when torch, a GPU or the backend is missing.

What it measures, per message size (``--min-bytes`` .. ``--max-bytes``, times ``--factor``), per
mode (eager, CUDA graph) and per placement (out-of-place, in-place):

* the time of one all-reduce: ``--iters`` back-to-back calls timed together (CUDA events on GPU,
  a monotonic clock on CPU), repeated ``--repeats`` times after at least ``--warmup`` untimed calls
  (whole blocks of ``--iters``: a CUDA graph replays all of them at once); each repeat is
  averaged over the ranks as nccl-tests does by default (``-a 1``) and the median repeat is kept;
* ``algbw = S / t`` and ``busbw = algbw * 2(n-1)/n`` (nccl-tests' definitions, GB = 1e9 bytes:
  NVIDIA/nccl-tests src/all_reduce.cu:59-65 ``AllReduceGetBw`` at a0b82b2, NCCL_TESTS_VERSION 2.19.6);
* ``avg_busbw_gbps``: nccl-tests' "Avg bus bandwidth", the mean busbw of a run's rows, out-of-place
  and in-place (src/common.cu:895-896, 939-940, 1831); a nccl-tests run is either eager or CUDA graph
  (``-G``), so the eager rows make ``avg_busbw_gbps`` and the graph rows ``avg_busbw_graph_gbps``;
* correctness of every size: each rank contributes ``pattern * (rank + 1)`` and every rank checks
  the sum; a wrong element makes the run ``fail`` and the row carries no bandwidth at all.

Backends (the caller decides which ones the image supports, from the probes' results):

* ``nccl``: ``torch.distributed`` on NCCL; ``--nccl-algo ring|tree`` sets the per-collective form
  ``NCCL_ALGO=allreduce:<algo>`` (a global ``NCCL_ALGO=Tree`` breaks all-gather/broadcast, which
  have no tree algorithm). torch exposes no out-of-place NCCL all-reduce (ProcessGroupNCCL reduces
  in place), and ``out.copy_(in)`` + in-place would add a device copy that nccl-tests' out-of-place
  (``ncclAllReduce(sendbuff, recvbuff)``, src/all_reduce.cu:507) does not have: out-of-place NCCL
  rows are skipped with that reason, not measured as something else.
* ``custom``: SGLang's custom all-reduce, the class its own ``dispatch_custom_allreduce`` picks
  (``CustomAllReduceV2`` on full-NVLink groups in 0.5.23, else ``CustomAllreduce``; out-of-place only;
  sizes under its max size).
* ``symm-mem``: torch symmetric memory ops (``--symm-mem-op one_shot|two_shot|multimem``).
* ``gloo``: CPU, so that the whole multi-process harness runs for real without a GPU.

Every rank is a separate process (spawned by the shared helper ``_sfprobe.run_ranks``). The parent
supervises them with a per-phase timeout (``--phase-timeout``: setup, then each measurement): a rank
that makes no progress is a hang, and a hang is a ``fail`` naming the rank and its phase -- never a
stuck script; a rank that dies is named before the errors it causes in its peers. ``timeout`` and
``crash`` of the script itself are the runner's to assign.

The last stdout line is ``STACKFORGE_RESULT {json}`` (status, reason, evidence, metrics, facts).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import _sfbench as bench  # beside this script (sys.path[0]); it imports _sfprobe

sf = bench.sf

COLLECTIVE = "allreduce"
BACKENDS = ("nccl", "custom", "symm-mem", "gloo")
NCCL_ALGOS = ("ring", "tree", "nvls", "nvlstree", "collnetdirect", "collnetchain")
SYMM_MEM_OPS = ("one_shot", "two_shot", "multimem")
DTYPES = ("float32", "float16", "bfloat16")
MODES = ("eager", "graph")
PLACEMENTS = ("out-of-place", "in-place")
# Why the NCCL backend measures no out-of-place rows (see the module docstring).
NCCL_OUT_OF_PLACE = ("torch.distributed has no out-of-place NCCL all-reduce (ProcessGroupNCCL reduces in place); "
                     "a copy + in-place row would add a device copy nccl-tests' out-of-place does not have")
# nccl-tests' default datatype (src/common.cu:102, ``nccltype = ncclFloat``): the rows compare with
# an all_reduce_perf run without -d.
DEFAULT_DTYPE = "float32"
# Relative tolerance of the correctness check per dtype. The pattern sums are small integers
# (exact in every dtype up to 8 ranks), so this only matters for larger worlds.
_TOLERANCE = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}


# The formulas (nccl-tests' algbw/busbw), statistics and json_safe are stackforge's own, from the
# shared _sfshared.py of the mounted in-image package.
shared = bench.shared


# ------------------------------------------------------------------------------------------- plan


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes`` inclusive, each ``factor`` times the previous."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {min_bytes} .. {max_bytes}")
    if factor < 2:
        raise ValueError(f"factor must be >= 2, got {factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def element_size(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def plan_steps(config: dict) -> tuple[list[dict], list[dict]]:
    """Expand the sweep into measurement steps (identical on every rank), and up-front skips."""
    steps, skipped = [], []
    if config["backend"] == "gloo" and config["requested_graph"]:
        skipped.append({"mode": "graph", "reason": "CUDA graphs need a CUDA backend (gloo runs on the CPU)"})
    elem = element_size(config["dtype"])
    for size in message_sizes(config["min_bytes"], config["max_bytes"], config["factor"]):
        count = size // elem
        if count == 0:
            skipped.append({"size_bytes": size, "reason": f"smaller than one {config['dtype']} element"})
            continue
        for mode in config["modes"]:
            for placement in config["placements"]:
                steps.append({"index": len(steps), "size_bytes": count * elem, "count": count,
                              "mode": mode, "placement": placement})
    return steps, skipped


def step_label(step: dict) -> str:
    return f"{human_bytes(step['size_bytes'])} {step['mode']} {step['placement']}"


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


# ------------------------------------------------------------------------------------------- ranks


class Unavailable(Exception):
    """The backend cannot run here (not installed, disabled by its own checks): a skip, not a failure."""


class TorchDistBackend:
    """``torch.distributed`` all-reduce on NCCL (GPU) or gloo (CPU)."""

    def __init__(self, torch, dist, rank: int, config: dict) -> None:
        self.torch, self.dist, self.rank, self.config = torch, dist, rank, config
        self.on_gpu = config["backend"] != "gloo"
        self.device = torch.device(f"cuda:{rank}") if self.on_gpu else torch.device("cpu")

    def unsupported(self, step: dict) -> str | None:
        if step["mode"] == "graph" and not self.on_gpu:
            return "CUDA graphs need a CUDA backend (gloo runs on the CPU)"
        if step["placement"] == "out-of-place" and self.config["backend"] == "nccl":
            return NCCL_OUT_OF_PLACE
        return None

    def impl(self, placement: str) -> str:
        return "all_reduce" if placement == "in-place" else "copy+all_reduce"

    def buffers(self, count: int):
        dtype = getattr(self.torch, self.config["dtype"])
        return (self.torch.zeros(count, dtype=dtype, device=self.device),
                self.torch.zeros(count, dtype=dtype, device=self.device))

    def operation(self, placement: str, inp, out):
        """A callable doing one all-reduce, and a callable returning the tensor that holds its result."""
        all_reduce = self.dist.all_reduce
        if placement == "in-place":
            return (lambda: all_reduce(inp)), (lambda: inp)

        def out_of_place():
            out.copy_(inp)
            all_reduce(out)
        return out_of_place, (lambda: out)

    def capture_context(self):
        import contextlib
        return contextlib.nullcontext()


class CustomAllreduceBackend(TorchDistBackend):
    """SGLang's custom all-reduce kernel (sgl-kernel), as SGLang itself drives it."""

    def __init__(self, torch, dist, rank: int, config: dict) -> None:
        super().__init__(torch, dist, rank, config)
        import logging
        records = _capture_logs(logging.getLogger("sglang"))
        cpu_group = dist.new_group(backend="gloo")  # SGLang asserts a non-NCCL group for its IPC setup
        try:
            self.p2p_check = sf.skip_sglang_p2p_check()  # as a server does; SGLang's own check needs its world group
            chosen, self.class_name = sf.sglang_custom_allreduce_class(cpu_group, self.device)
        except Exception as exc:  # ImportError, or sglang failing at import time
            raise Unavailable(f"cannot import SGLang's custom all-reduce: {type(exc).__name__}: {exc}") from None
        kwargs = {"max_size": config["custom_max_size"]} if config.get("custom_max_size") else {}
        self.ca = chosen(group=cpu_group, device=self.device, **kwargs)
        if self.ca.disabled:
            said = "; ".join(records) or "no warning logged (world size 1, or sgl_kernel missing)"
            raise Unavailable(f"SGLang disabled its custom all-reduce: {said}")

    def unsupported(self, step: dict) -> str | None:
        if step["placement"] == "in-place":
            return "SGLang's custom all-reduce is out-of-place only"
        probe = self.torch.empty(step["count"], dtype=getattr(self.torch, self.config["dtype"]),
                                 device=self.device)
        if not self.ca.should_custom_ar(probe):
            return (f"SGLang would not use custom all-reduce here (size {step['size_bytes']} B: must be "
                    f"a multiple of 16 and under max size {getattr(self.ca, 'max_size', '?')} B)")
        return None

    def impl(self, placement: str) -> str:
        return f"sglang {self.class_name}.custom_all_reduce"

    def operation(self, placement: str, inp, out):
        holder = [None]

        def run():
            holder[0] = self.ca.custom_all_reduce(inp)
        return run, (lambda: holder[0])

    def capture_context(self):
        # register_graph_buffers() at the end of this context is what makes graph replay work.
        return self.ca.capture()


class SymmMemBackend(TorchDistBackend):
    """torch symmetric memory all-reduce ops (``torch.ops.symm_mem``)."""

    _OPS = {  # (op, placement) -> (op name, takes an out tensor)
        ("one_shot", "out-of-place"): ("one_shot_all_reduce_out", True),
        ("two_shot", "in-place"): ("two_shot_all_reduce_", False),
        ("two_shot", "out-of-place"): ("two_shot_all_reduce_out", True),
        ("multimem", "in-place"): ("multimem_all_reduce_", False),
    }

    def __init__(self, torch, dist, rank: int, config: dict) -> None:
        super().__init__(torch, dist, rank, config)
        try:
            import torch.distributed._symmetric_memory as symm_mem
        except ImportError as exc:
            raise Unavailable(f"torch has no symmetric memory module: {exc}") from None
        self.symm_mem = symm_mem
        self.group_name = dist.group.WORLD.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # required before torch 2.8, a deprecated no-op later
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(self.group_name)

    def _op(self, placement: str):
        name, has_out = self._OPS.get((self.config["symm_mem_op"], placement), (None, False))
        if name is None:
            return None, False
        try:
            return getattr(self.torch.ops.symm_mem, name), has_out
        except (AttributeError, RuntimeError):
            return None, has_out

    def unsupported(self, step: dict) -> str | None:
        op, _ = self._op(step["placement"])
        if op is None:
            return (f"torch.ops.symm_mem has no {self.config['symm_mem_op']} {step['placement']} "
                    f"all-reduce in torch {self.torch.__version__}")
        name, _ = self._OPS[(self.config["symm_mem_op"], step["placement"])]
        no_kernel = sf.symm_mem_unsupported(name, self.dist.get_world_size(), self.config["dtype"])
        return f"unsupported: {no_kernel}" if no_kernel else None

    def impl(self, placement: str) -> str:
        name, _ = self._OPS.get((self.config["symm_mem_op"], placement), ("?", False))
        return f"torch.ops.symm_mem.{name}"

    def buffers(self, count: int):
        dtype = getattr(self.torch, self.config["dtype"])
        inp = self.symm_mem.empty(count, dtype=dtype, device=self.device)
        inp.zero_()
        self.symm_mem.rendezvous(inp, self.group_name)
        return inp, self.torch.zeros(count, dtype=dtype, device=self.device)

    def operation(self, placement: str, inp, out):
        op, has_out = self._op(placement)
        group = self.group_name
        if has_out:
            return (lambda: op(inp, "sum", group, out)), (lambda: out)
        return (lambda: op(inp, "sum", group)), (lambda: inp)


def _capture_logs(logger) -> list[str]:
    """Collect the messages ``logger`` emits from now on (SGLang explains why it disables a feature)."""
    import logging
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())
    logger.addHandler(Keep(level=logging.INFO))
    return messages


def _make_backend(torch, dist, rank: int, config: dict):
    kind = config["backend"]
    if kind == "custom":
        return CustomAllreduceBackend(torch, dist, rank, config)
    if kind == "symm-mem":
        return SymmMemBackend(torch, dist, rank, config)
    return TorchDistBackend(torch, dist, rank, config)


def _pattern(torch, count: int, dtype, device):
    """1, 2, ..., 7, 1, 2, ... -- small integers, exact in every dtype when summed over <= 8 ranks."""
    block = torch.arange(1, 8, dtype=dtype, device=device)
    return block.repeat(count // 7 + 1)[:count]


def _check(torch, result, expected, dtype: str) -> tuple[int, str]:
    """Number of wrong elements, and the first one as text."""
    tol = _TOLERANCE[dtype]
    bad = ~torch.isclose(result, expected, rtol=tol, atol=tol)
    wrong = int(bad.sum().item())
    if not wrong:
        return 0, ""
    index = int(bad.nonzero()[0].item())
    return wrong, f"element {index}: got {result[index].item()!r}, expected {expected[index].item()!r}"


class CollectiveClock:
    """Times ``iters`` calls of a callable: CUDA events on GPU (device time), perf_counter on CPU."""

    def __init__(self, torch, on_gpu: bool) -> None:
        self.torch, self.on_gpu = torch, on_gpu

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def seconds(self, run) -> float:
        if not self.on_gpu:
            start = time.perf_counter()
            run()
            return time.perf_counter() - start
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def _capture_graph(torch, backend, op, times: int):
    """Capture ``times`` calls of ``op`` in one CUDA graph (warm-up on a side stream first, as NCCL
    initialises its communicator lazily and capture forbids that)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with backend.capture_context():
        with torch.cuda.stream(side):
            for _ in range(2):
                op()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(times):
                op()
    torch.cuda.synchronize()
    return graph


def _measure(torch, dist, backend, clock: CollectiveClock, rank: int, world: int, step: dict, config: dict) -> dict:
    """One step on one rank: correctness check, then timed repeats."""
    reason = backend.unsupported(step)
    if reason:
        return {"skipped": reason}
    dtype = getattr(torch, config["dtype"])
    inp, out = backend.buffers(step["count"])
    op, result = backend.operation(step["placement"], inp, out)
    base = _pattern(torch, step["count"], dtype, backend.device)
    graph_mode = step["mode"] == "graph"

    # Correctness first, on the same code path that is timed (a one-call graph in graph mode).
    check_graph = _capture_graph(torch, backend, op, 1) if graph_mode else None
    inp.copy_(base * (rank + 1))
    if config.get("corrupt_rank") == rank:  # test-only: proves a wrong sum fails the run
        inp.view(-1)[0] += 1
    dist.barrier()
    check_graph.replay() if graph_mode else op()
    clock.sync()
    wrong, example = _check(torch, result(), base * (world * (world + 1) // 2), config["dtype"])
    del check_graph

    # Timing on zeros: a repeated in-place sum of zeros stays zero (no overflow to inf/NaN).
    inp.zero_()
    out.zero_()
    iters = config["iters"]
    if graph_mode:
        graph = _capture_graph(torch, backend, op, iters)
        run = graph.replay
    else:
        def run():
            for _ in range(iters):
                op()
    for _ in range(max(1, math.ceil(config["warmup"] / iters))):  # at least one: uploads the graph
        run()
    clock.sync()
    times = []
    for _ in range(config["repeats"]):
        dist.barrier()
        clock.sync()
        times.append(clock.seconds(run) / iters)
    return {"times": times, "wrong": wrong, "example": example, "impl": backend.impl(step["placement"])}


def _rank_facts(torch, config: dict) -> dict:
    """What rank 0 sees that the parent cannot without a CUDA context (facts beside collect_facts)."""
    facts = {}
    if config["backend"] != "gloo":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        facts["capability"] = f"{props.major}.{props.minor}"
        facts["gpu_name"] = props.name
    return facts


def _inject_fault(rank: int, config: dict) -> None:
    """Test-only faults (hidden flags) that prove the parent's hang and death handling for real."""
    if config.get("stall_rank") == rank:
        time.sleep(24 * 3600)
    if config.get("kill_rank") == rank:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def rank_worker(rank: int, world_size: int, config: dict, reporter) -> None:
    """One rank (its own process, spawned by ``_sfprobe.run_ranks``): every phase is reported, each
    measurement's numbers travel in its phase's ``ok`` event."""
    with reporter.phase("init") as data:
        import torch
        import torch.distributed as dist
        on_gpu = config["backend"] != "gloo"
        if on_gpu:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if on_gpu else "gloo", init_method=config["init_method"],
                                rank=rank, world_size=world_size)
        if on_gpu:  # create the communicator now, inside the init phase, not in the first measurement
            dist.barrier()
        try:
            backend = _make_backend(torch, dist, rank, config)
        except Unavailable as exc:
            unavailable = str(exc)
        else:
            unavailable = ""
        if rank == 0:
            data.update(_rank_facts(torch, config))
    if unavailable:
        # Every rank reaches the same decision (same checks, same machine), so none waits on another.
        reporter.send("init", "skip", unavailable)
        return
    clock = CollectiveClock(torch, on_gpu)
    steps, _ = plan_steps(config)
    for step in steps:
        with reporter.phase(step_label(step)) as data:
            _inject_fault(rank, config)
            data.update(index=step["index"], **_measure(torch, dist, backend, clock, rank, world_size, step, config))
    with reporter.phase("teardown"):
        dist.destroy_process_group()


class Abort(Exception):
    """The sweep cannot continue; carries the status, reason and evidence to report."""

    def __init__(self, status: str, reason: str, evidence: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.evidence = status, reason, evidence


def check_ranks(outcome) -> None:
    """Turn what went wrong with the ranks into an :class:`Abort`; return when every rank finished.

    A dead rank is named before the errors of its peers, which are usually only its consequence
    ("connection closed by peer").
    """
    log = outcome.log()
    if outcome.hung is not None:
        rank, phase, seconds = outcome.hung
        raise Abort("fail", f"hang: rank {rank} made no progress for {seconds:.0f} s in phase '{phase}'", log)
    crashed = outcome.crashed()
    failures = outcome.failures()
    if crashed and (not failures or all(f.rank != crashed[0][0] for f in failures)):
        rank, code = crashed[0]
        started = [e.phase for e in outcome.events if e.rank == rank and e.state == "start"]
        phase = started[-1] if started else "spawn"
        raise Abort("fail", f"rank {rank} died ({sf.rank_signal_name(code)}) in phase '{phase}'", log)
    if failures:
        first = failures[0]
        raise Abort("fail", f"rank {first.rank} failed in phase '{first.phase}': {first.detail}",
                    (first.data.get("traceback") or "") + "\n" + log)
    skips = [e for e in outcome.events if e.state == "skip"]
    if skips:
        raise Abort("skip", skips[0].detail, log)


def collect_steps(outcome, steps: list[dict], world: int) -> dict[int, dict[int, dict]]:
    """``{step index: {rank: measurement}}`` from the ranks' ``ok`` events.

    Raises:
        Abort: a rank did not report a step (it cannot happen after :func:`check_ranks`; a bug if so).
    """
    reports: dict[int, dict[int, dict]] = {}
    for event in outcome.events:
        if event.state == "ok" and "index" in event.data:
            reports.setdefault(event.data["index"], {})[event.rank] = dict(event.data)
    missing = [s["index"] for s in steps if len(reports.get(s["index"], {})) != world]
    if missing:
        raise Abort("error", f"measurements {missing[:5]} were not reported by every rank", outcome.log())
    return reports


def merge_step(step: dict, per_rank: dict, world: int, dtype: str) -> dict:
    """One table row from every rank's report of a step (times averaged over ranks per repeat)."""
    row = {"size_bytes": step["size_bytes"], "count": step["count"], "dtype": dtype,
           "mode": step["mode"], "placement": step["placement"]}
    first = per_rank[0]
    if "skipped" in first:
        return {**row, "skipped": first["skipped"]}
    wrong = sum(r["wrong"] for r in per_rank.values())
    row.update(impl=first["impl"], wrong=wrong)
    if wrong:
        examples = [f"rank {k}: {r['example']}" for k, r in sorted(per_rank.items()) if r["example"]]
        return {**row, "wrong_examples": examples}
    repeats = len(first["times"])
    averaged = [statistics.fmean(per_rank[r]["times"][i] for r in per_rank) for i in range(repeats)]
    spread = shared.summarize(averaged)
    seconds = spread["median"]
    return {**row, **bench.time_columns(spread),
            "algbw_gbps": shared.algbw_gbps(step["size_bytes"], seconds),
            "busbw_gbps": shared.busbw_gbps(step["size_bytes"], seconds, COLLECTIVE, world)}


def group_skips(rows) -> list[dict]:
    """One entry per (mode, placement, reason) with the sizes it covers, instead of one per size."""
    groups: dict[tuple, list[int]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["placement"], row["skipped"]), []).append(row["size_bytes"])
    return [{"mode": mode, "placement": placement, "reason": reason, "sizes": sizes}
            for (mode, placement, reason), sizes in groups.items()]


def format_table(rows: list[dict]) -> str:
    """An nccl-tests-like table of the measured rows."""
    lines = [f"#{'size(B)':>12} {'count':>11} {'type':>9} {'mode':>6} {'placement':>13} {'time(us)':>11} "
             f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'cv':>6} {'#wrong':>7}"]
    for row in rows:
        if "skipped" in row:
            continue
        if row["wrong"]:
            timing = f"{'-':>11} {'-':>12} {'-':>12} {'-':>6}"
        else:
            timing = (f"{row['time_us']:>11.2f} {row['algbw_gbps']:>12.3f} {row['busbw_gbps']:>12.3f} "
                      f"{row['time_cv']:>6.3f}")
        lines.append(f" {row['size_bytes']:>12} {row['count']:>11} {row['dtype']:>9} {row['mode']:>6} "
                     f"{row['placement']:>13} {timing} {row['wrong']:>7}")
    return "\n".join(lines)


def summary_metrics(rows: list[dict]) -> dict:
    """Headline numbers: peak busbw and its size, nccl-tests' 'Avg bus bandwidth' (one per mode, as
    one nccl-tests run is either eager or -G), small-message latency."""
    good = [r for r in rows if "busbw_gbps" in r]
    if not good:
        return {}
    best = max(good, key=lambda r: r["busbw_gbps"])
    smallest = min(r["size_bytes"] for r in good)
    latencies = [r["time_us"] for r in good if r["size_bytes"] == smallest]
    summary = {"peak_busbw_gbps": best["busbw_gbps"], "peak_busbw_size_bytes": best["size_bytes"],
               "peak_busbw_mode": best["mode"], "peak_busbw_placement": best["placement"],
               "min_size_bytes": smallest, "min_size_latency_us": min(latencies)}
    for mode, key in (("eager", "avg_busbw_gbps"), ("graph", "avg_busbw_graph_gbps")):
        of_mode = [r["busbw_gbps"] for r in good if r["mode"] == mode]
        if of_mode:
            summary[key] = statistics.fmean(of_mode)
    return summary


# ------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="nccl")
    parser.add_argument("--world-size", type=int, default=0,
                        help="ranks (default: every visible GPU; 2 for gloo)")
    parser.add_argument("--dtype", choices=DTYPES, default=DEFAULT_DTYPE,
                        help=f"default {DEFAULT_DTYPE}, as nccl-tests (all_reduce_perf without -d)")
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--mode", choices=("eager", "graph", "both"), default="both")
    parser.add_argument("--placement", choices=("out-of-place", "in-place", "both"), default="both")
    parser.add_argument("--nccl-algo", choices=NCCL_ALGOS, default=None,
                        help="force the all-reduce algorithm (NCCL_ALGO=allreduce:<algo>)")
    parser.add_argument("--nccl-proto", choices=("simple", "ll", "ll128"), default=None)
    parser.add_argument("--symm-mem-op", choices=SYMM_MEM_OPS, default="two_shot")
    parser.add_argument("--custom-max-size", type=int, default=0, help="CustomAllreduce max_size (0: its default)")
    bench.add_timing_arguments(parser, warmup=5, iters=20, repeats=5)
    parser.add_argument("--phase-timeout", type=float, default=300.0,
                        help="seconds a rank may spend in one phase (setup, one measurement) before it is a hang")
    parser.add_argument("--total-timeout", type=float, default=0.0, help="seconds for the whole sweep (0: none)")
    # Test-only fault injection: a wrong contribution, a rank that hangs, a rank that dies.
    parser.add_argument("--corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stall-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kill-rank", type=int, default=None, help=argparse.SUPPRESS)
    return bench.parse_timed_args(parser, argv)


def preconditions(args):
    """Import torch and check the backend can run here; return (torch, world size) or a skip Abort."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise Abort("skip", f"torch is not installed in this image: {exc}", str(exc)) from None
    if not dist.is_available():
        raise Abort("skip", "this torch build has no torch.distributed", torch.__version__)
    if args.backend == "gloo":
        if not dist.is_gloo_available():
            raise Abort("skip", "this torch build has no gloo backend", torch.__version__)
        return torch, args.world_size or 2
    if not torch.cuda.is_available():
        raise Abort("skip", f"{sf.NO_GPU_REASON}; torch {torch.__version__}, built for CUDA {torch.version.cuda}",
                    "torch.cuda.is_available() is False")
    if not dist.is_nccl_available():
        raise Abort("skip", "this torch build has no NCCL backend", torch.__version__)
    visible = torch.cuda.device_count()
    world = args.world_size or visible
    if world > visible:
        raise Abort("skip", f"{world} ranks need {world} GPUs; {visible} visible", f"device_count()={visible}")
    if args.backend in ("custom", "symm-mem") and world < 2:
        raise Abort("skip", f"{args.backend} all-reduce needs at least 2 GPUs; {world} available", "")
    return torch, world


def build_config(args, world: int, init_method: str) -> dict:
    """The plain-dict configuration every rank receives (it is pickled into the spawned processes)."""
    modes = [m for m in (MODES if args.mode == "both" else (args.mode,))
             if not (m == "graph" and args.backend == "gloo")]
    placements = PLACEMENTS if args.placement == "both" else (args.placement,)
    dtype = args.dtype
    return {"backend": args.backend, "world_size": world, "dtype": dtype, "min_bytes": args.min_bytes,
            "max_bytes": args.max_bytes, "factor": args.factor, "modes": list(modes),
            "requested_graph": args.mode in ("graph", "both"), "placements": list(placements),
            "symm_mem_op": args.symm_mem_op, "custom_max_size": args.custom_max_size, "warmup": args.warmup,
            "iters": args.iters, "repeats": args.repeats, "corrupt_rank": args.corrupt_rank,
            "stall_rank": args.stall_rank, "kill_rank": args.kill_rank, "init_method": init_method}


def nccl_environment(args) -> dict:
    """NCCL variables this run sets (per-collective syntax: a global NCCL_ALGO breaks other collectives)."""
    env = {}
    if args.nccl_algo:
        env["NCCL_ALGO"] = f"allreduce:{args.nccl_algo}"
    if args.nccl_proto:
        env["NCCL_PROTO"] = args.nccl_proto
    return env


def run_sweep(args) -> dict:
    """Spawn the ranks (``_sfprobe.run_ranks``: per-phase timeout), check them, merge their numbers."""
    _, world = preconditions(args)
    config = build_config(args, world, f"tcp://127.0.0.1:{sf.free_tcp_port()}")
    steps, skipped = plan_steps(config)
    print(f"allreduce sweep: backend={args.backend} ranks={world} dtype={config['dtype']} "
          f"measurements={len(steps)}", flush=True)
    outcome = sf.run_ranks(rank_worker, world, config, phase_timeout_s=args.phase_timeout,
                           env=nccl_environment(args), total_timeout_s=args.total_timeout or None)
    check_ranks(outcome)
    reports = collect_steps(outcome, steps, world)
    rows = [merge_step(step, reports[step["index"]], world, config["dtype"]) for step in steps]
    skipped += group_skips(r for r in rows if "skipped" in r)
    rank0 = next((e.data for e in outcome.events if e.rank == 0 and e.phase == "init" and e.state == "ok"), {})
    return {"config": config, "rows": [r for r in rows if "skipped" not in r], "skipped": skipped,
            "rank_facts": {k: v for k, v in rank0.items()}}


def result_fields(sweep: dict) -> tuple[str, str, str, dict]:
    """(status, reason, evidence, metrics) from a finished sweep."""
    config, rows = sweep["config"], sweep["rows"]
    table = format_table(rows)
    metrics = {"collective": COLLECTIVE, "backend": config["backend"], "world_size": config["world_size"],
               "dtype": config["dtype"],
               "busbw_factor": shared.busbw_factor(COLLECTIVE, config["world_size"]),
               "iters": config["iters"], "repeats": config["repeats"], "warmup": config["warmup"],
               "rows": rows, "skipped": sweep["skipped"], **summary_metrics(rows)}
    if config["backend"] == "symm-mem":
        metrics["symm_mem_op"] = config["symm_mem_op"]
    wrong = [r for r in rows if r["wrong"]]
    if wrong:
        first = wrong[0]
        evidence = "\n".join(f"{human_bytes(r['size_bytes'])} {r['mode']} {r['placement']}: {r['wrong']} wrong; "
                             + "; ".join(r["wrong_examples"]) for r in wrong)
        return ("fail", f"wrong all-reduce result in {len(wrong)} of {len(rows)} measurements (first: "
                        f"{human_bytes(first['size_bytes'])} {first['mode']} {first['placement']})",
                evidence + "\n" + table, metrics)
    if not rows:
        reasons = sorted({s["reason"] for s in sweep["skipped"]})
        return "skip", f"nothing measurable: {'; '.join(reasons)}", "\n".join(reasons), metrics
    return ("pass", f"{config['backend']} all-reduce over {config['world_size']} ranks: {len(rows)} measurements "
                    f"correct; peak busbw {metrics['peak_busbw_gbps']:.3f} GB/s at "
                    f"{human_bytes(metrics['peak_busbw_size_bytes'])}", table, metrics)


def main(argv) -> None:
    """Run the sweep and emit its result (``_sfprobe.run_main`` turns a stray exception into ``error``)."""
    args = parse_args(argv)
    base = {"collective": COLLECTIVE, "backend": args.backend, "nccl_env": nccl_environment(args)}
    try:
        sweep = run_sweep(args)
    except Abort as abort:
        sf.emit(abort.status, abort.reason, abort.evidence, base, _facts(args, {}))
    status, reason, evidence, metrics = result_fields(sweep)
    print(format_table(sweep["rows"]), flush=True)
    sf.emit(status, reason, evidence, shared.json_safe({**base, **metrics}),
            _facts(args, sweep["rank_facts"]))


def _facts(args, rank_facts: dict) -> dict:
    """Provenance: what is installed (``_sfprobe.collect_facts``) plus what rank 0 saw on its GPU."""
    facts = sf.collect_facts(import_torch=True)
    facts.update(rank_facts)
    return facts


if __name__ == "__main__":
    sf.run_main(main)
