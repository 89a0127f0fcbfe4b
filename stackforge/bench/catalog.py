"""The bench suites as data: which script measures what, with which fixed arguments and preconditions.

A :class:`BenchSpec` is the bench-tier sibling of a probe spec: an id (the record key's ``probe``
field), the feature it speaks for, the in-image script and its fixed arguments, a default hard
timeout, and the preconditions under which running it makes sense (GPUs on the host, GPUs in the
target, NVLS multicast, a model directory). Unmet preconditions become a ``skip`` with the reason,
decided by :func:`stackforge.bench.run.plan_bench` before anything runs.

Each spec also declares what its script reports (:class:`MetricSpec`: name, unit, which direction is
better, and where the number is a headline), and what run-time inputs its script takes
(:data:`SCRIPT_INPUTS`). The report's units, pick's throughput ranking, diff's direction, the
terminal's one-line summary and ``stackforge bench --suite`` read them from here, so a new benchmark
is a script and one entry below.

Which all-reduce backends to measure is the caller's decision (``stackforge bench
--allreduce-backend``), ideally from the runtime probes' results: a bench measures what works, it
does not rediscover what does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.errors import SpecError

#: The in-image bench scripts (mounted read-only into containers, never baked into images).
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
#: All-reduce variants measured when the caller names none.
DEFAULT_ALLREDUCE_VARIANTS = ("nccl",)
#: Run-time inputs a bench script may take, in the order its spec lists them: ``--repeats N``,
#: ``--world-size <target GPUs>``, ``--max-bytes N`` (when the user gave one), ``--model PATH``,
#: ``--tp <target GPUs>``, and the user's ``--serve-arg`` values.
SCRIPT_INPUTS = ("repeats", "world-size", "max-bytes", "model", "tp", "serve-args")
BETTER = ("higher", "lower")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One number a bench script reports.

    Attributes:
        name: the key in the record's metrics, as the script writes it.
        unit: shown beside the value (``GB/s``, ``TFLOP/s``, ``tok/s``, ``µs``).
        better: ``higher`` or ``lower``: which way is an improvement (:func:`stackforge.report.diff.lower_is_better`).
        aliases: other names other writers give the same number (same unit and direction).
        summary_rank: set when the number can be a cell's headline in the report; the lowest rank
            found in a cell's passing records wins.
        throughput: pick's label when the number ranks stacks by throughput (ranked by ``summary_rank``).
        headline: the terminal's one-line summary, ``{value}`` replaced by the number (a mapping's
            values as ``key value, ...``), with ``digits`` decimals.
        share: a metric holding this number's share of the link peak, shown after the headline.
    """

    name: str
    unit: str
    better: str = "higher"
    aliases: tuple[str, ...] = ()
    summary_rank: int | None = None
    throughput: str | None = None
    headline: str | None = None
    digits: int = 1
    share: str | None = None

    def __post_init__(self) -> None:
        if self.better not in BETTER:
            raise SpecError(f"metric {self.name}: better must be one of {', '.join(BETTER)}, got {self.better!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def describe(self, metrics: Mapping[str, Any]) -> str | None:
        """The headline of this number in ``metrics``; None when it has none or the number is absent."""
        found = [metrics[n] for n in self.names if metrics.get(n) is not None and metrics.get(n) != {}]
        if self.headline is None or not found:
            return None
        value = found[0]
        if isinstance(value, Mapping):
            text = ", ".join(f"{k} {v:.{self.digits}f}" for k, v in value.items() if v is not None)
        else:
            text = f"{value:.{self.digits}f}"
        share = metrics.get(self.share) if self.share else None
        context = f" ({share:.0%} of {metrics['link_peak']['name']})" if share is not None else ""
        return self.headline.format(value=text) + context


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
        inputs: the run-time inputs the script takes, in order (names from :data:`SCRIPT_INPUTS`).
        metrics: what the script reports (:class:`MetricSpec`).
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
    inputs: tuple[str, ...] = ("repeats",)
    metrics: tuple[MetricSpec, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in self.inputs if name not in SCRIPT_INPUTS]
        if unknown:
            raise SpecError(f"bench {self.id}: unknown script input(s) {', '.join(unknown)}; "
                            f"known: {', '.join(SCRIPT_INPUTS)}")
        if "/" in self.script or not self.script.endswith(".py"):
            raise SpecError(f"bench {self.id}: script must be a .py file name, got {self.script!r}")


#: What allreduce_sweep.py reports that the report, pick and diff read.
ALLREDUCE_METRICS = (
    MetricSpec("peak_busbw_gbps", "GB/s", aliases=("busbw_gbps", "busbw"), summary_rank=20, throughput="busbw",
               headline="peak busbw {value} GB/s", digits=2, share="peak_busbw_efficiency"),
    MetricSpec("min_size_latency_us", "µs", better="lower", aliases=("latency_us",), summary_rank=40),
)
GEMM_METRICS = (
    MetricSpec("best_tflops", "TFLOP/s", aliases=("tflops",), summary_rank=30, throughput="tflops",
               headline="best TFLOP/s {value}"),
)
SERVE_METRICS = (
    MetricSpec("output_throughput", "tok/s", aliases=("output_tok_s",), summary_rank=10,
               throughput="output_throughput", headline="{value} output tok/s"),
    MetricSpec("ttft_ms", "ms", better="lower", summary_rank=50),
)


def _allreduce(variant: str, feature: str, args: tuple[str, ...], description: str, *,
               min_gpus: int = 2, needs_gpu: bool = True, needs_multicast: bool = False) -> BenchSpec:
    # every GPU of the target is a rank; gloo runs 2 CPU ranks
    inputs = ("repeats", "world-size", "max-bytes") if needs_gpu else ("repeats", "max-bytes")
    return BenchSpec(id=f"bench.allreduce.{variant}", suite="allreduce", variant=variant, feature=feature,
                     script="allreduce_sweep.py", args=args, default_timeout_s=3600.0, needs_gpu=needs_gpu,
                     min_gpus=min_gpus, needs_multicast=needs_multicast, description=description, inputs=inputs,
                     metrics=ALLREDUCE_METRICS)


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
                  default_timeout_s=1800.0, description="bf16 / fp8 GEMM TFLOP/s at 8B/70B serving shapes",
                  metrics=GEMM_METRICS),
        BenchSpec(id="bench.serve", suite="serve", variant="sglang", feature="serving-throughput",
                  script="serve.py", default_timeout_s=3600.0, needs_model=True,
                  description="SGLang server with the stack's flags + SGLang's own serving benchmark",
                  inputs=("model", "tp", "serve-args"), metrics=SERVE_METRICS),
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
    chosen_suites = suites or default_suites(specs, model_dir=None)
    known_suites = suite_names(specs)
    unknown = [s for s in chosen_suites if s not in known_suites]
    if unknown:
        raise SpecError(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(known_suites)}")
    variants = allreduce_variants or DEFAULT_ALLREDUCE_VARIANTS
    known_variants = suite_variants("allreduce", specs)
    unknown = [v for v in variants if v not in known_variants]
    if unknown:
        raise SpecError(f"unknown all-reduce variant(s): {', '.join(unknown)}; known: {', '.join(known_variants)}")
    return tuple(s for s in specs if s.suite in chosen_suites and (s.suite != "allreduce" or s.variant in variants))


