"""Generate the nightly GitHub Actions workflow that runs a matrix file, sharded, and publishes the
compatibility matrix.

Pure: :func:`write_workflow` turns a :class:`WorkflowConfig` into YAML text, byte for byte the same
for the same config (a golden test and the repository's own committed workflow depend on that).
:func:`ci_fan_out` turns a plan (``stackforge plan --json``) into the jobs the workflow fans out over
(GitHub calls that list a job "matrix"; here it is the fan-out); the workflow's ``plan`` job calls it through ``stackforge ci shards``.

The workflow, job by job::

    watch     (CPU)  stackforge watch (what the index uploaded since the last run, read in the wheels;
                     index pages asked conditionally, so an idle poll moves headers, not pages) and,
                     nightly, stackforge compat verify; the report is the job summary and an artifact.
                     The watch schedule (every 10 minutes) runs this job and the next alone.
    propose   (CPU)  on news: one branch per change set (watch/<hash>) with the proposed patches and
                     the lock update, and one pull request for it whose body is the report (opened, or
                     updated when open); then the watch state is saved on the stackforge-watch-state
                     branch (never only in a cache). The only job that may write (contents, pull-requests).
    plan      (CPU)  stackforge plan --json (on a lock re-resolved first, when the matrix follows the
                     index); which shards have work (nightly: only the stacks the previous night's plan
                     lacks or planned with other inputs; a manual run: all); which GPU jobs exist
    build     (CPU)  one job per shard: build and push to the registry
    gate      (CPU)  one job per shard: gate-tier probes in the pushed images (no GPU needed)
    runtime   (GPU)  one job per arch label x target x shard on self-hosted runners
    bench     (GPU)  the same fan-out, after the runtime probes
    report    (CPU)  merge every shard's results, render the matrix, diff against the last run
    publish   (CPU)  deploy the matrix to GitHub Pages
    verdict   (CPU)  fail the run when the diff found regressions (after publishing them)

Registry credentials only ever reach ``docker/login-action`` (from ``secrets``); no step echoes a
secret or writes one into a file that is uploaded.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stackforge.core.data import DATA_FOLDERS, data_dir, resolve_matrix_path
from stackforge.core.errors import SpecError, StackforgeError, UnsafeValueError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.shard import MAX_SHARDS, Shard, nonempty_shards
from stackforge.core.versions import compact
from stackforge.edges.registry import Repository
from stackforge.plan.matrix_file import load_matrix
from stackforge.plan.planner import Plan

#: Every action the workflow uses, pinned by major version (all run on Node 24).
ACTIONS = {
    "checkout": "actions/checkout@v6",
    "setup-python": "actions/setup-python@v6",
    "upload-artifact": "actions/upload-artifact@v7",
    "download-artifact": "actions/download-artifact@v8",
    "upload-pages-artifact": "actions/upload-pages-artifact@v5",
    "deploy-pages": "actions/deploy-pages@v5",
    "login": "docker/login-action@v4",
    "setup-buildx": "docker/setup-buildx-action@v4",
    "cache": "actions/cache@v5",
}

DEFAULT_MATRIX = "matrices/default.yaml"
DEFAULT_SHARDS = 4
# 03:17 UTC: off the hour, when GitHub's scheduler is least loaded and cron runs start on time.
DEFAULT_CRON = "17 3 * * *"
# Every 10 minutes: the worst case from an upload to its pull request is the interval, the job's start
# and install (~2 minutes), the read (under a minute) and the pull request (seconds): under 15 minutes
# (benchmarks/release_to_verdict.py prints the estimate). An idle poll is one conditional request per
# watched package (a 304 when nothing changed).
DEFAULT_WATCH_CRON = "*/10 * * * *"
#: The branch that holds the watch state (one commit, replaced each save): no cache eviction can lose it.
STATE_BRANCH = "stackforge-watch-state"
DEFAULT_RUNNER = "ubuntu-latest"
DEFAULT_PYTHON = "3.12"
DEFAULT_WORKFLOW_PATH = ".github/workflows/stackforge-nightly.yml"
#: The workflow's own checkout: stackforge's repository or a fork of it. PyPI's "stackforge" is another
#: project; elsewhere pass --install git+https://<host>/<owner>/stackforge@<tag>.
DEFAULT_INSTALL = "."
#: Used when no --registry is given: the repository's own GitHub Container Registry package.
GHCR_OF_REPOSITORY = "ghcr.io/${{ github.repository }}"
#: Secrets a non-GHCR registry login reads (documented in docs/scale-out.md).
USERNAME_SECRET = "STACKFORGE_REGISTRY_USERNAME"
PASSWORD_SECRET = "STACKFORGE_REGISTRY_PASSWORD"
PAGES_ARTIFACT = "stackforge-matrix"

# Minutes per job. A full SGLang image builds in about 8 minutes on a fast machine and can take an hour
# on a 4-core hosted runner; hosted runners stop any job at 6 hours.
TIMEOUTS = {"watch": 30, "propose": 15, "plan": 15, "build": 300, "gate": 120, "runtime": 180, "bench": 240, "report": 30, "publish": 15,
            "verdict": 5}

_GPU_LABEL = re.compile(r"sm_[0-9]{2,3}[af]?")
_RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_MATRIX_PATH = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._/-]{0,199}")
_OUT_PATH = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/-]{0,399}")
_INSTALL_SPEC = re.compile(r"[A-Za-z0-9.][A-Za-z0-9._=<>!~,\[\]+@:/-]{0,299}")
_CRON_FIELD = re.compile(r"[0-9*/,-]+")
_PYTHON = re.compile(r"3\.[0-9]{1,2}")


@dataclass(frozen=True, slots=True)
class WorkflowConfig:
    """What the generated workflow runs, and where.

    Attributes:
        matrix: matrix file (relative to the repository root) or shipped matrix name.
        gpu_labels: arch labels of self-hosted GPU runners (``sm_120``); each gets runtime and bench jobs
            for the matrix targets of that arch. Empty: CPU-only (build + gate).
        registry: ``host/path`` images are pushed to; ``None`` is the repository's GHCR package.
        shards: how many shards build, gate, runtime and bench jobs split the matrix into.
        cron: when the nightly run starts (UTC, five fields).
        runner: label of the CPU runners (GitHub-hosted by default).
        install: what ``pip install`` installs on the runners: ``.`` (the default) is the workflow's own
            checkout, i.e. stackforge's repository or a fork; a ``git+https://...@<tag>`` URL elsewhere.
        python: Python version set up on the runners.
        workflow_path: where the file goes; its name is how the report job finds the previous run.
    """

    matrix: str = DEFAULT_MATRIX
    gpu_labels: tuple[str, ...] = ()
    registry: str | None = None
    shards: int = DEFAULT_SHARDS
    cron: str = DEFAULT_CRON
    runner: str = DEFAULT_RUNNER
    install: str = DEFAULT_INSTALL
    python: str = DEFAULT_PYTHON
    workflow_path: str = DEFAULT_WORKFLOW_PATH
    watch_cron: str = DEFAULT_WATCH_CRON

    def __post_init__(self) -> None:
        _check(_MATRIX_PATH, self.matrix, "--matrix", "a relative path such as matrices/default.yaml")
        if self.matrix.startswith("/") or ".." in self.matrix.split("/"):
            raise UnsafeValueError(f"--matrix {self.matrix!r} must be relative to the repository root")
        for label in self.gpu_labels:
            _check(_GPU_LABEL, label, "--gpu-label", "an arch label such as sm_120 or sm_90")
        if len(set(self.gpu_labels)) != len(self.gpu_labels):
            raise SpecError(f"--gpu-label values repeat: {', '.join(self.gpu_labels)}")
        if self.registry is not None:
            Repository.parse(self.registry)
        if not 1 <= self.shards <= MAX_SHARDS:
            raise SpecError(f"--shards must be between 1 and {MAX_SHARDS}, got {self.shards}")
        for option, cron in (("--cron", self.cron), ("--watch-cron", self.watch_cron)):
            fields = cron.split(" ")
            if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
                raise SpecError(f"{option} {cron!r} is not five cron fields separated by single spaces")
        if self.cron == self.watch_cron:
            raise SpecError("--watch-cron must differ from --cron: the schedule tells the two runs apart")
        _check(_RUNNER_LABEL, self.runner, "--runner", "a runner label such as ubuntu-latest")
        _check(_INSTALL_SPEC, self.install, "--install",
               "a pip requirement such as git+https://github.com/<owner>/stackforge@v0.1.0, or .")
        _check(_PYTHON, self.python, "--python", "a version such as 3.12")
        _check(_OUT_PATH, self.workflow_path, "--out", f"a path such as {DEFAULT_WORKFLOW_PATH}")

    @property
    def nightly(self) -> str:
        """The condition of the nightly jobs: a manual run, or the nightly schedule (not the 10-minute watch)."""
        return f"github.event_name != 'schedule' || github.event.schedule == '{self.cron}'"

    @property
    def registry_ref(self) -> str:
        """The registry as the workflow spells it (may contain a GitHub expression)."""
        return self.registry or GHCR_OF_REPOSITORY

    @property
    def registry_host(self) -> str:
        return Repository.parse(self.registry).host if self.registry else "ghcr.io"

    @property
    def workflow_file(self) -> str:
        return self.workflow_path.rpartition("/")[2]

    def command_line(self) -> str:
        """The canonical ``stackforge ci github`` call that regenerates exactly this workflow."""
        parts = ["stackforge", "ci", "github", "--matrix", self.matrix]
        for label in self.gpu_labels:
            parts += ["--gpu-label", label]
        if self.registry:
            parts += ["--registry", self.registry]
        parts += ["--shards", str(self.shards)]
        if self.cron != DEFAULT_CRON:
            parts += ["--cron", self.cron]
        if self.watch_cron != DEFAULT_WATCH_CRON:
            parts += ["--watch-cron", self.watch_cron]
        if self.runner != DEFAULT_RUNNER:
            parts += ["--runner", self.runner]
        parts += ["--install", self.install]
        if self.python != DEFAULT_PYTHON:
            parts += ["--python", self.python]
        return shlex.join(parts + ["--out", self.workflow_path])


def _check(pattern: re.Pattern[str], value: str, option: str, expected: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UnsafeValueError(f"{option} {value!r} is not {expected}")


# ---------------------------------------------------------------------------------------------- steps


def _checkout() -> dict[str, Any]:
    return {"uses": ACTIONS["checkout"], "with": {"persist-credentials": False}}


def _setup_python(config: WorkflowConfig) -> dict[str, Any]:
    return {"uses": ACTIONS["setup-python"], "with": {"python-version": config.python}}


def _install(config: WorkflowConfig) -> dict[str, Any]:
    return {"name": "Install stackforge",
            "run": f"python -m pip install --upgrade pip\npython -m pip install '{config.install}'\n"}


def _prepare(config: WorkflowConfig) -> list[dict[str, Any]]:
    return [_checkout(), _setup_python(config), _install(config)]


def _free_disk() -> dict[str, Any]:
    # Hosted runners start with ~14 GB free; an SGLang image is 7-11 GB plus build cache. The
    # preinstalled SDKs below are unused here. Never on self-hosted machines: they are someone's box.
    return {"name": "Free disk space (GitHub-hosted runners only)",
            "if": "runner.environment == 'github-hosted'",
            "run": "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc "
                   "/opt/hostedtoolcache/CodeQL\ndf -h /\n"}


def _login(config: WorkflowConfig) -> list[dict[str, Any]]:
    """Log in to the registry; the password goes from ``secrets`` straight into the action."""
    if config.registry and Repository.parse(config.registry).loopback:
        return []  # a loopback registry is the runner's own; nothing to log in to
    if config.registry_host == "ghcr.io":
        credentials = {"username": "${{ github.actor }}", "password": "${{ secrets.GITHUB_TOKEN }}"}
    else:
        credentials = {"username": f"${{{{ secrets.{USERNAME_SECRET} }}}}",
                       "password": f"${{{{ secrets.{PASSWORD_SECRET} }}}}"}
    return [{"name": "Log in to the registry", "uses": ACTIONS["login"],
             "with": {"registry": config.registry_host, **credentials}}]


def _download_build_records() -> dict[str, Any]:
    """Every build shard's records: the probe and bench jobs pull the images they name by digest."""
    return {"name": "Download the build records", "uses": ACTIONS["download-artifact"],
            "with": {"pattern": "build-*", "path": "build-out", "merge-multiple": True}}


