"""The runtime FlashInfer probe's correctness checks are right, and can fail.

``flashinfer_run.py`` compares FlashInfer's kernels with plain torch. Without a GPU the kernels
cannot run, but the torch references can: here they run on the CPU (real torch, in the probe venv)
against independent implementations standing in for FlashInfer (``torch.nn.functional.rms_norm`` and
``scaled_dot_product_attention`` with grouped-query heads). Matching implementations pass; a kernel
that forgets the 1/sqrt(d) softmax scale, or normalises without the weight, is caught.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

from test_probe_scripts import SCRIPTS, fi072_python, script_module, torch_python  # noqa: F401  (venv fixtures)

STAND_INS = textwrap.dedent("""
    import json, sys, types
    sys.path.insert(0, SCRIPTS)
    import torch
    import torch.nn.functional as F
    import flashinfer_run as probe
    probe.DEVICE = "cpu"

    def rmsnorm(x, weight, eps=1e-6):
        return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)

    def decode(q, k, v, scale=None):
        # SDPA wants [heads, seq, dim]; one query position; enable_gqa repeats the 8 KV heads for 32 query heads.
        out = F.scaled_dot_product_attention(q.float().unsqueeze(1), k.float().transpose(0, 1),
                                             v.float().transpose(0, 1), enable_gqa=True, scale=scale)
        return out.squeeze(1).to(q.dtype)

    right = types.SimpleNamespace(norm=types.SimpleNamespace(rmsnorm=rmsnorm),
                                  single_decode_with_kv_cache=lambda q, k, v: decode(q, k, v))
    wrong = types.SimpleNamespace(norm=types.SimpleNamespace(rmsnorm=lambda x, w, eps=1e-6: rmsnorm(x, torch.ones_like(w))),
                                  single_decode_with_kv_cache=lambda q, k, v: decode(q, k, v, scale=1.0))
    rows = {name: [probe.run_kernel(torch, fi, kernel, check) for kernel, check in probe.KERNELS]
            for name, fi in (("right", right), ("wrong", wrong))}
    print(json.dumps(rows))
""")


def test_references_match_independent_kernels_and_catch_wrong_ones(torch_python):  # noqa: F811
    code = f"SCRIPTS = {str(SCRIPTS)!r}\n" + STAND_INS
    done = subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["kernel"] for r in rows["right"]] == ["rmsnorm", "single_decode_with_kv_cache"]
    for row in rows["right"]:
        assert row["ok"] and row["max_rel_error"] < 0.02, row
    for row in rows["wrong"]:
        assert not row["ok"] and "differs from the torch reference" in row["error"], row


# FlashInfer 0.7.2's own norm dispatch (flashinfer/norm/__init__.py reads FLASHINFER_USE_CUDA_NORM once,
# at import; _use_cuda_norm(device) answers from it before asking the CuTe DSL about the arch). The probe
# leaves the switch as the image sets it: the default path is the one a serving run takes.
NORM_DISPATCH = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, SCRIPTS)
    import torch
    import flashinfer_run as probe
    probe.DEVICE = "cpu"
    chosen_by = probe.norm_chooser(os.environ)
    import flashinfer
    print(json.dumps({"chosen_by": chosen_by, "flag": flashinfer.norm._USE_CUDA_NORM,
                      "backend": probe.norm_backend(torch, flashinfer)}))
""")


def test_flashinfer_072_reads_the_cuda_norm_switch_the_image_sets_before_import(fi072_python):  # noqa: F811
    import os
    code = f"SCRIPTS = {str(SCRIPTS)!r}\n" + NORM_DISPATCH
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_USE_CUDA_NORM"}
    done = subprocess.run([str(fi072_python), "-c", code], capture_output=True, text=True, timeout=600, check=False,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # the probe sets nothing; without nvidia-cutlass-dsl in this venv FlashInfer itself falls back to CUDA JIT
    assert seen == {"chosen_by": "flashinfer (its default, as a serving run)", "flag": True, "backend": "cuda-jit"}
    # an image that chose is left alone, and its choice is what FlashInfer sees
    done = subprocess.run([str(fi072_python), "-c", code], capture_output=True, text=True, timeout=600, check=False,
                          env={**env, "FLASHINFER_USE_CUDA_NORM": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["chosen_by"] == "image (FLASHINFER_USE_CUDA_NORM=0)"
    # without nvidia-cutlass-dsl in this venv FlashInfer falls back to the CUDA JIT kernels by itself
    assert seen["flag"] is True and seen["backend"] == "cuda-jit"


def test_a_flashinfer_without_cute_norm_is_cuda_jit(tmp_path):
    import types
    probe = script_module("flashinfer_run")
    assert probe.norm_backend(None, types.SimpleNamespace(norm=types.SimpleNamespace())) == \
        "cuda-jit (no CuTe-DSL norm in this FlashInfer)"
    assert probe.norm_backend(None, types.SimpleNamespace(norm=types.SimpleNamespace(_USE_CUDA_NORM=False))) == \
        "cute-dsl"


#: FlashInfer 0.6.3's words when the image has no nvcc (flashinfer/jit/cpp_ext.py:58, get_cuda_path).
NO_NVCC = "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"


def test_no_nvcc_in_the_image_is_a_skip_never_a_fail():
    """The 12.8 wheels image has no nvcc: FlashInfer's JIT raises 'Could not find nvcc'. That is the image's
    flavour, not FlashInfer on sm_120: a skip saying so, with the prebuilt kernels that ran named."""
    probe = script_module("flashinfer_run")
    rows = [{"kernel": "rmsnorm", "ok": False, "error": NO_NVCC, "seconds": 0.1},
            {"kernel": "single_decode_with_kv_cache", "ok": True, "max_rel_error": 0.01, "seconds": 0.2}]
    reason = probe.no_nvcc_skip(rows, nvcc=None)
    assert reason is not None and reason.startswith("no nvcc in this flavour")
    assert "could not JIT-compile rmsnorm (RuntimeError: Could not find nvcc" in reason
    assert reason.endswith("prebuilt kernels ran and matched torch: single_decode_with_kv_cache")
    # With nvcc in the image the same words are FlashInfer's failure; a wrong result is always one.
    assert probe.no_nvcc_skip(rows, nvcc="/usr/local/cuda/bin/nvcc") is None
    wrong = [{"kernel": "rmsnorm", "ok": False, "max_rel_error": 0.9, "error": "result differs (nvcc built it)"}]
    assert probe.no_nvcc_skip(wrong, nvcc=None) is None
    mixed = [rows[0], {"kernel": "single_decode_with_kv_cache", "ok": False, "error": "CUDA error: illegal address"}]
    assert probe.no_nvcc_skip(mixed, nvcc=None) is None
