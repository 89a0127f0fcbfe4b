#!/usr/bin/env python3
"""GEMM throughput at serving-sized shapes: bf16, and fp8 where the GPU has it (runs inside an image).

Standalone: stdlib + torch + the shared probe helper ``_sfprobe.py`` (mounted beside). Without
torch or a GPU it answers ``skip`` with the reason; ``--allow-cpu`` runs a tiny CPU mode instead
(tiny shapes, wall-clock timing), which exists to test the harness and is labelled as such in its
metrics -- never a GPU number.

What it measures:

* the linear layers of 8B- and 70B-class models (Llama-3 shapes: q/k/v, o, gate+up, down), with
  ``--tp`` splitting them as tensor parallelism does (column-parallel N, row-parallel K), at
  M = tokens in flight (``--m``, default 1, 16, 128, 1024, 4096: decode to large prefill);
* bf16 through ``torch.nn.functional.linear`` (what the serving path calls, ``x @ W^T``), and fp8
  (e4m3, per-tensor scales) through ``torch._scaled_mm`` on compute capability >= 8.9; a shape the
  fp8 kernel rejects (cuBLASLt wants multiples of 16) is reported as skipped with its error text;
* the best rate of the same kind of kernel on a large square product in the same run
  (``--peak-size``): ``torch.matmul`` for bf16, ``torch._scaled_mm`` for fp8, so each shape's
  ``fraction_of_matmul_best`` (median over median) reads against its own dtype; a dtype whose
  reference raises (the fp8 product refused) is skipped with the error text, the others go on;
* the weight is cycled through enough copies that, between two uses of one copy, the others have
  streamed ``--l2-flush-factor`` times the GPU's L2 (``L2_cache_size`` of the device properties)
  through the cache (:func:`rotation_copies`, within ``--rotation-budget-mb``): a decode-sized
  GEMM reads its weight from HBM, as in serving, not from L2 where the previous call left it;
* every shape's result is checked against a float32 reference on a slice: a wrong GEMM is a
  failure, not a number.

Timing: CUDA events around ``--iters`` back-to-back calls after ``--warmup`` calls, ``--repeats``
times; the median repeat is reported with min, max and coefficient of variation.
TFLOP/s = 2*M*N*K / t / 1e12. The last stdout line is ``STACKFORGE_RESULT {json}``.
"""

from __future__ import annotations

import argparse
import math
import time

import _sfbench as bench  # beside this script (sys.path[0]); it imports _sfprobe

sf = bench.sf

DEFAULT_M = (1, 16, 128, 1024, 4096)

# (name, N, K, how tensor parallelism splits it). Llama-3 8B: hidden 4096, 32 q heads + 8 kv heads
# of 128, FFN 14336; Llama-3 70B: hidden 8192, 64 q + 8 kv heads of 128, FFN 28672.
SHAPES = (
    ("8b.qkv", 6144, 4096, "n"),
    ("8b.o", 4096, 4096, "k"),
    ("8b.gate_up", 28672, 4096, "n"),
    ("8b.down", 4096, 14336, "k"),
    ("70b.qkv", 10240, 8192, "n"),
    ("70b.o", 8192, 8192, "k"),
    ("70b.gate_up", 57344, 8192, "n"),
    ("70b.down", 8192, 28672, "k"),
)
CPU_SHAPES = (("cpu.tiny", 256, 256, "n"), ("cpu.wide", 512, 256, "n"))
# Relative error of the checked slice against a float32 reference (bf16 output: 8 mantissa bits).
_TOLERANCE = 3e-2
_FP8_MIN_CAPABILITY = (8, 9)


# TFLOP/s, statistics and json_safe are stackforge's own, from the shared _sfshared.py of the mounted
# in-image package.
shared = bench.shared


class Skip(Exception):
    """Nothing to measure here (no torch, no GPU): a skip, with its reason."""


# ------------------------------------------------------------------------------------------- shapes