def _upload(name: str, path: str, *, retention_days: int | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {"name": "Upload " + ", ".join(p.rstrip("/") for p in path.split()),
                            "if": "${{ !cancelled() }}",
                            "uses": ACTIONS["upload-artifact"],
                            "with": {"name": name, "path": path, "if-no-files-found": "warn"}}
    if retention_days is not None:
        step["with"]["retention-days"] = retention_days
    return step


# ----------------------------------------------------------------------------------------------- jobs


def _permissions(*extra: tuple[str, str]) -> dict[str, str]:
    return {"contents": "read", **dict(extra)}


def _packages(config: WorkflowConfig, access: str) -> tuple[tuple[str, str], ...]:
    return (("packages", access),) if config.registry_host == "ghcr.io" else ()


# watch exits 1 when it read new releases: that is news, not a failure. 2 and 3 fail the step.
# save-state: news (the state moved) or no saved state yet (this watch records the baseline).
_WATCH = """\
rc=0
stackforge watch --matrix "$STACKFORGE_MATRIX" --results watch-state --md watch.md --json-out watch.json || rc=$?
cat watch.md >> "$GITHUB_STEP_SUMMARY"
if [ "$rc" -gt 1 ]; then
  exit "$rc"
fi
if [ "$rc" -eq 1 ]; then
  echo "new-releases=true" >> "$GITHUB_OUTPUT"
else
  echo "new-releases=false" >> "$GITHUB_OUTPUT"
fi
if [ "$rc" -eq 1 ] || [ "$FRESH_STATE" = "true" ]; then
  echo "save-state=true" >> "$GITHUB_OUTPUT"
fi
"""

# The state is one file on its own branch, read through the contents API with the job's read token.
# Only a 404 means "no state yet"; any other answer fails the job (a baseline recorded by mistake
# would hide the releases uploaded since the last watch).
_RESTORE_STATE = f"""\
mkdir -p watch-state
status=$(curl -sS -o watch-state/watch-state.json -w '%{{http_code}}' \\
  -H "Authorization: Bearer $GH_TOKEN" -H "Accept: application/vnd.github.raw" \\
  "$GITHUB_API_URL/repos/$GITHUB_REPOSITORY/contents/watch-state.json?ref={STATE_BRANCH}")
if [ "$status" = "404" ]; then
  rm -f watch-state/watch-state.json
  echo "fresh=true" >> "$GITHUB_OUTPUT"
  echo "No watch state on branch {STATE_BRANCH} yet: this watch records the baseline."
elif [ "$status" != "200" ]; then
  echo "::error::reading the watch state from branch {STATE_BRANCH} answered HTTP $status"
  exit 1
fi
"""

_VERIFY = """\
rc=0
stackforge compat verify > verify.txt || rc=$?
{ echo '## compat verify'; echo '```'; tail -n 40 verify.txt; echo '```'; } >> "$GITHUB_STEP_SUMMARY"
exit "$rc"
"""


def _watch_job(config: WorkflowConfig) -> dict[str, Any]:
    """What the index uploaded since the last run (state read from its branch), and the rules verified."""
    return {
        "name": "Watch the index",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["watch"],
        "permissions": _permissions(),
        "outputs": {"new-releases": "${{ steps.watch.outputs.new-releases }}",
                    "save-state": "${{ steps.watch.outputs.save-state }}"},
        "steps": [
            *_prepare(config),
            {"name": "Restore the watch state", "id": "state", "env": {"GH_TOKEN": "${{ github.token }}"},
             "run": _RESTORE_STATE},
            # The index pages and their validators (ETag, Last-Modified): losing them costs one full poll, never news.
            {"name": "Restore the index pages", "uses": ACTIONS["cache"],
             "with": {"path": "~/.cache/stackforge/wheels/index",
                      "key": "stackforge-index-${{ github.run_id }}-${{ github.run_attempt }}",
                      "restore-keys": "stackforge-index-"}},
            {"name": "Watch", "id": "watch", "env": {"FRESH_STATE": "${{ steps.state.outputs.fresh }}"},
             "run": _WATCH},
            {"name": "Verify the rules against the wheels", "if": f"${{{{ {config.nightly} }}}}", "run": _VERIFY},
            _upload("watch-report", "watch.md\nwatch.json\nwatch-state/watch-state.json\n", retention_days=30),
        ],
    }


# One branch per change set: the same new releases give the same branch, so a rerun updates its pull request.
_PROPOSE = """\
set -o pipefail
changes=$(jq -r '[.releases[] | "\\(.package)==\\(.version)"] | sort | join(",")' watch.json)
branch="watch/$(printf '%s' "$changes" | sha256sum | cut -c1-12)"
git switch -c "$branch"
jq -r '.releases[].proposed_patches[].diff | select(. != "")' watch.json > "$RUNNER_TEMP/proposed.patch"
if [ -s "$RUNNER_TEMP/proposed.patch" ]; then
  git apply --index "$RUNNER_TEMP/proposed.patch" || echo "::warning::a proposed patch did not apply; the report has it"
fi
lock="${STACKFORGE_MATRIX%.*}.lock.yaml"
if [ -f "$lock" ]; then
  stackforge plan --matrix "$STACKFORGE_MATRIX" --update-lock
  git add "$lock"
fi
git -c user.name="github-actions[bot]" -c user.email="41898282+github-actions[bot]@users.noreply.github.com" \\
  commit --allow-empty -q -m "stackforge watch: $changes"
git push --force -q origin "$branch"
title="stackforge watch: $(jq -r '.headline' watch.json | head -c 200)"
stackforge ci pull-request --repo "$GITHUB_REPOSITORY" --branch "$branch" --base "$GITHUB_REF_NAME" \\
  --title "$title" --body-file watch.md
"""

# The state as the only file of a one-commit branch, replaced each time (its history is of no use).
_SAVE_STATE = f"""\
export GIT_INDEX_FILE="$RUNNER_TEMP/state.index"
git --work-tree=watch-state add watch-state.json
tree=$(git write-tree)
commit=$(git -c user.name="github-actions[bot]" -c user.email="41898282+github-actions[bot]@users.noreply.github.com" \\
  commit-tree "$tree" -m "watch state of run $GITHUB_RUN_ID")
git push --force -q origin "$commit:refs/heads/{STATE_BRANCH}"
"""


def _propose_job(config: WorkflowConfig) -> dict[str, Any]:
    """News as a pull request, then the state saved: the only job with write permissions."""
    return {
        "name": "Propose the change set",
        "needs": ["watch"],
        "if": "${{ !cancelled() && needs.watch.result == 'success' && needs.watch.outputs.save-state == 'true' }}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["propose"],
        "permissions": {"contents": "write", "pull-requests": "write"},
        # Two runs (the watch schedule and the nightly) must not save the state or push a branch at once.
        "concurrency": {"group": f"{STATE_BRANCH}-${{{{ github.ref }}}}", "cancel-in-progress": False},
        "steps": [
            # Credentials persist here (and only here): the branch pushes need them.
            {"uses": ACTIONS["checkout"]},
            _setup_python(config),
            _install(config),
            {"name": "Download the watch report", "uses": ACTIONS["download-artifact"],
             "with": {"name": "watch-report", "path": "."}},
            {"name": "Branch and pull request",
             "if": "${{ needs.watch.outputs.new-releases == 'true' }}",
             "env": {"GITHUB_TOKEN": "${{ github.token }}"}, "run": _PROPOSE},
            # Last: a pull request that failed leaves the state where it was, so the next watch reports again.
            {"name": "Save the watch state", "run": _SAVE_STATE},
        ],
    }


def _plan_job(config: WorkflowConfig) -> dict[str, Any]:
    labels = "".join(f" --gpu-label {label}" for label in config.gpu_labels)
    return {
        "name": "Plan the matrix",
        "needs": ["watch"],
        "if": f"${{{{ !cancelled() && ({config.nightly}) }}}}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["plan"],
        # actions: read lets `gh` find the previous night's plan.
        "permissions": _permissions(("actions", "read")),
        "outputs": {key: f"${{{{ steps.shards.outputs.{key} }}}}"
                    for key in ("has-stacks", "cpu", "has-gpu", "gpu", "incremental")}
        | {"registry": "${{ steps.registry.outputs.registry }}"},
        "steps": [
            *_prepare(config),
            {"name": "Plan",
             "run": _PLAN},
            {"name": "Fetch the previous run's matrix", "id": "previous",
             "if": "${{ github.event_name == 'schedule' }}",
             "env": {"GH_TOKEN": "${{ github.token }}", "PAGES_ARTIFACT": PAGES_ARTIFACT},
             "run": _PREVIOUS},
            # Nightly: only the stacks the lock diff adds or whose inputs changed; a manual run: all of them.
            {"name": "Shard the plan into jobs", "id": "shards",
             "run": 'since=()\nif [ -f previous/plan.json ]; then\n  since=(--since previous/plan.json)\nfi\n'
                    f'stackforge ci shards --plan plan.json --shards {config.shards}{labels}'
                    ' "${since[@]}" >> "$GITHUB_OUTPUT"\n'},
            # Image references must be lower case; github.repository keeps the owner's capitals.
            {"name": "Registry", "id": "registry",
             "run": 'echo "registry=${STACKFORGE_REGISTRY,,}" >> "$GITHUB_OUTPUT"\n'},
            _upload("plan", "plan.json"),
        ],
    }


# A matrix that follows the index has a lock beside it: resolve it afresh, so the night builds today's releases.
_PLAN = """\
lock="${STACKFORGE_MATRIX%.*}.lock.yaml"
if [ -f "$lock" ]; then
  stackforge plan --matrix "$STACKFORGE_MATRIX" --update-lock > /dev/null
fi
stackforge plan --matrix "$STACKFORGE_MATRIX" --json > plan.json
{ echo '## Plan'; echo '```'; stackforge plan --matrix "$STACKFORGE_MATRIX"; echo '```'; } >> "$GITHUB_STEP_SUMMARY"
"""


# A nightly run after an earlier one names the shard's changed stacks (ONLY); empty: every stack of the shard.
_ONLY = """\
only=()
for stack in $ONLY; do
  only+=(--only "$stack")
done
"""


def _cpu_job(config: WorkflowConfig, kind: str, needs: list[str], run: str) -> dict[str, Any]:
    """A job per non-empty shard on CPU runners (build or gate)."""
    is_build = kind == "build"
    steps = [_free_disk(), *_prepare(config)]
    if is_build:
        steps.append({"name": "Set up Docker Buildx", "uses": ACTIONS["setup-buildx"]})
    steps += _login(config)
    if not is_build:
        steps.append(_download_build_records())
    steps.append({"name": "Build and push" if is_build else "Gate-tier probes",
                  "env": {"SHARD": "${{ matrix.shard }}", "ONLY": "${{ matrix.only }}"}, "run": _ONLY + run})
    steps.append(_upload(f"{'build' if is_build else 'results-gate'}-${{{{ matrix.slug }}}}",
                         "build-out/" if is_build else "results/"))
    return {
        "name": f"{'Build' if is_build else 'Gate probes'} ${{{{ matrix.shard }}}}",
        "needs": needs,
        "if": "${{ !cancelled() && needs.plan.outputs.has-stacks == 'true' }}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS[kind],
        "permissions": _permissions(*_packages(config, "write" if is_build else "read")),
        "env": {"STACKFORGE_REGISTRY": "${{ needs.plan.outputs.registry }}"},
        "strategy": {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.cpu) }}"},
        "steps": steps,
    }


