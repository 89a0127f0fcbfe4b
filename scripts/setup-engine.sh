#!/usr/bin/env bash
# Prepare a Debian bookworm machine for stackforge: Docker engine, debootstrap and buildx.
#
# For development and CI machines without a container registry (see README.md, "Set up a fresh
# machine"). Idempotent: every step checks first and does nothing when its work is already done, so it
# is safe (and quick) to run before every CI job. Run as root:  sudo scripts/setup-engine.sh
#
# Steps, one output line each:
#   1. apt-get install docker.io debootstrap      (only the missing ones)
#   2. docker buildx from Debian trixie            (only if `docker buildx version` fails)
#   3. start dockerd --bridge=none --iptables=false (only if `docker info` fails; host networking only)
#   4. check that buildx can build with this engine (FROM scratch: nothing is pulled)
#
# Knobs (environment), mostly for testing on a machine that already runs an engine:
#   DOCKER_HOST                  a unix:// socket other than the default makes dockerd listen there
#   STACKFORGE_DEBIAN_MIRROR     Debian archive for trixie's docker-buildx (default http://deb.debian.org/debian)
#   STACKFORGE_DOCKERD_LOG       dockerd's log file (default /var/log/stackforge-dockerd.log)
#   STACKFORGE_DOCKERD_PIDFILE   dockerd's pid file (default /var/run/docker.pid)
#   STACKFORGE_DOCKERD_ARGS      extra dockerd arguments, e.g. "--data-root /srv/docker"
#   STACKFORGE_ENGINE_WAIT_S     seconds to wait for the engine to answer (default 60)
set -euo pipefail

readonly DEFAULT_SOCKET="unix:///var/run/docker.sock"
readonly MIRROR="${STACKFORGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly DOCKERD_LOG="${STACKFORGE_DOCKERD_LOG:-/var/log/stackforge-dockerd.log}"
readonly DOCKERD_PIDFILE="${STACKFORGE_DOCKERD_PIDFILE:-/var/run/docker.pid}"
readonly WAIT_S="${STACKFORGE_ENGINE_WAIT_S:-60}"
readonly PLUGIN_DIR="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"

SCRATCH=""
cleanup() { if [[ -n "$SCRATCH" ]]; then rm -rf "$SCRATCH"; fi; }
trap cleanup EXIT