def split_for_tp(n: int, k: int, split: str, tp: int) -> tuple[int, int]:
    """Per-GPU (N, K) of a layer under tensor parallelism (column-parallel splits N, row-parallel K)."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if split == "n":
        return n // tp, k
    return n, k // tp


def plan_shapes(ms, names, tp: int, cpu: bool) -> list[dict]:
    """Every (M, layer) pair to measure."""
    table = CPU_SHAPES if cpu else SHAPES
    chosen = [s for s in table if not names or s[0] in names]
    unknown = set(names or ()) - {s[0] for s in table}
    if unknown:
        raise ValueError(f"unknown shape(s) {sorted(unknown)}; known: {[s[0] for s in table]}")
    plans = []
    for name, n, k, split in chosen:
        n_tp, k_tp = split_for_tp(n, k, split, tp)
        plans.extend({"shape": name, "m": m, "n": n_tp, "k": k_tp} for m in ms)
    return plans


# ------------------------------------------------------------------------------------------- L2


def rotation_copies(weight_bytes: int, l2_bytes: int | None, budget_bytes: int, flush_factor: float = 2.0) -> int:
    """How many copies of a weight to cycle through so that a call never finds its weight in L2.

    Between two uses of one copy the other ``copies - 1`` are read, so ``(copies - 1) * weight_bytes``
    must reach ``flush_factor * l2_bytes``; the copies must also fit ``budget_bytes`` (at least one).
    Without a known L2 size (CPU mode) one copy.
    """
    if weight_bytes < 1:
        raise ValueError(f"weight_bytes must be >= 1, got {weight_bytes}")
    if not l2_bytes:
        return 1
    needed = 1 + math.ceil(flush_factor * l2_bytes / weight_bytes)
    return max(1, min(needed, budget_bytes // weight_bytes))


def rotating(calls: list):
    """A callable running ``calls[0]``, ``calls[1]``, ... in turn (one weight copy each)."""
    state = {"next": 0}

    def run():
        index = state["next"]
        state["next"] = (index + 1) % len(calls)
        return calls[index]()
    return run


def l2_cache_bytes(torch, on_gpu: bool) -> int | None:
    """The GPU's L2 size as the driver reports it (``cudaDeviceProp.l2CacheSize``), None on CPU."""
    if not on_gpu:
        return None
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or None


# ------------------------------------------------------------------------------------------- timing


class GemmClock:
    """Seconds per call of ``fn`` over ``iters`` calls: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, torch, on_gpu: bool) -> None:
        self.torch, self.on_gpu = torch, on_gpu

    def per_call(self, fn, iters: int) -> float:
        if not self.on_gpu:
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - start) / iters
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    def repeats(self, fn, *, warmup: int, iters: int, repeats: int) -> list[float]:
        for _ in range(warmup):
            fn()
        if self.on_gpu:
            self.torch.cuda.synchronize()
        return [self.per_call(fn, iters) for _ in range(repeats)]


# ------------------------------------------------------------------------------------------- kernels


class GemmKernel:
    """One way to compute ``x @ W^T`` for a shape. Its inputs come from a generator seeded by the
    shape, so every run checks and times the same numbers; the weight is cloned ``copies`` times and
    the calls cycle through the copies (:func:`rotating`), so a call reads its weight from HBM, not
    from L2 where the previous call left it."""

    dtype: str
    weight_bytes_per_element: int

    def __init__(self, torch, device) -> None:
        self.torch, self.device = torch, device

    def prepare(self, m: int, n: int, k: int, copies: int = 1):
        """(a callable running the product, the float32 inputs :func:`check_slice` compares with)."""
        gen = self.torch.Generator(device=self.device).manual_seed(m * 7919 + n * 31 + k)
        x, w = self.inputs(m, n, k, gen)
        weights = [w] + [w.clone() for _ in range(copies - 1)]
        return rotating([self.call(x, weight) for weight in weights]), (x.float(), w.float())

    def inputs(self, m: int, n: int, k: int, gen):
        """(x [M, K], W [N, K]) in the kernel's input dtype, drawn from ``gen``."""
        raise NotImplementedError

    def call(self, x, weight):
        """A callable computing ``x @ weight^T`` with this kernel."""
        raise NotImplementedError


