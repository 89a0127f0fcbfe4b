#!/usr/bin/env bash
# The single-GPU checks stackforge can run on a lent GPU box without Docker: one short, prepared run
# that ends within a global deadline (DEVICE_CHECK_DEADLINE_S, default 300 s wall), whatever happens
# inside, and leaves exactly two files (a device machine sends back at most 8), also when it refuses:
#   OUT_DIR/device-check.json   one summary: the host (nvidia-smi), the host check's verdict, the Python,
#                               the wheels installed, and for each check its planned and given budget,
#                               seconds and result (or, on a refusal, why: "refused")
#   OUT_DIR/device-check.log    the host check's findings and every check's full output, one after the
#                               other under a header
#
# First the host check every runtime run starts with (stackforge.edges.gpu_host, as `stackforge doctor
# --gpu`: driver, persistence mode, Fabric Manager on NVSwitch, Xid/ECC errors, IOMMU/ACS, the nvidia_uvm
# HMM setting; at most 20 s), its verdict written before anything else; a failing verdict is printed and
# named in the summary's scope: the checks still run, but their results are the host's to explain.
# Then stackforge's in-image scripts directly in the box's Python (the probes and benches are plain
# scripts that need only the standard library plus what they measure), for the GPU it finds:
#   1. torch-arch       gate.torch.arch-list: torch's compiled arch list covers this GPU
#   2. flashinfer-jit   runtime.flashinfer.jit: FlashInfer JIT-builds and runs rmsnorm + decode attention
#                       for this GPU (when FlashInfer is importable: carry its wheels, see below); an
#                       image without nvcc is a skip that says so
#   3. gemm             bench.gemm: bf16 / fp8 GEMM TFLOP/s at serving shapes, against torch.matmul /
#                       torch._scaled_mm in the same run
#   4. nccl-graph-tree  runtime.nccl.graph-tree: needs two GPUs; on a one-GPU box it reports skip
# Each check gets a budget (printed before it runs): its planned share, cut to what is left of the
# deadline; a check with no time left is not started and the summary says so.
#
# What it shows: on the lent H200 (sm_90, one GPU) it validates the machinery (the scripts, the JIT
# path, the harness, the result lines) on real CUDA, not a verdict for the sm_120 target: the summary
# and the last line say so.
#
# Usage (from the repository root, on the GPU machine):
#   scripts/device-check.sh [--dry-run] [OUT_DIR]   # default OUT_DIR: $OUT when set, else ./device-out
#   --dry-run: print the checks, their budgets and the files it would write, then exit 0 (no GPU needed).
# Wheels: .whl/ is ignored by git, so it reaches a device machine only when named in the call's carry
# list. For each distribution there, the wheel matching the Python found here (its cpXY tag, or
# py3-none) is installed into a private --target folder first. Carry what the default matrix pins and
# fits the 64 MiB transfer: FlashInfer 0.6.3 (the CUDA 12.8 stacks' pin, 7.6 MB) and apache-tvm-ffi
# (2.7 MB); 0.7.2's wheel (65.2 MB) does not fit beside the working tree. From a machine with PyPI:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl flashinfer-python==0.6.3 apache-tvm-ffi==0.1.11
# Exit status: 0 when every check gave a result (pass, fail or skip alike), 1 when one did not,
# 2 when there is no GPU (said on stderr within seconds).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi
deadline_s="${DEVICE_CHECK_DEADLINE_S:-300}"
out="${1:-${OUT:-device-out}}"
python="${PYTHON:-python3}"
summary="$out/device-check.json"
log="$out/device-check.log"
probes=stackforge/probes/scripts
bench=stackforge/bench/scripts
kill_grace_s=5
# name, planned seconds, script and its arguments (ARCH and GPUS are filled in below).
# Planned budgets add up to 270 s, under the 300 s deadline with the set-up.
checks=(
  "torch-arch|30|$probes/torch_arch.py --arch ARCH --gpus GPUS"
  "flashinfer-jit|150|$probes/flashinfer_run.py --arch ARCH --gpus 1"
  "gemm|60|$bench/gemm.py --repeats 3 --shapes 8b.qkv,8b.o,8b.down,70b.down --m 1,16,128,4096"
  "nccl-graph-tree|30|$probes/nccl_graph.py --arch ARCH --gpus GPUS --algo tree --phase-timeout 20"
)

if ((dry_run)); then
  echo "device-check (dry run): deadline ${deadline_s} s; writes 2 files: $summary, $log"
  total=0
  for entry in "${checks[@]}"; do
    IFS='|' read -r name planned command <<<"$entry"
    total=$((total + planned))
    echo "  $name: budget ${planned} s: $command"
  done
  echo "device-check (dry run): planned ${total} s of ${deadline_s} s"
  exit 0
fi

mkdir -p "$out"
: >"$log"
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
repo="$PWD"