# ---------------------------------------------------------------------------------------------- read from the specs
# Each takes the specs, default the whole catalog read at call time.


def suite_names(specs: Sequence[BenchSpec] | None = None) -> tuple[str, ...]:
    """Every suite, in catalog order."""
    return tuple(dict.fromkeys(s.suite for s in (catalog() if specs is None else specs)))


def suite_variants(suite: str, specs: Sequence[BenchSpec] | None = None) -> tuple[str, ...]:
    """The variants of one suite, in catalog order (``--allreduce-backend`` choices)."""
    return tuple(s.variant for s in (catalog() if specs is None else specs) if s.suite == suite)


def default_suites(specs: Sequence[BenchSpec] | None = None, *, model_dir: Path | None) -> tuple[str, ...]:
    """The suites run when none is named: every one, less those that need a model when none is given."""
    specs = catalog() if specs is None else specs
    return tuple(suite for suite in suite_names(specs)
                 if model_dir is not None or not any(s.needs_model for s in specs if s.suite == suite))


def declared_metrics(specs: Sequence[BenchSpec] | None = None) -> tuple[MetricSpec, ...]:
    """Every metric the benches declare, once each, in catalog order."""
    found: dict[str, MetricSpec] = {}
    for spec in catalog() if specs is None else specs:
        for metric in spec.metrics:
            found.setdefault(metric.name, metric)
    return tuple(found.values())


def metric_units(specs: Sequence[BenchSpec] | None = None) -> dict[str, str]:
    """Metric name (aliases too) -> unit."""
    return {name: m.unit for m in declared_metrics(specs) for name in m.names}


def metric_direction(name: str, specs: Sequence[BenchSpec] | None = None) -> str | None:
    """``higher`` or ``lower`` as the bench that reports ``name`` declares it; None when none does."""
    return next((m.better for m in declared_metrics(specs) if name in m.names), None)


def _ranked(specs: Sequence[BenchSpec] | None) -> list[MetricSpec]:
    return sorted((m for m in declared_metrics(specs) if m.summary_rank is not None), key=lambda m: m.summary_rank)


def summary_metric_names(specs: Sequence[BenchSpec] | None = None) -> tuple[str, ...]:
    """The names that can be a cell's headline, most preferred first (a metric's aliases follow it)."""
    return tuple(name for m in _ranked(specs) for name in m.names)


def throughput_metrics(specs: Sequence[BenchSpec] | None = None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(label, names) of the metrics pick ranks stacks by, most relevant first."""
    return tuple((m.throughput, m.names) for m in _ranked(specs) if m.throughput)


def describe_metrics(metrics: Mapping[str, Any], specs: Sequence[BenchSpec] | None = None) -> str:
    """A short headline of a bench record's numbers for the terminal: the first declared headline found."""
    return next((text for m in declared_metrics(specs) if (text := m.describe(metrics)) is not None), "")
