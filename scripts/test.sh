#!/usr/bin/env bash
# The test command (README): prepare the machine, install stackforge, build the base image, check the
# README's install line with one small real build, run the tests. .ci/run calls this script.
#
# It installs what the tests need on a fresh machine: the engine and buildx, Chromium, Debian's
# docker-registry (registry hand-off tests), a venv with the CPU torch wheel from the wheelhouse
# (gloo all-reduce and GEMM bench tests; STACKFORGE_TEST_TORCH_PYTHON names another). On a machine
# without GPU the only skips allowed are GPU-only ones (tests/_skips.py): any other skip fails the run.
#
# For a Debian bookworm machine without GPU and without a container registry (PyPI and Debian's archive
# reachable), run from anywhere as root (or with passwordless sudo):  scripts/test.sh
# Extra arguments go to pytest, e.g.  scripts/test.sh -m "not slow"
# The whole job must fit in 90 minutes on 2 cores; the tests get STACKFORGE_CI_TEST_TIMEOUT (80m).
# Before anything it checks the disk (stackforge/doctor/disk_budget.py holds the need, measured in
# docs/measurements.md; STACKFORGE_DISK_NEED_GB=N replaces it) and refuses in one line when the disk
# cannot hold the run; at its end (pass or fail) it prunes the engine's BuildKit cache to the budget's
# cap. When a step fails, the last line names it and the steps that did not run; the exit status is the
# failed step's (pytest's own when the tests fail).
set -euo pipefail

cd "$(dirname "$0")/.."
readonly TEST_TIMEOUT="${STACKFORGE_CI_TEST_TIMEOUT:-80m}"
readonly VENV=".venv"
readonly CACHE=".cache"   # ignored by git: the torch venv and the skip report live here
readonly WHEELHOUSE="${STACKFORGE_WHEELHOUSE:-/opt/wheels}"
readonly TORCH_VERSION="2.13.0+cpu"
readonly TORCH_VENV="$CACHE/test-torch-venv"
readonly SKIP_REPORT="$CACHE/skips.tsv"
readonly WHEEL_CACHE="$CACHE/wheels"   # compat verify's wheels, kept between runs (content-addressed)
readonly PYTEST_LOG="$CACHE/pytest.log"
readonly BUDGET=(python3 -m stackforge.doctor.disk_budget)   # the disk need and caps, in one place

say() { printf 'ci: %s\n' "$*"; }
# die: the run ends here; the EXIT trap then names the steps that did not run.
die() { printf 'ci: error: %s\n' "$*" >&2; exit 1; }
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
seconds_since() { echo $(( $(date +%s) - $1 )); }
apt_install() {
  # A fresh machine may have no package lists yet: update once, then try again.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 \
    || { as_root apt-get update -qq >/dev/null && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; } \
    || die "apt-get install $* failed"
}

step_disk() {
  # Refuse before anything is installed or built: a run that fills the disk fails 100 tests with
  # "No space left on device" after twenty minutes.
  local status=0
  "${BUDGET[@]}" check test 2>&1 | sed 's/^/ci: /' || status=${PIPESTATUS[0]}
  case "$status" in
    0) ;;
    3) exit 1 ;;   # it printed the commands that free what stackforge holds, then the refusal (the last line)
    *) die "the disk check (${BUDGET[*]} check test) could not run (status $status)" ;;
  esac
}

step_engine() {
  as_root scripts/setup-engine.sh
}

step_browser() {
  # The HTML matrix is checked in headless Chromium (Debian's package; no browser download).
  if ! command -v chromium >/dev/null 2>&1; then
    say "installing chromium (browser test of the HTML matrix)"
    apt_install chromium
  fi
}

step_registry() {
  # The registry hand-off tests start a throw-away registry on 127.0.0.1 (tests/registry_fixture.py).
  if ! command -v docker-registry >/dev/null 2>&1; then
    say "installing docker-registry (the registry hand-off tests run their own on 127.0.0.1)"
    apt_install docker-registry
  fi
  # The package also installs a service on :5000; the tests need only the program, and this machine
  # is meant to have no registry running.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
    as_root systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  say "docker-registry: $(command -v docker-registry)"
}

