"""What the host and the in-image scripts both compute, in one place (standard library only).

The probe and bench scripts run INSIDE stack images, where stackforge is not installed; this file
is mounted read-only with the in-image package at ``/stackforge/inimage`` and imported there by file
name (``import _sfshared``: the runner puts that folder on ``PYTHONPATH``). On the host the same file is
imported as
``stackforge.inimage._sfshared`` by :mod:`stackforge.jobs.job_runner`, :mod:`stackforge.build.verify`,
:mod:`stackforge.bench.metrics` and :mod:`stackforge.bench.stats`. It holds:

* the result-line contract: :data:`RESULT_MARKER` and :func:`parse_result_line`;
* nccl-tests' bandwidth formulas (:func:`busbw_factor`, :func:`algbw_gbps`, :func:`busbw_gbps`) and
  GEMM throughput (:func:`gemm_flops`, :func:`tflops`);
* the summary statistics of repeated timings (:func:`summarize`);
* :func:`json_safe`, the strict-JSON form of a metrics payload;
* the image facts both the build's verification (``stackforge.build.verify``, which runs this file
  inside the image as a ``python -c`` program) and every probe record (``_sfprobe.collect_facts``)
  read: :func:`installed_versions` and :func:`torch_build_facts`.

Nothing here may import beyond the standard library, nor anything of stackforge.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# ------------------------------------------------------------------------------------- result line

#: What starts the one line a script prints last: ``STACKFORGE_RESULT {json}``.
RESULT_MARKER = "STACKFORGE_RESULT "


def parse_result_line(output: str) -> dict[str, Any] | None:
    """Find the last ``STACKFORGE_RESULT {...}`` line a probe script printed; ``None`` if there is none."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                payload = json.loads(line[len(RESULT_MARKER):])
            except json.JSONDecodeError:
                return None
            return payload if isinstance(payload, dict) else None
    return None


# ---------------------------------------------------------------------------------------- formulas
# nccl-tests (doc/PERFORMANCE.md) reports two bandwidths for a collective over n ranks that moved S
# bytes in t seconds: algbw = S / t (GB/s, GB = 1e9 bytes) and busbw = algbw * factor(n), the
# bandwidth each link really carried. S is the size nccl-tests prints in its ``size`` column.

#: Collectives whose bus-bandwidth factor nccl-tests defines.
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv")

#: Bytes in the GB nccl-tests uses for GB/s (decimal, not GiB).
GB = 1e9
#: FLOPs in a TFLOP.
TFLOP = 1e12


def busbw_factor(collective: str, n_ranks: int) -> float:
    """The factor nccl-tests multiplies algbw by to get busbw.

    all-reduce ``2(n-1)/n`` (a reduce-scatter then an all-gather, each moving ``(n-1)/n`` of the
    data over every link); all-gather, reduce-scatter and all-to-all ``(n-1)/n``; broadcast,
    reduce and send/recv ``1`` (every byte crosses a link once).

    Raises:
        ValueError: an unknown collective or fewer than one rank.
    """
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    name = collective.replace("_", "").replace("-", "").lower()
    if name == "allreduce":
        return 2.0 * (n_ranks - 1) / n_ranks
    if name in ("allgather", "reducescatter", "alltoall"):
        return (n_ranks - 1) / n_ranks
    if name in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes): ``size / time``.

    Raises:
        ValueError: a non-positive time or a negative size.
    """
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r}")
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0, got {size_bytes!r}")
    return size_bytes / seconds / GB


def busbw_gbps(size_bytes: float, seconds: float, collective: str, n_ranks: int) -> float:
    """Bus bandwidth in GB/s: :func:`algbw_gbps` times :func:`busbw_factor`."""
    return algbw_gbps(size_bytes, seconds) * busbw_factor(collective, n_ranks)


def gemm_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an ``[m,k] x [k,n]`` matrix product: one multiply and one add
    per (row, column, inner) triple, ``2*m*n*k``."""
    if min(m, n, k) < 1:
        raise ValueError(f"GEMM dimensions must be >= 1, got m={m} n={n} k={k}")
    return 2 * m * n * k


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """Achieved TFLOP/s of one ``[m,k] x [k,n]`` product that took ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r}")
    return gemm_flops(m, n, k) / seconds / TFLOP


# -------------------------------------------------------------------------------------- statistics


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """``n``, ``median``, ``minimum``, ``maximum``, ``mean``, ``stdev`` (sample, n-1; 0.0 for one
    sample) and ``cv`` (``stdev / mean``; 0.0 for one sample or a zero mean) of ``samples``.

    Raises:
        ValueError: no samples, or a sample that is not a finite number.
    """
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("cannot summarize zero samples")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"samples must be finite numbers, got {values!r}")
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    cv = stdev / mean if mean != 0 else 0.0
    return {"n": len(values), "median": statistics.median(values), "minimum": min(values),
            "maximum": max(values), "mean": mean, "stdev": stdev, "cv": cv}


# ---------------------------------------------------------------------------------------- payloads


def json_safe(value: Any) -> Any:
    """Strict-JSON copy of a payload value: non-finite floats (SGLang writes ``request_rate:
    Infinity``) become strings, tuples lists, keys strings, anything else not JSON its ``str``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# ------------------------------------------------------------------------------------- image facts


def installed_versions(distributions: Iterable[str]) -> dict[str, str]:
    """distribution -> installed version, for those of ``distributions`` that are installed (asked-for
    is not installed: pip may resolve something else)."""
    versions = {}
    for name in distributions:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if version:  # metadata without a Version field reads as None: not a usable install
            versions[name] = version
    return versions


def torch_build_facts(torch: Any) -> dict[str, Any]:
    """What torch was built as, read without a GPU: ``version``, ``cuda`` (``torch.version.cuda``,
    None for a CPU build), ``git_version`` and ``arch_flags`` (:func:`torch_arch_flags`).

    The arch flags are the compile-time string: ``torch.cuda.get_arch_list()`` returns [] whenever
    no GPU is visible, so on a CPU runner it says nothing.
    """
    version = getattr(torch, "version", None)
    return {"version": getattr(torch, "__version__", None), "cuda": getattr(version, "cuda", None),
            "git_version": getattr(version, "git_version", None), "arch_flags": torch_arch_flags(torch)}


def torch_arch_flags(torch: Any) -> str | None:
    """The arch list torch was compiled with (``torch._C._cuda_getArchFlags()``), or None."""
    getter = getattr(torch._C, "_cuda_getArchFlags", None)
    if getter is None:
        return None
    try:
        flags = getter()
    except Exception:  # noqa: BLE001 - a torch without CUDA support may raise here
        return None
    return flags if isinstance(flags, str) else None