# The host check, first: stackforge's own (edges/gpu_host.py), for a target made of what this box is.
# It never fails the script; what it could not read or import is its verdict ("not run", "no gpu").
echo "=== host check" >>"$log"
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$repo" timeout --kill-after=2 20 "$python" - "$results/host.json" \
  >>"$log" 2>&1 <<'PY'
import json, sys
path = sys.argv[1]
def write(verdict):
    with open(path, "w") as handle:
        json.dump(verdict, handle)
    print(f"host check: {verdict['status']}: {verdict.get('reason', '')}")
try:
    from stackforge.core.model import Interconnect, Target
    from stackforge.edges.gpu_host import judge_gpu_host, read_gpu_host_facts
    from stackforge.edges.gpus import detect_host_gpus, host_facts
except Exception as exc:   # the box's Python lacks what stackforge imports (packaging): said, not fatal
    write({"status": "not run", "reason": f"stackforge's host check does not import here: {type(exc).__name__}: {exc}"})
    sys.exit(0)
gpus = detect_host_gpus(None)
if not gpus.available or not gpus.devices:
    write({"status": "no gpu", "reason": gpus.evidence, "host": host_facts(gpus)})
    sys.exit(0)
facts = read_gpu_host_facts(gpus)
first = gpus.devices[0]
fabric = any((g.fabric_state or "N/A") != "N/A" for g in facts.gpus)
links = [kind for _, _, kind in gpus.links or ()]
interconnect = (Interconnect.NVSWITCH if fabric else Interconnect.NVLINK if any(k.startswith("NV") for k in links)
                else Interconnect.PCIE)
target = Target("this-host", first.name, first.arch or "", len(gpus.devices), interconnect)
verdict = judge_gpu_host(facts, target)
for finding in verdict.findings:
    print(f"  {finding.check}: {finding.status.value}: {finding.text}")
failing = [f"{f.check}: {f.text}" for f in verdict.findings if f.status.value == "fail"]
write({"status": verdict.status.value, "reason": "; ".join(failing) or f"{len(verdict.findings)} finding(s), none failing",
       "target": target.to_json(), "verdict": verdict.to_json(), "facts": facts.to_json(), "host": host_facts(gpus)})
PY
[[ -s "$results/host.json" ]] || echo '{"status": "not run", "reason": "the host check gave no verdict within 20 s"}' \
  >"$results/host.json"
host_status="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$results/host.json" \
  2>/dev/null || echo "not run")"

# The scripts import _sfprobe / _sfshared from the in-image package, as the job runner arranges it.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD/stackforge/inimage${PYTHONPATH:+:$PYTHONPATH}"
refuse() {  # refuse REASON: the two promised files (the summary says why), the reason on stderr, exit 2
  echo "device-check: $1" >&2
  echo "device-check: refused: $1" >>"$log"
  "$python" - "$summary" "$results/host.json" "$1" "$deadline_s" "$SECONDS" <<'PY'
import json, sys
path, host, reason, deadline, seconds = sys.argv[1:6]
try:
    host_check = json.load(open(host))
except (OSError, ValueError):
    host_check = {"status": "not run", "reason": "no verdict"}
json.dump({"schema": "stackforge.device-check", "schema_version": 1, "deadline_s": int(deadline),
           "seconds": int(seconds), "refused": reason, "host_check": host_check, "checks": []},
          open(path, "w"), indent=2)
PY
  exit 2
}
arch="$(timeout 60 "$python" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}.{n}")' \
  2>/dev/null)" \
  || refuse "no CUDA device visible to $python (torch.cuda.get_device_capability failed)"
gpus="$(timeout 60 "$python" -c 'import torch; print(torch.cuda.device_count())')"
tag="$("$python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')"

