"""The disk budget (stackforge/doctor/disk_budget.py): the one place the test command's and the main job's
disk need live, judged purely here; the scripts' use of it is in test_shell_scripts.py."""

from __future__ import annotations

import subprocess
import sys

from stackforge.doctor.checks import CheckStatus, budget_checks
from stackforge.doctor.disk_budget import (
    GB,
    NEEDS,
    DiskBudget,
    Filesystem,
    Holding,
    buildx_total,
    free_lines,
    parse_size,
    refusal_line,
    reuse_line,
    shortfalls,
    system_df_bytes,
)

HELD = (Holding("stack images", "/var/lib/docker", 24 * GB, "docker image rm $(docker image ls -q --filter "
                "label=io.stackforge.stack.id)"),
        Holding("BuildKit cache", "/var/lib/docker", 11_700_000_000, "docker buildx prune --force"),
        Holding("probe venvs", "/tmp/sf-probe-venvs", 16 * GB, "rm -rf /tmp/sf-probe-venvs"))


def one_disk(free_gb: float, override: int | None = None) -> DiskBudget:
    return DiskBudget((Filesystem("/", int(free_gb * GB), ("engine data root", "temp dir", "checkout")),),
                      "/var/lib/docker", "", HELD, override)


def test_docker_sizes_read_as_bytes():
    assert parse_size("11.7GB") == 11_700_000_000 and parse_size("87B") == 87 and parse_size("1.2kB") == 1200
    assert parse_size("nothing") is None
    assert buildx_total("ID\tRECLAIMABLE\tSIZE\nabc\ttrue\t1GB\nShared:\t0B\nReclaimable:\t1GB\nTotal:\t11.7GB\n") \
        == 11_700_000_000
    assert system_df_bytes("Images\t23.6GB\nContainers\t0B\nLocal Volumes\t0B\nBuild Cache\t11.7GB\n") \
        == 35_300_000_000


def test_one_filesystem_must_hold_the_whole_need():
    test = NEEDS["test"]
    assert shortfalls(one_disk(test.total_gb + 1), test) == []
    short = shortfalls(one_disk(test.total_gb - 1), test)
    assert [s.need_bytes for s in short] == [test.total_gb * GB]


def test_on_separate_filesystems_each_holds_its_part():
    need = NEEDS["main-job"]
    budget = DiskBudget((Filesystem("/var", need.engine_gb * GB, ("engine data root",)),
                         Filesystem("/", 1 * GB, ("temp dir", "checkout"))), "/var/lib/docker", "", HELD)
    short = shortfalls(budget, need)
    assert [(s.filesystem.mount, s.need_bytes) for s in short] == [("/", need.scratch_gb * GB)]


def test_the_refusal_is_one_line_naming_need_free_and_what_stackforge_holds():
    budget = one_disk(20)
    line = refusal_line(NEEDS["test"], budget, shortfalls(budget, NEEDS["test"]))
    assert line == ("not enough disk: scripts/test.sh needs 61.0 GB free on / and 20.0 GB is (docs/measurements.md); "
                    "stackforge holds there: stack images 24.0 GB, BuildKit cache 11.7 GB, probe venvs 16.0 GB")
    assert "\n" not in line and len(line) <= 200
    assert [line.rsplit(": ", 1)[1] for line in free_lines(budget)] == [h.free_command for h in HELD]


def test_the_override_replaces_the_need():
    budget = one_disk(20, override=10)
    assert shortfalls(budget, NEEDS["main-job"]) == []
    line = refusal_line(NEEDS["main-job"], one_disk(5, override=10), shortfalls(one_disk(5, override=10),
                                                                              NEEDS["main-job"]))
    assert "needs 10.0 GB free on / and 5.0 GB is (STACKFORGE_DISK_NEED_GB=10)" in line


def test_held_stack_images_name_the_override_for_a_run_that_reuses_them():
    line = reuse_line(one_disk(20))
    assert line == ("the need counts the stack images here (24.0 GB) as built anew; a run that reuses them "
                    "(--resume, stacks unchanged) may set STACKFORGE_DISK_NEED_GB=N to the GB it adds")
    assert len("main-job: " + line) <= 200
    assert reuse_line(one_disk(20, override=10)) == ""
    no_images = DiskBudget(one_disk(20).filesystems, "/var/lib/docker", "", HELD[1:])
    assert reuse_line(no_images) == ""


def test_doctor_shows_the_same_figures():
    (check,) = budget_checks(one_disk(45))
    assert check.status is CheckStatus.WARN and not check.required      # enough for the main job, not the tests
    assert "test needs 61.0 GB on / (short); main-job needs 38.0 GB on / (enough)" in check.summary
    assert "stackforge holds: stack images 24.0 GB, BuildKit cache 11.7 GB, probe venvs 16.0 GB" in check.summary
    assert "docker buildx prune --force" in check.hint and "rm -rf /tmp/sf-probe-venvs" in check.hint
    assert check.facts["needs_gb"]["test"]["engine"] == NEEDS["test"].engine_gb
    assert budget_checks(None) == ()


def test_a_bad_override_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "stackforge.doctor.disk_budget", "check", "test"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": "/usr/bin:/bin", "STACKFORGE_DISK_NEED_GB": "lots"})
    assert done.returncode == 2 and done.stdout == "error: STACKFORGE_DISK_NEED_GB='lots' is not a whole number of GB\n"
