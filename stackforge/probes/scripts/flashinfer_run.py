"""Runtime probe ``flashinfer-jit``: FlashInfer JIT-compiles its kernels for the visible GPU and runs them.

The gate probe (``flashinfer_gates.py``) asks FlashInfer's own arch gates and builds (compiles and
links) its modules without a GPU, loading nothing; this one does what a server does at its first
request, on one GPU of the target arch: FlashInfer builds (or loads) the module for the device it sees
and the kernel runs. Each kernel's result is checked against a plain torch computation of the same thing.

FlashInfer's JIT cache lives under ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``; the probe
points it at a fresh temporary folder, so a module built here is a real compile on this image, not
a leftover. Modules that come prebuilt (``flashinfer-jit-cache``, AOT) load without a compile, and
the metrics say which happened: the shared objects built under the fresh cache are listed.

Kernels: ``flashinfer.norm.rmsnorm`` (bf16) and ``flashinfer.single_decode_with_kv_cache`` (one
decode step of attention, bf16, grouped-query heads). A failure carries FlashInfer's own words.

FlashInfer 0.7 dispatches ``rmsnorm`` to a CuTe-DSL kernel when ``nvidia-cutlass-dsl`` imports and
targets the arch, unless ``FLASHINFER_USE_CUDA_NORM=1`` (read once, at import, into the module global
``_USE_CUDA_NORM``, which ``_use_cuda_norm`` reads at every call: flashinfer-python 0.7.2 wheel,
flashinfer/norm/__init__.py:60-75 and :89-101, the dispatch at :186). A serving run sets nothing, so its
path is FlashInfer's default: the probe runs that path first, as the image's environment leaves it, then,
when the default is the CuTe DSL, the forced CUDA JIT variant too (the global set after the import), and
records which kernels each ran (``norm_paths``: the kernel names torch.profiler saw, evidence that the
intended path, not a fallback, executed).

nvcc is looked for where FlashInfer looks (``_sfprobe.flashinfer_nvcc``): an nvcc only in the CUDA
wheels' folder, not on PATH and without CUDA_HOME, is not FlashInfer's; a JIT failure for want of it is a
``skip`` that says where FlashInfer looked and where the unused nvcc is.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import _sfprobe as sf

#: bf16 keeps ~3 significant digits; kernels that sum in another order differ by rounding, not more.
TOLERANCE = 0.05
#: Where the checks allocate; the tests point it at the CPU to check the torch references themselves.
DEVICE = "cuda"
#: FlashInfer >= 0.7: "1" selects the CUDA JIT norm kernels over the CuTe-DSL ones (read at import).
CUDA_NORM_ENV = "FLASHINFER_USE_CUDA_NORM"
#: The rmsnorm variants: FlashInfer's default (what a serving run takes) and the forced CUDA JIT kernels.
DEFAULT_PATH, FORCED_CUDA = "default", "forced cuda-jit"


def norm_chooser(environ: Mapping[str, str]) -> str:
    """Who chose the default rmsnorm path: FlashInfer, or the image (its own FLASHINFER_USE_CUDA_NORM)."""
    if environ.get(CUDA_NORM_ENV) is not None:
        return f"image ({CUDA_NORM_ENV}={environ[CUDA_NORM_ENV]})"
    return "flashinfer (its default, as a serving run)"


def norm_variants(default_backend: str, can_force: bool) -> tuple[str, ...]:
    """The rmsnorm variants to run: the default path always; the forced CUDA JIT one too when the default
    is the CuTe DSL and this FlashInfer has the switch (otherwise the default already is the CUDA JIT)."""
    return (DEFAULT_PATH, FORCED_CUDA) if default_backend == "cute-dsl" and can_force else (DEFAULT_PATH,)


def kernel_path(names: Sequence[str]) -> str:
    """Which rmsnorm implementation the launched kernel names show: ``cuda-jit`` (FlashInfer's
    ``flashinfer::norm::RMSNormKernel``, include/flashinfer/norm.cuh), ``cute-dsl`` (a CuTe-DSL kernel, named
    after cutlass), or ``unknown``."""
    if any("flashinfer::norm::" in n for n in names):
        return "cuda-jit"
    if any("cutlass" in n.lower() or "cute" in n.lower() for n in names):
        return "cute-dsl"
    return "unknown"


def path_evidence(variant: str, expected: str, names: Sequence[str] | str) -> dict[str, Any]:
    """One variant's evidence: the backend FlashInfer's rule picks, the kernels the profiler saw and whether
    they are that backend's (``as_expected``: True, False on a fallback, None when no kernel name was recorded)."""
    if isinstance(names, str):   # the profiler could not say
        return {"variant": variant, "backend": expected, "kernels": [], "ran": "not recorded: " + names,
                "as_expected": None}
    ran = kernel_path(names)
    expected_path = expected.split(" ")[0]
    return {"variant": variant, "backend": expected, "kernels": list(names), "ran": ran,
            "as_expected": None if ran == "unknown" else ran == expected_path}


