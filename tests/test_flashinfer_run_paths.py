"""The runtime FlashInfer probe sees nvcc where FlashInfer looks, and runs the rmsnorm path a server takes.

* nvcc: FlashInfer's JIT calls ``$FLASHINFER_NVCC`` or ``<CUDA home>/bin/nvcc``, the CUDA home being
  $CUDA_HOME, $CUDA_PATH, the folder above ``which nvcc``'s bin, else /usr/local/cuda
  (flashinfer/jit/cpp_ext.py ``get_cuda_path``). An nvcc only in the CUDA wheels' folder (site-packages
  ``nvidia/cu13/bin``), not on PATH, is not FlashInfer's: its JIT failure is a ``skip`` saying so, never a
  ``fail``.
* kernel path: on FlashInfer 0.7.x the default rmsnorm is the CuTe DSL; the probe runs that default, then
  the forced CUDA JIT variant, and records the kernel names each launched. The GPU part (real kernels under
  torch.profiler) runs in the probe itself on a lent GPU (scripts/device-check.sh); the decisions, the
  evidence's shape and FlashInfer 0.7.2's own switch are checked here on the CPU.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
import types
from pathlib import Path

import pytest
from test_probe_scripts import SCRIPTS, fi072_python, script_module  # noqa: F401  (venv fixture)

#: FlashInfer's words when it finds no CUDA home (flashinfer/jit/cpp_ext.py get_cuda_path, 0.6.3 and 0.7.2).
NO_CUDA_HOME = "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"
WHEEL_NVCC = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc"


@pytest.fixture(scope="module")
def probe():
    return script_module("flashinfer_run")


def fake_nvcc(folder: Path) -> Path:
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


def test_flashinfer_nvcc_follows_flashinfers_own_order(probe, tmp_path):
    sf = probe.sf
    home = fake_nvcc(tmp_path / "cuda")
    on_path = fake_nvcc(tmp_path / "other")
    assert sf.flashinfer_nvcc(environ={"CUDA_HOME": str(tmp_path / "cuda"), "PATH": str(on_path.parent)}) == \
        (str(home), str(home))
    assert sf.flashinfer_nvcc(environ={"PATH": str(on_path.parent)}) == (str(on_path), str(on_path))
    assert sf.flashinfer_nvcc(environ={"FLASHINFER_NVCC": str(home), "CUDA_HOME": "/nowhere"}) == \
        (str(home), f"$FLASHINFER_NVCC={home}")
    # FlashInfer's own get_cuda_path answers when given; a CUDA home without bin/nvcc is no nvcc.
    assert sf.flashinfer_nvcc(lambda: str(tmp_path / "cuda"), environ={}) == (str(home), str(home))
    assert sf.flashinfer_nvcc(lambda: "/usr/local/cuda-libs-only", environ={}) == \
        ("", "/usr/local/cuda-libs-only/bin/nvcc")

    def raises() -> str:
        raise RuntimeError("Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist")

    assert sf.flashinfer_nvcc(raises, environ={}) == ("", f"no CUDA home ({NO_CUDA_HOME})")


def test_an_nvcc_only_in_site_packages_is_a_skip_not_a_fail(probe, monkeypatch):
    """The image's nvcc sits in the CUDA wheels' folder, not on PATH: _sfprobe.find_nvcc finds it, FlashInfer
    does not, and its JIT raises. Judged by the nvcc find_nvcc found (before), this was a ``fail``."""
    monkeypatch.setattr(probe.sf, "find_nvcc", lambda explicit=None: WHEEL_NVCC)
    rows = [{"kernel": "rmsnorm", "ok": False, "error": NO_CUDA_HOME, "seconds": 0.1},
            {"kernel": "single_decode_with_kv_cache", "ok": False, "error": "RuntimeError: Ninja build failed.",
             "seconds": 0.1}]
    reason = probe.jit_skip(rows, "", f"no CUDA home ({NO_CUDA_HOME})")
    assert reason is not None and reason.startswith("no nvcc in this flavour")
    assert f"FlashInfer looks for nvcc at no CUDA home ({NO_CUDA_HOME})" in reason
    assert f"the nvcc at {WHEEL_NVCC} is not where FlashInfer looks (not on PATH, no CUDA_HOME)" in reason
    # Where FlashInfer finds an nvcc, the same failure is FlashInfer's: a fail, with nothing to skip.
    assert probe.jit_skip(rows, "/usr/local/cuda/bin/nvcc", "/usr/local/cuda/bin/nvcc") is None
    # A wrong result is never the missing compiler's.
    wrong = [{"kernel": "rmsnorm", "ok": False, "max_rel_error": 0.9, "error": "result differs"}]
    assert probe.jit_skip(wrong, "", "/usr/local/cuda/bin/nvcc") is None


def test_the_default_path_runs_first_and_the_forced_cuda_jit_one_beside_it(probe):
    assert probe.norm_variants("cute-dsl", can_force=True) == ("default", "forced cuda-jit")
    assert probe.norm_variants("cuda-jit", can_force=True) == ("default",)
    assert probe.norm_variants("cute-dsl", can_force=False) == ("default",)
    assert probe.norm_chooser({}) == "flashinfer (its default, as a serving run)"
    assert probe.norm_chooser({"FLASHINFER_USE_CUDA_NORM": "1"}) == "image (FLASHINFER_USE_CUDA_NORM=1)"


CUDA_KERNEL = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, ...)"
DSL_KERNEL = "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__0"


def test_the_kernel_names_say_which_path_ran(probe):
    assert probe.kernel_path([CUDA_KERNEL]) == "cuda-jit"
    assert probe.kernel_path([DSL_KERNEL]) == "cute-dsl"
    assert probe.kernel_path(["void at::native::reduce_kernel<512, 1>"]) == "unknown"
    assert probe.path_evidence("default", "cute-dsl", [DSL_KERNEL]) == {
        "variant": "default", "backend": "cute-dsl", "kernels": [DSL_KERNEL], "ran": "cute-dsl", "as_expected": True}
    fallback = probe.path_evidence("default", "cute-dsl", [CUDA_KERNEL])
    assert fallback["ran"] == "cuda-jit" and fallback["as_expected"] is False
    unknown = probe.path_evidence("default", "cuda-jit (no CuTe-DSL norm in this FlashInfer)", [CUDA_KERNEL])
    assert unknown["as_expected"] is True
    blind = probe.path_evidence("forced cuda-jit", "cuda-jit", "RuntimeError: CUPTI unavailable")
    assert blind == {"variant": "forced cuda-jit", "backend": "cuda-jit", "kernels": [],
                     "ran": "not recorded: RuntimeError: CUPTI unavailable", "as_expected": None}


def test_run_norm_paths_switches_flashinfers_global_and_restores_it(probe, monkeypatch):
    """A FlashInfer stand-in whose rmsnorm reads the module global at every call, as 0.7.2's does."""
    seen = []
    norm = types.SimpleNamespace(_USE_CUDA_NORM=False)

    def rmsnorm(x, weight, eps=1e-6):
        seen.append("cuda-jit" if norm._USE_CUDA_NORM else "cute-dsl")
        return x

    norm.rmsnorm = rmsnorm
    flashinfer = types.SimpleNamespace(norm=norm)
    monkeypatch.setattr(probe, "rmsnorm_inputs", lambda torch: ("x", "w"))
    monkeypatch.setattr(probe, "DEVICE", "cpu")             # no synchronize: the stand-in launches nothing

    def check(torch, fi):
        fi.norm.rmsnorm("x", "w")
        return 0.001

    def profile(torch, call):
        before = len(seen)
        call()
        return [CUDA_KERNEL if seen[before] == "cuda-jit" else DSL_KERNEL]

    rows, paths = probe.run_norm_paths(None, flashinfer, "cute-dsl", profile=profile, check=check)
    assert [r["kernel"] for r in rows] == ["rmsnorm", "rmsnorm (forced cuda-jit)"]
    assert [r["backend"] for r in rows] == ["cute-dsl", "cuda-jit"] and all(r["ok"] for r in rows)
    assert [(p["variant"], p["ran"], p["as_expected"]) for p in paths] == [
        ("default", "cute-dsl", True), ("forced cuda-jit", "cuda-jit", True)]
    assert seen == ["cute-dsl", "cute-dsl", "cuda-jit", "cuda-jit"]
    assert norm._USE_CUDA_NORM is False                        # the default is back for the kernels after it
    # A failing variant is a row like any kernel's, with no kernel names to show.
    rows, paths = probe.run_norm_paths(None, flashinfer, "cute-dsl", profile=profile,
                                       check=lambda torch, fi: 1 / 0)
    assert not rows[0]["ok"] and "ZeroDivisionError" in rows[0]["error"]
    assert paths[0]["ran"] == "not recorded: the kernel did not run to completion"