class Bf16Linear(GemmKernel):
    """``F.linear(x, W)`` in bf16: what a serving engine's unquantized linear layer runs."""

    dtype = "bf16"
    weight_bytes_per_element = 2

    def inputs(self, m: int, n: int, k: int, gen):
        torch = self.torch
        x = torch.randn(m, k, device=self.device, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device=self.device, dtype=torch.bfloat16, generator=gen) / math.sqrt(k)
        return x, w

    def call(self, x, weight):
        torch = self.torch
        return lambda: torch.nn.functional.linear(x, weight)


class Fp8ScaledMm(GemmKernel):
    """``torch._scaled_mm`` on e4m3 inputs with per-tensor scales, bf16 output (an fp8 linear layer)."""

    dtype = "fp8"
    weight_bytes_per_element = 1

    def inputs(self, m: int, n: int, k: int, gen):
        torch = self.torch
        x = torch.randn(m, k, device=self.device, generator=gen).clamp(-4, 4).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device=self.device, generator=gen).clamp(-4, 4)).to(torch.float8_e4m3fn)
        return x, w

    def call(self, x, weight):
        return scaled_mm_call(self.torch, x, weight, self.device)


def scaled_mm_call(torch, x, w, device):
    """``x @ w^T`` through ``torch._scaled_mm`` (e4m3, per-tensor scales of one, bf16 out)."""
    one = torch.ones((), device=device, dtype=torch.float32)
    w_t = w.t()  # column-major [K, N], the layout cuBLASLt's fp8 kernels require

    def run():
        out = torch._scaled_mm(x, w_t, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return out[0] if isinstance(out, tuple) else out  # torch < 2.4 returned (out, amax)
    return run


def check_slice(torch, out, reference) -> tuple[bool, str]:
    """Compare a corner of the output with a float32 product of the same inputs."""
    x, w = reference
    rows, cols = min(x.shape[0], 8), min(w.shape[0], 64)
    expected = x[:rows] @ w[:cols].t()
    got = out[:rows, :cols].float()
    scale = float(expected.abs().max().item()) or 1.0
    error = float((got - expected).abs().max().item()) / scale
    return error <= _TOLERANCE, f"max relative error {error:.2e} on a {rows}x{cols} slice (limit {_TOLERANCE:g})"


def measure_shape(torch, clock: GemmClock, kernel, plan: dict, args, l2_bytes: int | None = None) -> dict:
    """Check then time one shape with one kernel (its weight rotated past L2); a rejected shape
    comes back as skipped."""
    weight_bytes = plan["n"] * plan["k"] * kernel.weight_bytes_per_element
    copies = rotation_copies(weight_bytes, l2_bytes, args.rotation_budget_mb << 20, args.l2_flush_factor)
    row = {"dtype": kernel.dtype, **plan, "weight_copies": copies}
    try:
        run, reference = kernel.prepare(plan["m"], plan["n"], plan["k"], copies)
        out = run()
    except RuntimeError as exc:
        return {**row, "skipped": error_text(exc)}
    correct, detail = check_slice(torch, out, reference)
    row.update(correct=correct, check=detail)
    if not correct:
        return row
    times = clock.repeats(run, warmup=args.warmup, iters=args.iters, repeats=args.repeats)
    spread = shared.summarize(times)
    return {**row, **bench.time_columns(spread),
            "tflops": shared.tflops(plan["m"], plan["n"], plan["k"], spread["median"]),
            "tflops_best": shared.tflops(plan["m"], plan["n"], plan["k"], spread["minimum"])}


def error_text(exc: BaseException) -> str:
    """``RuntimeError: message`` on one line, cut to 300 characters (a skip's reason)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def dtype_references(torch, clock: GemmClock, device, size: int, args, kernels: list) -> tuple[dict, list, list[dict]]:
    """(square reference per dtype (see :func:`matmul_best`), the kernels whose reference ran, the
    dtypes skipped with their reason). A reference that raises (``torch._scaled_mm`` refused by
    this build or GPU) skips its dtype with the error text instead of aborting the other dtypes'
    rows with it. ``size`` 0: no references, every kernel kept."""
    if not size:
        return {}, list(kernels), []
    references, kept, skipped = {}, [], []
    for kernel in kernels:
        try:
            references[kernel.dtype] = matmul_best(torch, clock, device, size, args, kernel.dtype)
        except RuntimeError as exc:
            skipped.append({"dtype": kernel.dtype,
                            "reason": f"its {size}x{size} reference product failed: {error_text(exc)}"})
            continue
        kept.append(kernel)
    return references, kept, skipped


def matmul_best(torch, clock: GemmClock, device, size: int, args, dtype: str = "bf16") -> dict:
    """The rate of a large square product with the kernel a dtype's rows use (bf16: torch.matmul;
    fp8: torch._scaled_mm): the best this GPU + build reaches for that dtype."""
    if dtype == "fp8":
        a = torch.randn(size, size, device=device).clamp(-4, 4).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device=device).clamp(-4, 4).to(torch.float8_e4m3fn)
        run, kernel = scaled_mm_call(torch, a, b, device), "torch._scaled_mm"
    else:
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        run, kernel = (lambda: torch.matmul(a, b)), "torch.matmul"
    times = clock.repeats(run, warmup=args.warmup, iters=max(1, args.iters // 5), repeats=args.repeats)
    return {"size": size, "dtype": dtype, "kernel": kernel,
            "tflops": shared.tflops(size, size, size, min(times)),
            "tflops_median": shared.tflops(size, size, size, shared.summarize(times)["median"])}


def fraction_of_best(row: dict, references: dict) -> float | None:
    """A row's median TFLOP/s over the median of its own dtype's square reference (like with like)."""
    reference = references.get(row["dtype"])
    if not reference or "tflops" not in row:
        return None
    return row["tflops"] / reference["tflops_median"]


# ------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="comma-separated M values")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--dtypes", default="bf16,fp8", help="bf16 and/or fp8")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree the layers are split for")
    bench.add_timing_arguments(parser, warmup=10, iters=50, repeats=5)
    parser.add_argument("--peak-size", type=int, default=8192,
                        help="square reference product per dtype (torch.matmul / torch._scaled_mm; 0: off)")
    parser.add_argument("--l2-flush-factor", type=float, default=2.0,
                        help="L2 sizes of other weight copies read between two uses of one copy")
    parser.add_argument("--rotation-budget-mb", type=int, default=4096,
                        help="most memory the rotated weight copies of one shape may take")
    parser.add_argument("--allow-cpu", action="store_true", help="tiny CPU mode to test the harness")
    return bench.parse_timed_args(parser, argv)


def environment(args):
    """(torch, device, on_gpu, facts), or Skip when nothing can be measured here."""
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed in this image: {exc}") from None
    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "torch_git_version": getattr(torch.version, "git_version", None)}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                     capability=f"{props.major}.{props.minor}")
        return torch, torch.device("cuda:0"), True, facts
    if not args.allow_cpu:
        raise Skip(f"no CUDA device visible (torch.cuda.is_available() is False; torch {torch.__version__}, "
                   f"built for CUDA {torch.version.cuda})")
    return torch, torch.device("cpu"), False, {**facts, "device": "cpu"}


def kernels_for(torch, device, on_gpu: bool, dtypes) -> tuple[list, list[dict]]:
    """The kernels to run, and the dtypes skipped with their reason."""
    kernels, skipped = [], []
    if "bf16" in dtypes:
        kernels.append(Bf16Linear(torch, device))
    if "fp8" in dtypes:
        capability = torch.cuda.get_device_capability(0) if on_gpu else None
        if not on_gpu:
            skipped.append({"dtype": "fp8", "reason": "fp8 GEMM needs a GPU (CPU mode)"})
        elif capability < _FP8_MIN_CAPABILITY:
            skipped.append({"dtype": "fp8", "reason": f"fp8 tensor cores need compute capability >= 8.9; this GPU "
                                                      f"is {capability[0]}.{capability[1]}"})
        elif not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            skipped.append({"dtype": "fp8", "reason": f"torch {torch.__version__} has no _scaled_mm/float8_e4m3fn"})
        else:
            kernels.append(Fp8ScaledMm(torch, device))
    return kernels, skipped


def format_table(rows: list[dict]) -> str:
    """A readable table of the measured (and skipped, and wrong) shapes."""
    lines = [f"# {'dtype':>5} {'shape':>12} {'M':>6} {'N':>6} {'K':>6} {'time(us)':>10} {'TFLOP/s':>9} "
             f"{'cv':>6} check"]
    for r in rows:
        where = f"  {r['dtype']:>5} {r['shape']:>12} {r['m']:>6} {r['n']:>6} {r['k']:>6}"
        if "skipped" in r:
            lines.append(f"{where} skipped: {r['skipped']}")
        elif not r["correct"]:
            lines.append(f"{where} WRONG: {r['check']}")
        else:
            lines.append(f"{where} {r['time_us']:>10.2f} {r['tflops']:>9.2f} {r['time_cv']:>6.3f} ok")
    return "\n".join(lines)


def run_gemm(args) -> tuple[str, str, str, dict, dict]:
    """Measure everything; return (status, reason, evidence, metrics, facts)."""
    torch, device, on_gpu, facts = environment(args)
    ms = [int(m) for m in args.m.split(",") if m.strip()]
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    plans = plan_shapes(ms, names, args.tp, cpu=not on_gpu)
    kernels, skipped = kernels_for(torch, device, on_gpu, {d.strip() for d in args.dtypes.split(",")})
    clock = GemmClock(torch, on_gpu)
    peak_size = args.peak_size if on_gpu else min(args.peak_size, 512)
    references, kernels, failed_references = dtype_references(torch, clock, device, peak_size, args, kernels)
    skipped += failed_references
    l2_bytes = l2_cache_bytes(torch, on_gpu)
    rows = [measure_shape(torch, clock, kernel, plan, args, l2_bytes) for kernel in kernels for plan in plans]
    for row in rows:
        fraction = fraction_of_best(row, references)
        if fraction is not None:
            row["fraction_of_matmul_best"] = fraction
        print(format_table([row]).splitlines()[-1], flush=True)
    table = format_table(rows)
    metrics = {"device": "cuda" if on_gpu else "cpu", "tp": args.tp, "matmul_best": references,
               "l2_cache_bytes": l2_bytes, "l2_flush_factor": args.l2_flush_factor, "rows": rows,
               "skipped": skipped + [{"dtype": r["dtype"], "shape": r["shape"], "m": r["m"], "reason": r["skipped"]}
                                     for r in rows if "skipped" in r],
               "best_tflops": {k.dtype: max((r["tflops"] for r in rows if r["dtype"] == k.dtype and "tflops" in r),
                                            default=None) for k in kernels}}
    wrong = [r for r in rows if r.get("correct") is False]
    measured = [r for r in rows if "tflops" in r]
    if wrong:
        first = wrong[0]
        return ("fail", f"wrong GEMM result in {len(wrong)} shape(s) (first: {first['dtype']} {first['shape']} "
                        f"M={first['m']}: {first['check']})", table, metrics, facts)
    if not measured:
        return "skip", "no shape could be measured: " + "; ".join(s["reason"] for s in skipped), table, metrics, facts
    best = ", ".join(f"{d} {t:.1f}" for d, t in metrics["best_tflops"].items() if t is not None)
    mode = "" if on_gpu else " (CPU harness mode, not a GPU number)"
    return "pass", f"{len(measured)} GEMM shapes correct; best TFLOP/s {best}{mode}", table, metrics, facts


def main(argv) -> None:
    """Measure and emit (``_sfprobe.run_main`` turns a stray exception into an ``error`` result)."""
    args = parse_args(argv)
    try:
        status, reason, evidence, metrics, facts = run_gemm(args)
    except Skip as skip:
        sf.emit("skip", str(skip), str(skip), facts=sf.collect_facts(import_torch=False))
    sf.emit(status, reason, evidence, shared.json_safe(metrics),
            {**sf.collect_facts(import_torch=False), **facts})


if __name__ == "__main__":
    sf.run_main(main)
