#!/usr/bin/env bash
# The main job (README): answer "what do we gain and lose going from CUDA 12.8 to 13.1 on the default
# target?" end to end on this machine, from the shipped default matrix (matrices/default.yaml):
#
#   install     install stackforge into .venv
#   answer      the first answer, within a minute: the upgrade report 12.8 -> 13.1 from the pinned
#               releases' own code, read from their wheels on the index (upgrade --read-wheels; no image,
#               no GPU); the images and probes below confirm it, and the end says what they changed
#   engine      start a Docker engine + buildx (scripts/setup-engine.sh)
#   base        create the registry-free Debian base image (stackforge bootstrap-base)
#   build-13.1  stackforge build --cuda 13.1 (the headline command)
#   build-12.8  build the CUDA 12.8 stacks that can be built here; a stack whose base image needs a
#               registry that does not answer (the devel flavour's nvidia/cuda image) is skipped and
#               said so: its cells stay predictions
#   probe       the gate tier for the default target, on every stack built above (a rerun on the
#               same images, target and probe code reuses the gate run it recorded; MAIN_JOB_PROBE=always)
#   wheel       the wheel tier for the same stacks: their FlashInfer / SGLang releases' own code read
#               from the index's wheels (features no gate probe decides: PCIe IPC all-reduce, MNNVL...)
#   matrix      out/matrix.html (from the gate run and the wheel run)
#   deadends    out/deadends.md (also printed)
#   upgrade     the upgrade report 12.8 -> 13.1 (stackforge upgrade; also printed)
#   pick        the best image with its evidence level (out/pick.txt)
#   confirm     what the images and probes changed against the first answer (out/first-answer.json)
#
# Before anything it checks the disk (stackforge/doctor/disk_budget.py holds the need, measured in
# docs/measurements.md; STACKFORGE_DISK_NEED_GB=N replaces it) and refuses in one line when the disk
# cannot hold the job. Ends with where each file is, how long each stage took (also in out/main-job.tsv:
# stage, seconds, status, note), how much the engine's own usage grew (docker system df) and the commands
# that remove what it built. Exits non-zero as soon as a stage fails (the summary is still printed). No
# line it prints, its own or stackforge's, is over 200 characters (MAX_LINE): longer ones are wrapped.
#
# For a Debian bookworm machine (root or passwordless sudo; no GPU, no container registry needed).
# Extra arguments go to both `stackforge build` calls, e.g.  scripts/main-job.sh -j 2 --resume
set -euo pipefail

cd "$(dirname "$0")/.."
readonly VENV=".venv"
readonly SF="$VENV/bin/stackforge"
readonly OUT="out"
readonly RESULTS="results"
readonly TARGET="rtx-pro-6000-x8-pcie"
readonly FROM_CUDA="12.8"
readonly TO_CUDA="13.1"
readonly STAGES_TSV="$OUT/main-job.tsv"
readonly FIRST_ANSWER="$OUT/first-answer.json"
readonly PROBE_INPUTS="$OUT/probe-inputs.txt"
# What the picked image must have: torch kernels for the target's arch (without them nothing runs);
# pick's exit status then says how that was decided: 0 measured on the GPU, 5 by a gate probe only.
readonly REQUIRE="torch-kernels"
readonly BUDGET=(python3 -m stackforge.doctor.disk_budget)   # the disk need, in one place
readonly MAX_LINE=200
# stackforge fits its tables to COLUMNS (the build summary among them) and, unbuffered, prints each line
# as it happens although its output goes through wrap's pipe.
if [[ "${COLUMNS:-}" =~ ^[1-9][0-9]*$ ]] && (( COLUMNS < MAX_LINE )); then export COLUMNS; else export COLUMNS=$MAX_LINE; fi
export PYTHONUNBUFFERED=1
# The "current as of: ..." line every report command prints on stderr: kept here, printed once at the end.
readonly CURRENCY="$OUT/currency.txt"

