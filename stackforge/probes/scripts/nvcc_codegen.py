"""Gate probe ``nvcc-codegen``: can the image's nvcc generate code for the target arch?

Finds nvcc ($CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin, the CUDA 13 wheels'
site-packages/nvidia/cu13/bin, PATH), then compiles a tiny kernel to a cubin for ``-arch=sm_120``
and checks that the cubin really is an NVIDIA ELF for that SM. The arch-specific (``sm_120a``) and
family (``sm_120f``) targets and a PTX build are compiled too and reported as metrics; the plain
``sm_XY`` cubin decides. An image without nvcc (the runtime flavour, CUDA 12.x wheels) is a skip,
"no nvcc in this flavour", not a failure: it says nothing about nvcc's code generation.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf

KERNEL = r"""
extern "C" __global__ void stackforge_probe_axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

EM_CUDA = 190


def cubin_sm(path: str) -> int | None:
    """The SM number stored in a cubin's ELF header, or None if it is not a CUDA ELF.

    e_flags layout: ELF ABI version >= 8 (CUDA 12.8+ toolchains, needed for sm_100+) keeps the SM
    in bits 8..15 (0x7802 -> 120); older cubins keep it in the low byte.
    """
    with open(path, "rb") as handle:
        header = handle.read(64)
    if len(header) < 52 or header[:4] != b"\x7fELF":
        return None
    little = header[5] == 1
    is64 = header[4] == 2
    abi_version = header[8]
    order = "<" if little else ">"
    machine = struct.unpack_from(order + "H", header, 18)[0]
    if machine != EM_CUDA:
        return None
    flags = struct.unpack_from(order + "I", header, 48 if is64 else 36)[0]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF


def compile_variant(nvcc: str, source: str, workdir: str, arch_flag: str, output_kind: str,
                    timeout_s: float) -> dict[str, Any]:
    """Compile ``source`` with ``-<output_kind> -arch=<arch_flag>``; the outcome as a dict."""
    out = os.path.join(workdir, f"probe_{arch_flag}.{output_kind}")
    result = sf.run_command([nvcc, f"-{output_kind}", f"-arch={arch_flag}", "-o", out, source], timeout_s,
                            cwd=workdir)
    outcome: dict[str, Any] = {"arch": arch_flag, "seconds": round(result.seconds, 2)}
    if result.timed_out:
        outcome.update(status="timeout", output=f"nvcc did not finish within {timeout_s:.0f} s")
    elif not result.ok:
        outcome.update(status="fail", output=result.start_error or result.output or f"exit {result.returncode}")
    elif not os.path.isfile(out):
        outcome.update(status="fail", output=f"nvcc exited 0 but wrote no {out}")
    else:
        outcome.update(status="ok", output=result.output, bytes=os.path.getsize(out))
        if output_kind == "cubin":
            outcome["elf_sm"] = cubin_sm(out)
    return outcome


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--nvcc", help="use this nvcc instead of searching the usual places")
    parser.add_argument("--compile-timeout", type=float, default=120.0, help="seconds per nvcc call")
    args = parser.parse_args(argv)
    target = args.arch
    nvcc = sf.find_nvcc(args.nvcc)
    facts = sf.collect_facts(nvcc_path=nvcc, search_nvcc=False)
    if nvcc is None:
        searched = ", ".join(sf.nvcc_candidates(args.nvcc))
        sf.emit("skip", sf.no_nvcc(f"nothing to generate {target.sm_name} code with"),
                evidence=f"searched: {searched}", facts=facts)
    release, version_line = sf.nvcc_version(nvcc)
    if not release:
        sf.emit("fail", f"{nvcc} does not run: {sf.one_line(version_line)[:300]}", evidence=version_line,
                facts=facts)
    with tempfile.TemporaryDirectory(prefix="sf-nvcc-") as workdir:
        source = os.path.join(workdir, "probe.cu")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(KERNEL)
        base = f"sm_{target.sm}"
        main_outcome = compile_variant(nvcc, source, workdir, base, "cubin", args.compile_timeout)
        variants = [compile_variant(nvcc, source, workdir, f"{base}{suffix}", "cubin", args.compile_timeout)
                    for suffix in ("a", "f")]
        ptx = compile_variant(nvcc, source, workdir, f"compute_{target.sm}", "ptx", args.compile_timeout)
    metrics = {"nvcc_release": release, "variants": {o["arch"]: o["status"] for o in [main_outcome, *variants, ptx]},
               "seconds": {o["arch"]: o["seconds"] for o in [main_outcome, *variants, ptx]},
               "variant_errors": {o["arch"]: sf.one_line(o["output"])[:300]
                                  for o in [*variants, ptx] if o["status"] != "ok"}}
    evidence = f"{nvcc}: {version_line}\n$ nvcc -cubin -arch={base}: {main_outcome['status']}"
    if main_outcome["output"]:
        evidence += "\n" + main_outcome["output"]
    decide(main_outcome, base, release, evidence, metrics, facts, target)


def decide(outcome: dict[str, Any], base: str, release: str, evidence: str, metrics: dict[str, Any],
           facts: dict[str, Any], target: sf.Arch) -> None:
    """Emit pass/fail/error from the plain ``sm_XY`` cubin build."""
    if outcome["status"] == "timeout":
        sf.emit("error", f"nvcc {release} did not finish compiling a tiny kernel for {base}", evidence=evidence,
                metrics=metrics, facts=facts)
    if outcome["status"] != "ok":
        first = next((line for line in outcome["output"].splitlines() if line.strip()), "")
        sf.emit("fail", f"nvcc {release} cannot generate code for {base}: {first[:200]}", evidence=evidence,
                metrics=metrics, facts=facts)
    if outcome.get("elf_sm") != target.sm:
        sf.emit("fail", f"nvcc {release} produced a cubin for SM {outcome.get('elf_sm')}, not {target.sm}",
                evidence=evidence, metrics=metrics, facts=facts)
    others = ", ".join(f"{arch}={status}" for arch, status in metrics["variants"].items() if arch != base)
    sf.emit("pass", f"nvcc {release} compiled a kernel to a {base} cubin (ELF SM {target.sm}); {others}",
            evidence=evidence, metrics=metrics, facts=facts)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