wheels=""
if compgen -G ".whl/*.whl" >/dev/null; then
  # One distribution name per wheel file (the part before the first '-'); pip picks the file that fits.
  for dist in $(for w in .whl/*.whl; do basename "$w" | cut -d- -f1; done | sort -u); do
    echo "=== wheels: $dist" >>"$log"
    if "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --find-links .whl --target /tmp/sf-site "$dist" >>"$log" 2>&1; then
      wheels+="$dist installed; "
    else
      wheels+="$dist: no wheel for this Python ($tag), left out; "
      echo "device-check: no wheel of $dist in .whl/ for this Python ($tag); left out (see $log)"
    fi
  done
  export PYTHONPATH="/tmp/sf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
smi="$(timeout 30 nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader 2>&1 || true)"
echo "device-check: $gpus GPU(s), compute capability $arch, Python $tag; deadline ${deadline_s} s; results in $summary"
echo "device-check: host check $host_status (findings in $log)"

failed=0
write_result() {  # write_result NAME STATUS REASON: a result this script states itself
  "$python" - "$results/$1.json" "$2" "$3" <<'PY'
import json, sys
path, status, reason = sys.argv[1:4]
json.dump({"status": status, "reason": reason, "evidence": "", "metrics": {}, "facts": {}}, open(path, "w"))
PY
}

check() {  # check NAME PLANNED_S SCRIPT ARGS...
  local name="$1" planned="$2"; shift 2
  local left=$((deadline_s - SECONDS - kill_grace_s))
  local budget=$((planned < left ? planned : left))
  echo "$planned" >"$results/$name.planned"
  if ((budget < 10)); then
    echo "  $name: not started, ${left} s left of the ${deadline_s} s deadline"
    write_result "$name" skip "not started: the ${deadline_s} s deadline of device-check.sh was reached"
    echo 0 >"$results/$name.budget"; echo 0 >"$results/$name.seconds"
    failed=1
    return
  fi
  echo "  $name: budget ${budget} s (planned ${planned} s, ${left} s left)"
  echo "$budget" >"$results/$name.budget"
  echo "=== $name: budget ${budget} s: $*" >>"$log"
  local started=$SECONDS
  timeout --kill-after="$kill_grace_s" "$budget" "$python" "$@" >"$results/$name.out" 2>&1
  local rc=$?
  cat "$results/$name.out" >>"$log"
  echo $((SECONDS - started)) >"$results/$name.seconds"
  grep '^STACKFORGE_RESULT ' "$results/$name.out" | tail -1 | cut -d' ' -f2- >"$results/$name.json"
  if [[ ! -s "$results/$name.json" ]]; then
    if ((rc == 124 || rc == 137)); then
      write_result "$name" timeout "killed at its ${budget} s budget (exit $rc)"
    else
      write_result "$name" error "no result line (exit $rc after $((SECONDS - started)) s); see device-check.log"
    fi
    echo "  $name: no result line (exit $rc after $((SECONDS - started)) s); see $log"
    failed=1
    return
  fi
  "$python" - "$results/$name.json" "$name" "$((SECONDS - started))" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
print(f"  {sys.argv[2]}: {result['status']} in {sys.argv[3]} s: {result['reason'][:400]}")
PY
}

for entry in "${checks[@]}"; do
  IFS='|' read -r name planned command <<<"$entry"
  command="${command//ARCH/$arch}"
  command="${command//GPUS/$gpus}"
  read -r -a argv <<<"$command"
  check "$name" "$planned" "${argv[@]}"
done

scope="compute capability $arch on $gpus GPU(s): this validates the machinery (scripts, JIT path, harness, result lines) on real CUDA"
[[ "$arch" != "12.0" ]] && scope+=", not a verdict for the sm_120 target"
[[ "$host_status" == "fail" ]] && scope+="; the host check failed: these results are the host's to explain"
"$python" - "$summary" "$results" "$deadline_s" "$SECONDS" "$arch" "$gpus" "$tag" "$wheels" "$smi" "$scope" <<'PY'
import json, os, re, sys
path, results, deadline, seconds, arch, gpus, tag, wheels, smi, scope = sys.argv[1:11]
try:
    host_check = json.load(open(os.path.join(results, "host.json")))
except (OSError, ValueError):
    host_check = {"status": "not run", "reason": "no verdict"}
checks = []
for name in ("torch-arch", "flashinfer-jit", "gemm", "nccl-graph-tree"):
    def read(suffix, default=""):
        file = os.path.join(results, f"{name}.{suffix}")
        return open(file).read().strip() if os.path.exists(file) else default
    result = json.loads(read("json", "{}") or "{}")
    checks.append({"check": name, "planned_s": int(read("planned", "0")), "budget_s": int(read("budget", "0")),
                   "seconds": int(read("seconds", "0")), "result": result})
matrix = open("matrices/default.yaml").read() if os.path.exists("matrices/default.yaml") else ""
installed = next((c["result"].get("metrics", {}).get("flashinfer") for c in checks if c["check"] == "flashinfer-jit"), None)
pinned = None if not installed else bool(re.search(rf'["\s]{re.escape(installed)}["\s,\]]', matrix))
summary = {"schema": "stackforge.device-check", "schema_version": 1, "deadline_s": int(deadline),
           "seconds": int(seconds), "arch": arch, "gpus": int(gpus), "python": tag, "nvidia_smi": smi,
           "wheels": wheels.strip(), "scope": scope, "host_check": host_check,
           "flashinfer_tested": installed, "flashinfer_pinned_by_default_matrix": pinned, "checks": checks}
with open(path, "w") as handle:
    json.dump(summary, handle, indent=2)
if installed:
    print(f"device-check: FlashInfer {installed} tested; "
          + ("pinned by matrices/default.yaml" if pinned else "NOT a version matrices/default.yaml pins"))
PY
echo "device-check: done in ${SECONDS} s; $scope"
exit "$failed"