say() { printf 'setup-engine: %s\n' "$*"; }
die() { printf 'setup-engine: error: %s\n' "$*" >&2; exit 1; }
scratch_dir() { SCRATCH="$(mktemp -d /tmp/stackforge-setup.XXXXXX)"; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

require_root() {
  [[ "$(id -u)" -eq 0 ]] || die "must run as root (it installs packages and starts dockerd): sudo $0"
}

install_packages() {
  local missing=()
  if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then missing+=(docker.io); fi
  if ! command -v debootstrap >/dev/null && [[ ! -x /usr/sbin/debootstrap ]]; then missing+=(debootstrap); fi
  if [[ ${#missing[@]} -eq 0 ]]; then
    say "packages: docker and debootstrap already installed"
    return
  fi
  local started; started=$(date +%s)
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${missing[@]}" >/dev/null
  say "packages: installed ${missing[*]} in $(seconds_since "$started") s"
}

install_buildx() {
  if docker buildx version >/dev/null 2>&1; then
    say "buildx: already installed ($(docker buildx version | head -n 1))"
    return
  fi
  # bookworm has no docker-buildx; trixie's package is a static Go binary that works here. A private
  # sources list, lists folder and cache keep the host's apt state untouched.
  local started; started=$(date +%s)
  scratch_dir
  mkdir -p "$SCRATCH/lists/partial" "$SCRATCH/cache/archives/partial" "$SCRATCH/deb"
  echo "deb $MIRROR trixie main" > "$SCRATCH/sources.list"
  local apt_opts=(
    -o "Dir::Etc::sourcelist=$SCRATCH/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$SCRATCH/lists" -o "Dir::Cache=$SCRATCH/cache"
    -o "APT::Sandbox::User=root"
  )
  apt-get update -qq "${apt_opts[@]}" >/dev/null || die "buildx: apt-get update against trixie ($MIRROR) failed"
  (cd "$SCRATCH/deb" && apt-get download -qq "${apt_opts[@]}" docker-buildx >/dev/null) \
    || die "buildx: apt-get download docker-buildx (trixie) failed"
  dpkg -x "$SCRATCH"/deb/docker-buildx_*.deb "$SCRATCH/root"
  install -D -m 0755 "$SCRATCH/root/usr/libexec/docker/cli-plugins/docker-buildx" "$PLUGIN_DIR/docker-buildx"
  cleanup; SCRATCH=""
  docker buildx version >/dev/null 2>&1 || die "buildx: installed into $PLUGIN_DIR but 'docker buildx version' fails"
  say "buildx: installed $(docker buildx version | head -n 1) into $PLUGIN_DIR in $(seconds_since "$started") s"
}

engine_answers() { docker info >/dev/null 2>&1; }

dockerd_running() {
  # The pid file is only trusted when it names a live dockerd: pids are reused after a reboot, and a
  # killed dockerd stays a zombie (still named dockerd) until its parent reaps it.
  [[ -s "$DOCKERD_PIDFILE" ]] || return 1
  local pid comm state
  pid="$(cat "$DOCKERD_PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  read -r _ comm state _ 2>/dev/null < "/proc/$pid/stat" || return 1
  [[ "$comm" == "(dockerd)" && "$state" != "Z" && "$state" != "X" ]]
}

engine_zombies() {
  # Pids of dockerd/containerd processes that were killed but not yet reaped by their parent. dockerd
  # takes a zombie containerd named in its pid file for a live one and then waits for it in vain.
  local stat pid comm state
  for stat in /proc/[0-9]*/stat; do
    read -r pid comm state _ 2>/dev/null < "$stat" || continue
    if [[ "$state" == "Z" && ( "$comm" == "(dockerd)" || "$comm" == "(containerd)" ) ]]; then echo "$pid"; fi
  done
}

wait_for_zombies_reaped() {
  local waited=0
  while [[ -n "$(engine_zombies)" ]]; do
    if (( waited >= WAIT_S )); then
      say "engine: warning: killed engine processes not reaped after ${WAIT_S} s: $(engine_zombies | tr '\n' ' ')"
      return
    fi
    sleep 1; waited=$(( waited + 1 ))
  done
}

start_engine() {
  local host="${DOCKER_HOST:-$DEFAULT_SOCKET}"
  if engine_answers; then
    say "engine: already running at $host (server $(docker version --format '{{.Server.Version}}'))"
    return
  fi
  [[ "$host" == unix://* ]] || die "engine: DOCKER_HOST=$host does not answer; start that engine (this script starts local ones only)"
  local started; started=$(date +%s)
  local note="started"
  if dockerd_running; then
    note="waited for the running dockerd (pid $(cat "$DOCKERD_PIDFILE"))"
  else
    wait_for_zombies_reaped
    if [[ -e "$DOCKERD_PIDFILE" ]]; then
      rm -f "$DOCKERD_PIDFILE"
      note="removed stale $DOCKERD_PIDFILE, started"
    fi
    local args=(--bridge=none --iptables=false --pidfile "$DOCKERD_PIDFILE")
    [[ "$host" == "$DEFAULT_SOCKET" ]] || args+=(-H "$host")
    # shellcheck disable=SC2206  # word splitting of the extra arguments is intended
    args+=(${STACKFORGE_DOCKERD_ARGS:-})
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    setsid dockerd "${args[@]}" >>"$DOCKERD_LOG" 2>&1 </dev/null &
    note="$note dockerd (pid $!)"
  fi
  local waited=0
  until engine_answers; do
    if (( waited >= WAIT_S )); then
      tail -n 5 "$DOCKERD_LOG" >&2 || true
      die "engine: no answer at $host after ${WAIT_S} s; see $DOCKERD_LOG"
    fi
    sleep 1; waited=$(( waited + 1 ))
  done
  say "engine: $note, answering at $host after $(seconds_since "$started") s (log $DOCKERD_LOG)"
}

check_buildx_build() {
  # FROM scratch + COPY needs no registry. The builder must use the "docker" driver (the engine's own
  # BuildKit); a docker-container builder would try to pull moby/buildkit.
  local started; started=$(date +%s)
  local builder; builder="$(docker buildx inspect 2>/dev/null | awk '/^Driver:/ {print $2; exit}')"
  [[ "$builder" == "docker" ]] || die "buildx: the current builder uses driver '${builder:-?}', which pulls images; run: docker buildx use default"
  scratch_dir
  printf 'FROM scratch\nCOPY stackforge-check.txt /\n' > "$SCRATCH/Dockerfile"
  echo "stackforge setup check" > "$SCRATCH/stackforge-check.txt"
  local tag="stackforge-setup-check:$$"
  if ! docker buildx build --network host --label io.stackforge.test=1 -t "$tag" "$SCRATCH" \
      >"$SCRATCH/build.log" 2>&1; then
    tail -n 15 "$SCRATCH/build.log" >&2
    die "buildx: a trivial build with this engine failed"
  fi
  docker image inspect "$tag" >/dev/null 2>&1 || die "buildx: the build succeeded but $tag is not in the engine"
  docker image rm "$tag" >/dev/null
  cleanup; SCRATCH=""
  say "buildx: build check passed in $(seconds_since "$started") s (driver docker, --network host)"
}

main() {
  local started; started=$(date +%s)
  require_root
  install_packages
  install_buildx
  start_engine
  check_buildx_build
  say "ready in $(seconds_since "$started") s"
}

main "$@"