def _gpu_job(config: WorkflowConfig, kind: str, needs: list[str], run: str) -> dict[str, Any]:
    """A job per (arch label, target, shard) on self-hosted GPU runners carrying that label."""
    return {
        "name": f"{'Runtime probes' if kind == 'runtime' else 'Bench'} "
                "${{ matrix.target }} ${{ matrix.shard }}",
        "needs": needs,
        "if": "${{ !cancelled() && needs.plan.outputs.has-gpu == 'true' }}",
        "runs-on": ["self-hosted", "linux", "gpu", "${{ matrix.label }}"],
        "timeout-minutes": TIMEOUTS[kind],
        "permissions": _permissions(*_packages(config, "read")),
        "env": {"STACKFORGE_REGISTRY": "${{ needs.plan.outputs.registry }}"},
        "strategy": {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.gpu) }}"},
        "steps": [
            *_prepare(config),
            *_login(config),
            _download_build_records(),
            {"name": "Runtime-tier probes" if kind == "runtime" else "Benchmarks",
             "env": {"SHARD": "${{ matrix.shard }}", "TARGET": "${{ matrix.target }}", "ONLY": "${{ matrix.only }}"},
             "run": _ONLY + run},
            _upload(f"results-{kind}-${{{{ matrix.slug }}}}", "results/"),
        ],
    }


