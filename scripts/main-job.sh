#!/usr/bin/env bash
# The main job (README): set up this machine and run `stackforge build --cuda 13.1` on the shipped
# default matrix (matrices/default.yaml). Prints the time and the disk it took.
#
# For a Debian bookworm machine (root or passwordless sudo; no GPU, no container registry needed).
# Extra arguments go to `stackforge build`, e.g.  scripts/main-job.sh -j 2 --resume
set -euo pipefail

cd "$(dirname "$0")/.."
readonly VENV=".venv"

say() { printf 'main-job: %s\n' "$*"; }
die() { printf 'main-job: error: %s\n' "$*" >&2; exit 1; }
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
docker_bytes() { df -B1 --output=used "$(docker info --format '{{.DockerRootDir}}')" | tail -1; }

started=$(date +%s)
as_root scripts/setup-engine.sh

if ! python3 -c "import ensurepip" 2>/dev/null; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check . || die "pip install . failed"
say "$("$VENV/bin/stackforge" --version | head -n 1) installed in $VENV"

# The base image stackforge falls back to when no registry answers: Debian from Debian's packages.
as_root "$VENV/bin/stackforge" bootstrap-base

before=$(docker_bytes)
build_started=$(date +%s)
status=0
# build trusts the CA bundle pip here trusts (a proxy re-signing TLS, say) by itself: it goes in as a
# BuildKit secret, never into a layer; the first line of its output names the path.
"$VENV/bin/stackforge" build --cuda 13.1 "$@" || status=$?
after=$(docker_bytes)
say "build took $(( $(date +%s) - build_started )) s; the whole job $(( $(date +%s) - started )) s"
say "disk used by the engine grew by $(( (after - before) / 1024 / 1024 )) MiB"
# Built images carry their stack's facts as labels (io.stackforge.managed marks only containers).
say "CUDA 13.1 images on this engine:"
docker image ls --filter label=io.stackforge.cuda=13.1 --format '  {{.Repository}}:{{.Tag}}  {{.Size}}'
exit "$status"