def launched_kernels(torch: Any, call: Callable[[], Any]) -> list[str] | str:
    """The distinct GPU kernel names ``call`` launched, from torch.profiler (copies and memsets left out); the
    reason as a string when the profiler could not say."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")}
    except Exception as exc:  # noqa: BLE001 - evidence only: its absence is said, never a verdict
        return sf.describe_exception(exc)
    return sorted(n for n in names if not n.startswith(("Memcpy", "Memset")))


def norm_backend(torch: Any, flashinfer: Any) -> str:
    """Which kernels ``flashinfer.norm.rmsnorm`` dispatches to on the device, by FlashInfer's own
    rule (``_use_cuda_norm``, 0.7); a FlashInfer without a CuTe-DSL norm has only the CUDA JIT one."""
    norm = getattr(flashinfer, "norm", None)
    decide = getattr(norm, "_use_cuda_norm", None)
    if decide is None:
        flag = getattr(norm, "_USE_CUDA_NORM", None)
        if flag is None:
            return "cuda-jit (no CuTe-DSL norm in this FlashInfer)"
        return "cuda-jit" if flag else "cute-dsl"
    device = torch.device(DEVICE, 0) if DEVICE == "cuda" else torch.device(DEVICE)
    return "cuda-jit" if decide(device) else "cute-dsl"


def rmsnorm_inputs(torch: Any) -> tuple[Any, Any]:
    generator = torch.Generator(device=DEVICE).manual_seed(7)
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    weight = torch.randn(4096, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    return x, weight


def rmsnorm_check(torch: Any, flashinfer: Any) -> float:
    """flashinfer.norm.rmsnorm against x / rms(x) * w; returns the largest relative error."""
    x, weight = rmsnorm_inputs(torch)
    got = flashinfer.norm.rmsnorm(x, weight, eps=1e-6)
    variance = x.float().pow(2).mean(dim=-1, keepdim=True)
    expected = x.float() * torch.rsqrt(variance + 1e-6) * weight.float()
    return relative_error(got, expected)


def decode_check(torch: Any, flashinfer: Any) -> float:
    """flashinfer.single_decode_with_kv_cache (NHD, 32 query heads over 8 KV heads) against softmax(qk/sqrt(d)) v."""
    generator = torch.Generator(device=DEVICE).manual_seed(11)
    kv_len, q_heads, kv_heads, dim = 1024, 32, 8, 128
    q = torch.randn(q_heads, dim, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    k = torch.randn(kv_len, kv_heads, dim, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    v = torch.randn(kv_len, kv_heads, dim, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    got = flashinfer.single_decode_with_kv_cache(q, k, v)
    group = q_heads // kv_heads
    keys = k.float().repeat_interleave(group, dim=1)      # [kv_len, q_heads, dim]
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,lhd->hl", q.float(), keys) / dim ** 0.5
    expected = torch.einsum("hl,lhd->hd", scores.softmax(dim=-1), values)
    return relative_error(got, expected)


def relative_error(got: Any, expected: Any) -> float:
    scale = float(expected.abs().max().item()) or 1.0
    return round(float((got.float() - expected).abs().max().item()) / scale, 6)


KERNELS: tuple[tuple[str, Callable[[Any, Any], float]], ...] = (
    ("rmsnorm", rmsnorm_check),
    ("single_decode_with_kv_cache", decode_check),
)


def run_kernel(torch: Any, flashinfer: Any, name: str, check: Callable[[Any, Any], float]) -> dict[str, Any]:
    """Build-or-load plus first run (timed), then the check; an exception is the kernel's result."""
    started = time.perf_counter()
    try:
        error = check(torch, flashinfer)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - FlashInfer's own failure is the evidence
        return {"kernel": name, "ok": False, "error": sf.describe_exception(exc),
                "seconds": round(time.perf_counter() - started, 2)}
    ok = error <= TOLERANCE
    row = {"kernel": name, "ok": ok, "max_rel_error": error, "seconds": round(time.perf_counter() - started, 2)}
    if not ok:
        row["error"] = f"result differs from the torch reference by {error} (relative; tolerance {TOLERANCE})"
    return row