# One matrix per target of the plan (``stackforge matrix`` needs --target when a run holds several):
# site/<target>/{matrix.json,matrix.md,index.html}, and site/index.html linking them.
_MERGE_AND_RENDER = """\
shopt -s nullglob
shards=(shards/*/)
if [ "${#shards[@]}" -eq 0 ]; then
  echo "::error::no shard produced results"
  exit 1
fi
# An incremental night probed only the changed stacks: the others keep the previous night's results.
if [ "$INCREMENTAL" = "true" ] && [ -d previous/results ]; then
  shards+=(previous/results)
fi
stackforge results merge "${shards[@]}" --out merged --run-id "nightly-${GITHUB_RUN_ID}-${GITHUB_RUN_ATTEMPT}"
run="merged/nightly-${GITHUB_RUN_ID}-${GITHUB_RUN_ATTEMPT}"
mkdir -p site
cp -r "$run" site/results
cp plan.json site/plan.json
python -c 'import json, sys; print("\\n".join(json.load(sys.stdin)["targets"]))' < plan.json > site/targets.txt
{ echo '<!DOCTYPE html><html><head><meta charset="utf-8"><title>stackforge matrix</title></head><body><ul>'
  while read -r target; do echo "<li><a href='$target/'>$target</a></li>"; done < site/targets.txt
  echo '</ul></body></html>'; } > site/index.html
while read -r target; do
  matrix=(stackforge matrix --results "$run" --plan plan.json --target "$target")
  "${matrix[@]}" --format json --out "site/$target/matrix.json"
  "${matrix[@]}" --format md --out "site/$target/matrix.md"
  "${matrix[@]}" --format html --out "site/$target/index.html"
  cat "site/$target/matrix.md" >> "$GITHUB_STEP_SUMMARY"
done < site/targets.txt
"""