step_torch_venv() {
  # The gloo all-reduce and GEMM bench tests run the bench scripts in an interpreter with torch: the
  # CPU wheel from the wheelhouse (a CUDA torch is gigabytes; these tests run on the CPU), in a venv
  # under this checkout's ignored .cache/.
  local started; started=$(date +%s)
  if [[ -n "${STACKFORGE_TEST_TORCH_PYTHON:-}" ]]; then
    "$STACKFORGE_TEST_TORCH_PYTHON" -c "import torch" 2>/dev/null \
      || die "STACKFORGE_TEST_TORCH_PYTHON=$STACKFORGE_TEST_TORCH_PYTHON cannot import torch"
    say "torch for the bench tests: $STACKFORGE_TEST_TORCH_PYTHON (given)"
    return
  fi
  local python="$TORCH_VENV/bin/python"
  if ! "$python" -c "import sys, torch; sys.exit(torch.__version__ != '$TORCH_VERSION')" 2>/dev/null; then
    rm -rf "$TORCH_VENV"
    python3 -m venv "$TORCH_VENV"
    "$python" -m pip install --disable-pip-version-check --find-links "$WHEELHOUSE" "torch==$TORCH_VERSION" \
      >"$CACHE/test-torch-venv.log" 2>&1 \
      || { tail -n 30 "$CACHE/test-torch-venv.log" >&2; die "pip install torch==$TORCH_VERSION (wheelhouse $WHEELHOUSE) into $TORCH_VENV failed"; }
  fi
  STACKFORGE_TEST_TORCH_PYTHON="$PWD/$python"
  export STACKFORGE_TEST_TORCH_PYTHON
  say "torch for the bench tests: $STACKFORGE_TEST_TORCH_PYTHON (torch $TORCH_VERSION) in $(seconds_since "$started") s"
}

step_venv() {
  local started; started=$(date +%s)
  if ! python3 -c "import ensurepip" 2>/dev/null; then
    # Debian's python3 ships venv's pip bootstrap separately.
    say "installing python3-venv (python3 -m venv needs it)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c "" 2>/dev/null; then
    say "removing broken $VENV (its interpreter no longer runs)"
    rm -rf "$VENV"
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]' \
    || die "pip install -e '.[test]' failed"
  say "venv: $VENV ready ($("$VENV/bin/python" --version), stackforge installed editable) in $(seconds_since "$started") s"
}

step_base_image() {
  local started; started=$(date +%s)
  as_root "$VENV/bin/stackforge" bootstrap-base
  say "base image: ready in $(seconds_since "$started") s"
}

step_readme_install() {
  # What the main job does: the README's plain `pip install .` in a fresh venv, then a real build with
  # verification (one small stack); the test venv has the test extra and would hide a missing dependency.
  local started; started=$(date +%s)
  STACKFORGE_WHEELHOUSE="$WHEELHOUSE" bash scripts/readme-install-check.sh || die "the README's install path failed"
  say "README install line + one verified build: passed in $(seconds_since "$started") s"
}

step_tests() {
  local started; started=$(date +%s)
  local status=0
  rm -f "$SKIP_REPORT"
  # The tests' conftest prints the skips by reason at the end and writes them to the report. pytest's
  # output also goes to a log: its closing line is repeated on the last line when it fails.
  STACKFORGE_SKIP_REPORT="$PWD/$SKIP_REPORT" \
    timeout --signal=TERM --kill-after=60 "$TEST_TIMEOUT" "$VENV/bin/python" -m pytest -q "$@" 2>&1 \
    | tee "$PYTEST_LOG" || status=${PIPESTATUS[0]}
  say "tests: pytest exited with status $status after $(seconds_since "$started") s"
  local closing full
  # pytest's closing line: "1 failed, 1867 passed, 96 errors in 1423.12s (0:23:43)".
  closing=$(grep -E ' in [0-9.]+s( \([0-9:]+\))?( =+)?$' "$PYTEST_LOG" | tail -n 1 | sed 's/^=* *//; s/ *=*$//' || true)
  full=$(grep -c 'No space left on device' "$PYTEST_LOG" || true)
  if [[ "$full" -gt 0 ]]; then
    say "tests: $full line(s) of pytest's output say 'No space left on device': ${BUDGET[*]} check test"
  fi
  case "$status" in
    0) ;;
    5) die "pytest collected no tests (exit status 5): a CI run that tests nothing is a failure" ;;
    124) die "pytest ran past $TEST_TIMEOUT and was stopped (pytest: ${closing:-no closing line})" ;;
    # pytest's own status is the run's (the EXIT trap's last line says it too).
    *) printf 'ci: error: pytest exited with status %s (pytest: %s)\n' "$status" "${closing:-no closing line}" >&2
       exit "$status" ;;
  esac
}

