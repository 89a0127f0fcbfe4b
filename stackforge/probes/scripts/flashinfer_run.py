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
targets the arch; a DSL failure would then read as a JIT failure. ``FLASHINFER_USE_CUDA_NORM=1``
(read once, at import, in ``flashinfer/norm/__init__.py``) selects the CUDA JIT kernels, so the
probe sets it before the import unless the image sets it itself, and records which backend ran
(``norm_backend``: FlashInfer's own ``_use_cuda_norm`` answer).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _sfprobe as sf

#: bf16 keeps ~3 significant digits; kernels that sum in another order differ by rounding, not more.
TOLERANCE = 0.05
#: Where the checks allocate; the tests point it at the CPU to check the torch references themselves.
DEVICE = "cuda"
#: FlashInfer >= 0.7: "1" selects the CUDA JIT norm kernels over the CuTe-DSL ones (read at import).
CUDA_NORM_ENV = "FLASHINFER_USE_CUDA_NORM"


def choose_cuda_norm(environ: dict[str, str] | Any) -> str:
    """Ask for FlashInfer's CUDA JIT norm kernels (before the import) unless the image chose;
    returns who chose: ``probe`` or ``image (<value>)``."""
    if environ.get(CUDA_NORM_ENV) is not None:
        return f"image ({CUDA_NORM_ENV}={environ[CUDA_NORM_ENV]})"
    environ[CUDA_NORM_ENV] = "1"
    return "probe"


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


def rmsnorm_check(torch: Any, flashinfer: Any) -> float:
    """flashinfer.norm.rmsnorm against x / rms(x) * w; returns the largest relative error."""
    generator = torch.Generator(device=DEVICE).manual_seed(7)
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device=DEVICE, generator=generator)
    weight = torch.randn(4096, dtype=torch.bfloat16, device=DEVICE, generator=generator)
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
    exist', flashinfer/jit/cpp_ext.py get_cuda_path in 0.6.3 and 0.7.2)."""
    return not row["ok"] and "max_rel_error" not in row and "nvcc" in str(row.get("error", "")).lower()


def no_nvcc_skip(rows: Sequence[dict[str, Any]], nvcc: str | None) -> str | None:
    """The skip reason when every failure is a JIT compile with no nvcc in the image, else None.

    An image without nvcc (the runtime flavour, CUDA 12.x wheels) cannot JIT-compile: that says nothing
    about FlashInfer on this GPU, so it is a skip, as the gate probe's; prebuilt kernels that ran are named.
    """
    failed = [r for r in rows if not r["ok"]]
    if not failed or nvcc is not None or not all(nvcc_missing(r) for r in failed):
        return None
    ran = [r["kernel"] for r in rows if r["ok"]]
    text = f"FlashInfer could not JIT-compile {', '.join(r['kernel'] for r in failed)} ({failed[0]['error']})"
    return sf.no_nvcc(text + (f"; prebuilt kernels ran and matched torch: {', '.join(ran)}" if ran else ""))


def built_modules(cache_base: Path) -> list[str]:
    """Shared objects FlashInfer built under the fresh cache (empty: everything came prebuilt)."""
    return sorted(p.name for p in cache_base.rglob("*.so"))


def build_and_run(torch: Any) -> tuple[str | None, list[dict[str, Any]], list[str], dict[str, str]]:
    """(import error or None, kernel rows, modules built here, norm backend facts), with FlashInfer's
    JIT cache in a fresh temporary folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="sf-flashinfer-jit-") as base:
        # Before the import: FlashInfer reads its cache location and the norm backend once, at import.
        os.environ["FLASHINFER_WORKSPACE_BASE"] = base
        chosen_by = choose_cuda_norm(os.environ)
        flashinfer, error = sf.try_import("flashinfer")
        if flashinfer is None:
            return error, [], [], {}
        backend = {"norm_backend": norm_backend(torch, flashinfer), "norm_backend_chosen_by": chosen_by}
        rows = [run_kernel(torch, flashinfer, name, check) for name, check in KERNELS]
        for row in rows:
            if row["kernel"] == "rmsnorm":
                row["backend"] = backend["norm_backend"]
        return None, rows, built_modules(Path(base)), backend


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
    evidence += f"\nrmsnorm backend: {backend['norm_backend']} (chosen by {backend['norm_backend_chosen_by']})"
    skip = no_nvcc_skip(rows, sf.find_nvcc())
    if skip is not None:
        sf.emit("skip", skip, evidence, metrics=metrics, facts=facts)
    failed = [r for r in rows if not r["ok"]]
    what = f"FlashInfer {metrics['flashinfer']} on {metrics['gpu']} ({args.arch.sm_name})"
    if failed:
        sf.emit("fail", f"{what}: {failed[0]['kernel']}: {failed[0]['error']}", evidence, metrics=metrics,
                facts=facts)
    how = f"JIT-built {len(built)} module(s) here" if built else "modules came prebuilt"
    sf.emit("pass", f"{what}: {', '.join(r['kernel'] for r in rows)} ran and matched torch; {how}; rmsnorm on "
            f"{backend['norm_backend']}", evidence,
            metrics=metrics, facts=facts)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
