#!/usr/bin/env bash
# The README's install line as a user meets it: a brand-new venv in a temporary folder, `pip install .`
# (no extras), then `stackforge build` of one small real stack, verification included, run by that
# venv's own `stackforge`. A runtime dependency missing from pyproject.toml's core dependencies fails
# here, where the test venv (installed with the test extra) would hide it. scripts/test.sh runs this
# after the engine and the base image are ready (25-35 s with warm caches).
#
# The stack is tests/_build_helpers.py's small one as a matrix file can say it: torch 2.13.0+cpu from
# the wheelhouse, the CUDA 13.0 toolkit wheels (a real nvcc to verify), FlashInfer 0.6.6 with its
# dependencies, SGLang --no-deps, wheels flavour on the bootstrapped Debian 12 base. SGLang 0.5.8
# because compat/tables.yaml holds no pins for it, so no kernel package (300+ MB of CUDA kernels)
# is derived and no pin rule prunes the CPU torch; if pins for 0.5.8 are ever added, `stackforge
# build` stops here with "no stack to build" and this stack needs another SGLang release.
set -euo pipefail

cd "$(dirname "$0")/.."
readonly WHEELHOUSE="${STACKFORGE_WHEELHOUSE:-/opt/wheels}"

say() { printf 'readme-install: %s\n' "$*"; }
die() { printf 'readme-install: error: %s\n' "$*" >&2; exit 1; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

work="$(mktemp -d)"
# One fixed label: labels are part of the image content, so a per-run value would defeat the layer cache.
label="io.stackforge.ci.readme-install=1"
cleanup() {
  docker image ls -q --filter "label=$label" | sort -u | xargs -r docker image rm -f >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The README's line, word for word but for where the venv lives. Its output goes to a log: pip
#    is chatty, and the log's tail is what matters when it fails.
started=$(date +%s)
if ! { python3 -m venv "$work/.venv" && "$work/.venv/bin/pip" install . >"$work/pip.log" 2>&1; }; then
  tail -n 30 "$work/pip.log" >&2
  die "the README's install line failed (python3 -m venv X && X/bin/pip install .)"
fi
stackforge="$work/.venv/bin/stackforge"
say "python3 -m venv + pip install . in $(seconds_since "$started") s: $("$stackforge" --version)"

# 2. One small real build with verification, by the fresh venv's stackforge.
# SGLang 0.4.5 is older than the first release compat/sglang_pins.yaml reads (0.4.6): no pins are known
# for it, so the stack brings no kernel package and no pin rule prunes it beside torch 2.13.0 (installed
# --no-deps: the point is stackforge's own install path and one verified build, not a serving stack).
cat >"$work/matrix.yaml" <<'YAML'
schema: 1
name: readme-install-check
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.11", flavour: wheels, os: debian12, torch_variant: cpu}
axes:
  cuda: ["13.0"]
  torch: ["2.13.0"]
  flashinfer: ["0.6.6"]
  sglang: ["0.4.5"]
YAML
# pip inside the build trusts what pip here trusts (a TLS re-signing proxy, say): build's own default.

started=$(date +%s)
"$stackforge" build --matrix "$work/matrix.yaml" --find-links "$WHEELHOUSE" --no-deps sglang \
  --out "$work/out" --label "$label" --timeout 900 --no-progress \
  || die "stackforge build (from the README-installed venv) failed; see the lines above"

# 3. The record says the image was verified from the inside (testinfra ran in this venv), lock included.
"$work/.venv/bin/python" - "$work/out/builds" <<'PY' || die "the build record does not show a passed verification"
import json, sys
from pathlib import Path

records = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
if len(records) != 1:
    sys.exit(f"expected one build record, found {len(records)}")
record = records[0]
verify = record.get("verify") or {}
checks = verify.get("checks") or []
print(f"readme-install: {record['stack_id']}: {record['status']}, verification {verify.get('status')} "
      f"({len(checks)} checks: {', '.join(c['name'] for c in checks)}); seconds per phase: "
      + ", ".join(f"{phase} {seconds:.0f}" for phase, seconds in (record.get("durations") or {}).items()))
if record["status"] not in ("built", "cached") or verify.get("status") != "pass" or not checks:
    sys.exit(1)
# The build resolved the stack's lock on the host first (uv from this venv) and the image is exactly it.
if not record.get("lock_sha256") or not any(c["name"] == "lock" and c["status"] == "pass" for c in checks):
    sys.exit("the build did not install a stack lock, or pip freeze in the image is not the lock")
PY
say "stackforge build with verification in $(seconds_since "$started") s"