def nvcc_missing(row: dict[str, Any]) -> bool:
    """A kernel that failed because FlashInfer found no nvcc to JIT-compile it: an exception (not a wrong
    result) in FlashInfer's own words naming nvcc ('Could not find nvcc and default cuda_home=... doesn't
    exist', flashinfer/jit/cpp_ext.py get_cuda_path in 0.6.3 and 0.7.2) or its ninja build (which calls the
    nvcc that is not there)."""
    error = str(row.get("error", "")).lower()
    return not row["ok"] and "max_rel_error" not in row and ("nvcc" in error or "ninja" in error)


def no_nvcc_skip(rows: Sequence[dict[str, Any]], nvcc: str | None, looked: str = "",
                 elsewhere: str | None = None) -> str | None:
    """The skip reason when every failure is a JIT compile with no nvcc where FlashInfer looks, else None.

    An image without nvcc (the runtime flavour, CUDA 12.x wheels) cannot JIT-compile: that says nothing
    about FlashInfer on this GPU, so it is a skip, as the gate probe's; prebuilt kernels that ran are named.
    ``nvcc`` is FlashInfer's (:func:`_sfprobe.flashinfer_nvcc`), ``looked`` where it looked, ``elsewhere`` an
    nvcc in the image FlashInfer does not look at (a serving run would not find it either).
    """
    failed = [r for r in rows if not r["ok"]]
    if not failed or nvcc is not None or not all(nvcc_missing(r) for r in failed):
        return None
    ran = [r["kernel"] for r in rows if r["ok"]]
    text = f"FlashInfer could not JIT-compile {', '.join(r['kernel'] for r in failed)} ({failed[0]['error']})"
    if looked:
        text += f"; FlashInfer looks for nvcc at {looked}"
    if elsewhere:
        text += f"; the nvcc at {elsewhere} is not where FlashInfer looks (not on PATH, no CUDA_HOME)"
    return sf.no_nvcc(text + (f"; prebuilt kernels ran and matched torch: {', '.join(ran)}" if ran else ""))


def jit_skip(rows: Sequence[dict[str, Any]], fi_nvcc: str, looked: str) -> str | None:
    """:func:`no_nvcc_skip` judged by FlashInfer's nvcc (``fi_nvcc``, "" for none), naming an nvcc the image has
    where FlashInfer does not look (the one :func:`_sfprobe.find_nvcc` finds in the CUDA wheels' folder)."""
    found = sf.find_nvcc()
    return no_nvcc_skip(rows, fi_nvcc or None, looked, found if found and found != fi_nvcc else None)


def built_modules(cache_base: Path) -> list[str]:
    """Shared objects FlashInfer built under the fresh cache (empty: everything came prebuilt)."""
    return sorted(p.name for p in cache_base.rglob("*.so"))


def cuda_path_of(flashinfer: Any) -> Callable[[], Any] | None:
    """FlashInfer's own ``get_cuda_path`` (flashinfer.jit.cpp_ext), None when this FlashInfer has none."""
    try:
        import flashinfer.jit.cpp_ext as cpp_ext  # noqa: F401 - the module FlashInfer's JIT uses

        return getattr(cpp_ext, "get_cuda_path", None)
    except Exception:  # noqa: BLE001 - then _sfprobe's copy of its rule answers
        return None


