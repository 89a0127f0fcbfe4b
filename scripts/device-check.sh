#!/usr/bin/env bash
# The single-GPU checks stackforge can run on a lent GPU box without Docker: one short, prepared run
# that ends within a global deadline (DEVICE_CHECK_DEADLINE_S, default 480 s = 8 minutes wall),
# whatever happens inside.
#
# Runs stackforge's in-image scripts directly in the box's Python (the probes and benches are plain
# scripts that need only the standard library plus what they measure), for the GPU it finds:
#   1. torch-arch       gate.torch.arch-list: torch's compiled arch list covers this GPU
#   2. flashinfer-jit   runtime.flashinfer.jit: FlashInfer JIT-builds and runs rmsnorm (CUDA JIT
#                       kernels, the backend is recorded) + decode attention (when FlashInfer is
#                       importable; carry its wheels, see below)
#   3. gemm             bench.gemm: bf16 / fp8 GEMM TFLOP/s at serving shapes, weights rotated past
#                       L2, against torch.matmul / torch._scaled_mm in the same run
#   4. nccl-graph-tree  runtime.nccl.graph-tree: needs two GPUs; on a one-GPU box it reports skip
# Each check gets a budget (printed before it runs): its planned share, cut to what is left of the
# deadline; a check with no time left is not started and its JSON says so.
#
# Usage (from the repository root, on the GPU machine):
#   scripts/device-check.sh [OUT_DIR]        # default: $OUT when set, else ./device-out
# Optional wheels: put them in .whl/; for each distribution there, the wheel matching the Python found
# here (its cpXY tag, or py3-none) is installed into a private --target folder first, and a
# distribution with no wheel for this Python is named and left out. For a box with Python 3.12 and
# torch but no FlashInfer (the lent H200 kind), from a machine with PyPI:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl flashinfer-python==0.6.6 apache-tvm-ffi==0.1.11
# (7.8 MB + 2.7 MB; flashinfer-python 0.7.2 is 65 MB, over a 64 MiB transfer limit. The modules probed
# here need none of its other dependencies beyond ninja, numpy, einops, tabulate, tqdm, nvidia-ml-py.)
# Every check writes OUT_DIR/<check>.json (its STACKFORGE_RESULT, or a status of timeout / error /
# skip written here when the script gave none) and OUT_DIR/<check>.log (its full output). Exit
# status: 0 when every check gave a result (pass, fail or skip alike), 1 when one did not, 2 when
# there is no GPU (said on stderr within seconds).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

deadline_s="${DEVICE_CHECK_DEADLINE_S:-480}"
out="${1:-${OUT:-device-out}}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

arch="$(timeout 60 "$python" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}.{n}")' \
  2>/dev/null)" \
  || { echo "device-check: no CUDA device visible to $python (torch.cuda.get_device_capability failed)" >&2; exit 2; }
gpus="$(timeout 60 "$python" -c 'import torch; print(torch.cuda.device_count())')"
tag="$("$python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')"

if compgen -G ".whl/*.whl" >/dev/null; then
  # One distribution name per wheel file (the part before the first '-'); pip picks the file that fits.
  for dist in $(for w in .whl/*.whl; do basename "$w" | cut -d- -f1; done | sort -u); do
    if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --find-links .whl --target /tmp/sf-site "$dist" >"$out/wheels-$dist.log" 2>&1; then
      echo "device-check: no wheel of $dist in .whl/ for this Python ($tag); left out (see $out/wheels-$dist.log)"
    fi
  done
  export PYTHONPATH="/tmp/sf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
timeout 30 nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader \
  >"$out/nvidia-smi.csv" 2>&1 || true
echo "device-check: $gpus GPU(s), compute capability $arch, Python $tag; deadline ${deadline_s} s; results in $out"

probes=stackforge/probes/scripts
bench=stackforge/bench/scripts
failed=0
kill_grace_s=5

write_json() {  # write_json FILE STATUS REASON: a result this script states itself
  "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
path, status, reason = sys.argv[1:4]
json.dump({"status": status, "reason": reason, "evidence": "", "metrics": {}, "facts": {}}, open(path, "w"))
PY
}

check() {  # check NAME PLANNED_S SCRIPT ARGS...
  local name="$1" planned="$2"; shift 2
  local left=$((deadline_s - SECONDS - kill_grace_s))
  local budget=$((planned < left ? planned : left))
  if ((budget < 10)); then
    echo "  $name: not started, ${left} s left of the ${deadline_s} s deadline"
    write_json "$out/$name.json" skip "not started: the ${deadline_s} s deadline of device-check.sh was reached"
    failed=1
    return
  fi
  echo "  $name: budget ${budget} s (planned ${planned} s, ${left} s left)"
  local started=$SECONDS
  timeout --kill-after="$kill_grace_s" "$budget" "$python" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  grep '^STACKFORGE_RESULT ' "$out/$name.log" | tail -1 | cut -d' ' -f2- >"$out/$name.json"
  if [[ ! -s "$out/$name.json" ]]; then
    if ((rc == 124 || rc == 137)); then
      write_json "$out/$name.json" timeout "killed at its ${budget} s budget (exit $rc)"
    else
      write_json "$out/$name.json" error "no result line (exit $rc after $((SECONDS - started)) s); see $name.log"
    fi
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

# Planned budgets add up to 450 s, under the 480 s deadline with the set-up above.
check torch-arch 45 "$probes/torch_arch.py" --arch "$arch" --gpus "$gpus"
check flashinfer-jit 240 "$probes/flashinfer_run.py" --arch "$arch" --gpus 1
check gemm 120 "$bench/gemm.py" --repeats 3 --shapes 8b.qkv,8b.o,8b.down,70b.down --m 1,16,128,4096
check nccl-graph-tree 45 "$probes/nccl_graph.py" --arch "$arch" --gpus "$gpus" --algo tree --phase-timeout 30
echo "device-check: done in ${SECONDS} s"
exit "$failed"