# The baseline is the newest artifact of the matrix on this branch that has not expired (a run that failed
# on regressions still published its matrix, so tomorrow compares with today). The artifacts list, not
# the run list: most runs are watch-only runs of the 10-minute schedule and leave no matrix.
_PREVIOUS = """\
mkdir -p previous
run_id=$(gh api "repos/$GITHUB_REPOSITORY/actions/artifacts?name=$PAGES_ARTIFACT&per_page=50" \\
  --jq '[.artifacts[] | select(.expired == false and .workflow_run.head_branch == env.GITHUB_REF_NAME
         and .workflow_run.id != (env.GITHUB_RUN_ID | tonumber))][0].workflow_run.id // empty')
if [ -n "$run_id" ] && gh run download "$run_id" --repo "$GITHUB_REPOSITORY" --name "$PAGES_ARTIFACT" --dir previous; then
  echo "run-id=$run_id" >> "$GITHUB_OUTPUT"
else
  echo "No earlier run left a matrix: nothing to compare with."
fi
"""

# Every target's matrix against the same target's matrix of the previous run; the worst exit code
# of the diffs (1 regression, 2 unusable input) is the step's status.
_DIFF = """\
status=0
: > site/diff.md
while read -r target; do
  echo "### $target" >> site/diff.md
  if [ -f "previous/$target/matrix.json" ]; then
    rc=0
    stackforge matrix diff "previous/$target/matrix.json" "site/$target/matrix.json" >> site/diff.md || rc=$?
    if [ "$rc" -gt "$status" ]; then status=$rc; fi
  else
    echo "No previous matrix for $target: nothing to compare with." >> site/diff.md
  fi
done < site/targets.txt
{ echo "## Changes since the previous run"; cat site/diff.md; } >> "$GITHUB_STEP_SUMMARY"
echo "status=$status" >> "$GITHUB_OUTPUT"
"""