# The real 0.7.2: its rmsnorm dispatch reads the module global at each call, so setting it after the import
# forces the CUDA JIT kernels (flashinfer/norm/__init__.py:89-101 _use_cuda_norm, :186 the dispatch).
GLOBAL_SWITCH = textwrap.dedent("""
    import json, sys
    import torch
    torch.cuda.get_device_capability = lambda device=None: (12, 0)
    import flashinfer.norm as norm
    norm._cute_dsl_supports_arch = lambda major, minor: True
    norm._USE_CUDA_NORM = False
    default = norm._use_cuda_norm(torch.device("cpu"))
    norm._USE_CUDA_NORM = True
    forced = norm._use_cuda_norm(torch.device("cpu"))
    print(json.dumps({"default_cuda": default, "forced_cuda": forced}))
""")


def test_flashinfer_072_reads_the_norm_global_at_each_call(fi072_python):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_USE_CUDA_NORM"}
    done = subprocess.run([str(fi072_python), "-c", GLOBAL_SWITCH], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"default_cuda": False, "forced_cuda": True}


def test_flashinfer_072_finds_no_nvcc_outside_its_search(fi072_python, tmp_path):  # noqa: F811
    """FlashInfer's own get_cuda_path, asked through the shared lookup: with no CUDA_HOME and no nvcc on
    PATH it never looks in the CUDA wheels' folder."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(SCRIPTS.parents[1] / "inimage")!r})
        import _sfprobe as sf
        import flashinfer.jit.cpp_ext as cpp_ext
        print(json.dumps(sf.flashinfer_nvcc(cpp_ext.get_cuda_path)))
    """)
    home = tmp_path / "cuda"
    nvcc = fake_nvcc(home)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC")}
    done = subprocess.run([str(fi072_python), "-c", code], capture_output=True, text=True, timeout=600, check=False,
                          env={**env, "CUDA_HOME": str(home)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [str(nvcc), str(nvcc)]
