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

from test_probe_scripts import SCRIPTS, torch_python  # noqa: F401  (the CPU torch venv fixture)

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