def _report_job(config: WorkflowConfig, needs: list[str]) -> dict[str, Any]:
    return {
        "name": "Merge, diff and render the matrix",
        "needs": needs,
        "if": "${{ !cancelled() && needs.plan.outputs.has-stacks == 'true' }}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["report"],
        # actions: read lets `gh` find the previous run's artifact.
        "permissions": _permissions(("actions", "read")),
        "outputs": {"diff-status": "${{ steps.diff.outputs.status }}"},
        "steps": [
            *_prepare(config),
            {"name": "Download the plan", "uses": ACTIONS["download-artifact"],
             "with": {"name": "plan", "path": "."}},
            {"name": "Download every shard's results", "uses": ACTIONS["download-artifact"],
             "with": {"pattern": "results-*", "path": "shards"}},
            {"name": "Fetch the previous run's matrix", "id": "previous",
             "env": {"GH_TOKEN": "${{ github.token }}", "PAGES_ARTIFACT": PAGES_ARTIFACT},
             "run": _PREVIOUS},
            {"name": "Merge and render", "env": {"INCREMENTAL": "${{ needs.plan.outputs.incremental }}"},
             "run": _MERGE_AND_RENDER},
            {"name": "Diff against the previous run", "id": "diff", "run": _DIFF},
            _upload(PAGES_ARTIFACT, "site/", retention_days=90),
            {"name": "Package the site for GitHub Pages", "uses": ACTIONS["upload-pages-artifact"],
             "with": {"path": "site/"}},
        ],
    }


def _publish_job(config: WorkflowConfig) -> dict[str, Any]:
    return {
        "name": "Publish the matrix to GitHub Pages",
        "needs": ["report"],
        "if": "${{ !cancelled() && needs.report.result == 'success' }}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["publish"],
        "permissions": {"pages": "write", "id-token": "write"},
        "environment": {"name": "github-pages", "url": "${{ steps.deployment.outputs.page_url }}"},
        "steps": [{"name": "Deploy", "id": "deployment", "uses": ACTIONS["deploy-pages"]}],
    }


def _verdict_job(config: WorkflowConfig) -> dict[str, Any]:
    return {
        "name": "Fail on regressions",
        "needs": ["plan", "report", "publish"],
        "if": f"${{{{ !cancelled() && ({config.nightly}) }}}}",
        "runs-on": config.runner,
        "timeout-minutes": TIMEOUTS["verdict"],
        "permissions": {},
        # A night on which no stack changed since the previous one builds nothing and reports nothing: no failure.
        "steps": [{"name": "Verdict",
                   "env": {"PLAN": "${{ needs.plan.result }}", "HAS_STACKS": "${{ needs.plan.outputs.has-stacks }}",
                           "REPORT": "${{ needs.report.result }}",
                           "DIFF": "${{ needs.report.outputs.diff-status }}"},
                   "run": 'if [ "$PLAN" = "success" ] && [ "$HAS_STACKS" = "false" ] && [ "$REPORT" = "skipped" ]; then\n'
                          '  echo "No stack changed since the previous run: nothing built, nothing to compare."\n'
                          '  exit 0\nfi\n'
                          'if [ "$REPORT" != "success" ]; then\n'
                          '  echo "::error::the report job did not succeed ($REPORT)"\n  exit 1\nfi\n'
                          'if [ "$DIFF" != "0" ]; then\n'
                          '  echo "::error::the matrix regressed since the previous run (see the summary)"\n'
                          '  exit 1\nfi\necho "No regressions."\n'}],
    }


#: BuildKit's layer cache kept in the registry beside the images, one cache per stack: a fresh runner
#: rebuilds nothing of a stack whose lock and templates did not change (setup-buildx-action's
#: docker-container builder can export it; the engine's own docker driver cannot).
REGISTRY_CACHE_ARGS = ('--cache-from "type=registry,ref=$STACKFORGE_REGISTRY/stackforge-cache:{stack}" '
                       '--cache-to "type=registry,ref=$STACKFORGE_REGISTRY/stackforge-cache:{stack},mode=max"')


