#!/usr/bin/env bash
# The test command (README): prepare the machine, install stackforge, build the base image, run the tests.
# .ci/run calls this script.
#
# For a Debian bookworm machine without GPU and without a container registry (PyPI and Debian's archive
# reachable), run from anywhere as root (or with passwordless sudo):  scripts/test.sh
# Extra arguments go to pytest, e.g.  scripts/test.sh -m "not slow"
# The whole job must fit in 90 minutes on 2 cores; the tests get STACKFORGE_CI_TEST_TIMEOUT (80m).
set -euo pipefail

cd "$(dirname "$0")/.."
readonly TEST_TIMEOUT="${STACKFORGE_CI_TEST_TIMEOUT:-80m}"
readonly VENV=".venv"

say() { printf 'ci: %s\n' "$*"; }
die() { printf 'ci: error: %s\n' "$*" >&2; exit 1; }
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

step_engine() {
  as_root scripts/setup-engine.sh
}

step_browser() {
  # The HTML matrix is checked in headless Chromium (Debian's package; no browser download).
  if ! command -v chromium >/dev/null 2>&1; then
    say "installing chromium (browser test of the HTML matrix)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
      || die "apt-get install chromium failed"
  fi
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
  # The lead wires `stackforge bootstrap-base`; until then the module entry point does the same work.
  if "$VENV/bin/stackforge" bootstrap-base --help >/dev/null 2>&1; then
    as_root "$VENV/bin/stackforge" bootstrap-base
  else
    as_root "$VENV/bin/python" -m stackforge.bootstrap
  fi
  say "base image: ready in $(seconds_since "$started") s"
}

step_tests() {
  local started; started=$(date +%s)
  local status=0
  timeout --signal=TERM --kill-after=60 "$TEST_TIMEOUT" "$VENV/bin/python" -m pytest -q "$@" || status=$?
  say "tests: pytest exited with status $status after $(seconds_since "$started") s"
  case "$status" in
    0) ;;
    5) die "pytest collected no tests (exit status 5): a CI run that tests nothing is a failure" ;;
    124) die "pytest ran past $TEST_TIMEOUT and was stopped" ;;
    *) exit "$status" ;;
  esac
}

main() {
  local started; started=$(date +%s)
  step_engine
  step_browser
  step_venv
  step_base_image
  step_tests "$@"
  say "passed in $(seconds_since "$started") s"
}

main "$@"
