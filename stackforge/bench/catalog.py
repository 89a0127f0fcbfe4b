"""The bench suites as data: which script measures what, with which fixed arguments and preconditions.

A :class:`BenchSpec` is the bench-tier sibling of a probe spec: an id (the record key's ``probe``
field), the feature it speaks for, the in-image script and its fixed arguments, a default hard
timeout, and the preconditions under which running it makes sense (GPUs on the host, GPUs in the
target, NVLS multicast, a model directory). Unmet preconditions become a ``skip`` with the reason,
decided by :func:`stackforge.bench.run.plan_bench` before anything runs.

Which all-reduce backends to measure is the caller's decision (``stackforge bench
--allreduce-backend``), ideally from the runtime probes' results: a bench measures what works, it
does not rediscover what does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stackforge.errors import SpecError

#: The in-image bench scripts (mounted read-only into containers, never baked into images).
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
SUITES = ("allreduce", "gemm", "serve")
#: All-reduce variants measured when the caller names none.
DEFAULT_ALLREDUCE_VARIANTS = ("nccl",)


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """One benchmark: a script, its fixed arguments, and when it applies.

    Attributes:
        id: record key (``probe`` field of the result), e.g. ``bench.allreduce.nccl-tree``.
        suite: ``allreduce`` | ``gemm`` | ``serve``.
        variant: what distinguishes benches of one suite (all-reduce backend and algorithm).
        feature: the feature the result speaks for: a rule feature where the bench exercises one
            (``custom-allreduce``, ``torch-symm-mem``, ``nccl-graph-tree``), else a bench family.
        script: file name under :data:`SCRIPTS_DIR`.
        args: fixed script arguments of this variant.
        default_timeout_s: hard timeout of the whole script (the runner kills it after that).
        needs_gpu: the host must offer GPUs (gloo is the one CPU bench: a harness self-test).
        min_gpus: the target must have at least this many GPUs.
        needs_multicast: the target's GPUs must support NVLS multicast.
        needs_model: a model directory must be given (serving).
        description: one line for ``stackforge bench --list``.
    """

    id: str
    suite: str
    variant: str
    feature: str
    script: str
    args: tuple[str, ...] = ()
    default_timeout_s: float = 1800.0
    needs_gpu: bool = True
    min_gpus: int = 1
    needs_multicast: bool = False
    needs_model: bool = False
    description: str = ""
    tier: str = "bench"


def _allreduce(variant: str, feature: str, args: tuple[str, ...], description: str, *,
               min_gpus: int = 2, needs_gpu: bool = True, needs_multicast: bool = False) -> BenchSpec:
    return BenchSpec(id=f"bench.allreduce.{variant}", suite="allreduce", variant=variant, feature=feature,
                     script="allreduce_sweep.py", args=args, default_timeout_s=3600.0, needs_gpu=needs_gpu,
                     min_gpus=min_gpus, needs_multicast=needs_multicast, description=description)


def catalog() -> tuple[BenchSpec, ...]:
    """Every bench stackforge knows, in report order."""
    return (
        _allreduce("nccl", "allreduce-bandwidth", ("--backend", "nccl"),
                   "NCCL all-reduce sweep, NCCL's own algorithm choice (eager and CUDA graph)"),
        _allreduce("nccl-ring", "allreduce-bandwidth", ("--backend", "nccl", "--nccl-algo", "ring"),
                   "NCCL all-reduce sweep forced to Ring (NCCL_ALGO=allreduce:ring)"),
        _allreduce("nccl-tree", "nccl-graph-tree", ("--backend", "nccl", "--nccl-algo", "tree"),
                   "NCCL all-reduce sweep forced to Tree (NCCL_ALGO=allreduce:tree), incl. under CUDA graphs"),
        _allreduce("custom", "custom-allreduce", ("--backend", "custom"),
                   "SGLang custom all-reduce (sgl-kernel), out-of-place, sizes under its 8 MiB limit"),
        _allreduce("symm-mem", "torch-symm-mem", ("--backend", "symm-mem", "--symm-mem-op", "two_shot"),
                   "torch symmetric-memory two-shot all-reduce (P2P, no multicast needed)"),
        _allreduce("symm-mem-multimem", "torch-symm-mem", ("--backend", "symm-mem", "--symm-mem-op", "multimem"),
                   "torch symmetric-memory multimem all-reduce (NVLS multicast)", needs_multicast=True),
        _allreduce("gloo", "allreduce-harness", ("--backend", "gloo", "--max-bytes", str(1 << 20)),
                   "gloo (CPU) all-reduce: runs the multi-process harness without a GPU", min_gpus=1,
                   needs_gpu=False),
        BenchSpec(id="bench.gemm", suite="gemm", variant="bf16+fp8", feature="gemm-throughput", script="gemm.py",
                  default_timeout_s=1800.0, description="bf16 / fp8 GEMM TFLOP/s at 8B/70B serving shapes"),
        BenchSpec(id="bench.serve", suite="serve", variant="sglang", feature="serving-throughput",
                  script="serve.py", default_timeout_s=3600.0, needs_model=True,
                  description="SGLang server with the stack's flags + SGLang's own serving benchmark"),
    )


def select_benches(specs: tuple[BenchSpec, ...], *, suites: tuple[str, ...] = (),
                   allreduce_variants: tuple[str, ...] = (), ids: tuple[str, ...] = ()) -> tuple[BenchSpec, ...]:
    """The benches to run: explicit ids, else the suites (all-reduce narrowed to the chosen variants).

    Raises:
        SpecError: an unknown id, suite or all-reduce variant (the message lists the known ones).
    """
    by_id = {s.id: s for s in specs}
    if ids:
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise SpecError(f"unknown bench id(s): {', '.join(unknown)}; known: {', '.join(by_id)}")
        return tuple(by_id[i] for i in dict.fromkeys(ids))
    chosen_suites = suites or ("allreduce", "gemm")
    unknown = [s for s in chosen_suites if s not in SUITES]
    if unknown:
        raise SpecError(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITES)}")
    variants = allreduce_variants or DEFAULT_ALLREDUCE_VARIANTS
    known_variants = [s.variant for s in specs if s.suite == "allreduce"]
    unknown = [v for v in variants if v not in known_variants]
    if unknown:
        raise SpecError(f"unknown all-reduce variant(s): {', '.join(unknown)}; known: {', '.join(known_variants)}")
    return tuple(s for s in specs if s.suite in chosen_suites and (s.suite != "allreduce" or s.variant in variants))