def workflow(config: WorkflowConfig) -> dict[str, Any]:
    """The workflow as a plain dict, keys in the order they are written."""
    matrix_arg = '--matrix "$STACKFORGE_MATRIX"'
    jobs: dict[str, Any] = {
        "watch": _watch_job(config),
        "propose": _propose_job(config),
        "plan": _plan_job(config),
        "build": _cpu_job(config, "build", ["plan"],
                          f'stackforge build {matrix_arg} --shard "$SHARD" "${{only[@]}}" --push "$STACKFORGE_REGISTRY" '
                          f"--out build-out {REGISTRY_CACHE_ARGS}\n"),
        "gate": _cpu_job(config, "gate", ["plan", "build"],
                         f'stackforge probe {matrix_arg} --tier gate --shard "$SHARD" "${{only[@]}}" '
                         '--builds build-out --results results\n'),
    }
    if config.gpu_labels:
        jobs["runtime"] = _gpu_job(config, "runtime", ["plan", "build"],
                                   f'stackforge probe {matrix_arg} --target "$TARGET" --tier runtime '
                                   '--shard "$SHARD" "${only[@]}" --builds build-out --results results\n')
        jobs["bench"] = _gpu_job(config, "bench", ["plan", "runtime"],
                                 f'stackforge bench {matrix_arg} --target "$TARGET" --shard "$SHARD" "${{only[@]}}" '
                                 "--builds build-out --results results\n")
    jobs["report"] = _report_job(config, ["plan", *(name for name in jobs if name not in ("watch", "propose", "plan", "build"))])
    jobs["publish"] = _publish_job(config)
    jobs["verdict"] = _verdict_job(config)
    return {
        "name": "stackforge nightly matrix",
        "on": {"schedule": [{"cron": config.cron}, {"cron": config.watch_cron}], "workflow_dispatch": {}},
        "permissions": {"contents": "read"},
        # Per schedule: a nightly run of hours must not hold back the 10-minute watch (and its news).
        "concurrency": {"group": "${{ github.workflow }}-${{ github.ref }}-${{ github.event.schedule || 'manual' }}",
                        "cancel-in-progress": False},
        "defaults": {"run": {"shell": "bash"}},
        "env": {"STACKFORGE_MATRIX": config.matrix, "STACKFORGE_REGISTRY": config.registry_ref,
                "PYTHONUNBUFFERED": "1"},
        "jobs": jobs,
    }


def check_workflow_inputs(config: WorkflowConfig) -> tuple[str, ...]:
    """Warnings about ``config``, after refusing what the runners could not use.

    The runners plan the matrix file from the repository root, so it must exist (and load) there now.
    An ``install`` naming the PyPI project ``stackforge`` installs another project of that name.

    Raises:
        SpecError: the matrix file is not there; MatrixError (a SpecError): it does not load.
    """
    matrix_path = local_matrix_path(config.matrix)
    if not matrix_path.is_file():
        raise SpecError(f"--matrix {config.matrix}: no such file here (the workflow plans it from the "
                        "repository root)", remedy="run from the repository root and pass a path relative to "
                        "it, or a shipped matrix name such as default")
    load_matrix(matrix_path)
    if re.fullmatch(r"stackforge\s*([=<>!~].*)?", config.install, flags=re.IGNORECASE):
        return ("--install names the PyPI project 'stackforge', which is not this one; use '.' in a "
                "checkout of it or git+https://<host>/<owner>/stackforge@<tag>",)
    return ()


def local_matrix_path(matrix: str) -> Path:
    """The file on this machine that the runners will plan as ``matrix``.

    A path relative to this directory when it is there; else a path into a shipped data folder
    (``matrices/default.yaml``) is that folder's file wherever stackforge is installed or checked out,
    so ``ci github`` answers the same from any directory (the runners plan it from the repository root).
    """
    path = resolve_matrix_path(matrix)
    folder, _, rest = matrix.partition("/")
    if path.is_file() or folder not in DATA_FOLDERS or not rest:
        return path
    try:
        return data_dir(folder) / rest
    except StackforgeError:
        return path


def write_workflow(config: WorkflowConfig) -> str:
    """The workflow file's text: a header naming the command that made it, then stable YAML."""
    header = (f"# Generated by: {config.command_line()}\n"
              "# Do not edit by hand: change the options and regenerate (a test compares this file with\n"
              "# the generator's output). See docs/scale-out.md.\n")
    return header + yaml.dump(workflow(config), Dumper=_WorkflowDumper, sort_keys=False, allow_unicode=True,
                              width=1000, default_flow_style=False)


def parse_header_command(text: str) -> list[str]:
    """The ``stackforge ci github ...`` arguments (after ``github``) recorded in a generated file's header."""
    first = text.splitlines()[0] if text else ""
    prefix = "# Generated by: stackforge ci github "
    if not first.startswith(prefix):
        raise SpecError("not a workflow generated by `stackforge ci github` (no header line)")
    return shlex.split(first[len(prefix):])