check_skips() {
  # GPU-only skips (raised with tests/_skips.py skip_gpu_only / require_host_gpus) are the only ones a
  # machine of this kind may have; any other skip is a feature that did not run, so the run fails.
  [[ -f "$SKIP_REPORT" ]] || die "pytest wrote no skip report ($SKIP_REPORT)"
  local others
  others=$(grep -v -c $'^gpu-only\t' "$SKIP_REPORT" || true)
  if [[ "$others" -gt 0 ]]; then
    grep -v $'^gpu-only\t' "$SKIP_REPORT" | sed 's/^/ci:   /' >&2
    die "$others skip reason(s) above are not GPU-only: this machine lacks what those tests need"
  fi
  say "skips: $(awk -F '\t' '{n += $2} END {print n + 0}' "$SKIP_REPORT") GPU-only, none other"
}

step_compat_verify() {
  # Every rule a wheel reader can witness, read in the PyPI wheels on both sides of its bounds: a rule
  # whose bound is off by one release fails the run (exit 1 names it and the measured bound). It needs
  # PyPI; the wheel cache under .cache/ makes a rerun cheap.
  local started; started=$(date +%s)
  local status=0
  STACKFORGE_WHEEL_CACHE="$PWD/$WHEEL_CACHE" "$VENV/bin/stackforge" compat verify >"$CACHE/compat-verify.txt" 2>&1 \
    || status=$?
  grep -E '^(WRONG|    (WRONG|measured))' "$CACHE/compat-verify.txt" | sed 's/^/ci:   /' >&2 || true
  tail -n 1 "$CACHE/compat-verify.txt" | sed 's/^/ci: compat verify: /'
  say "compat verify: exited with status $status after $(seconds_since "$started") s (full output: $CACHE/compat-verify.txt)"
  case "$status" in
    0) ;;
    1) die "compat verify found rules whose bounds the wheels contradict (above)" ;;
    *) tail -n 5 "$CACHE/compat-verify.txt" >&2; die "compat verify could not run (status $status)" ;;
  esac
}

prune_buildkit() {
  # The tests build real images: their layers stay in the engine's BuildKit cache (11.7 GB after one
  # run). Keep at most the budget's cap of it (least recently used pruned first; what a running build
  # uses is never pruned). buildx 0.13 (scripts/setup-engine.sh) has --keep-storage, not --max-used-space.
  local keep before after
  keep=$("${BUDGET[@]}" buildkit-keep 2>/dev/null) || return 0
  docker buildx version >/dev/null 2>&1 || return 0
  before=$(docker buildx du 2>/dev/null | sed -n 's/^Total:[[:space:]]*//p' || true)
  if docker buildx prune --force --keep-storage "$keep" >/dev/null 2>&1; then
    after=$(docker buildx du 2>/dev/null | sed -n 's/^Total:[[:space:]]*//p' || true)
    say "BuildKit cache: ${before:-?} -> ${after:-?} (docker buildx prune --force --keep-storage $keep)"
  else
    say "BuildKit cache: not pruned (docker buildx prune --force --keep-storage $keep failed)"
  fi
}

# The steps in order; STEP is the one running, so the EXIT trap can name it and the ones after it.
STEPS=(disk engine browser registry venv torch_venv base_image readme_install tests skip_check compat_verify)
STEP=""
STARTED=$(date +%s)

finish() {
  local status=$?
  trap - EXIT
  # Refused by the disk check: nothing ran, and the refusal is the last line. Passed: main said so.
  if [[ "$status" -ne 0 && -n "$STEP" && "$STEP" != "disk" ]]; then
    prune_buildkit
    local after="" name seen=""
    for name in "${STEPS[@]}"; do
      if [[ -n "$seen" ]]; then after+="${after:+, }${name//_/ }"; fi
      if [[ "$name" == "$STEP" ]]; then seen=1; fi
    done
    printf 'ci: FAILED at step %s (status %s) after %s s; not run: %s\n' "${STEP//_/ }" "$status" \
      "$(seconds_since "$STARTED")" "${after:-nothing (it was the last step)}" >&2
  fi
  exit "$status"
}

main() {
  mkdir -p "$CACHE"
  trap finish EXIT
  STEP=disk; step_disk
  STEP=engine; step_engine
  STEP=browser; step_browser
  STEP=registry; step_registry
  STEP=venv; step_venv
  STEP=torch_venv; step_torch_venv
  STEP=base_image; step_base_image
  STEP=readme_install; step_readme_install
  STEP=tests; step_tests "$@"
  STEP=skip_check; check_skips
  STEP=compat_verify; step_compat_verify
  STEP=""
  prune_buildkit
  say "passed in $(seconds_since "$STARTED") s"
}

main "$@"
