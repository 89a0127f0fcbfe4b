#!/usr/bin/env bash
# The single-GPU checks stackforge can run on a lent GPU box without Docker: one short, prepared run.
#
# Runs stackforge's in-image scripts directly in the box's Python (the probes and benches are plain
# scripts that need only the standard library plus what they measure), for the GPU it finds:
#   1. gate.torch.arch-list   torch's compiled arch list covers this GPU
#   2. runtime.flashinfer.jit FlashInfer JIT-builds and runs rmsnorm + decode attention (when FlashInfer
#                             is importable; carry its wheels, see below)
#   3. bench.gemm             bf16 / fp8 GEMM TFLOP/s at serving shapes against torch.matmul in the
#                             same run (the issue's bar: >= 85 % of matmul's best)
# Collective probes (NCCL graphs, symmetric memory, custom all-reduce, EP all-to-all) need two GPUs
# or more; on a one-GPU box they report skip, which this script shows too.
#
# Usage (from the repository root, on the GPU machine):
#   scripts/device-check.sh [OUT_DIR]        # default: $OUT when set, else ./device-out
# Optional wheels: put them in .whl/ for the box's Python and they are installed into a private --target
# folder first. For a box with Python 3.12 and torch but no FlashInfer (the lent H200 kind), from a
# machine with PyPI:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl flashinfer-python==0.6.6 apache-tvm-ffi==0.1.11
# (7.8 MB + 2.7 MB; flashinfer-python 0.7.2 is 65 MB, over a 64 MiB transfer limit. The modules probed
# here need none of its other dependencies beyond ninja, numpy, einops, tabulate, tqdm, nvidia-ml-py.)
# Every result line (STACKFORGE_RESULT {...}) is kept in OUT_DIR/<check>.json, the full output in
# OUT_DIR/<check>.log; the exit status is 0 when every check ran (pass, fail or skip alike).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

out="${1:-${OUT:-device-out}}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sf-site .whl/*.whl \
    || { echo "device-check: installing .whl/*.whl failed" >&2; exit 2; }
  export PYTHONPATH="/tmp/sf-site${PYTHONPATH:+:$PYTHONPATH}"
fi

arch="$("$python" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}.{n}")' 2>/dev/null)" \
  || { echo "device-check: no CUDA device visible to $python (torch.cuda.get_device_capability failed)" >&2; exit 2; }
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"
nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader >"$out/nvidia-smi.csv" 2>&1 || true
echo "device-check: $gpus GPU(s), compute capability $arch; results in $out"

probes=stackforge/probes/scripts
bench=stackforge/bench/scripts
failed=0
check() {  # check NAME TIMEOUT_S SCRIPT ARGS...
  local name="$1" limit="$2"; shift 2
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$python" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  grep '^STACKFORGE_RESULT ' "$out/$name.log" | tail -1 | cut -d' ' -f2- >"$out/$name.json"
  if [[ ! -s "$out/$name.json" ]]; then
    echo "  $name: no result line (exit $rc after $((SECONDS - started)) s); see $out/$name.log"
    failed=1
    return
  fi
  "$python" - "$out/$name.json" "$((SECONDS - started))" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
print(f"  {sys.argv[1].rsplit('/', 1)[-1][:-5]}: {result['status']} in {sys.argv[2]} s: {result['reason'][:400]}")
PY
}

check torch-arch 120 "$probes/torch_arch.py" --arch "$arch" --gpus "$gpus"
check flashinfer-jit 900 "$probes/flashinfer_run.py" --arch "$arch" --gpus 1
check gemm 900 "$bench/gemm.py" --repeats 5
check nccl-graph-tree 300 "$probes/nccl_graph.py" --arch "$arch" --gpus "$gpus" --algo tree
exit "$failed"