class _WorkflowDumper(yaml.SafeDumper):
    """SafeDumper that indents lists under their key and writes scripts as literal blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_WorkflowDumper.add_representer(str, _represent_str)


# ----------------------------------------------------------------------------------------- job matrices


@dataclass(frozen=True, slots=True)
class CiFanOut:
    """The fan-out of one nightly run, computed from the plan by the workflow's ``plan`` job.

    Attributes:
        cpu: one entry per shard that owns at least one kept stack (build and gate jobs).
        gpu: one entry per (arch label, target of that arch, shard with stacks kept for that target).
        unmatched_labels: labels no target of the plan has (their runners get no work; worth a warning).
    """

    cpu: tuple[dict[str, str], ...]
    gpu: tuple[dict[str, str], ...]
    unmatched_labels: tuple[str, ...] = field(default=())
    incremental: bool = False
    unchanged: tuple[str, ...] = ()

    def github_output(self) -> str:
        """``key=value`` lines for ``$GITHUB_OUTPUT`` (values are one-line JSON, read with fromJSON)."""
        def compact_json(value: Any) -> str:
            return json.dumps(value, separators=(",", ":"))
        lines = [f"incremental={'true' if self.incremental else 'false'}",
                 f"has-stacks={'true' if self.cpu else 'false'}",
                 f"cpu={compact_json({'include': list(self.cpu)})}",
                 f"has-gpu={'true' if self.gpu else 'false'}",
                 f"gpu={compact_json({'include': list(self.gpu)})}"]
        return "\n".join(lines) + "\n"


def changed_stacks(plan: Plan, previous: Plan) -> frozenset[str]:
    """The kept stacks of ``plan`` that ``previous`` did not keep, or kept with other inputs: another
    derivation (base image, torch index and requirement, kernel package, CUDA image) on some target.
    A stack's versions are its id, so a release the lock moved in is a new id."""
    before = {(c.stack_id, c.target.name): c.derived.to_json() for c in previous.cells if not c.pruned}
    return frozenset(c.stack_id for c in plan.cells
                     if not c.pruned and before.get((c.stack_id, c.target.name)) != c.derived.to_json())


def ci_fan_out(plan: Plan, shards: int, gpu_labels: Sequence[str] = (), since: Plan | None = None) -> CiFanOut:
    """Which shard jobs a plan needs: CPU shards over kept stacks, GPU shards per target arch.

    Args:
        plan: the plan (a ``stackforge plan --json`` file is read with :meth:`Plan.from_json`).
        shards: N of the K/N split.
        gpu_labels: arch labels (``sm_120``) that have self-hosted runners.
        since: the previous run's plan: only the stacks :func:`changed_stacks` names get jobs (the
            others keep that run's results). Shards are cut over the whole plan's stacks, so a stack's
            shard does not depend on what else changed.
    """
    for label in gpu_labels:
        _check(_GPU_LABEL, label, "--gpu-label", "an arch label such as sm_120 or sm_90")
    targets = {t.name: t.arch for t in plan.targets}
    wanted = changed_stacks(plan, since) if since is not None else None
    all_kept = list(dict.fromkeys(c.stack_id for c in plan.cells if not c.pruned))
    unchanged = tuple(s for s in all_kept if wanted is not None and s not in wanted)
    kept = [c.stack_id for c in plan.cells if not c.pruned and (wanted is None or c.stack_id in wanted)]
    def only(ids: Sequence[str], shard: Shard) -> str:
        # The changed stacks of the shard, for --only; "" (all of the shard) when the run is not incremental.
        return "" if wanted is None else " ".join(sorted(i for i in ids if shard.owns(i)))
    cpu = tuple({"shard": str(s), "slug": s.slug, "only": only(kept, s)}
                for s in nonempty_shards(dict.fromkeys(kept), shards))
    gpu: list[dict[str, str]] = []
    unmatched = []
    for label in gpu_labels:
        names = [name for name, arch in targets.items() if f"sm_{compact(arch)}" == label.rstrip("af")]
        unmatched += [] if names else [label]
        for name in names:
            ids = dict.fromkeys(c.stack_id for c in plan.cells_for_target(name)
                                if not c.pruned and (wanted is None or c.stack_id in wanted))
            gpu += [{"label": label, "target": name, "shard": str(s), "slug": f"{label}-{name}-{s.slug}",
                     "only": only(list(ids), s)} for s in nonempty_shards(ids, shards)]
    return CiFanOut(cpu=cpu, gpu=tuple(gpu), unmatched_labels=tuple(unmatched), incremental=since is not None,
                    unchanged=unchanged)


@dataclass(frozen=True, slots=True)
class WorkflowFile:
    """What :func:`sync_workflow` did with the workflow file: ``written``, ``up-to-date`` or ``out-of-date``
    (``--check``: nothing written), and the input warnings to tell first."""

    path: Path
    state: str
    warnings: tuple[str, ...]


def sync_workflow(config: WorkflowConfig, path: Path, *, check: bool = False) -> WorkflowFile:
    """``stackforge ci github``'s one library entry: write the workflow to ``path`` (atomically), or with
    ``check`` only compare it with the file there.

    Raises:
        SpecError: a config the workflow cannot be written from. OSError: the file cannot be written.
    """
    warnings = check_workflow_inputs(config)
    text = write_workflow(config)
    if check:
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        return WorkflowFile(path, "up-to-date" if current == text else "out-of-date", warnings)
    atomic_write_text(path, text)
    return WorkflowFile(path, "written", warnings)


__all__ = ["ACTIONS", "CiFanOut", "STATE_BRANCH", "WorkflowConfig", "WorkflowFile", "changed_stacks",
           "check_workflow_inputs", "ci_fan_out", "local_matrix_path",
           "parse_header_command", "sync_workflow", "write_workflow", "workflow"]