# wrap: each line over MAX_LINE characters folded at a space where there is one in its second half
# (continuations indented). Characters, not bytes: a box-drawing or check-mark character is 3 bytes in
# UTF-8 and never split. Each line is passed on as it arrives.
wrap() {
  python3 -c '
import sys
sys.stdin.reconfigure(errors="surrogateescape")
sys.stdout.reconfigure(errors="surrogateescape", line_buffering=True)
limit = int(sys.argv[1])
for line in sys.stdin:
    rest, lead = line.rstrip("\n"), ""
    while len(lead) + len(rest) > limit:
        room = limit - len(lead)
        space = rest.rfind(" ", room // 2, room)
        cut = space + 1 if space >= 0 else room
        print(lead + rest[:cut])
        rest, lead = rest[cut:], "    "
    print(lead + rest)
' "$MAX_LINE"
}
# wrapped CMD...: CMD with its stdout and its stderr each wrapped, each on its own stream.
wrapped() {
  { "$@" 2>&1 1>&3 3>&- | wrap >&2; } 3>&1 | wrap
}
say() { printf 'main-job: %s\n' "$*" | wrap; }
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
# The engine's own usage (images, containers, volumes, build cache: docker system df), not the filesystem's.
engine_bytes() { "${BUDGET[@]}" engine-bytes 2>/dev/null || true; }
gb() { awk -v b="$1" 'BEGIN { printf "%.1f GB", b / 1e9 }'; }

# sf ARGS: stackforge, its "current as of" line kept for the end instead of printed by every command.
sf() {
  { "$SF" "$@" 2>&1 1>&3 3>&- | keep_currency | wrap >&2; } 3>&1 | wrap
}
keep_currency() {
  local line
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" == "current as of: "* ]]; then printf '%s\n' "$line" >"$CURRENCY"; else printf '%s\n' "$line"; fi
  done
}

STAGE_NAMES=()
STAGE_SECONDS=()
STAGE_STATUS=()
STAGE_NOTES=()
FILES=()
JOB_STARTED=$(date +%s)
ENGINE_BEFORE=""

# stage NAME WHAT COMMAND...: run one stage under errexit and record its seconds; when it fails, the
# EXIT trap records it as failed (CURRENT_STAGE) and the job ends with its exit status. A stage may add
# to its note (CURRENT_NOTE) what the summary should say about it.
CURRENT_STAGE=""
CURRENT_NOTE=""
CURRENT_STARTED=0
stage() {
  CURRENT_STAGE="$1"; CURRENT_NOTE="$2"; CURRENT_STARTED=$(date +%s); shift 2
  say "== $CURRENT_STAGE: $CURRENT_NOTE"
  "$@"
  record_stage "$CURRENT_STAGE" "$(( $(date +%s) - CURRENT_STARTED ))" ok "$CURRENT_NOTE"
  CURRENT_STAGE=""
}

record_stage() {
  STAGE_NAMES+=("$1"); STAGE_SECONDS+=("$2"); STAGE_STATUS+=("$3"); STAGE_NOTES+=("$4")
}

summary() {
  local status=$? i
  if [[ -n "$CURRENT_STAGE" ]]; then
    record_stage "$CURRENT_STAGE" "$(( $(date +%s) - CURRENT_STARTED ))" "failed ($status)" "$CURRENT_NOTE"
    say "stage $CURRENT_STAGE failed (exit $status)"
  fi
  mkdir -p "$OUT"
  : >"$STAGES_TSV"
  say ""
  say "stages (seconds):"
  for i in "${!STAGE_NAMES[@]}"; do
    printf '  %-11s %6s s  %-10s %s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECONDS[$i]}" "${STAGE_STATUS[$i]}" \
      "${STAGE_NOTES[$i]}" | wrap
    printf '%s\t%s\t%s\t%s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECONDS[$i]}" "${STAGE_STATUS[$i]}" "${STAGE_NOTES[$i]}" \
      >>"$STAGES_TSV"
  done
  printf '  %-11s %6s s\n' "total" "$(( $(date +%s) - JOB_STARTED ))"
  printf 'total\t%s\t%s\t\n' "$(( $(date +%s) - JOB_STARTED ))" "$([[ $status -eq 0 ]] && echo ok || echo "failed ($status)")" \
    >>"$STAGES_TSV"
  if [[ -f "$CURRENCY" ]]; then say "$(cat "$CURRENCY")"; fi
  local after; after=$(engine_bytes)
  if [[ -n "$ENGINE_BEFORE" && -n "$after" ]]; then
    say "the engine's own usage (docker system df: images, containers, volumes, build cache) went from" \
        "$(gb "$ENGINE_BEFORE") to $(gb "$after") during the builds"
  fi
  say "files (in $PWD):"
  for i in "${FILES[@]}" "$STAGES_TSV"; do printf '  %s\n' "$i" | wrap; done
  say_removal
  exit "$status"
}

# say_removal: the commands that remove what this job built (its stacks' images, by label) and the
# BuildKit cache; the base image is small and every build uses it.
say_removal() {
  local id refs=()
  [[ ${#BUILT_IDS[@]} -gt 0 ]] || return 0
  for id in "${BUILT_IDS[@]}"; do
    while read -r ref; do [[ -n "$ref" ]] && refs+=("$ref"); done \
      < <(docker image ls --filter "label=io.stackforge.stack.id=$id" --format '{{.Repository}}:{{.Tag}}' 2>/dev/null || true)
  done
  [[ ${#refs[@]} -gt 0 ]] || return 0
  say "to remove the ${#refs[@]} image(s) this job built, and then the engine's BuildKit cache:"
  for id in "${refs[@]}"; do printf '  docker image rm %s\n' "$id" | wrap; done
  printf '  docker buildx prune --force\n'
}
trap summary EXIT
# A signal ends the job with its own status (130 Ctrl-C, 143 TERM, 129 HUP), so the summary marks the stage
# it cut short as failed with that status and the job never exits 0 when interrupted.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# kept_stacks CUDA: "stack-id flavour base-image" per kept stack of the default matrix with that toolkit.
kept_stacks() {
  "$SF" plan --cuda "$1" --target "$TARGET" --json | "$VENV/bin/python" -c '
import json, sys
for cell in json.load(sys.stdin)["cells"]:
    if cell["status"] == "kept":
        print(cell["stack_id"], cell["stack"]["flavour"], cell["derived"]["base_image"])'
}

# can_build_here FLAVOUR BASE: is the base image here, or can it be had? The wheels flavour on
# Debian 12 builds from the bootstrapped base when no registry answers (stackforge build says so).
can_build_here() {
  local flavour="$1" base="$2"
  [[ "$flavour" == "wheels" ]] && return 0
  docker image inspect "$base" >/dev/null 2>&1 && return 0
  timeout 60 docker manifest inspect "$base" >/dev/null 2>&1
}

BUILT_IDS=()
SKIPPED_IDS=()

build_family() {
  local cuda="$1" stacks id flavour base wanted=() only=()
  shift
  stacks=$(kept_stacks "$cuda")
  while read -r id flavour base; do
    if can_build_here "$flavour" "$base"; then
      wanted+=("$id")
      only+=(--only "$id")
    else
      say "skipped $id ($flavour flavour): its base image $base is not on this engine and no registry" \
          "answers; its cells stay predictions (a machine with a registry builds it)"
      SKIPPED_IDS+=("$id")
    fi
  done <<<"$stacks"
  if [[ ${#SKIPPED_IDS[@]} -gt 0 ]]; then
    CURRENT_NOTE+="; skipped, no registry: ${SKIPPED_IDS[*]}"
  fi
  if [[ ${#wanted[@]} -eq 0 ]]; then
    say "no CUDA $cuda stack can be built here"
    return 0
  fi
  wrapped "$SF" build "${only[@]}" "$@"
  BUILT_IDS+=("${wanted[@]}")
}

build_headline() {
  local stacks
  stacks=$(kept_stacks "$TO_CUDA")
  # build trusts the CA bundle pip here trusts (a proxy re-signing TLS, say) by itself: it goes in as a
  # BuildKit secret, never into a layer; the first line of its output names the path.
  wrapped "$SF" build --cuda "$TO_CUDA" "$@"
  local id
  while read -r id _; do BUILT_IDS+=("$id"); done <<<"$stacks"
}

# Gate verdicts are a function of the image, the target and the probe code (gate probes get no GPU),
# so a rerun on the same images reuses the gate run recorded in PROBE_INPUTS when all three are
# unchanged; MAIN_JOB_PROBE=always probes again anyway. Sets GATE_RUN.
GATE_RUN=""
# The runs the reports read: this job's gate run and wheel run, by name (set by probe_wheels).
REPORT_RUNS=()
probe_gate() {
  local only=() id run inputs
  inputs=$(probe_inputs)
  run=$(sed -n 's/^run //p' "$PROBE_INPUTS" 2>/dev/null || true)
  if [[ "${MAIN_JOB_PROBE:-auto}" != "always" && -n "$run" && -f "$run/run.json" ]] \
     && [[ "$(cat "$PROBE_INPUTS")" == "$inputs"$'\n'"run $run" ]] && grep -q '"finished_at": "' "$run/run.json"; then
    say "gate results reused from $run: the same images (ids), target and probe code as when they were recorded" \
        "(MAIN_JOB_PROBE=always probes again)"
    CURRENT_NOTE+="; reused $run"
    FILES+=("$run  (the gate records used)")
    GATE_RUN="$run"
    return 0
  fi
  rm -f "$PROBE_INPUTS"
  for id in "${BUILT_IDS[@]}"; do only+=(--only "$id"); done
  # --builds: the images this job's build records name, never another image that carries the label.
  wrapped "$SF" probe --tier gate --target "$TARGET" "${only[@]}" --builds "$OUT" --results "$RESULTS"
  GATE_RUN=$(newest_run)
  printf '%s\nrun %s\n' "$inputs" "$GATE_RUN" >"$PROBE_INPUTS"
  FILES+=("$GATE_RUN  (this run's gate records)")
}

# The wheel tier reads the pinned releases' own code from the wheels on the index (a few seconds once
# the wheel cache holds them): the features no gate probe decides get a measured verdict too. Sets REPORT_RUNS.
probe_wheels() {
  local only=() id wheel_run
  for id in "${BUILT_IDS[@]}"; do only+=(--only "$id"); done
  wrapped "$SF" probe --tier wheel --target "$TARGET" "${only[@]}" --results "$RESULTS"
  wheel_run=$(newest_run)
  FILES+=("$wheel_run  (this run's wheel records)")
  REPORT_RUNS=(--run "$(basename "$GATE_RUN")" --run "$(basename "$wheel_run")")
}

# probe_inputs: what the gate verdicts depend on: the target, each stack's local images (ids; probe runs
# the newest), and a hash of the installed probe code (scripts, catalog, runner).
probe_inputs() {
  local id
  echo "target $TARGET"
  for id in "${BUILT_IDS[@]}"; do
    echo "images $id $(docker image ls -q --no-trunc --filter "label=io.stackforge.stack.id=$id" | tr '\n' ' ')"
  done
  "$VENV/bin/python" -c '
import hashlib, pathlib, stackforge.probes as probes
root = pathlib.Path(probes.__file__).parent
digest = hashlib.sha256()
for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
    digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
print("probe-code", digest.hexdigest())'
}

# newest_run: the newest run folder under $RESULTS (probe writes one per run).
newest_run() {
  local newest="" dir
  for dir in "$RESULTS"/*/; do
    [[ -d "$dir" ]] || continue   # no run yet: the pattern itself
    if [[ -z "$newest" || "$dir" -nt "$newest" ]]; then newest="$dir"; fi
  done
  printf '%s\n' "$newest"
}

write_matrix() {
  sf matrix --results "$RESULTS" "${REPORT_RUNS[@]}" --target "$TARGET" --format html --out "$OUT/matrix.html"
  FILES+=("$OUT/matrix.html")
}

# The reports go to files in full (md, html) and to the terminal one screen each (--format text).
print_deadends() {
  local args=(--results "$RESULTS" "${REPORT_RUNS[@]}" --target "$TARGET")
  sf deadends "${args[@]}" --format md --out "$OUT/deadends.md"
  sf deadends "${args[@]}" | wrap
  FILES+=("$OUT/deadends.md")
}

print_upgrade() {
  local args=(--from-cuda "$FROM_CUDA" --to-cuda "$TO_CUDA" --target "$TARGET" --results "$RESULTS" "${REPORT_RUNS[@]}"
              --builds "$OUT")
  sf upgrade "${args[@]}" --format md --out "$OUT/upgrade.md"
  sf upgrade "${args[@]}" --format html --out "$OUT/upgrade.html"
  sf upgrade "${args[@]}" --format json --out "$OUT/upgrade.json"   # which stacks it picked (confirm reads it)
  sf upgrade "${args[@]}" | wrap
  FILES+=("$OUT/upgrade.md" "$OUT/upgrade.html" "$OUT/upgrade.json")
}

pick_image() {
  local status=0
  sf pick --results "$RESULTS" "${REPORT_RUNS[@]}" --target "$TARGET" --require "$REQUIRE" >"$OUT/pick.txt" || status=$?
  wrap <"$OUT/pick.txt"
  FILES+=("$OUT/pick.txt")
  case "$status" in
    0) say "evidence: $REQUIRE measured by a runtime probe on a GPU of the target" ;;
    5) say "evidence: gate only ($REQUIRE decided inside the image without a GPU; no runtime measurement)" ;;
    *) return "$status" ;;
  esac
}

# first_answer: the upgrade report from the wheels alone (seconds), printed before any image work.
first_answer() {
  mkdir -p "$OUT"
  sf upgrade --from-cuda "$FROM_CUDA" --to-cuda "$TO_CUDA" --target "$TARGET" --results "$RESULTS" \
    --read-wheels --format json --out "$FIRST_ANSWER"
  "$VENV/bin/python" - "$FIRST_ANSWER" <<'PY' | wrap
import json, sys
report = json.load(open(sys.argv[1]))
s = report["summary"]
print(f"main-job: first answer compares {report['from']['stack_id']} -> {report['to']['stack_id']}")
built = f"{s['built']} built, " if s.get("built") else ""
flavour = f", {s['flavour']} the flavours' (not the upgrade's)" if s.get("flavour") else ""
print(f"main-job: first answer (the releases' code, read from their wheels; no image yet): {s['gained']} gained, "
      f"{built}{s['admitted']} admitted by the code, {s['lost']} lost, {s['unchanged']} unchanged, {s['undecided']} "
      f"undecided, {s['n/a']} n/a{flavour}; driver floor {s['driver_floor']}; {len(report['dead_ends_after'])} dead "
      "end(s) remain")
for feature in report["features"]:
    if feature["change"] in ("gained", "built", "admitted", "lost", "flavour"):
        print(f"main-job:   {feature['change']:<8} {feature['feature']}: {feature['to']['reason'][:100]}")
print("main-job: the images and probes that follow confirm it; the end says what they changed")
PY
  FILES+=("$FIRST_ANSWER  (the first answer, from the wheels)")
}

# confirm: what the images and probes changed against the first answer, feature by feature, for the
# same FROM and TO stacks as the first answer (named by id: --from-cuda / --to-cuda pick the best stack
# of each family from what was measured, which may be another stack than the one the wheels answered for).
confirm() {
  local final="$OUT/confirm.json" from to
  read -r from to < <("$VENV/bin/python" -c '
import json, sys
report = json.load(open(sys.argv[1]))
print(report["from"]["stack_id"], report["to"]["stack_id"])' "$FIRST_ANSWER")
  sf upgrade "$from" "$to" --target "$TARGET" --results "$RESULTS" "${REPORT_RUNS[@]}" --builds "$OUT" \
    --format json --out "$final"
  FILES+=("$final  (the first answer's stacks, with the images' evidence)")
  "$VENV/bin/python" - "$FIRST_ANSWER" "$final" "$OUT/upgrade.json" <<'PY' | wrap
import json, sys
first, final, report = (json.load(open(path)) for path in sys.argv[1:4])
pair = lambda r: (r["from"]["stack_id"], r["to"]["stack_id"])
print(f"main-job: compared, as the first answer: {pair(first)[0]} -> {pair(first)[1]}")
if pair(report) != pair(first):
    side = "from" if pair(report)[0] != pair(first)[0] else "to"
    print(f"main-job: the upgrade report above compared {pair(report)[0]} -> {pair(report)[1]} instead: with the images' "
          f"evidence --{side}-cuda took {report[side]['stack_id']} ({report[side].get('why') or 'no reason recorded'})")
before = {f["feature"]: f for f in first["features"]}
moved = [(f, before.get(f["feature"])) for f in final["features"]
         if before.get(f["feature"]) is None or (before[f["feature"]]["change"], before[f["feature"]]["to"]["status"])
         != (f["change"], f["to"]["status"])]
if not moved:
    print("main-job: the images changed nothing in the first answer")
for f, old in moved:
    was = f"{old['change']} ({old['to']['status']}, {old['to']['evidence']})" if old else "absent"
    print(f"main-job: images changed {f['feature']}: {was} -> {f['change']} ({f['to']['status']}, {f['to']['evidence']})")
PY
}

install() {
  if ! python3 -c "import ensurepip" 2>/dev/null; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check .
  say "$("$SF" --version | head -n 1) installed in $VENV"
}
# The disk first: a job that fills it fails in its second build, twenty minutes in.
budget_status=0
"${BUDGET[@]}" check main-job | sed 's/^/main-job: /' | wrap || budget_status=${PIPESTATUS[0]}
case "$budget_status" in
  0) ;;
  3) trap - EXIT; exit 1 ;;   # it printed the commands that free what stackforge holds, then the refusal
  *) trap - EXIT; say "error: the disk check (${BUDGET[*]} check main-job) could not run (status $budget_status)"; exit 1 ;;
esac
mkdir -p "$OUT"
rm -f "$CURRENCY"
stage install "pip install . into $VENV" install
stage answer "the upgrade report from the wheels (upgrade --read-wheels), before any image" first_answer
stage engine "Docker engine and buildx (scripts/setup-engine.sh)" as_root scripts/setup-engine.sh
# The base image stackforge falls back to when no registry answers: Debian from Debian's packages.
stage base "stackforge bootstrap-base (Debian base image for registry-free builds)" as_root "$SF" bootstrap-base
ENGINE_BEFORE=$(engine_bytes)
mkdir -p "$OUT"
stage "build-$TO_CUDA" "stackforge build --cuda $TO_CUDA" build_headline "$@"
stage "build-$FROM_CUDA" "the CUDA $FROM_CUDA stacks this machine can build" build_family "$FROM_CUDA" "$@"
FILES+=("$OUT/builds/  (build records)" "$OUT/logs/  (build logs)")
say "images of the stacks built here:"
docker image ls --filter label=io.stackforge.stack.id --format '  {{.Repository}}:{{.Tag}}  {{.Size}}' \
  | grep -F -f <(printf '%s\n' "${BUILT_IDS[@]}") | wrap || say "  (none)"
stage probe "gate probes for $TARGET" probe_gate
stage wheel "wheel tier for $TARGET (the releases' code, from the index)" probe_wheels
stage matrix "stackforge matrix --format html" write_matrix
stage deadends "stackforge deadends" print_deadends
stage upgrade "stackforge upgrade --from-cuda $FROM_CUDA --to-cuda $TO_CUDA" print_upgrade
stage pick "stackforge pick --require $REQUIRE" pick_image
stage confirm "what the images changed against the first answer" confirm