def run_norm_paths(torch: Any, flashinfer: Any, default_backend: str,
                   profile: Callable[[Any, Callable[[], Any]], list[str] | str] = launched_kernels,
                   check: Callable[[Any, Any], float] | None = None,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rmsnorm rows, their path evidence): the default path, then the forced CUDA JIT one where the default
    is the CuTe DSL (FlashInfer's module global, restored afterwards). Each variant that ran and matched is
    run once more under the profiler for the names of the kernels it launched."""
    check = check or rmsnorm_check
    norm = getattr(flashinfer, "norm", None)
    can_force = norm is not None and hasattr(norm, "_USE_CUDA_NORM")
    rows, paths = [], []
    for variant in norm_variants(default_backend, can_force):
        forced = variant == FORCED_CUDA
        saved = getattr(norm, "_USE_CUDA_NORM", None)
        if forced:
            norm._USE_CUDA_NORM = True
        try:
            row = run_kernel(torch, flashinfer, "rmsnorm" if not forced else f"rmsnorm ({FORCED_CUDA})", check)
            row["backend"] = "cuda-jit" if forced else default_backend
            names: list[str] | str = "the kernel did not run to completion"
            if row["ok"]:
                x, weight = rmsnorm_inputs(torch)
                names = profile(torch, lambda: flashinfer.norm.rmsnorm(x, weight, eps=1e-6))
        finally:
            if forced:
                norm._USE_CUDA_NORM = saved
        rows.append(row)
        paths.append(path_evidence(variant, row["backend"], names))
    return rows, paths


def build_and_run(torch: Any) -> tuple[str | None, list[dict[str, Any]], list[str], dict[str, Any]]:
    """(import error or None, kernel rows, modules built here, norm backend facts), with FlashInfer's
    JIT cache in a fresh temporary folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="sf-flashinfer-jit-") as base:
        # Before the import: FlashInfer reads its cache location and the norm backend once, at import. The
        # norm switch is left as the image sets it: the default path is what a serving run takes.
        os.environ["FLASHINFER_WORKSPACE_BASE"] = base
        chosen_by = norm_chooser(os.environ)
        flashinfer, error = sf.try_import("flashinfer")
        if flashinfer is None:
            return error, [], [], {}
        default = norm_backend(torch, flashinfer)
        norm_rows, paths = run_norm_paths(torch, flashinfer, default)
        rows = [*norm_rows, *(run_kernel(torch, flashinfer, name, check) for name, check in KERNELS
                              if name != "rmsnorm")]
        nvcc, looked = sf.flashinfer_nvcc(cuda_path_of(flashinfer))
        facts = {"norm_backend": default, "norm_backend_chosen_by": chosen_by, "norm_paths": paths,
                 "fi_nvcc": nvcc, "fi_nvcc_looked": looked}
        return None, rows, built_modules(Path(base)), facts


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    status, reason, torch = sf.gpu_preflight(1, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    import_error, rows, built, backend = build_and_run(torch)
    if import_error is not None:
        sf.emit("skip" if "No module named 'flashinfer'" in import_error else "fail",
                f"import flashinfer: {import_error}", import_error, facts=facts)
    metrics = {"gpu": torch.cuda.get_device_name(0), "kernels": rows, "built_here": built,
               "flashinfer": sf.installed_version("flashinfer-python"), **backend}
    evidence = "\n".join(f"{r['kernel']}: " + (f"ok, max relative error {r['max_rel_error']}" if r["ok"]
                                                else r["error"]) + f" ({r['seconds']} s)" for r in rows)
    evidence += "\nbuilt under the fresh JIT cache: " + (", ".join(built) or "nothing (prebuilt modules)")
    evidence += f"\nrmsnorm default backend: {backend['norm_backend']} (chosen by {backend['norm_backend_chosen_by']})"
    evidence += "".join(f"\nrmsnorm {p['variant']}: {p['backend']}; ran {p['ran']} {p['kernels']}"
                        for p in backend["norm_paths"])
    evidence += f"\nnvcc where FlashInfer looks: {backend['fi_nvcc'] or 'none'} ({backend['fi_nvcc_looked']})"
    skip = jit_skip(rows, backend["fi_nvcc"], backend["fi_nvcc_looked"])
    if skip is not None:
        sf.emit("skip", skip, evidence, metrics=metrics, facts=facts)
    failed = [r for r in rows if not r["ok"]]
    what = f"FlashInfer {metrics['flashinfer']} on {metrics['gpu']} ({args.arch.sm_name})"
    if failed:
        sf.emit("fail", f"{what}: {failed[0]['kernel']}: {failed[0]['error']}", evidence, metrics=metrics,
                facts=facts)
    how = f"JIT-built {len(built)} module(s) here" if built else "modules came prebuilt"
    ran = "; ".join(f"rmsnorm {p['variant']} on {p['backend']}"
                    + ("" if p["as_expected"] is not False else f" (but the kernels ran are {p['ran']}'s)")
                    for p in backend["norm_paths"])
    sf.emit("pass", f"{what}: {', '.join(r['kernel'] for r in rows)} ran and matched torch; {how}; {ran}", evidence,
            metrics=metrics, facts=facts)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
